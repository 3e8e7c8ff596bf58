//! The api-server process: real NATS and Redis.
use std::time::Duration;

use primus_config::ApiServerSettings;
use primus_service::Shutdown;
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port};

fn token_file() -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), "service-test-token\n").expect("write tokens");
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_starts_serves_health_and_stops_on_sigterm() {
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let tokens = token_file();
    let settings = format!(
        "nats:\n  url: {}\nredis:\n  url: {}\nauth:\n  token_file: {}\n",
        nats.url(),
        redis.url(),
        tokens.path().display()
    );
    primus_testkit::service::check_service_binary(
        env!("CARGO_BIN_EXE_primus-api-server").as_ref(),
        &settings,
    )
    .await
    .expect("service binary checks");
}

#[tokio::test(flavor = "multi_thread")]
async fn health_follows_redis_and_shutdown_returns() {
    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let mut settings = ApiServerSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.redis.url = redis.url();
    let tokens = token_file();
    settings.auth.token_file = Some(tokens.path().to_owned());
    let addr = settings.server.grpc_addr.to_string();

    let shutdown = Shutdown::new();
    let service = tokio::spawn(primus_api_server::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("serving");

    drop(redis);
    wait_for_health(&addr, ServingStatus::NotServing, Duration::from_secs(20))
        .await
        .expect("not serving once Redis is gone");

    shutdown.trigger();
    let result = tokio::time::timeout(Duration::from_secs(15), service)
        .await
        .expect("run returns after shutdown")
        .expect("task");
    result.expect("clean exit");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_redis_fails_start_naming_the_setting() {
    let nats = NatsServer::start().expect("nats-server");
    let mut settings = ApiServerSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], 0).into();
    settings.nats.url = nats.url();
    settings.redis.url = format!("redis://:hunter2@127.0.0.1:{}", free_port().expect("port"));
    let tokens = token_file();
    settings.auth.token_file = Some(tokens.path().to_owned());
    let err = primus_api_server::run(settings, Shutdown::new())
        .await
        .expect_err("no Redis");
    let text = format!("{err:#}");
    assert!(text.contains("redis.url"), "{text}");
    assert!(
        !text.contains("hunter2"),
        "the password must not be shown: {text}"
    );
}
