//! The real binary: --help, health, SIGTERM exit 0, a bad setting named.
use primus_testkit::NatsServer;

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let nats = NatsServer::start().expect("nats-server");
    let settings = format!("nats:\n  url: {}\n", nats.url());
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-ps").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}
