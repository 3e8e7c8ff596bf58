//! PS processes over real gRPC: several shards behind the routing client answer exactly as
//! one in-process table; bad input is refused and changes nothing; a restarting shard's
//! part of a push waits for it.

#![allow(
    clippy::print_stdout,
    reason = "a check that cannot run here says so on stdout, beside the test's name"
)]
use std::time::Duration;

use primus_config::PsSettings;
use primus_config::{S3Settings, StorageSettings};
use primus_embedding::{Table, TableOptions};
use primus_gpu::{CudaStatus, cuda_status};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{
    ExportDeltaRequest, LookupRequest, PushRequest, RestoreRequest, SnapshotRequest, StatsRequest,
};
use primus_ps_client::PsClient;
use primus_service::Shutdown;
use primus_spec::job::{Device, Initializer, OptimizerSpec, TableSpec};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, S3Bucket, SeaweedS3, restartable_port};
use tonic::Code;

#[path = "ps/exports.rs"]
mod exports;
#[path = "ps/flash.rs"]
mod flash;
#[path = "ps/reshard.rs"]
mod reshard;
#[path = "ps/tables.rs"]
mod tables;
#[path = "ps/unreachable.rs"]
mod unreachable;

const DIM: usize = 8;
const SEED: u64 = 5;

fn table_spec(name: &str) -> TableSpec {
    TableSpec {
        optimizer: OptimizerSpec::Adagrad {
            learning_rate: 0.05,
            initial_accumulator: 0.1,
            epsilon: 1e-8,
        },
        initializer: Initializer::Normal { std: 0.01 },
        ..TableSpec::new(name, DIM as u32, OptimizerSpec::adagrad(0.05))
    }
}

