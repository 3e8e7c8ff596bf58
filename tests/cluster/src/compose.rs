//! `deploy/docker-compose.yaml` as a user runs it: Docker Compose v2 (built by
//! `scripts/install-cluster-tools.sh`) on the testkit's Docker engine, the Primus image from
//! deploy/Dockerfile and the testkit's NATS, Redis, MinIO and Jaeger images named by an
//! override file (as an air-gapped operator names a local registry's images), the ports
//! published on the engine's address instead of its loopback, and the compose example Job
//! applied from the host with the `primus` CLI, as docs/compose.md tells a user to.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use primus_api_client::{ApiClient, ClientSettings};
use primus_config::StorageSettings;
use primus_harness::binary;
use primus_spec::Kind;
use primus_spec::status::{Phase, Status};
use primus_testkit::{DockerEngine, images};
use serde_json::Value;

use crate::example::{ExampleRun, job_seconds};

/// The compose example's Job (examples/compose-criteo.yaml).
pub const JOB: &str = "ctr-compose";
/// Its rows (the `example-data` service's 24 windows of 10,000).
pub const ROWS: u64 = 240_000;
/// The compose project's name.
const PROJECT: &str = "primus-test";
/// The services that run until they are stopped.
const LONG_RUNNING: [&str; 7] = [
    "nats",
    "redis",
    "minio",
    "jaeger",
    "api-server",
    "master",
    "serving-sync",
];

/// The compose cluster, up; stopped with its volumes by [`ComposeDeployment::down`].
pub struct ComposeDeployment {
    engine: &'static DockerEngine,
    compose: PathBuf,
    overrides: PathBuf,
}

impl ComposeDeployment {
    /// Loads the images into the engine, runs `docker-compose up -d` with the override
    /// file, and waits for every long-running service to run (healthy where it has a
    /// health check) and the one-shot services (bucket, example data) to have succeeded.
    pub fn up() -> Result<Self, String> {
        let started = Instant::now();
        let engine = DockerEngine::shared().map_err(|e| e.to_string())?;
        let compose = images::cluster_tool("docker-compose-v2").map_err(|e| e.to_string())?;
        let mut services = String::new();
        let upstream = [
            ("nats", images::nats_image(), &["4222:4222"][..]),
            ("redis", images::redis_image(), &[][..]),
            (
                "minio",
                images::minio_image(),
                &["9000:9000", "9001:9001"][..],
            ),
            (
                "jaeger",
                images::jaeger_image(),
                &["16686:16686", "4317:4317"][..],
            ),
        ];
        for (service, image, ports) in upstream {
            let (tag, archive) = image.map_err(|e| e.to_string())?;
            engine.load(&archive).map_err(|e| e.to_string())?;
            services.push_str(&format!("  {service}:\n    image: {tag}\n"));
            services.push_str(&published(ports));
        }
        services.push_str(&format!(
            "  api-server:\n{}",
            published(&["7070:7070", "7080:7080"])
        ));
        let primus = primus_harness::image::primus_image().map_err(|e| e.to_string())?;
        engine.load(&primus).map_err(|e| e.to_string())?;

        let overrides = engine.dir().join("compose-overrides.yaml");
        let text = format!(
            "# deploy/docker-compose.yaml with the images this machine built, its ports\n\
             # published on the engine's address.\nservices:\n{services}"
        );
        std::fs::write(&overrides, text).map_err(|e| e.to_string())?;
        let deployment = Self {
            engine,
            compose,
            overrides,
        };
        deployment
            .compose_run(&["up", "--detach", "--no-build", "--pull", "never"])
            .map_err(|e| format!("{e}\n{}", deployment.diagnostics()))?;
        deployment.wait_until_up(Duration::from_secs(300))?;
        eprintln!(
            "[compose] deploy/docker-compose.yaml up in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        Ok(deployment)
    }

    /// `docker-compose -p primus-test -f deploy/docker-compose.yaml -f <overrides> ARGS`
    /// against the engine.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.compose);
        command
            .env("DOCKER_HOST", self.engine.host())
            .current_dir(primus_testkit::repo_root())
            .args(["--project-name", PROJECT, "--file"])
            .arg(primus_testkit::repo_root().join("deploy/docker-compose.yaml"))
            .arg("--file")
            .arg(&self.overrides)
            .args(args);
        command
    }

