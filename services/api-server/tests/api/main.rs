//! The resource API against real Redis and NATS, through the real client (and over HTTP,
//! the dashboard's view of it).

mod dashboard;
mod scopes;

use std::collections::HashMap;
use std::time::Duration;

use primus_api_client::{ApiClient, ClientError, ClientSettings};
use primus_config::ApiServerSettings;
use primus_proto::v1::{ApplyRequest, EventType, Resource, ResourceEvent};
use primus_service::Shutdown;
use primus_spec::Kind;
use primus_spec::metric::{MetricPoint, MetricSeries, MetricSpec};
use primus_spec::status::{Phase, Progress, Status};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, RedisServer, free_port};
use tokio::task::JoinHandle;
use tonic::Code;

const TOKEN: &str = "test-token-1";

const DATASET: &str = r#"
kind: Dataset
metadata: {name: clicks, labels: {team: ads}}
spec:
  streams:
    - name: main
      window: {unit: hourly, start: "2026-11-20T00", end: "2026-11-20T03"}
      sources:
        - {name: logs, parquet: {uri: "memory://clicks"}}
  schema:
    label: label
    dense: [{name: i1}]
    sparse: [{name: c1, table: items}]
"#;

fn job_yaml(name: &str, dataset: &str, dim: i64) -> String {
    format!(
        r#"
kind: Job
metadata: {{name: {name}, labels: {{team: ads}}}}
spec:
  model:
    kind: wide_deep
    tables:
      - {{name: items, dim: {dim}, optimizer: {{kind: adagrad, learning_rate: 0.05}}}}
    dense: {{top: [16, 1]}}
  dataset: {dataset}
  mode: batch
  topology:
    data_executors: {{replicas: 1}}
    trainers: {{replicas: 1}}
    ps: {{replicas: 1}}
    serving: {{replicas: 1}}
"#
    )
}

/// Applies Job `name` (on Dataset `clicks`) and returns it as stored.
async fn apply_job(client: &ApiClient, name: &str, dim: i64) -> Resource {
    client
        .apply(&parse_one(&job_yaml(name, "clicks", dim)), 0)
        .await
        .expect("apply job")
        .resource
        .expect("stored resource")
}

fn parse_one(yaml: &str) -> primus_spec::Resource {
    primus_spec::parse_documents("test.yaml", yaml)
        .expect("valid test resource")
        .remove(0)
}

/// Real NATS and Redis plus a token file, shared by the API servers of one test.
struct Cluster {
    nats: NatsServer,
    redis: RedisServer,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("tokens"), format!("# test\n{TOKEN}\n")).expect("tokens");
        Self {
            nats: NatsServer::start().expect("nats-server"),
            redis: RedisServer::start().expect("redis-server"),
            dir,
        }
    }

    fn settings(&self) -> ApiServerSettings {
        let mut settings = ApiServerSettings::default();
        settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
        settings.nats.url = self.nats.url();
        settings.redis.url = self.redis.url();
        settings.auth.token_file = Some(self.dir.path().join("tokens"));
        settings
    }

    async fn server(&self) -> Server {
        Server::start(self.settings()).await
    }
}

struct Server {
    addr: String,
    shutdown: Shutdown,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(settings: ApiServerSettings) -> Self {
        let addr = settings.server.grpc_addr.to_string();
        let shutdown = Shutdown::new();
        let task = tokio::spawn(primus_api_server::run(settings, shutdown.clone()));
        wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
            .await
            .expect("api-server serving");
        Self {
            addr,
            shutdown,
            task,
        }
    }

    async fn client_with(&self, token: &str) -> ApiClient {
        ApiClient::connect(&ClientSettings {
            server: format!("http://{}", self.addr),
            token: token.into(),
            ca_file: None,
        })
        .await
        .expect("connect")
    }

    async fn client(&self) -> ApiClient {
        self.client_with(TOKEN).await
    }

    async fn stop(self) {
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(15), self.task)
            .await
            .expect("stops")
            .expect("task")
            .expect("clean exit");
    }
}

fn code(result: Result<impl std::fmt::Debug, ClientError>) -> (Code, String) {
    let err = result.expect_err("the call must fail");
    let message = err.to_string();
    (err.code().expect("a gRPC status"), message)
}

async fn next_event(stream: &mut tonic::Streaming<ResourceEvent>) -> ResourceEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .expect("stream ok")
        .expect("stream open")
}

