//! PS processes over real gRPC: several shards behind the routing client answer exactly as
//! one in-process table; bad input is refused and changes nothing.
use std::time::Duration;

use primus_embedding::{Table, TableOptions};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{ExportDeltaRequest, LookupRequest, PushRequest, StatsRequest};
use primus_ps::PsSettings;
use primus_ps::client::PsClient;
use primus_service::Shutdown;
use primus_spec::job::{AdmissionSpec, Initializer, OptimizerSpec, TableSpec};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, free_port};
use tonic::Code;

const DIM: usize = 8;
const SEED: u64 = 5;

fn table_spec(name: &str) -> TableSpec {
    TableSpec {
        name: name.into(),
        dim: DIM as u32,
        optimizer: OptimizerSpec::Adagrad {
            learning_rate: 0.05,
            initial_accumulator: 0.1,
            epsilon: 1e-8,
        },
        initializer: Initializer::Normal { std: 0.01 },
        admission: AdmissionSpec::default(),
        ttl_seconds: None,
    }
}

struct Shard {
    addr: String,
    shutdown: Shutdown,
}

async fn start_shard(nats: &NatsServer, tables: Vec<TableSpec>) -> Shard {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], free_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.ps.tables = tables;
    settings.ps.seed = SEED;
    settings.ps.shards_per_table = 8;
    let addr = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    tokio::spawn(primus_ps::run(settings, shutdown.clone()));
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(20))
        .await
        .expect("ps serving");
    Shard { addr, shutdown }
}

/// A deterministic stream of keys with many repeats (and duplicates within a batch).
fn batch(step: u64, len: usize) -> Vec<u64> {
    (0..len as u64)
        .map(|i| {
            let x = (step * 7919 + i * 104_729) % 3_000;
            x.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_shards_answer_like_one_table() {
    let nats = NatsServer::start().expect("nats-server");
    let mut shards = Vec::new();
    for _ in 0..3 {
        shards.push(start_shard(&nats, vec![table_spec("items"), table_spec("users")]).await);
    }
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    let client = PsClient::connect(&addrs).await.expect("connect");
    let reference = Table::new(
        &table_spec("items"),
        TableOptions {
            shards: 1,
            seed: SEED,
            ..TableOptions::default()
        },
    )
    .expect("table");

    for step in 0..30 {
        let keys = batch(step, 257);
        let grads: Vec<f32> = (0..keys.len() * DIM)
            .map(|i| ((i as u64 * 31 + step) % 17) as f32 / 17.0 - 0.5)
            .collect();
        let (applied, dropped) = client.push("items", &keys, &grads).await.expect("push");
        assert_eq!((applied, dropped), (keys.len() as u64, 0));
        reference.push(&keys, &grads, 1).expect("reference push");

        let probe = batch(step + 1_000, 300);
        let (rows, dim) = client.lookup("items", &probe).await.expect("lookup");
        assert_eq!(dim, DIM);
        let mut expected = vec![0.0; probe.len() * DIM];
        reference
            .lookup(&probe, &mut expected)
            .expect("reference lookup");
        assert_eq!(rows, expected, "step {step}");
    }

    // Every row lives on exactly one shard, and together they hold the reference's rows.
    let mut total_rows = 0;
    for addr in &addrs {
        let mut raw = ParameterServerClient::connect(format!("http://{addr}"))
            .await
            .expect("connect");
        let stats = raw
            .stats(StatsRequest {})
            .await
            .expect("stats")
            .into_inner();
        let items = stats
            .tables
            .iter()
            .find(|t| t.table == "items")
            .expect("items");
        assert!(items.rows > 0, "every shard got keys");
        total_rows += items.rows;
        let delta = raw
            .export_delta(ExportDeltaRequest { since_version: 0 })
            .await
            .expect("delta")
            .into_inner();
        let items_delta = delta
            .tables
            .iter()
            .find(|t| t.table == "items")
            .expect("items");
        assert_eq!(items_delta.keys.len() as u64 / 8, items.rows);
        assert_eq!(items_delta.rows.len(), items_delta.keys.len() / 8 * DIM * 4);
    }
    assert_eq!(total_rows, reference.len() as u64);
    for shard in shards {
        shard.shutdown.trigger();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_invalid_argument_and_change_nothing() {
    let nats = NatsServer::start().expect("nats-server");
    let shard = start_shard(&nats, vec![table_spec("items")]).await;
    let mut raw = ParameterServerClient::connect(format!("http://{}", shard.addr))
        .await
        .expect("connect");
    let keys: Vec<u8> = [1u64, 2].iter().flat_map(|k| k.to_le_bytes()).collect();
    let floats =
        |values: &[f32]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut nan = vec![0.1f32; 2 * DIM];
    nan[DIM + 3] = f32::NAN;

    let cases = [
        (
            PushRequest {
                table: "nope".into(),
                keys: keys.clone(),
                grads: floats(&[0.1; 2 * DIM]),
            },
            "\"nope\" is not held",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys.clone(),
                grads: floats(&[0.1; DIM]),
            },
            "need 16",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys.clone(),
                grads: floats(&nan),
            },
            "not finite",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys[..12].to_vec(),
                grads: floats(&[0.1; DIM]),
            },
            "8-byte keys",
        ),
    ];
    for (request, expected) in cases {
        let status = raw.push(request).await.expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(expected),
            "{expected:?} in {}",
            status.message()
        );
    }
    let status = raw
        .lookup(LookupRequest {
            table: "users".into(),
            keys: keys.clone(),
        })
        .await
        .expect_err("unknown table");
    assert!(
        status.message().contains("tables: items"),
        "{}",
        status.message()
    );
    let stats = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.tables[0].rows, 0, "nothing was applied");
    shard.shutdown.trigger();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_table_setting_fails_start_naming_it() {
    let nats = NatsServer::start().expect("nats-server");
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], 0).into();
    settings.nats.url = nats.url();
    let mut bad = table_spec("items");
    bad.dim = 0;
    settings.ps.tables = vec![table_spec("users"), bad];
    let err = primus_ps::run(settings, Shutdown::new())
        .await
        .expect_err("invalid table");
    let text = format!("{err:#}");
    assert!(text.contains("ps.tables[1].dim"), "{text}");
}
