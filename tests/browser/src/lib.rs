//! The dashboard's browser test: `tests/dashboard.rs` starts a cluster and a Job, and runs
//! `dashboard.cjs` (playwright-core over Debian's chromium, both installed by
//! `scripts/install-deps.sh`) against the API server's dashboard.