fn version(event: &ResourceEvent) -> u64 {
    event.resource.as_ref().map_or(0, |r| r.resource_version)
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_get_list_delete_round_trip() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;

    let dataset = client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    assert!(dataset.created);
    let job = client
        .apply(&parse_one(&job_yaml("ctr", "clicks", 8)), 0)
        .await
        .expect("job");
    let job = job.resource.expect("resource");
    assert_eq!(job.generation, 1);
    assert!(job.resource_version > dataset.resource.expect("ds").resource_version);
    let status: Status = serde_json::from_str(&job.status_json).expect("status json");
    assert_eq!(status.phase, Phase::Pending);

    let got = client.get(Kind::Job, "ctr").await.expect("get");
    assert_eq!(got, job);

    // Re-applying the same spec changes nothing: same version, no new generation.
    let again = client
        .apply(&parse_one(&job_yaml("ctr", "clicks", 8)), 0)
        .await
        .expect("re-apply");
    assert!(!again.created && !again.changed);
    assert_eq!(
        again.resource.expect("r").resource_version,
        job.resource_version
    );

    // A spec change bumps generation and version.
    let changed = apply_job(&client, "ctr", 16).await;
    assert_eq!(changed.generation, 2);
    assert!(changed.resource_version > job.resource_version);
    assert_eq!(changed.created_unix_ms, job.created_unix_ms);

    client
        .apply(
            &parse_one(&job_yaml("other", "clicks", 4).replace("team: ads", "team: search")),
            0,
        )
        .await
        .expect("second job");
    let all = client.list(Kind::Job, HashMap::new()).await.expect("list");
    let names: Vec<_> = all.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ctr", "other"]);
    let ads = client
        .list(Kind::Job, HashMap::from([("team".into(), "ads".into())]))
        .await
        .expect("list by label");
    assert_eq!(ads.resources.len(), 1);
    assert_eq!(ads.resources[0].name, "ctr");
    assert!(ads.resource_version >= changed.resource_version);

    let deleted = client.delete(Kind::Job, "ctr", 0).await.expect("delete");
    assert!(deleted.resource_version > changed.resource_version);
    let (code_, message) = code(client.get(Kind::Job, "ctr").await);
    assert_eq!(code_, Code::NotFound, "{message}");
    let (code_, _) = code(client.delete(Kind::Job, "ctr", 0).await);
    assert_eq!(code_, Code::NotFound);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_applies_with_one_version_exactly_one_wins() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let base = apply_job(&client, "ctr", 8).await;

    for round in 0..5 {
        let current = client.get(Kind::Job, "ctr").await.expect("get");
        let attempts = (0..2).map(|i| {
            let client = client.clone();
            let resource = parse_one(&job_yaml("ctr", "clicks", 32 + round * 2 + i));
            let expected = current.resource_version;
            tokio::spawn(async move { client.apply(&resource, expected).await })
        });
        let results = futures::future::join_all(attempts).await;
        let (won, lost): (Vec<_>, Vec<_>) = results
            .into_iter()
            .map(|r| r.expect("task"))
            .partition(Result::is_ok);
        assert_eq!(won.len(), 1, "round {round}: exactly one wins");
        let (code_, message) = code(lost.into_iter().next().expect("one lost"));
        assert_eq!(code_, Code::Aborted, "{message}");
        assert!(message.contains("version"), "{message}");
    }
    let last = client.get(Kind::Job, "ctr").await.expect("get");
    assert_eq!(last.generation, base.generation + 5);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn update_status_keeps_spec_and_bumps_version() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let job = apply_job(&client, "ctr", 8).await;

    let status = Status {
        phase: Phase::Running,
        observed_generation: 1,
        progress: Some(Progress {
            samples: 1000,
            steps: 10,
            fraction: Some(0.25),
            ..Progress::default()
        }),
        ..Status::default()
    };
    let updated = client
        .update_status(Kind::Job, "ctr", &status, job.resource_version)
        .await
        .expect("status");
    assert!(updated.resource_version > job.resource_version);
    assert_eq!(updated.spec_json, job.spec_json);
    assert_eq!(updated.generation, job.generation);
    let read: Status = serde_json::from_str(&updated.status_json).expect("json");
    assert_eq!(read, status);

    // A stale version is refused.
    let (code_, _) = code(
        client
            .update_status(Kind::Job, "ctr", &status, job.resource_version)
            .await,
    );
    assert_eq!(code_, Code::Aborted);

    // A later spec change keeps the status.
    let changed = apply_job(&client, "ctr", 16).await;
    assert_eq!(changed.status_json, updated.status_json);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_watch_sees_every_event_once_in_order() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let listed = client.list(Kind::Job, HashMap::new()).await.expect("list");

    let mut watch = client
        .watch(Some(Kind::Job), None, listed.resource_version)
        .await
        .expect("watch");
    let writer = {
        let client = client.clone();
        tokio::spawn(async move {
            for dim in 1..=30 {
                let name = format!("job-{}", dim % 3);
                client
                    .apply(&parse_one(&job_yaml(&name, "clicks", dim)), 0)
                    .await
                    .expect("apply");
            }
            client.delete(Kind::Job, "job-0", 0).await.expect("delete");
        })
    };
    let mut seen = Vec::new();
    // Read some, drop the stream mid-way, resume from the last version seen.
    for _ in 0..7 {
        seen.push(next_event(&mut watch).await);
    }
    drop(watch);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = version(seen.last().expect("seen"));
    let mut watch = client
        .watch(Some(Kind::Job), None, last)
        .await
        .expect("resume");
    while seen.len() < 31 {
        seen.push(next_event(&mut watch).await);
    }
    writer.await.expect("writer");

    let versions: Vec<u64> = seen.iter().map(version).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "strictly increasing, no repeats: {versions:?}"
    );
    let types: Vec<i32> = seen.iter().map(|e| e.r#type).collect();
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == EventType::Added as i32)
            .count(),
        3
    );
    assert_eq!(
        types
            .iter()
            .filter(|t| **t == EventType::Modified as i32)
            .count(),
        27
    );
    assert_eq!(types.last(), Some(&(EventType::Deleted as i32)));
    // Nothing beyond those: the next read times out.
    let extra = tokio::time::timeout(Duration::from_millis(500), watch.message()).await;
    assert!(extra.is_err(), "no further event: {extra:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_from_trimmed_history_is_told_to_relist() {
    let cluster = Cluster::start();
    let mut settings = cluster.settings();
    settings.store.event_log_retention = 3;
    let server = Server::start(settings).await;
    let client = server.client().await;
    let first = client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let first_version = first.resource.expect("r").resource_version;
    for dim in 1..=6 {
        client
            .apply(&parse_one(&job_yaml("ctr", "clicks", dim)), 0)
            .await
            .expect("apply");
    }
    let (code_, message) = code(client.watch(None, None, first_version).await);
    assert_eq!(code_, Code::OutOfRange, "{message}");
    assert!(message.contains("list again"), "{message}");

    let latest = client.list(Kind::Job, HashMap::new()).await.expect("list");
    let (code_, message) = code(client.watch(None, None, latest.resource_version + 10).await);
    assert_eq!(code_, Code::OutOfRange, "{message}");

    // The last three changes are still replayable.
    let mut watch = client
        .watch(None, None, latest.resource_version - 3)
        .await
        .expect("within retention");
    for expected in latest.resource_version - 2..=latest.resource_version {
        assert_eq!(version(&next_event(&mut watch).await), expected);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_loses_nothing_and_versions_keep_growing() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let job = apply_job(&client, "ctr", 8).await;
    let addr = server.addr.clone();
    server.stop().await;

    let mut settings = cluster.settings();
    settings.server.grpc_addr = addr.parse().expect("addr");
    let server = Server::start(settings).await;
    let client = server.client().await;
    assert_eq!(client.get(Kind::Job, "ctr").await.expect("get"), job);
    assert_eq!(
        client
            .list(Kind::Dataset, HashMap::new())
            .await
            .expect("list")
            .resources
            .len(),
        1
    );
    // History survives too: a watch from before the restart replays the job's creation.
    let mut watch = client
        .watch(Some(Kind::Job), Some("ctr"), job.resource_version - 1)
        .await
        .expect("watch");
    assert_eq!(next_event(&mut watch).await.resource, Some(job.clone()));
    let next = apply_job(&client, "ctr", 9).await;
    assert_eq!(next.resource_version, job.resource_version + 1);
    server.stop().await;
}

/// Applies a raw request and checks it fails with `code` naming `field`, storing nothing.
async fn refused(client: &ApiClient, kind: &str, spec_json: &str, code_: Code, field: &str) {
    let before = client.list(Kind::Job, HashMap::new()).await.expect("list");
    let request = ApplyRequest {
        resource: Some(Resource {
            kind: kind.into(),
            name: "bad".into(),
            spec_json: spec_json.into(),
            ..Resource::default()
        }),
        expected_version: 0,
    };
    let (got, message) = code(client.apply_raw(request).await);
    assert_eq!(got, code_, "{message}");
    assert!(message.contains(field), "error names {field}: {message}");
    let after = client.list(Kind::Job, HashMap::new()).await.expect("list");
    assert_eq!(after, before, "nothing stored, no version taken");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_resources_are_refused_naming_the_field_and_store_nothing() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let good = parse_one(&job_yaml("bad", "clicks", 8))
        .spec_json()
        .expect("json");
    let value: serde_json::Value = serde_json::from_str(&good).expect("json");
    let edit = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = value.clone();
        f(&mut v);
        v.to_string()
    };

    refused(
        &client,
        "Job",
        "{\"model\": ",
        Code::InvalidArgument,
        "spec",
    )
    .await;
    let unknown = edit(&|v| v["model"]["colour"] = "red".into());
    refused(
        &client,
        "Job",
        &unknown,
        Code::InvalidArgument,
        "spec.model",
    )
    .await;
    let negative = edit(&|v| v["model"]["tables"][0]["dim"] = (-4).into());
    refused(
        &client,
        "Job",
        &negative,
        Code::InvalidArgument,
        "spec.model.tables[0].dim",
    )
    .await;
    let optimizer = edit(&|v| v["model"]["tables"][0]["optimizer"]["kind"] = "adadelta".into());
    refused(
        &client,
        "Job",
        &optimizer,
        Code::InvalidArgument,
        "optimizer",
    )
    .await;
    // Valid alone, but not over the Dataset's schema.
    let other_table = edit(&|v| v["model"]["tables"][0]["name"] = "users".into());
    refused(
        &client,
        "Job",
        &other_table,
        Code::InvalidArgument,
        "feature \"c1\": reads table \"items\", which is not in spec.model.tables",
    )
    .await;
    let graph = |input: serde_json::Value, label: &str| {
        edit(&|v| {
            v["model"]["kind"] = "graph".into();
            v["model"]["dense"] = serde_json::json!({"graph": {
                "inputs": {"x": input.clone()},
                "blocks": {"out": {"kind": "mlp", "input": "x", "widths": [1]}},
                "heads": {"click": {"input": "out", "label": label}}
            }});
        })
    };
    let fits = graph(serde_json::json!({"kind": "embeddings"}), "label");
    let stored = client.apply_raw(ApplyRequest {
        resource: Some(Resource {
            kind: "Job".into(),
            name: "graph".into(),
            spec_json: fits,
            ..Resource::default()
        }),
        expected_version: 0,
    });
    stored.await.expect("a graph that fits the schema");
    client
        .delete(Kind::Job, "graph", 0)
        .await
        .expect("delete it");
    let unknown_feature = graph(
        serde_json::json!({"kind": "dense", "features": ["i9"]}),
        "label",
    );
    refused(
        &client,
        "Job",
        &unknown_feature,
        Code::InvalidArgument,
        "spec.model.dense.graph.inputs.x.features[0]: the Dataset has no dense feature \"i9\"",
    )
    .await;
    let other_label = graph(serde_json::json!({"kind": "embeddings"}), "clicked");
    refused(
        &client,
        "Job",
        &other_label,
        Code::InvalidArgument,
        "spec.model.dense.graph.heads.click.label",
    )
    .await;
    let dangling = edit(&|v| v["dataset"] = "nope".into());
    refused(
        &client,
        "Job",
        &dangling,
        Code::FailedPrecondition,
        "spec.dataset",
    )
    .await;
    refused(&client, "Widget", &good, Code::InvalidArgument, "kind").await;

    let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(10 << 20));
    refused(&client, "Job", &huge, Code::InvalidArgument, "over the").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_referenced_dataset_cannot_be_deleted() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    client
        .apply(&parse_one(&job_yaml("ctr", "clicks", 8)), 0)
        .await
        .expect("job");
    let (code_, message) = code(client.delete(Kind::Dataset, "clicks", 0).await);
    assert_eq!(code_, Code::FailedPrecondition, "{message}");
    assert!(message.contains("Job/ctr"), "{message}");
    client
        .delete(Kind::Job, "ctr", 0)
        .await
        .expect("job delete");
    client
        .delete(Kind::Dataset, "clicks", 0)
        .await
        .expect("unreferenced dataset delete");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_call_needs_a_known_token() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    for token in ["", "wrong"] {
        let client = server.client_with(token).await;
        let (code_, message) = code(client.list(Kind::Job, HashMap::new()).await);
        assert_eq!(code_, Code::Unauthenticated, "{token:?}: {message}");
        let (code_, _) = code(client.watch(None, None, 0).await);
        assert_eq!(code_, Code::Unauthenticated);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_revoked_and_added_by_editing_the_token_file_without_a_restart() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let (old, new) = (
        server.client().await,
        server.client_with("added-token").await,
    );
    let list = |client: &ApiClient| {
        let client = client.clone();
        async move {
            match client.list(Kind::Job, HashMap::new()).await {
                Ok(_) => Code::Ok,
                Err(e) => e.code().expect("a gRPC status"),
            }
        }
    };
    assert_eq!(list(&old).await, Code::Ok);
    assert_eq!(list(&new).await, Code::Unauthenticated);
    let file = cluster.dir.path().join("tokens");
    std::fs::write(&file, "# rotated\nadded-token\n").expect("rewrite the token file");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while list(&old).await == Code::Ok {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old token still passes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(list(&old).await, Code::Unauthenticated, "the removed token");
    assert_eq!(list(&new).await, Code::Ok, "the added token, same server");
    let (watch, _) = code(old.watch(None, None, 0).await);
    assert_eq!(watch, Code::Unauthenticated);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_are_published_on_nats() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let mut events = nats
        .subscribe("primus.events.Dataset.clicks")
        .await
        .expect("subscribe");
    nats.flush().await.expect("flush");
    let applied = client.apply(&parse_one(DATASET), 0).await.expect("dataset");
    let message = tokio::time::timeout(
        Duration::from_secs(5),
        futures::StreamExt::next(&mut events),
    )
    .await
    .expect("published within 5 s")
    .expect("message");
    let event: ResourceEvent = prost::Message::decode(message.payload).expect("ResourceEvent");
    assert_eq!(event.r#type, EventType::Added as i32);
    assert_eq!(event.resource, applied.resource);
    server.stop().await;
}

fn metric(points: impl IntoIterator<Item = (i64, f64)>) -> (MetricSpec, primus_spec::Resource) {
    let spec = MetricSpec {
        job: "ctr".to_owned(),
        series: vec![MetricSeries {
            name: "auc".to_owned(),
            role: Some("trainer".to_owned()),
            executor: None,
            points: (points.into_iter())
                .map(|(unix_ms, value)| MetricPoint { unix_ms, value })
                .collect(),
        }],
    };
    let resource = primus_spec::Resource::Metric(Box::new(primus_spec::Object {
        metadata: primus_spec::Metadata {
            name: "ctr".to_owned(),
            labels: Default::default(),
        },
        spec: spec.clone(),
    }));
    (spec, resource)
}

/// A Metric resource that grows by a point is logged and published with that point only
/// (Get still returns the whole series, and a watcher appending rebuilds it); a change
/// that rewrites a point travels whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_metric_change_carries_only_its_appended_points() {
    let cluster = Cluster::start();
    let server = cluster.server().await;
    let client = server.client().await;
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let mut published = nats
        .subscribe("primus.events.Metric.ctr")
        .await
        .expect("subscribe");
    nats.flush().await.expect("flush");
    let auc = |t: i64| (t, 0.5 + t as f64 / 1e4);
    let (first, resource) = metric((1..=500).map(auc));
    let added = client.apply(&resource, 0).await.expect("metric");
    let since = added.resource.expect("stored").resource_version;
    let mut watch = (client.watch(Some(Kind::Metric), Some("ctr"), since).await).expect("watch");

    // The oldest point dropped, one appended.
    let (grown, resource) = metric((2..=501).map(auc));
    client.apply(&resource, 0).await.expect("grown");
    let event = next_event(&mut watch).await;
    assert_eq!(event.r#type, EventType::Appended as i32);
    let logged = event.resource.expect("resource");
    let appended: MetricSpec = serde_json::from_str(&logged.spec_json).expect("appended");
    assert_eq!(appended.series[0].points, grown.series[0].points[499..]);
    let stored = client.get(Kind::Metric, "ctr").await.expect("get");
    assert!(
        logged.spec_json.len() * 100 < stored.spec_json.len(),
        "{} bytes against the whole series' {}",
        logged.spec_json.len(),
        stored.spec_json.len()
    );
    let whole: MetricSpec = serde_json::from_str(&stored.spec_json).expect("stored");
    assert_eq!(whole, grown);
    let mut rebuilt = first;
    rebuilt.append(appended, 500);
    assert_eq!(rebuilt, grown, "a watcher appending has the whole series");
    let mut types = Vec::new();
    while types.len() < 2 {
        let message = tokio::time::timeout(
            Duration::from_secs(5),
            futures::StreamExt::next(&mut published),
        )
        .await
        .expect("published within 5 s")
        .expect("message");
        let event: ResourceEvent = prost::Message::decode(message.payload).expect("event");
        types.push(event.r#type);
    }
    assert_eq!(
        types,
        [EventType::Added as i32, EventType::Appended as i32],
        "NATS carries the same changes"
    );

    let (rewritten, resource) = metric((2..=501).map(|t| (t, 0.25)));
    client.apply(&resource, 0).await.expect("rewritten");
    let event = next_event(&mut watch).await;
    assert_eq!(event.r#type, EventType::Modified as i32);
    let whole: MetricSpec =
        serde_json::from_str(&event.resource.expect("resource").spec_json).expect("whole");
    assert_eq!(whole, rewritten);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_on_one_server_sees_writes_through_another_at_once() {
    let cluster = Cluster::start();
    // Polling is pushed out of the way: only the NATS wake-up can deliver in time.
    let mut slow_poll = cluster.settings();
    slow_poll.store.watch_poll_interval_ms = 60_000;
    let watching = Server::start(slow_poll).await;
    let writing = cluster.server().await;
    let mut watch = watching
        .client()
        .await
        .watch(Some(Kind::Dataset), None, 0)
        .await
        .expect("watch");
    let applied = writing
        .client()
        .await
        .apply(&parse_one(DATASET), 0)
        .await
        .expect("apply");
    let event = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("seen within 5 s, long before the 60 s poll")
        .expect("ok")
        .expect("open");
    assert_eq!(event.resource, applied.resource);
    writing.stop().await;
    watching.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_listener_serves_clients_that_trust_its_ca() {
    let cluster = Cluster::start();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    let cert_file = cluster.dir.path().join("server.pem");
    let key_file = cluster.dir.path().join("server.key");
    std::fs::write(&cert_file, certified.cert.pem()).expect("cert");
    std::fs::write(&key_file, certified.signing_key.serialize_pem()).expect("key");
    let mut settings = cluster.settings();
    settings.server.tls = Some(primus_config::TlsSettings {
        cert_file: cert_file.clone(),
        key_file,
    });
    let port = settings.server.grpc_addr.port();
    let shutdown = Shutdown::new();
    let task = tokio::spawn(primus_api_server::run(settings, shutdown.clone()));

    let trusted = ClientSettings {
        server: format!("https://localhost:{port}"),
        token: TOKEN.into(),
        ca_file: Some(cert_file),
    };
    let mut last_error = String::new();
    for _ in 0..100 {
        match ApiClient::connect(&trusted).await {
            Ok(client) => match client.list(Kind::Job, HashMap::new()).await {
                Ok(_) => {
                    last_error.clear();
                    break;
                }
                Err(e) => last_error = e.to_string(),
            },
            Err(e) => last_error = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        last_error.is_empty(),
        "a TLS client with the CA is served: {last_error}"
    );

    let plaintext = ClientSettings {
        server: format!("http://localhost:{port}"),
        ..trusted.clone()
    };
    let refused = match ApiClient::connect(&plaintext).await {
        Ok(client) => client.list(Kind::Job, HashMap::new()).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "plaintext is not served on a TLS listener");

    let untrusting = ClientSettings {
        ca_file: None,
        ..trusted
    };
    let refused = match ApiClient::connect(&untrusting).await {
        Ok(client) => client.list(Kind::Job, HashMap::new()).await.is_err(),
        Err(_) => true,
    };
    assert!(
        refused,
        "a self-signed certificate is not trusted by default"
    );

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("stops")
        .expect("task")
        .expect("clean exit");
}
