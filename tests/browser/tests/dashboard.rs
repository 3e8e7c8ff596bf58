//! The dashboard in a real headless Chromium: a wrong token sees nothing; with the right
//! one the running Job is listed, its page's curves gain points live and keep them across a
//! reload, and the Job leaves the list when it is deleted. The screenshot the README shows
//! is taken here (written to `docs/images/dashboard.png` with `PRIMUS_BLESS=1`).

use std::process::Stdio;
use std::time::Duration;

use primus_harness::criteo::{apply_criteo_dataset, dlrm_job};
use primus_harness::{MasterProcess, Sandbox, TOKEN, binary};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const JOB: &str = "dashboard";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_shows_live_curves_to_its_token_only_and_leaves_the_list_when_deleted() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    sandbox
        .apply([dlrm_job(&sandbox, JOB, 1, 3600).build()])
        .await;
    let mut settings = sandbox.master_settings();
    // Slow reads keep the Job training while the browser looks at it.
    settings.master.fault_injection.data_read_delay_ms = 1_000;
    for needed in ["primus-data-executor", "primus-ps", "primus-trainer"] {
        binary(needed);
    }
    let master = MasterProcess::start(&sandbox, &settings, &[]);
    sandbox.wait_for_at_least(JOB, 1).await;

    let screenshot = primus_browser::screenshot_path("dashboard.png", sandbox.dir());
    let dashboard = sandbox
        .dashboard_addr()
        .expect("the sandbox serves a dashboard");
    let script = primus_browser::script(
        "dashboard.cjs",
        &format!("http://{dashboard}/"),
        TOKEN,
        JOB,
        &screenshot,
    );
    let mut browser = Command::from(script)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs (scripts/install-deps.sh installs it)");
    let mut lines = BufReader::new(browser.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let reading = async {
        while let Some(line) = lines.next_line().await.expect("the script's output") {
            eprintln!("dashboard.cjs: {line}");
            if line == format!("delete {JOB}") {
                sandbox.delete_job(JOB).await;
            }
            seen.push(line);
        }
    };
    tokio::time::timeout(Duration::from_secs(300), reading)
        .await
        .expect("the browser checks end within 5 minutes");
    let exit = browser.wait().await.expect("node exits");
    assert!(
        exit.success() && seen.last().map(String::as_str) == Some("ok"),
        "the dashboard checks failed ({exit}): {seen:?}\n{}",
        sandbox.logs(JOB)
    );
    assert!(
        screenshot.is_file(),
        "a screenshot at {}",
        screenshot.display()
    );
    master.stop();
}
