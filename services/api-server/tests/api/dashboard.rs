//! The dashboard's listener (`server.http_addr`): its bundled pages, and the resources as
//! JSON and server-sent events, behind the gRPC API's tokens.

use std::time::Duration;

use primus_testkit::free_port;
use primus_testkit::service::http_request;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Cluster, DATASET, Server, TOKEN, apply_job, parse_one};

/// An API server with its dashboard; returns it and the dashboard's address.
async fn dashboard(cluster: &Cluster) -> (Server, String) {
    dashboard_with(cluster, None).await
}

/// An API server with its dashboard reading traces from `jaeger`.
async fn dashboard_with(cluster: &Cluster, jaeger: Option<String>) -> (Server, String) {
    let mut settings = cluster.settings();
    let addr = format!("127.0.0.1:{}", free_port().expect("port"));
    settings.server.http_addr = Some(addr.parse().expect("addr"));
    settings.traces.jaeger_query_url = jaeger;
    (Server::start(settings).await, addr)
}

/// `GET path` with the test token (or `token`), as status and parsed JSON.
async fn get_json(addr: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let bearer = format!("Bearer {}", token.unwrap_or(TOKEN));
    let (status, body) = http_request(addr, "GET", path, &[("authorization", &bearer)], "")
        .await
        .expect("an answer");
    (status, serde_json::from_str(&body).expect("a JSON body"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_serves_its_pages_and_the_resources_only_with_a_token() {
    let cluster = Cluster::start();
    let (server, addr) = dashboard(&cluster).await;
    let client = server.client().await;
    let (status, page) = http_request(&addr, "GET", "/", &[], "")
        .await
        .expect("page");
    assert!(
        status == 200 && page.contains("/assets/app.js") && page.contains("/assets/uplot.js"),
        "{status} {page}"
    );
    for asset in ["app.js", "style.css", "uplot.js", "uplot.css"] {
        let (status, body) = http_request(&addr, "GET", &format!("/assets/{asset}"), &[], "")
            .await
            .expect("asset");
        assert!(status == 200 && body.len() > 500, "{asset}: {status}");
    }

    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    apply_job(&client, "ctr", 16).await;
    let (status, missing) = http_request(&addr, "GET", "/api/v1/Job", &[], "")
        .await
        .expect("answer");
    assert!(
        status == 401 && missing.contains("Unauthenticated") && !missing.contains("ctr"),
        "{status} {missing}"
    );
    let (status, wrong) = get_json(&addr, "/api/v1/Job/ctr", Some("not-a-token")).await;
    assert_eq!(
        (status, wrong["code"].as_str()),
        (401, Some("Unauthenticated"))
    );

    let (status, jobs) = get_json(&addr, "/api/v1/Job?labels=team=ads", None).await;
    assert_eq!(status, 200);
    assert_eq!(jobs["items"][0]["metadata"]["name"], "ctr");
    assert_eq!(jobs["items"][0]["spec"]["dataset"], "clicks");
    assert_eq!(jobs["items"][0]["status"]["phase"], "Pending");
    assert!(jobs["resource_version"].as_u64() > Some(0));
    let (_, others) = get_json(&addr, "/api/v1/Job?labels=team=search", None).await;
    assert_eq!(others["items"], Value::Array(Vec::new()));
    let (status, job) = get_json(&addr, "/api/v1/Job/ctr", None).await;
    assert_eq!(
        (status, job["metadata"]["labels"]["team"].as_str()),
        (200, Some("ads"))
    );

    // Traces come from Jaeger, which this server has not been given.
    let (status, traces) = get_json(&addr, "/api/v1/traces/ctr", None).await;
    assert!(
        status == 412
            && traces["code"] == "FailedPrecondition"
            && traces["error"]
                .as_str()
                .is_some_and(|e| e.contains("traces.jaeger_query_url")),
        "{status} {traces}"
    );
    let (status, _) = get_json(&addr, "/api/v1/traces/ctr", Some("not-a-token")).await;
    assert_eq!(status, 401);

    let (status, bad) = get_json(&addr, "/api/v1/Job?labels=team", None).await;
    assert!(
        status == 400
            && bad["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("labels: "))
    );
    let (status, bad) = get_json(&addr, "/api/v1/Nope", None).await;
    assert!(
        status == 400
            && bad["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("kind: "))
    );
    let (status, gone) = get_json(&addr, "/api/v1/Job/absent", None).await;
    assert_eq!((status, gone["code"].as_str()), (404, Some("NotFound")));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_traces_name_the_jaeger_that_did_not_answer() {
    let cluster = Cluster::start();
    // A port nothing listens on.
    let jaeger = format!("http://127.0.0.1:{}", free_port().expect("port"));
    let (server, addr) = dashboard_with(&cluster, Some(jaeger.clone())).await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    apply_job(&client, "ctr", 16).await;
    let (status, away) = get_json(&addr, "/api/v1/traces/ctr", None).await;
    assert!(
        status == 503
            && away["code"] == "Unavailable"
            && away["error"].as_str().is_some_and(|e| e.contains(&jaeger)),
        "{status} {away}"
    );
    let (status, absent) = get_json(&addr, "/api/v1/traces/absent", None).await;
    assert_eq!((status, absent["code"].as_str()), (404, Some("NotFound")));
    server.stop().await;
}

/// Reads a streaming answer from `stream` until `wanted` appears in it (10 s at most).
async fn read_until(stream: &mut tokio::net::TcpStream, seen: &mut String, wanted: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut buffer = [0u8; 8192];
    while !seen.contains(wanted) {
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buffer))
            .await
            .unwrap_or_else(|_| panic!("{wanted:?} within 10 s; got {seen}"))
            .expect("read");
        assert!(read > 0, "the stream ended before {wanted:?}: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buffer[..read]));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_watch_streams_changes_as_server_sent_events() {
    let cluster = Cluster::start();
    let (server, addr) = dashboard(&cluster).await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let created = apply_job(&client, "ctr", 16).await;

    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!(
        "GET /api/v1/watch?kind=Job&since={} HTTP/1.1\r\nHost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\r\n",
        created.resource_version
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut seen = String::new();
    read_until(&mut stream, &mut seen, "text/event-stream").await;
    let changed = apply_job(&client, "ctr", 32).await;
    read_until(&mut stream, &mut seen, "\n\n").await;
    read_until(&mut stream, &mut seen, "\"dim\":32").await;
    assert!(
        seen.contains(&format!("id: {}", changed.resource_version))
            && seen.contains("event: modified"),
        "{seen}"
    );
    client
        .delete(primus_spec::Kind::Job, "ctr", 0)
        .await
        .expect("delete");
    read_until(&mut stream, &mut seen, "event: deleted").await;

    let ahead = format!(
        "/api/v1/watch?kind=Job&since={}",
        changed.resource_version + 1000
    );
    let (status, refused) = get_json(&addr, &ahead, None).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (400, Some("OutOfRange"))
    );
    let (status, _) = http_request(&addr, "GET", "/api/v1/watch?kind=Job", &[], "")
        .await
        .expect("answer");
    assert_eq!(status, 401, "no watch without a token");
    drop(stream);
    server.stop().await;
}
