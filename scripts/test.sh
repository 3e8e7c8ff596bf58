#!/usr/bin/env bash
# Everything CI checks: installs what is missing, then formatting, clippy and every test.
# Tests start their own NATS, Redis and SeaweedFS on loopback (primus-testkit); with CI=true
# a server that cannot start fails the test that needs it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

./scripts/install-deps.sh
# shellcheck source=scripts/env.sh
. scripts/env.sh
./scripts/free-target-space.sh
# A CI run builds a fresh clone, whose workspace crates no later build reuses incremental
# caches of (they are keyed by the clone's path): writing them costs about a tenth of the
# workspace's compile time and gigabytes of disk.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
echo "[test] CARGO_TARGET_DIR=$CARGO_TARGET_DIR"

./scripts/check-deploy.sh

echo "[test] cargo fmt --check"
cargo fmt --all --check
# Each cargo invocation selects the whole workspace, so that a crate's dependencies resolve
# the same features every time and are built once (a narrower selection resolves fewer and
# builds them again); target filters (--test) narrow what is built and run.
# The workspace as users build it: every binary's default features (Kubernetes, HDFS, burn).
echo "[test] cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The quickstart's build: the services without their optional features.
cargo clippy --locked --no-default-features "${SERVICE_PACKAGES[@]/#/--package=}" --lib --bins -- -D warnings
# The `cuda` feature (primus-model on burn 0.21 with its CUDA backend;
# libs/model/src/on_burn/backend.rs) is a different build of the dense network: the model is
# linted on it, and its tests run on it too (their GPU parts print SKIPPED without a device).
cargo clippy --workspace --features primus-model/cuda --test model --bench step --locked -- -D warnings
echo "[test] cargo doc (warnings are errors)"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked
echo "[test] cargo deny: licenses, duplicate versions, sources"
cargo deny --locked check licenses bans sources
# Advisories: against the local RustSec database, or the dated snapshot in third_party/
# where none is newer (this machine cannot fetch the database from GitHub).
advisories_of="$(./scripts/advisory-db.sh)"
echo "[test] cargo deny advisories: against the RustSec advisory database of $advisories_of (offline)"
cargo deny --locked --offline check advisories
echo "[test] cargo test"
cargo test --workspace --exclude primus-chaos --exclude primus-cluster-tests --locked
cargo test --workspace --exclude primus-chaos --test operator --test compose --locked
# The Kubernetes suite (tests/cluster/tests/kubernetes) mostly waits on its cluster: it keeps
# about 40% of two cores busy for 7-8 minutes. It runs beside the model's `cuda` build and
# tests, which start no server, after every other test that starts a cluster, and its output
# follows theirs. The chaos suite runs alone after it: it restarts servers on their ports,
# which a suite picking ports beside it could take in between.
kube_log="$(mktemp)"
cargo test --workspace --exclude primus-chaos --test kubernetes --locked -- --nocapture >"$kube_log" 2>&1 &
kube_suite=$!
model_status=0
cargo test --workspace --features primus-model/cuda --test model --locked || model_status=$?
kube_status=0
wait "$kube_suite" || kube_status=$?
echo "[test] the Kubernetes suite (ran beside the model's cuda tests)"
cat "$kube_log"
rm -f "$kube_log"
[ "$model_status" -eq 0 ] || exit "$model_status"
[ "$kube_status" -eq 0 ] || exit "$kube_status"
echo "[test] chaos suite"
cargo test --workspace --test chaos --locked -- --nocapture
