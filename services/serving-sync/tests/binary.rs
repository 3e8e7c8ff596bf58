//! The real binary: --help, health, SIGTERM exit 0, a bad setting named. Serving-sync reads
//! Jobs from the API server, so the sandbox runs one.
use primus_harness::Sandbox;

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let sandbox = Sandbox::start().await;
    let settings = format!(
        "nats:\n  url: {}\napi:\n  server: http://{}\n  token_file: {}\n",
        sandbox.nats.url(),
        sandbox.api_addr(),
        sandbox.token_file().display(),
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-serving-sync").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}
