//! The real binary: --help, health, SIGTERM exit 0, a bad setting named. Serving-sync reads
//! Jobs from the API server, so one runs in-process.
use std::time::Duration;

use primus_config::ApiServerSettings;
use primus_service::Shutdown;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port};

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "binary-test-token\n").expect("token");
    let mut api = ApiServerSettings::default();
    api.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    api.nats.url = nats.url();
    api.redis.url = redis.url();
    api.auth.token_file = Some(token.clone());
    let api_addr = api.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    tokio::spawn(primus_api_server::run(api, shutdown.clone()));
    wait_for_health(&api_addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("api-server serving");
    let settings = format!(
        "nats:\n  url: {}\napi:\n  server: http://{api_addr}\n  token_file: {}\n",
        nats.url(),
        token.display(),
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-serving-sync").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
    shutdown.trigger();
}
