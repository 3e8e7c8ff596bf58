//! The real binary: --help, health, SIGTERM exit 0, a bad setting named.
use primus_harness::Sandbox;

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let sandbox = Sandbox::start().await;
    let settings = format!(
        "nats:\n  url: {}\nredis:\n  url: {}\napi:\n  server: http://{}\n  token_file: {}\nlocal:\n  work_dir: {}\n",
        sandbox.nats.url(),
        sandbox.redis.url(),
        sandbox.api_addr(),
        sandbox.token_file().display(),
        sandbox.work_dir().display()
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-master").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}
