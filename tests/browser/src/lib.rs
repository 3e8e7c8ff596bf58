//! The dashboard in headless Chromium: `tests/dashboard.rs` starts a cluster and a Job, and
//! runs `dashboard.cjs` against the API server's dashboard; `traces.cjs` opens a Job's trace
//! page (run by the compose test of `tests/cluster`, where Jaeger holds the Job's traces).
//! Both are playwright-core over Debian's chromium, installed by `scripts/install-deps.sh`.

#![warn(missing_docs)]

use std::path::PathBuf;
use std::process::Command;

/// Debian's chromium (or `PRIMUS_CHROMIUM`); fails naming the fix without one.
#[expect(
    clippy::disallowed_methods,
    reason = "PRIMUS_CHROMIUM names another browser"
)]
pub fn chromium() -> PathBuf {
    let path = std::env::var_os("PRIMUS_CHROMIUM")
        .map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from);
    assert!(
        path.is_file(),
        "no Chromium at {}: scripts/install-deps.sh installs Debian's chromium (PRIMUS_CHROMIUM names another)",
        path.display()
    );
    path
}

/// Where playwright-core is installed (`.tools/web/node_modules`); fails naming the fix.
pub fn node_modules() -> PathBuf {
    let modules = root().join(".tools/web/node_modules");
    assert!(
        modules.join("playwright-core/package.json").is_file(),
        "no playwright-core under {}: scripts/install-deps.sh installs it",
        modules.display()
    );
    modules
}

/// `node <script of this crate>` with Chromium and playwright-core found, and the settings
/// every script reads: the dashboard's URL, a token, a Job, where to write the screenshot.
pub fn script(
    name: &str,
    dashboard_url: &str,
    token: &str,
    job: &str,
    screenshot: &std::path::Path,
) -> Command {
    let mut command = Command::new("node");
    command
        .arg(root().join("tests/browser").join(name))
        .env("NODE_PATH", node_modules())
        .env("PRIMUS_CHROMIUM", chromium())
        .env("PRIMUS_DASHBOARD_URL", dashboard_url)
        .env("PRIMUS_TOKEN", token)
        .env("PRIMUS_JOB", job)
        .env("PRIMUS_SCREENSHOT", screenshot);
    command
}

/// Where a screenshot goes: `docs/images/<name>` with `PRIMUS_BLESS=1` (the docs show it),
/// else `scratch/<name>`.
#[expect(
    clippy::disallowed_methods,
    reason = "PRIMUS_BLESS writes the screenshot the docs show"
)]
pub fn screenshot_path(name: &str, scratch: &std::path::Path) -> PathBuf {
    match std::env::var_os("PRIMUS_BLESS") {
        Some(_) => root().join("docs/images").join(name),
        None => scratch.join(name),
    }
}

/// The checkout the tests run in, found at run time: a library compiled in another
/// checkout that shares the target folder would otherwise name that one.
fn root() -> PathBuf {
    primus_testkit::repo_root()
}
