//! The real binary: --help, health, SIGTERM exit 0, a bad setting named. The master it is
//! pointed at does not exist; the executor keeps serving health while it retries.
use primus_testkit::NatsServer;

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let nats = NatsServer::start().expect("nats-server");
    let master = primus_testkit::free_port().expect("port");
    let settings = format!(
        r#"nats:
  url: {}
data:
  job: demo
  executor_id: data_executor-0
  master_addr: "127.0.0.1:{master}"
  dataset:
    streams:
      - name: logs
        window: {{unit: hourly, start: "2026-11-01T00"}}
        sources: [{{name: clicks, parquet: {{uri: /nonexistent}}}}]
    schema: {{label: label, sparse: [{{name: c1, table: t}}]}}
"#,
        nats.url()
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-data-executor").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}
