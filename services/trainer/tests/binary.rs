//! The real binary: --help, health, SIGTERM exit 0, a bad setting named. The master it is
//! pointed at does not exist; the trainer keeps serving health while it retries.
use primus_testkit::NatsServer;

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let nats = NatsServer::start().expect("nats-server");
    let master = primus_testkit::free_port().expect("port");
    let settings = format!(
        r#"nats:
  url: {}
trainer:
  job: demo
  executor_id: trainer-0
  master_addr: "127.0.0.1:{master}"
  model:
    kind: dlrm
    tables: [{{name: t, dim: 4, optimizer: {{kind: sgd, learning_rate: 0.1}}}}]
    dense: {{bottom: [8, 4], top: [8, 1]}}
  schema: {{label: label, dense: [{{name: i1}}], sparse: [{{name: c1, table: t}}]}}
"#,
        nats.url()
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-trainer").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}
