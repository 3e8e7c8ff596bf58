//! The dashboard over the custom resources (`dashboard.resources: kubernetes`): an API
//! server in this process whose dashboard reads the PrimusJobs of a namespace of the test
//! cluster, behind its bearer tokens: lists, gets and watches as the pages ask for them.

use std::time::Duration;

use primus_config::{ApiServerSettings, ResourceSource};
use primus_harness::resources::{dataset, hourly, job, parquet, small_wide_deep};
use primus_kube_resources::convert::custom_resource;
use primus_service::Shutdown;
use primus_spec::job::TrainingMode;
use primus_testkit::service::{ServingStatus, http_request, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::crds::{apply, cluster, kubectl, namespace};

const TOKEN: &str = "dashboard-token";

/// `GET path` with the token, as status and parsed JSON.
async fn get_json(addr: &str, path: &str) -> (u16, Value) {
    let bearer = format!("Bearer {TOKEN}");
    let (status, body) = http_request(addr, "GET", path, &[("authorization", &bearer)], "")
        .await
        .expect("an answer");
    (status, serde_json::from_str(&body).expect("a JSON body"))
}

/// Reads the streaming answer on `stream` until `wanted` appears (30 s at most).
async fn read_until(stream: &mut tokio::net::TcpStream, seen: &mut String, wanted: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut buffer = [0u8; 8192];
    while !seen.contains(wanted) {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buffer))
            .await
            .unwrap_or_else(|_| panic!("no {wanted:?} within 30 s: {seen}"))
            .expect("read");
        assert!(read > 0, "the stream ended before {wanted:?}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_gets_and_watches_the_custom_resources() {
    let cluster = cluster();
    let namespace = namespace(cluster, "dashboard");
    let objects = [
        dataset("clicks")
            .stream(
                "logs",
                hourly("2026-11-01T00", None),
                vec![parquet("p", "/data")],
            )
            .build(),
        job("ctr", "clicks", TrainingMode::Batch, small_wide_deep()).build(),
    ]
    .map(|r| custom_resource(&r, None).expect("a custom resource"));
    apply(cluster, namespace, &objects, &[]).expect("applied with kubectl");

    let nats = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("token");
    let mut settings = ApiServerSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    settings.server.http_addr = Some(addr.parse().expect("addr"));
    settings.nats.url = nats.url();
    settings.redis.url = redis.url();
    settings.auth.token_file = Some(dir.path().join("token"));
    settings.dashboard.resources = ResourceSource::Kubernetes;
    settings.dashboard.kubeconfig = Some(cluster.kubeconfig());
    settings.dashboard.namespace = Some(namespace.into());
    let grpc = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    let server = tokio::spawn(primus_api_server::run(settings, shutdown.clone()));
    wait_for_health(&grpc, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("the API server serving");

    let (status, jobs) = get_json(&addr, "/api/v1/Job").await;
    assert_eq!(status, 200, "{jobs}");
    assert_eq!(jobs["items"][0]["metadata"]["name"], "ctr", "{jobs}");
    assert_eq!(jobs["items"][0]["spec"]["dataset"], "clicks", "{jobs}");
    let version = jobs["resource_version"].as_u64().expect("a list version");
    assert!(version > 0, "{jobs}");
    let (status, datasets) = get_json(&addr, "/api/v1/Dataset").await;
    assert_eq!(
        (status, &datasets["items"][0]["metadata"]["name"]),
        (200, &Value::from("clicks"))
    );
    let (status, found) = get_json(&addr, "/api/v1/Job/ctr").await;
    assert_eq!(
        (status, found["kind"].as_str()),
        (200, Some("Job")),
        "{found}"
    );
    let (status, missing) = get_json(&addr, "/api/v1/Job/nope").await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (404, Some("NotFound")),
        "{missing}"
    );
    let (status, refused) = http_request(&addr, "GET", "/api/v1/Job", &[], "")
        .await
        .expect("an answer");
    assert!(
        status == 401 && !refused.contains("ctr"),
        "{status} {refused}"
    );

    // A change made with kubectl reaches a watch from the list's version.
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "GET /api/v1/watch?kind=Job&name=ctr&since={version} HTTP/1.1\r\nHost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut seen = String::new();
    read_until(&mut stream, &mut seen, "text/event-stream").await;
    kubectl(
        cluster,
        &["label", "pjob", "ctr", "team=ads", "-n", namespace],
    );
    read_until(&mut stream, &mut seen, "\"team\":\"ads\"").await;
    assert!(seen.contains("event: modified"), "{seen}");
    kubectl(
        cluster,
        &["delete", "pjob", "ctr", "-n", namespace, "--wait=false"],
    );
    read_until(&mut stream, &mut seen, "event: deleted").await;

    drop(stream);
    shutdown.trigger();
    server
        .await
        .expect("the API server task")
        .expect("the API server stopped cleanly");
}
