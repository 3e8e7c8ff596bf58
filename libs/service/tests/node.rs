//! The gRPC listener every service runs: health follows dependencies and shutdown.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use primus_config::ServerSettings;
use primus_service::{Node, Services, Shutdown};
use primus_testkit::service::{
    ServingStatus, health_status, http_request, reflected_services, reflected_symbols,
    wait_for_health,
};

fn settings(drain_timeout_ms: u64) -> ServerSettings {
    ServerSettings {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        drain_timeout_ms,
        tls: None,
        advertise_ip: None,
        http_addr: None,
    }
}

/// Triggers shutdown and expects `serve` to return cleanly within 5 s.
async fn stop(shutdown: &Shutdown, serving: tokio::task::JoinHandle<anyhow::Result<()>>) {
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("serve returns")
        .expect("task")
        .expect("clean");
}

#[tokio::test(flavor = "multi_thread")]
async fn health_follows_a_dependency_and_shutdown_stops_serving() {
    let mut node = Node::bind("primus-test", &settings(1_000))
        .await
        .expect("bind");
    let addr = node.local_addr().expect("addr").to_string();
    let up = Arc::new(AtomicBool::new(true));
    let probe = up.clone();
    node.depends_on("fake-dependency", move || {
        let up = probe.load(Ordering::SeqCst);
        async move { up }
    });
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(node.serve(Services::new(), shutdown.clone()));

    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(5))
        .await
        .expect("serving");
    assert_eq!(
        health_status(&addr, "primus-test")
            .await
            .expect("named service"),
        ServingStatus::Serving
    );
    up.store(false, Ordering::SeqCst);
    wait_for_health(&addr, ServingStatus::NotServing, Duration::from_secs(5))
        .await
        .expect("dependency down");
    up.store(true, Ordering::SeqCst);
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(5))
        .await
        .expect("dependency back");

    let started = Instant::now();
    stop(&shutdown, serving).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no open calls, no wait"
    );
    assert!(health_status(&addr, "").await.is_err(), "listener closed");
}

#[tokio::test(flavor = "multi_thread")]
async fn reflection_describes_what_a_node_serves_and_http_routes_share_its_port() {
    let node = Node::bind("primus-test", &settings(1_000))
        .await
        .expect("bind");
    let addr = node.local_addr().expect("addr").to_string();
    let http = axum::Router::new().route("/ping", axum::routing::get(|| async { "pong" }));
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(node.serve(Services::new().http(http), shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(5))
        .await
        .expect("serving");

    // No gRPC service added: only health is listed, and every message can be described.
    assert_eq!(
        reflected_services(&addr).await.expect("list services"),
        ["grpc.health.v1.Health"]
    );
    let symbols = reflected_symbols(&addr, "primus.v1.ServingService")
        .await
        .expect("describe a service");
    assert!(
        symbols.iter().any(|s| s == "primus.v1.PredictRequest"),
        "{symbols:?}"
    );
    let answer = http_request(&addr, "GET", "/ping", &[], "")
        .await
        .expect("HTTP/1.1 on the gRPC port");
    assert_eq!(answer, (200, "pong".to_owned()));

    stop(&shutdown, serving).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_web_listener_for_a_service_without_pages_is_refused_by_name() {
    let mut asked = settings(1_000);
    asked.http_addr = Some(([127, 0, 0, 1], 0).into());
    let err = Node::bind("primus-test", &asked)
        .await
        .err()
        .expect("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("server.http_addr") && text.contains("primus-test serves no web pages"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_taken_port_is_a_clear_error() {
    let first = Node::bind("primus-test", &settings(1_000))
        .await
        .expect("bind");
    let taken = first.local_addr().expect("addr");
    let err = Node::bind(
        "primus-test",
        &ServerSettings {
            grpc_addr: taken,
            drain_timeout_ms: 1_000,
            tls: None,
            advertise_ip: None,
            http_addr: None,
        },
    )
    .await
    .err()
    .expect("port in use");
    let text = format!("{err:#}");
    assert!(
        text.contains("server.grpc_addr") && text.contains(&taken.to_string()),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_drops_when_nats_goes_away() {
    let nats = primus_testkit::NatsServer::start().expect("nats-server");
    let mut node = Node::bind("primus-test", &settings(1_000))
        .await
        .expect("bind");
    let addr = node.local_addr().expect("addr").to_string();
    let bus = node
        .connect_nats(&primus_config::NatsSettings {
            url: nats.url(),
            ..Default::default()
        })
        .await
        .expect("connect");
    let shutdown = Shutdown::new();
    let serving = tokio::spawn(node.serve(Services::new(), shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(5))
        .await
        .expect("serving");

    nats.kill();
    wait_for_health(&addr, ServingStatus::NotServing, Duration::from_secs(10))
        .await
        .expect("NATS gone");
    assert!(!bus.is_connected());

    stop(&shutdown, serving).await;
}