    /// Runs docker-compose to completion; its stdout, or its stderr as the error.
    pub fn compose_run(&self, args: &[&str]) -> Result<String, String> {
        let output = self
            .command(args)
            .output()
            .map_err(|e| format!("docker-compose {}: {e}", args.join(" ")))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "docker-compose {}: {}\n{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Every container of the project: (service, state, health, exit code).
    fn containers(&self) -> Vec<(String, String, String, i64)> {
        let listed = self
            .compose_run(&["ps", "--all", "--format", "json"])
            .unwrap_or_default();
        listed
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .map(|c| {
                let text = |field: &str| c[field].as_str().unwrap_or_default().to_owned();
                let exit = c["ExitCode"].as_i64().unwrap_or(-1);
                (text("Service"), text("State"), text("Health"), exit)
            })
            .collect()
    }

    fn wait_until_up(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let containers = self.containers();
            let state = |service: &str| containers.iter().find(|c| c.0 == service);
            let running = LONG_RUNNING.iter().all(|service| {
                state(service).is_some_and(|(_, state, health, _)| {
                    state == "running" && (health.is_empty() || health == "healthy")
                })
            });
            let mut one_shots_done = true;
            for service in ["minio-bucket", "example-data"] {
                match state(service) {
                    Some((_, state, _, code)) if state == "exited" => {
                        if *code != 0 {
                            return Err(format!(
                                "{service} exited with {code}\n{}",
                                self.diagnostics()
                            ));
                        }
                    }
                    _ => one_shots_done = false,
                }
            }
            if running && one_shots_done {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not up within {timeout:?}: {containers:?}\n{}",
                    self.diagnostics()
                ));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Every container's state and the last lines of every service's log.
    pub fn diagnostics(&self) -> String {
        let ps = self
            .compose_run(&["ps", "--all"])
            .unwrap_or_else(|e| e.to_string());
        let logs = self
            .compose_run(&["logs", "--no-color", "--tail", "40"])
            .unwrap_or_else(|e| e.to_string());
        format!("docker-compose ps --all:\n{ps}\ndocker-compose logs --tail 40:\n{logs}")
    }

    /// The API server, as the host reaches it.
    pub fn api_server(&self) -> String {
        format!("http://{}:7070", self.engine.ip())
    }

    /// The API server's dashboard, as the host reaches it.
    pub fn dashboard(&self) -> String {
        format!("http://{}:7080/", self.engine.ip())
    }

    /// The API token of deploy/config/dev.token.
    pub fn token(&self) -> String {
        let path = primus_testkit::repo_root().join("deploy/config/dev.token");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (primus_config::tokens_in(&text).next())
            .unwrap_or_else(|| panic!("{}: no token", path.display()))
            .to_owned()
    }

    /// Jaeger's query API, as the host reaches it.
    pub fn jaeger(&self) -> String {
        format!("http://{}:16686", self.engine.ip())
    }

    /// A client of the compose cluster's API server, with the token of deploy/config.
    pub async fn client(&self) -> ApiClient {
        let api = primus_config::ApiSettings {
            server: self.api_server(),
            token_file: Some(primus_testkit::repo_root().join("deploy/config/dev.token")),
            ca_file: None,
        };
        let settings = ClientSettings::from_settings(&api).expect("deploy/config/dev.token");
        ApiClient::connect_patiently(&settings, 60)
            .await
            .expect("the compose cluster's API server")
    }

    /// Applies examples/compose-criteo.yaml with the `primus` CLI from the host, with the
    /// settings docs/compose.md gives, and follows the Job to Succeeded.
    pub async fn run_example(&self) -> (ExampleRun, Status) {
        let root = primus_testkit::repo_root();
        let applied = Command::new(binary("primus"))
            .env("PRIMUS_SERVER", self.api_server())
            .env("PRIMUS_TOKEN_FILE", root.join("deploy/config/dev.token"))
            .args(["apply", "-f"])
            .arg(root.join("examples/compose-criteo.yaml"))
            .output()
            .expect("primus apply");
        assert!(
            applied.status.success(),
            "primus apply -f examples/compose-criteo.yaml: {}",
            String::from_utf8_lossy(&applied.stderr)
        );
        let client = self.client().await;
        let deadline = Instant::now() + Duration::from_secs(900);
        let status = loop {
            let resource = client.get(Kind::Job, JOB).await.expect("the Job");
            let status: Status = serde_json::from_str(&resource.status_json).unwrap_or_default();
            if status.phase == Phase::Succeeded {
                break status;
            }
            assert!(
                !status.phase.is_terminal() && Instant::now() < deadline,
                "{JOB} is {:?}, not Succeeded: {status:#?}\n{}",
                status.phase,
                self.diagnostics()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let progress = status.progress.clone().expect("progress");
        let run = ExampleRun {
            samples: progress.samples,
            seconds: job_seconds(&status),
            auc: progress.auc.expect("an AUC"),
            ..ExampleRun::default()
        };
        (run, status)
    }

    /// The objects under `prefix` of the bucket `primus` in the compose cluster's MinIO.
    pub async fn objects(&self, prefix: &str) -> Vec<String> {
        let mut storage = StorageSettings::default();
        storage.s3.endpoint = Some(format!("http://{}:9000", self.engine.ip()));
        storage.s3.region = Some("us-east-1".into());
        storage.s3.access_key_id = Some("primus".into());
        storage.s3.secret_access_key = Some("primus-dev-secret".into());
        storage.s3.allow_http = true;
        let location = primus_storage::open("s3://primus", &storage).expect("MinIO");
        let listed = location.list(prefix).await.expect("a listing of MinIO");
        listed.into_iter().map(|o| o.location.to_string()).collect()
    }

    /// POST /v1/predict from inside the master's container (the Job's replica listens on
    /// its loopback), with curl from the Primus image.
    pub fn predict_in_master(&self, replica: &str, body: &Value) -> Value {
        let url = format!("http://{replica}/v1/predict");
        let body = body.to_string();
        let answer = self
            .compose_run(&[
                "exec",
                "-T",
                "master",
                "curl",
                "-sS",
                "--fail-with-body",
                "-H",
                "content-type: application/json",
                "--data",
                &body,
                &url,
            ])
            .unwrap_or_else(|e| panic!("Predict at {url}: {e}"));
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("Predict answer {answer:?}: {e}"))
    }

    /// GET on Jaeger's query API (`/api/...`); its `data`.
    pub fn jaeger_query(&self, path_and_query: &str) -> Value {
        let url = format!("{}{path_and_query}", self.jaeger());
        let output = Command::new("curl")
            .args(["-sS", "--fail-with-body", "--max-time", "30", &url])
            .output()
            .expect("curl");
        assert!(
            output.status.success(),
            "GET {url}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"));
        answer["data"].clone()
    }

    /// `docker-compose down --volumes`: every container, network and volume of the project.
    pub fn down(self) {
        if let Err(e) = self.compose_run(&["down", "--volumes", "--timeout", "20"]) {
            panic!("{e}");
        }
    }
}

/// The override of a service's `ports`: published on every address of the engine's
/// namespace (the host reaches them at the engine's address), not its loopback alone.
fn published(ports: &[&str]) -> String {
    if ports.is_empty() {
        return String::new();
    }
    let ports: Vec<String> = ports.iter().map(|p| format!("\"{p}\"")).collect();
    format!("    ports: !override [{}]\n", ports.join(", "))
}
