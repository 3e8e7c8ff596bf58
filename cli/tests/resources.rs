//! `primus apply/get/describe/delete/watch` as a user runs them, against an API server on
//! real Redis and NATS.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use primus_api_client::ApiClient;
use primus_harness::{Sandbox, TOKEN};
use primus_spec::Kind;
use primus_spec::status::{Condition, HeadProgress, Phase, Progress, SourceProgress, Status};

fn primus_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_primus"))
}

#[expect(
    clippy::disallowed_methods,
    reason = "Cargo sets the package's folder at run time; the compile-time path goes stale under a shared target folder"
)]
fn example(name: &str) -> PathBuf {
    // The run-time value, as a shared target folder may hold a build from another checkout.
    let crate_dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&crate_dir).join("../examples").join(name)
}

/// A sandbox's API server, called through the `primus` binary.
struct Cluster {
    sandbox: Sandbox,
    server: String,
}

impl Cluster {
    async fn start() -> Self {
        let sandbox = Sandbox::start().await;
        let server = format!("http://{}", sandbox.api_addr());
        Self { sandbox, server }
    }

    /// `primus` with the server and token in the environment, as a user would set them.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(primus_bin());
        command
            .args(args)
            .env("PRIMUS_SERVER", &self.server)
            .env("PRIMUS_TOKEN", TOKEN)
            .env("XDG_CONFIG_HOME", self.sandbox.dir().join("no-config"));
        command
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut command = self.command(args);
        tokio::task::spawn_blocking(move || command.output().expect("run primus"))
            .await
            .expect("join")
    }

    async fn client(&self) -> ApiClient {
        self.sandbox.client().await
    }
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn expect_exit(output: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = text(output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_get_describe_delete_an_example() {
    let cluster = Cluster::start().await;
    let file = example("criteo-like.yaml");
    let file = file.to_str().expect("utf-8 path");

    let (stdout, _) = expect_exit(&cluster.run(&["apply", "-f", file]).await, 0);
    assert!(stdout.contains("dataset/criteo-like created"), "{stdout}");
    assert!(stdout.contains("job/ctr-demo created"), "{stdout}");
    let (stdout, _) = expect_exit(&cluster.run(&["apply", "-f", file]).await, 0);
    assert!(stdout.contains("job/ctr-demo unchanged"), "{stdout}");

    let (stdout, _) = expect_exit(&cluster.run(&["get", "jobs"]).await, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("PHASE"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("ctr-demo")
            && lines[1].contains("Pending")
            && lines[1].contains("batch"),
        "{stdout}"
    );

    let (stdout, _) = expect_exit(
        &cluster.run(&["get", "job", "ctr-demo", "-o", "json"]).await,
        0,
    );
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["kind"], "Job");
    assert_eq!(json["spec"]["dataset"], "criteo-like");
    assert_eq!(json["status"]["phase"], "Pending");

    let (stdout, _) = expect_exit(
        &cluster
            .run(&["get", "datasets", "-o", "yaml", "-l", "team=ads"])
            .await,
        0,
    );
    let yaml: serde_json::Value = serde_yaml_ng::from_str(&stdout).expect("yaml");
    assert_eq!(yaml["metadata"]["name"], "criteo-like");
    let (stdout, _) = expect_exit(
        &cluster.run(&["get", "datasets", "-l", "team=none"]).await,
        0,
    );
    assert_eq!(stdout, "no datasets\n");

    let running = job_status(Phase::Running, 0.5, "Training");
    let client = cluster.client().await;
    (client.update_status(Kind::Job, "ctr-demo", &running, 0))
        .await
        .expect("status");
    let (stdout, _) = expect_exit(&cluster.run(&["describe", "job", "ctr-demo"]).await, 0);
    for expected in [
        "Kind:        Job",
        "Phase:       Running",
        "300 samples trained again after rollbacks",
        "Heads:       click AUC 0.7500, watch_time RMSE 1.2500",
        "  source     criteo-parquet: 800 rows read, 500 samples trained, 300 trained again after rollbacks",
        "Spec:",
        "dataset: criteo-like",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in:\n{stdout}");
    }

    // Still referenced: bad input (2), and the message says by whom.
    let (_, stderr) = expect_exit(&cluster.run(&["delete", "dataset", "criteo-like"]).await, 2);
    assert!(stderr.contains("Job/ctr-demo"), "{stderr}");
    let (stdout, _) = expect_exit(&cluster.run(&["delete", "job", "ctr-demo"]).await, 0);
    assert!(stdout.contains("job/ctr-demo deleted"), "{stdout}");
    let (_, stderr) = expect_exit(&cluster.run(&["get", "job", "ctr-demo"]).await, 1);
    assert!(stderr.contains("NotFound"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_exits_2_naming_the_problem_and_applies_nothing() {
    let cluster = Cluster::start().await;
    let dir = cluster.sandbox.dir();
    let write = |name: &str, content: &str| {
        let path = dir.join(name);
        std::fs::write(&path, content).expect("write");
        path.to_str().expect("utf-8").to_owned()
    };
    let good = std::fs::read_to_string(example("criteo-like.yaml")).expect("example");
    let cases = [
        (
            write("malformed.yaml", "kind: Job\nmetadata: [oops\n"),
            "malformed.yaml",
        ),
        (
            write("negative.yaml", &good.replace("dim: 16", "dim: -16")),
            "spec.model.tables[0].dim",
        ),
        (
            write(
                "optimizer.yaml",
                &good.replace("kind: adagrad", "kind: adadelta"),
            ),
            "unknown variant `adadelta`",
        ),
        (
            write("huge.yaml", &format!("# {}\n{good}", "x".repeat(10 << 20))),
            "over the",
        ),
    ];
    for (path, expected) in &cases {
        let (_, stderr) = expect_exit(&cluster.run(&["apply", "-f", path]).await, 2);
        assert!(stderr.contains(expected), "{expected:?} in: {stderr}");
    }
    // A dangling dataset reference is refused by the server, also as bad input.
    let job_only = good
        .split("---")
        .find(|doc| doc.contains("kind: Job"))
        .expect("job document")
        .to_owned();
    let path = write("dangling.yaml", &job_only);
    let (_, stderr) = expect_exit(&cluster.run(&["apply", "-f", &path]).await, 2);
    assert!(stderr.contains("spec.dataset"), "{stderr}");

    let (stdout, _) = expect_exit(&cluster.run(&["get", "jobs"]).await, 0);
    assert_eq!(stdout, "no jobs\n", "nothing was applied");
    let (_, stderr) = expect_exit(&cluster.run(&["get", "widgets"]).await, 2);
    assert!(stderr.contains("widgets"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_come_from_flags_env_or_config_file() {
    let cluster = Cluster::start().await;
    // No token anywhere: bad input, and the message says where to put one.
    let mut command = cluster.command(&["get", "jobs"]);
    command.env_remove("PRIMUS_TOKEN");
    let (_, stderr) = expect_exit(&command.output().expect("run"), 2);
    assert!(stderr.contains("no API token"), "{stderr}");

    // A wrong token: the server refuses (1).
    let (_, stderr) = expect_exit(&cluster.run(&["get", "jobs", "--token", "wrong"]).await, 1);
    assert!(stderr.contains("Unauthenticated"), "{stderr}");

    // The config file under $XDG_CONFIG_HOME/primus/config.yaml, with a token file.
    let config_home = cluster.sandbox.dir().join("config-home");
    std::fs::create_dir_all(config_home.join("primus")).expect("mkdir");
    std::fs::write(
        config_home.join("primus/config.yaml"),
        format!(
            "server: {}\ntoken_file: {}\n",
            cluster.server,
            cluster.sandbox.token_file().display()
        ),
    )
    .expect("config");
    let output = Command::new(primus_bin())
        .args(["get", "jobs"])
        .env_remove("PRIMUS_SERVER")
        .env_remove("PRIMUS_TOKEN")
        .env("XDG_CONFIG_HOME", &config_home)
        .output()
        .expect("run");
    let (stdout, _) = expect_exit(&output, 0);
    assert_eq!(stdout, "no jobs\n");

    // An unknown key in the config file is named.
    std::fs::write(config_home.join("primus/config.yaml"), "sever: x\n").expect("config");
    let output = Command::new(primus_bin())
        .args(["get", "jobs"])
        .env("XDG_CONFIG_HOME", &config_home)
        .output()
        .expect("run");
    let (_, stderr) = expect_exit(&output, 2);
    assert!(stderr.contains("sever"), "{stderr}");
}

fn job_status(phase: Phase, fraction: f64, reason: &str) -> Status {
    Status {
        phase,
        observed_generation: 1,
        conditions: vec![Condition {
            kind: "Progressing".into(),
            status: true,
            reason: reason.into(),
            message: String::new(),
            last_transition_unix_ms: 1,
        }],
        progress: Some(Progress {
            samples: (fraction * 1000.0) as u64,
            steps: 1,
            fraction: Some(fraction),
            samples_per_second: 500.0,
            auc: Some(0.75),
            retrained_samples: 300,
            heads: vec![
                HeadProgress {
                    name: "click".into(),
                    auc: Some(0.75),
                    rmse: None,
                },
                HeadProgress {
                    name: "watch_time".into(),
                    auc: None,
                    rmse: Some(1.25),
                },
            ],
            sources: vec![SourceProgress {
                source: "criteo-parquet".into(),
                rows_read: 800,
                samples: (fraction * 1000.0) as u64,
                retrained_samples: 300,
            }],
            tasks: None,
        }),
        ..Status::default()
    }
}

/// Starts `primus watch job ctr-demo`, writes `statuses`, returns the command's output.
async fn watch_through(cluster: &Cluster, statuses: Vec<Status>) -> Output {
    let file = example("criteo-like.yaml");
    expect_exit(
        &cluster
            .run(&["apply", "-f", file.to_str().expect("utf-8")])
            .await,
        0,
    );
    let mut command = cluster.command(&["watch", "job", "ctr-demo"]);
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    // Give the watch time to read the current state, then change it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let client = cluster.client().await;
    for status in &statuses {
        client
            .update_status(Kind::Job, "ctr-demo", status, 0)
            .await
            .expect("status");
    }
    let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
    tokio::time::timeout(Duration::from_secs(20), waited)
        .await
        .expect("watch ends with the job")
        .expect("join")
        .expect("output")
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_follows_a_job_to_success() {
    let cluster = Cluster::start().await;
    let output = watch_through(
        &cluster,
        vec![
            job_status(Phase::Running, 0.25, "Training"),
            job_status(Phase::Running, 0.75, "Training"),
            job_status(Phase::Succeeded, 1.0, "Done"),
        ],
    )
    .await;
    let (stdout, _) = expect_exit(&output, 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(
        lines[0].contains("CURRENT") && lines[0].contains("Pending"),
        "{stdout}"
    );
    assert!(
        lines[1].contains("MODIFIED") && lines[1].contains("25.0%"),
        "{stdout}"
    );
    assert!(
        lines[2].contains("75.0%") && lines[2].contains("AUC 0.7500"),
        "{stdout}"
    );
    assert!(lines[3].contains("Succeeded"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_exits_1_when_the_job_fails() {
    let cluster = Cluster::start().await;
    let output = watch_through(
        &cluster,
        vec![
            job_status(Phase::Running, 0.5, "Training"),
            job_status(Phase::Failed, 0.5, "TrainerCrashed"),
        ],
    )
    .await;
    let (_, stderr) = expect_exit(&output, 1);
    assert!(
        stderr.contains("Failed") && stderr.contains("TrainerCrashed"),
        "{stderr}"
    );
}

/// An error names each cause once: the server's message of a refused call, and an
/// unreachable server's connect error (tonic, hyper and the OS each wrap the last).
#[tokio::test(flavor = "multi_thread")]
async fn errors_state_each_cause_once() {
    let cluster = Cluster::start().await;
    let example = example("criteo-like.yaml");
    expect_exit(
        &cluster
            .run(&["apply", "-f", example.to_str().expect("utf-8")])
            .await,
        0,
    );
    let (_, stderr) = expect_exit(&cluster.run(&["delete", "dataset", "criteo-like"]).await, 2);
    assert_eq!(stderr.matches("Job/ctr-demo").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("FailedPrecondition").count(), 1, "{stderr}");

    let unused = primus_testkit::free_port().expect("a free port");
    let server = format!("http://127.0.0.1:{unused}");
    let (_, stderr) = expect_exit(&cluster.run(&["get", "jobs", "--server", &server]).await, 1);
    assert!(stderr.contains(&server), "{stderr}");
    for cause in ["tcp connect error", "Connection refused"] {
        assert_eq!(
            stderr.matches(cause).count(),
            1,
            "{cause:?} once in: {stderr}"
        );
    }
}
