//! Tokens narrowed by their lines in the token file: a scope bounds the calls, labels bound
//! the resources, over gRPC and the dashboard alike, and an edit narrows a token without a
//! restart.

use std::collections::HashMap;
use std::time::Duration;

use primus_api_client::ApiClient;
use primus_proto::v1::ResourceEvent;
use primus_spec::Kind;
use primus_spec::status::{Phase, Status};
use primus_testkit::free_port;
use primus_testkit::service::http_request;
use serde_json::Value;
use tonic::Code;

use super::{Cluster, DATASET, Server, TOKEN, code, job_yaml, next_event, parse_one};

/// Beside the test's own (bare, so admin) token: one of each narrower kind.
const NARROW_TOKENS: &str = "# scoped\nreader read\nads-writer write team=ads\n\
                             web-reader read team=web\n";

/// An API server with its dashboard, over a token file with the narrow tokens; the
/// Dataset `clicks` and Job `ctr` (team=ads) and Job `web-ctr` (team=web) applied.
async fn scoped(cluster: &Cluster) -> (Server, String) {
    let tokens = format!("{TOKEN}\n{NARROW_TOKENS}");
    std::fs::write(cluster.dir.path().join("tokens"), tokens).expect("token file");
    let mut settings = cluster.settings();
    let dashboard = format!("127.0.0.1:{}", free_port().expect("port"));
    settings.server.http_addr = Some(dashboard.parse().expect("addr"));
    let server = Server::start(settings).await;
    let admin = server.client().await;
    admin.apply(&parse_one(DATASET), 0).await.expect("dataset");
    for job in [job_yaml("ctr", "clicks", 8), web_job("web-ctr", "clicks")] {
        admin.apply(&parse_one(&job), 0).await.expect("job");
    }
    (server, dashboard)
}

fn web_job(name: &str, dataset: &str) -> String {
    job_yaml(name, dataset, 8).replace("team: ads", "team: web")
}

async fn job_names(client: &ApiClient) -> Vec<String> {
    let listed = client.list(Kind::Job, HashMap::new()).await.expect("list");
    listed.resources.into_iter().map(|r| r.name).collect()
}

/// The names of the next `n` changes a Watch sends.
async fn changed(changes: &mut tonic::Streaming<ResourceEvent>, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..n {
        names.push(next_event(changes).await.resource.expect("resource").name);
    }
    names
}