struct Shard {
    addr: String,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Shard {
    /// Shuts the shard down and waits until it has stopped serving, on its listener and on
    /// the connections clients hold open.
    async fn stop(self) {
        self.shutdown.trigger();
        self.running
            .await
            .expect("the shard's task")
            .expect("the shard stops cleanly");
    }
}

async fn start_shard(nats: &NatsServer, tables: Vec<TableSpec>) -> Shard {
    start_shard_with(nats, tables, StorageSettings::default()).await
}

async fn start_shard_with(
    nats: &NatsServer,
    tables: Vec<TableSpec>,
    storage: StorageSettings,
) -> Shard {
    let mut settings = shard_settings(nats, tables);
    settings.storage = storage;
    start(settings).await
}

/// A training PS on a free loopback port, with the tests' seed and 8 shards per table. The
/// port is below the ephemeral range: a test that stops a shard and starts it again on
/// the same address must not meet another test's shard there meanwhile.
fn shard_settings(nats: &NatsServer, tables: Vec<TableSpec>) -> PsSettings {
    let mut settings = PsSettings::default();
    settings.server.grpc_addr = ([127, 0, 0, 1], restartable_port().expect("port")).into();
    settings.nats.url = nats.url();
    settings.ps.tables = tables;
    settings.ps.seed = SEED;
    settings.ps.shards_per_table = 8;
    settings
}

async fn start(settings: PsSettings) -> Shard {
    let addr = settings.server.grpc_addr.to_string();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(primus_ps::run(settings, shutdown.clone()));
    // A PS on a GPU compiles its kernels (NVRTC) before it serves.
    wait_for_health(&addr, ServingStatus::Serving, Duration::from_secs(60))
        .await
        .expect("ps serving");
    Shard {
        addr,
        shutdown,
        running,
    }
}

/// A raw gRPC client of the shard at `addr`.
async fn raw_client(addr: &str) -> ParameterServerClient<tonic::transport::Channel> {
    ParameterServerClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// `values` as packed little-endian f32 bytes, as the wire carries gradients.
fn floats(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Gradients for `keys` keys at `step`, in [-0.5, 0.5).
fn grads_for(step: u64, keys: usize) -> Vec<f32> {
    (0..keys * DIM)
        .map(|i| ((i as u64 * 31 + step) % 17) as f32 / 17.0 - 0.5)
        .collect()
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

/// Three shards of tables "items" and "users", and a client of all three.
async fn three_shards(nats: &NatsServer) -> (Vec<Shard>, PsClient) {
    let mut shards = Vec::new();
    for _ in 0..3 {
        shards.push(start_shard(nats, vec![table_spec("items"), table_spec("users")]).await);
    }
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    let client = PsClient::connect(&addrs).await.expect("connect");
    (shards, client)
}

/// Table `name` in one piece in this process, seeded like the shards: what they must
/// answer together.
fn reference_table(name: &str) -> Table {
    let options = TableOptions {
        shards: 1,
        seed: SEED,
        ..TableOptions::default()
    };
    Table::new(&table_spec(name), options).expect("table")
}

#[tokio::test(flavor = "multi_thread")]
async fn three_shards_answer_like_one_table() {
    let nats = NatsServer::start().expect("nats-server");
    let (shards, client) = three_shards(&nats).await;
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    let reference = reference_table("items");

    for step in 0..30 {
        let keys = batch(step, 257);
        let grads = grads_for(step, keys.len());
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

    // Rows read with their optimizer state are the reference's; unknown keys are left out.
    let asked: Vec<u64> = batch(0, 40).into_iter().chain([u64::MAX]).collect();
    let stored = client.read_rows("items", &asked).await.expect("read rows");
    assert_eq!((stored.dim, stored.stride), (DIM, 2 * DIM));
    let mut read: Vec<u64> = stored.keys.clone();
    read.sort_unstable();
    let mut known: Vec<u64> = asked[..40].to_vec();
    known.sort_unstable();
    known.dedup();
    assert_eq!(read, known);
    for (key, values) in stored.rows() {
        let (weights, state, _) = reference.row(key).expect("read").expect("reference row");
        assert_eq!(values, [weights, state].concat().as_slice(), "key {key}");
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
            .export_delta(ExportDeltaRequest {
                since_version: 0,
                update_counts: false,
            })
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
    let mut nan = vec![0.1f32; 2 * DIM];
    nan[DIM + 3] = f32::NAN;

    let cases = [
        (
            PushRequest {
                table: "nope".into(),
                keys: keys.clone().into(),
                grads: floats(&[0.1; 2 * DIM]).into(),
            },
            "\"nope\" is not held",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys.clone().into(),
                grads: floats(&[0.1; DIM]).into(),
            },
            "need 16",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys.clone().into(),
                grads: floats(&nan).into(),
            },
            "not finite",
        ),
        (
            PushRequest {
                table: "items".into(),
                keys: keys[..12].to_vec().into(),
                grads: floats(&[0.1; DIM]).into(),
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
            keys: keys.clone().into(),
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

/// With a GPU, a PS whose rows live in GPU memory answers lookups, pushes and ReadRows
/// bitwise as a CPU PS does; without one, it refuses to start and says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_cuda_ps_answers_like_a_cpu_ps_or_refuses_to_start_without_a_gpu() {
    let nats = NatsServer::start().expect("nats-server");
    let mut settings = shard_settings(&nats, vec![table_spec("items")]);
    settings.ps.shards_per_table = 4;
    settings.ps.device = Device::Cuda;
    if !matches!(cuda_status(), CudaStatus::Ready { .. }) {
        let err = primus_ps::run(settings, Shutdown::new())
            .await
            .expect_err("no GPU here");
        let text = format!("{err:#}");
        assert!(
            text.contains("ps.device is cuda (device 0)") && text.contains("CUDA"),
            "{text}"
        );
        println!("no CUDA device: checked the refusal; the GPU PS's answers were not compared");
        return;
    }
    let gpu_shard = start(settings).await;
    let cpu_shard = start_shard(&nats, vec![table_spec("items")]).await;
    let on_gpu = PsClient::connect(std::slice::from_ref(&gpu_shard.addr))
        .await
        .expect("connect gpu ps");
    let on_cpu = PsClient::connect(std::slice::from_ref(&cpu_shard.addr))
        .await
        .expect("connect cpu ps");
    for step in 0..20 {
        let keys = batch(step, 2_000);
        let grads = grads_for(step, keys.len());
        let gpu = on_gpu.push("items", &keys, &grads).await.expect("gpu push");
        let cpu = on_cpu.push("items", &keys, &grads).await.expect("cpu push");
        assert_eq!(gpu, cpu, "step {step}: push");
        let probe = batch(step + 1_000, 700);
        let (gpu, _) = on_gpu.lookup("items", &probe).await.expect("gpu lookup");
        let (cpu, _) = on_cpu.lookup("items", &probe).await.expect("cpu lookup");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gpu), bits(&cpu), "step {step}: lookup");
    }
    let asked = batch(3, 500);
    let gpu = on_gpu.read_rows("items", &asked).await.expect("gpu rows");
    let cpu = on_cpu.read_rows("items", &asked).await.expect("cpu rows");
    // Rows come grouped by the table's shards, and the two PSs shard their tables
    // differently: compared key by key.
    let by_key = |keys: &[u64], values: &[f32]| {
        let width = values.len() / keys.len().max(1);
        let rows = values
            .chunks(width.max(1))
            .map(|row| row.iter().map(|x| x.to_bits()));
        (keys.iter().copied())
            .zip(rows.map(Vec::from_iter))
            .collect::<std::collections::BTreeMap<u64, Vec<u32>>>()
    };
    assert!(!gpu.keys.is_empty());
    assert_eq!(
        by_key(&gpu.keys, &gpu.values),
        by_key(&cpu.keys, &cpu.values)
    );
    gpu_shard.shutdown.trigger();
    cpu_shard.shutdown.trigger();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_serving_replica_refuses_device_cuda() {
    let mut settings = PsSettings::default();
    settings.ps.role = primus_config::PsRole::Serving;
    settings.ps.device = Device::Cuda;
    let err = primus_ps::run(settings, Shutdown::new())
        .await
        .expect_err("refused");
    assert!(format!("{err:#}").contains("ps.device: cuda"), "{err:#}");
}

/// Pushes a batch through `client` and returns the keys.
async fn push_batch(client: &PsClient, step: u64) -> Vec<u64> {
    let keys = batch(step, 500);
    let grads: Vec<f32> = (0..keys.len() * DIM)
        .map(|i| ((i as u64 + step) % 13) as f32 / 13.0 - 0.5)
        .collect();
    client.push("items", &keys, &grads).await.expect("push");
    keys
}

/// Full snapshot, more pushes, incremental snapshot; a fresh PS restored from the
/// incremental (and, through it, the full one) answers exactly like the original.
async fn snapshot_and_restore(nats: &NatsServer, storage: StorageSettings, uri: &str) {
    let original = start_shard_with(nats, vec![table_spec("items")], storage.clone()).await;
    let client = PsClient::connect(std::slice::from_ref(&original.addr))
        .await
        .expect("connect");
    let mut raw = ParameterServerClient::connect(format!("http://{}", original.addr))
        .await
        .expect("connect");
    for step in 0..5 {
        push_batch(&client, step).await;
    }
    raw.init_dense(primus_proto::v1::InitDenseRequest {
        tensors: vec![dense("top.w", &[4], &[0.1, 0.2, 0.3, 0.4])],
    })
    .await
    .expect("init dense");
    let full = raw
        .snapshot(SnapshotRequest {
            uri: uri.into(),
            base_manifest_uri: String::new(),
            in_background: false,
        })
        .await
        .expect("full snapshot")
        .into_inner();
    assert!(full.rows > 0);
    for step in 5..8 {
        push_batch(&client, step).await;
    }
    raw.push_dense(primus_proto::v1::PushDenseRequest {
        grads: vec![dense("top.w", &[4], &[1.0, -1.0, 0.5, 0.0])],
        minibatch: 0,
    })
    .await
    .expect("push dense");
    let incremental = raw
        .snapshot(SnapshotRequest {
            uri: uri.into(),
            base_manifest_uri: full.manifest_uri.clone(),
            in_background: false,
        })
        .await
        .expect("incremental snapshot")
        .into_inner();
    assert!(incremental.version > full.version);
    // Only rows pushed since the full one: three batches of 500 keys.
    assert!(
        (1..=1_500).contains(&incremental.rows),
        "{}",
        incremental.rows
    );

    let copy = start_shard_with(nats, vec![table_spec("items")], storage).await;
    let mut copy_raw = ParameterServerClient::connect(format!("http://{}", copy.addr))
        .await
        .expect("connect");
    copy_raw
        .restore(RestoreRequest {
            manifest_uri: incremental.manifest_uri.clone(),
            ..RestoreRequest::default()
        })
        .await
        .expect("restore");
    let copy_client = PsClient::connect(std::slice::from_ref(&copy.addr))
        .await
        .expect("connect");
    let probe: Vec<u64> = (0..10).flat_map(|s| batch(s, 300)).collect();
    let (want, _) = client.lookup("items", &probe).await.expect("lookup");
    let (got, _) = copy_client.lookup("items", &probe).await.expect("lookup");
    assert_eq!(got, want);
    for with_state in [false, true] {
        let pull = primus_proto::v1::PullDenseRequest {
            names: Vec::new(),
            with_state,
        };
        assert_eq!(
            copy_raw
                .pull_dense(pull.clone())
                .await
                .expect("pull")
                .into_inner(),
            raw.pull_dense(pull).await.expect("pull").into_inner(),
            "dense parameters, their optimizer state and version restored too"
        );
    }
    let rows = |stats: primus_proto::v1::StatsResponse| stats.tables[0].rows;
    assert_eq!(
        rows(
            copy_raw
                .stats(StatsRequest {})
                .await
                .expect("stats")
                .into_inner()
        ),
        rows(
            raw.stats(StatsRequest {})
                .await
                .expect("stats")
                .into_inner()
        )
    );
    original.shutdown.trigger();
    copy.shutdown.trigger();
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_restore_through_a_local_folder() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let uri = format!("file://{}/snapshots", dir.path().display());
    snapshot_and_restore(&nats, StorageSettings::default(), &uri).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_restore_through_s3() {
    let nats = NatsServer::start().expect("nats-server");
    let bucket = SeaweedS3::shared()
        .expect("seaweedfs")
        .bucket("ps-snapshots")
        .expect("bucket");
    let storage = StorageSettings {
        s3: S3Settings {
            endpoint: Some(bucket.endpoint.clone()),
            region: Some(S3Bucket::REGION.into()),
            access_key_id: Some(S3Bucket::ACCESS_KEY.into()),
            secret_access_key: Some(S3Bucket::SECRET_KEY.into()),
            allow_http: true,
        },
        ..StorageSettings::default()
    };
    snapshot_and_restore(&nats, storage, &format!("{}/job-a", bucket.url())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_snapshot_file_is_data_loss_and_restores_nothing() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let shard = start_shard(&nats, vec![table_spec("items")]).await;
    let client = PsClient::connect(std::slice::from_ref(&shard.addr))
        .await
        .expect("connect");
    let mut raw = ParameterServerClient::connect(format!("http://{}", shard.addr))
        .await
        .expect("connect");
    push_batch(&client, 1).await;
    let taken = raw
        .snapshot(SnapshotRequest {
            uri: format!("file://{}", dir.path().display()),
            base_manifest_uri: String::new(),
            in_background: false,
        })
        .await
        .expect("snapshot")
        .into_inner();
    let file = dir
        .path()
        .join(format!("full-{}", taken.version))
        .join("items/shard-0.bin");
    let mut bytes = std::fs::read(&file).expect("shard file");
    bytes[40] ^= 0xff;
    std::fs::write(&file, bytes).expect("write");
    push_batch(&client, 2).await;
    let before = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    let status = raw
        .restore(RestoreRequest {
            manifest_uri: taken.manifest_uri,
            ..RestoreRequest::default()
        })
        .await
        .expect_err("damaged");
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    assert!(
        status.message().contains("shard-0.bin"),
        "{}",
        status.message()
    );
    let after = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(
        after.tables[0].rows, before.tables[0].rows,
        "tables untouched"
    );
    shard.shutdown.trigger();
}

fn dense(name: &str, shape: &[u64], values: &[f32]) -> primus_proto::v1::DenseTensor {
    primus_proto::v1::DenseTensor {
        name: name.into(),
        shape: shape.to_vec(),
        values: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dense_parameters_are_initialised_once_and_updated_by_the_server_optimizer() {
    use primus_embedding::{DenseStore, DenseValues};
    use primus_proto::v1::{InitDenseRequest, PullDenseRequest, PushDenseRequest};

    let nats = NatsServer::start().expect("nats-server");
    let shard = start_shard(&nats, vec![table_spec("items")]).await;
    let mut raw = ParameterServerClient::connect(format!("http://{}", shard.addr))
        .await
        .expect("connect");
    let first = raw
        .init_dense(InitDenseRequest {
            tensors: vec![dense("top.w", &[2, 3], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])],
        })
        .await
        .expect("init")
        .into_inner();
    assert_eq!(first.created, vec!["top.w".to_owned()]);
    // A second trainer's initialisation loses: the first values stay.
    let second = raw
        .init_dense(InitDenseRequest {
            tensors: vec![dense("top.w", &[2, 3], &[9.0; 6])],
        })
        .await
        .expect("init")
        .into_inner();
    assert!(second.created.is_empty());

    // The server applies its default optimizer (Adam, lr 0.001); a local store agrees.
    let local = DenseStore::new(&PsSettings::default().ps.dense_optimizer);
    let initial = DenseValues {
        name: "top.w".into(),
        shape: vec![2, 3],
        values: vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
    };
    local.init(&[initial]).expect("local init");
    for step in 0..3 {
        let grad: Vec<f32> = (0..6).map(|i| (i + step) as f32 * 0.1 - 0.2).collect();
        raw.push_dense(PushDenseRequest {
            grads: vec![dense("top.w", &[2, 3], &grad)],
            minibatch: 0,
        })
        .await
        .expect("push");
        local
            .push(&[DenseValues {
                name: "top.w".into(),
                shape: vec![2, 3],
                values: grad,
            }])
            .expect("local push");
    }
    let pulled = raw
        .pull_dense(PullDenseRequest {
            names: vec!["top.w".into()],
            with_state: false,
        })
        .await
        .expect("pull")
        .into_inner();
    let values: Vec<f32> = pulled.tensors[0]
        .values
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (want, version) = local.pull(&[]).expect("local pull");
    assert_eq!(values, want[0].values);
    assert_eq!(pulled.version, version);
    // With their optimizer state: what the local store would encode, and its optimizer.
    let with_state = raw
        .pull_dense(PullDenseRequest {
            names: vec!["top.w".into()],
            with_state: true,
        })
        .await
        .expect("pull with state")
        .into_inner();
    assert!(with_state.tensors.is_empty());
    assert_eq!(with_state.state, local.encode());
    assert_eq!(with_state.version, version);
    let optimizer: primus_spec::job::OptimizerSpec =
        serde_json::from_str(&with_state.optimizer_json).expect("optimizer json");
    assert_eq!(&optimizer, local.optimizer());

    // Wrong size, wrong shape, unknown name: refused with codes a trainer can act on.
    let status = raw
        .push_dense(PushDenseRequest {
            grads: vec![dense("top.w", &[2, 3], &[0.1; 5])],
            minibatch: 0,
        })
        .await
        .expect_err("size");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = raw
        .init_dense(InitDenseRequest {
            tensors: vec![dense("top.w", &[3, 2], &[0.1; 6])],
        })
        .await
        .expect_err("shape");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let status = raw
        .pull_dense(PullDenseRequest {
            names: vec!["bottom.w".into()],
            with_state: true,
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    shard.shutdown.trigger();
}

/// A PS at `ps.memory_limit_bytes` refuses new keys (counted, the push still answers) and
/// keeps training the rows it has; it never aborts.
#[tokio::test(flavor = "multi_thread")]
async fn a_ps_at_its_memory_limit_refuses_new_keys_and_keeps_serving() {
    let nats = NatsServer::start().expect("nats-server");
    let empty = start_shard(&nats, vec![table_spec("items")]).await;
    let mut raw = raw_client(&empty.addr).await;
    let base = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner()
        .memory_bytes;
    empty.shutdown.trigger();
    // Room for a few thousand rows above what an empty PS holds.
    let limit = base + 400_000;
    let mut settings = shard_settings(&nats, vec![table_spec("items")]);
    settings.ps.memory_limit_bytes = Some(limit);
    let shard = start(settings).await;
    let client = PsClient::connect(std::slice::from_ref(&shard.addr))
        .await
        .expect("connect");
    let mut raw = raw_client(&shard.addr).await;
    let first: Vec<u64> = (0..100u64).collect();
    client
        .push("items", &first, &grads_for(0, first.len()))
        .await
        .expect("push");
    let mut dropped = 0;
    for step in 1..60u64 {
        let keys: Vec<u64> = (step * 1_000..step * 1_000 + 1_000).collect();
        let (_, refused) = client
            .push("items", &keys, &grads_for(step, keys.len()))
            .await
            .expect("a push at the limit still answers");
        dropped += refused;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = raw
        .stats(StatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.memory_limit_bytes, limit);
    assert!(stats.tables[0].refused > 0 && dropped > 0, "{stats:?}");
    // The limit is checked every 100 ms: it may be passed by what came in meanwhile.
    assert!(stats.memory_bytes < limit + 400_000, "{stats:?}");
    let (before, _) = client.lookup("items", &first).await.expect("lookup");
    let (applied, refused) = client
        .push("items", &first, &grads_for(99, first.len()))
        .await
        .expect("push");
    assert_eq!((applied, refused), (100, 0), "existing rows keep training");
    let (after, _) = client.lookup("items", &first).await.expect("lookup");
    assert_ne!(before, after);
    // Given more memory, it takes new keys again.
    raw.set_memory_limit(primus_proto::v1::SetMemoryLimitRequest { bytes: 0 })
        .await
        .expect("no limit");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let new: Vec<u64> = (900_000..901_000).collect();
    let (applied, refused) = client
        .push("items", &new, &grads_for(7, new.len()))
        .await
        .expect("push");
    assert_eq!((applied, refused), (1_000, 0), "new keys get rows again");
    shard.shutdown.trigger();
}