fn running() -> Status {
    Status {
        phase: Phase::Running,
        ..Status::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_s_scope_bounds_the_calls_it_may_make() {
    let cluster = Cluster::start();
    let (server, _) = scoped(&cluster).await;
    let reader = server.client_with("reader").await;
    assert_eq!(job_names(&reader).await, ["ctr", "web-ctr"]);
    reader.get(Kind::Job, "ctr").await.expect("a reader gets");
    reader.watch(None, None, 0).await.expect("a reader watches");
    let job = parse_one(&job_yaml("more", "clicks", 8));
    for (call, result) in [
        ("Apply", code(reader.apply(&job, 0).await)),
        ("Delete", code(reader.delete(Kind::Job, "ctr", 0).await)),
    ] {
        let (code_, message) = result;
        assert_eq!(code_, Code::PermissionDenied, "{call}: {message}");
        let want = format!("{call} needs a token of scope write or wider; this one's is read");
        assert!(message.contains(&want), "{message}");
    }

    let writer = server.client_with("ads-writer").await;
    writer.apply(&job, 0).await.expect("a writer applies");
    writer
        .delete(Kind::Job, "more", 0)
        .await
        .expect("and deletes");
    let (status, message) = code(writer.update_status(Kind::Job, "ctr", &running(), 0).await);
    assert_eq!(status, Code::PermissionDenied, "{message}");
    assert!(message.contains("UpdateStatus needs a token of scope admin"));
    let admin = server.client().await;
    (admin.update_status(Kind::Job, "ctr", &running(), 0).await).expect("an admin writes status");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_limited_to_labels_reaches_only_resources_that_carry_them() {
    let cluster = Cluster::start();
    let (server, dashboard) = scoped(&cluster).await;
    let (ads, web) = (
        server.client_with("ads-writer").await,
        server.client_with("web-reader").await,
    );
    assert_eq!(job_names(&ads).await, ["ctr"]);
    assert_eq!(job_names(&web).await, ["web-ctr"]);
    let datasets = web.list(Kind::Dataset, HashMap::new()).await.expect("list");
    assert!(datasets.resources.is_empty(), "clicks is team=ads");

    // Outside its labels a resource is as absent: the same code and message.
    let (absent, absent_message) = code(web.get(Kind::Job, "nowhere").await);
    assert_eq!(absent, Code::NotFound);
    let (hidden, hidden_message) = code(web.get(Kind::Job, "ctr").await);
    assert_eq!(
        (hidden, hidden_message),
        (Code::NotFound, absent_message.replace("nowhere", "ctr"))
    );
    let (deleted, _) = code(ads.delete(Kind::Job, "web-ctr", 0).await);
    assert_eq!(deleted, Code::NotFound, "a writer cannot delete outside");

    // A write must carry the token's labels, and may not take over another's resource.
    let (code_, message) = code(
        ads.apply(&parse_one(&web_job("web-two", "clicks")), 0)
            .await,
    );
    assert_eq!(code_, Code::PermissionDenied, "{message}");
    assert!(
        message.contains("metadata.labels: this token writes only resources labelled team=ads"),
        "{message}"
    );
    let taken = parse_one(&job_yaml("web-ctr", "clicks", 8));
    let (code_, message) = code(ads.apply(&taken, 0).await);
    assert_eq!(code_, Code::PermissionDenied, "{message}");
    assert!(
        message.contains("exists outside this token's labels"),
        "{message}"
    );

    // Its Jobs may only read its Datasets: another team's is refused as a missing one is.
    let admin = server.client().await;
    let web_data = DATASET
        .replace("name: clicks", "name: views")
        .replace("team: ads", "team: web");
    admin.apply(&parse_one(&web_data), 0).await.expect("views");
    let (missing, missing_message) = code(
        ads.apply(&parse_one(&job_yaml("ads-two", "nowhere", 8)), 0)
            .await,
    );
    let (refused, refused_message) = code(
        ads.apply(&parse_one(&job_yaml("ads-two", "views", 8)), 0)
            .await,
    );
    assert_eq!(missing, Code::FailedPrecondition, "{missing_message}");
    assert_eq!(
        (refused, refused_message),
        (missing, missing_message.replace("nowhere", "views"))
    );

    // A Watch carries only the changes of resources within the labels.
    let mut ads_changes = ads.watch(Some(Kind::Job), None, 0).await.expect("watch");
    let mut web_changes = web.watch(Some(Kind::Job), None, 0).await.expect("watch");
    for job in ["ctr", "web-ctr", "ctr"] {
        (admin.update_status(Kind::Job, job, &running(), 0).await).expect("status");
    }
    assert_eq!(changed(&mut ads_changes, 2).await, ["ctr", "ctr"]);
    assert_eq!(changed(&mut web_changes, 1).await, ["web-ctr"]);

    // The dashboard answers with the same bounds.
    let page = |path: &'static str| {
        let dashboard = dashboard.clone();
        async move {
            let bearer = "Bearer web-reader";
            let (status, body) =
                http_request(&dashboard, "GET", path, &[("authorization", bearer)], "")
                    .await
                    .expect("an answer");
            let body: Value = serde_json::from_str(&body).expect("JSON");
            (status, body)
        }
    };
    let (status, listed) = page("/api/v1/Job").await;
    let names: Vec<&str> = (listed["items"].as_array().expect("items").iter())
        .filter_map(|item| item["metadata"]["name"].as_str())
        .collect();
    assert_eq!((status, names), (200, vec!["web-ctr"]), "{listed}");
    let (status, body) = page("/api/v1/Job/ctr").await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn editing_a_token_s_line_narrows_it_without_a_restart() {
    let cluster = Cluster::start();
    let (server, _) = scoped(&cluster).await;
    let reader = server.client_with("reader").await;
    assert_eq!(job_names(&reader).await, ["ctr", "web-ctr"]);
    let narrowed = format!("{TOKEN}\nreader read team=web\n");
    std::fs::write(cluster.dir.path().join("tokens"), narrowed).expect("rewrite");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while job_names(&reader).await.len() > 1 {
        assert!(tokio::time::Instant::now() < deadline, "still unlimited");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(job_names(&reader).await, ["web-ctr"]);
    let writer = server.client_with("ads-writer").await;
    let (code_, _) = code(writer.list(Kind::Job, HashMap::new()).await);
    assert_eq!(
        code_,
        Code::Unauthenticated,
        "a removed line revokes its token"
    );
    server.stop().await;
}
