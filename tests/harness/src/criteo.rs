//! The Criteo-like DLRM workload of the end-to-end tests and the chaos suite: four hours
//! of generated rows as Dataset `criteo`, and a small DLRM Job over them.

use primus_config::StorageSettings;
use primus_spec::job::{
    DenseSpec, Initializer, ModelKind, ModelSpec, OptimizerSpec, TableSpec, TrainingMode,
};
use primus_spec::time;

use crate::Sandbox;
use crate::resources::{JobBuilder, dataset, hourly, job, parquet};

/// Hours and rows per hour of the Criteo-like data.
pub const DLRM_HOURS: usize = 4;
pub const DLRM_ROWS_PER_HOUR: usize = 100_000;
pub const DLRM_ROWS: u64 = (DLRM_HOURS * DLRM_ROWS_PER_HOUR) as u64;
/// Rows per row group of the DLRM data's files.
pub const DLRM_ROW_GROUP_ROWS: usize = 16_384;

/// Writes the Criteo-like data under the sandbox's `criteo/` (one Parquet file per hour)
/// and applies its Dataset `criteo`. Returns the data's best achievable AUC.
pub async fn apply_criteo_dataset(sandbox: &Sandbox) -> f64 {
    let best = write_criteo_rows(sandbox, DLRM_HOURS).await;
    apply_criteo_dataset_at(sandbox, sandbox.dir().join("criteo").display()).await;
    best
}

/// Applies Dataset `criteo` over the Criteo-like data already written under `uri` (any
/// store URL) by [`write_criteo_rows_to`].
pub async fn apply_criteo_dataset_at(sandbox: &Sandbox, uri: impl std::fmt::Display) {
    let end = format!("2026-11-01T{DLRM_HOURS:02}");
    let criteo = dataset("criteo")
        .schema(primus_datagen::criteo::feature_schema("categorical"))
        .stream(
            "clicks",
            hourly("2026-11-01T00", Some(&end)),
            vec![parquet("criteo", uri)],
        );
    sandbox.apply([criteo.build()]).await;
}

/// Writes `hours` hours of the Criteo-like data from 2026-11-01T00 under the sandbox's
/// `criteo/`, one Parquet file of [`DLRM_ROWS_PER_HOUR`] rows per hour. Returns the data's
/// best achievable AUC.
pub async fn write_criteo_rows(sandbox: &Sandbox, hours: usize) -> f64 {
    let data = sandbox.dir().join("criteo");
    let location = primus_storage::open(data.to_str().expect("utf-8"), &StorageSettings::default())
        .expect("location");
    write_criteo_rows_to(&location, hours).await
}

/// Writes `hours` hours of the Criteo-like data from 2026-11-01T00 under `location` (any
/// object store), as [`write_criteo_rows`] does. Returns the data's best achievable AUC.
pub async fn write_criteo_rows_to(location: &primus_storage::Location, hours: usize) -> f64 {
    use primus_datagen::write::{Layout, criteo};

    let layout = Layout {
        unit: primus_spec::dataset::WindowUnit::Hourly,
        start_unix_s: time::parse_window_time("2026-11-01T00").expect("time"),
        windows: hours,
        files_per_window: 1,
        row_group_rows: DLRM_ROW_GROUP_ROWS,
    };
    let summary = criteo(location, &layout, DLRM_ROWS_PER_HOUR, dlrm_options())
        .await
        .expect("generate");
    summary.best_auc.expect("both classes")
}

/// How the Criteo-like rows are generated: at most ~500 ids per column, so one pass over
/// 400,000 rows sees the tail ids often enough to learn them.
pub fn dlrm_options() -> primus_datagen::criteo::CriteoOptions {
    primus_datagen::criteo::CriteoOptions {
        cardinality_scale: 0.00005,
        ..Default::default()
    }
}

/// A small DLRM Job on Dataset `criteo` with `trainers` trainers and two PS shards,
/// checkpointed every `checkpoint_seconds` under the sandbox's `checkpoints/<job>`.
pub fn dlrm_job(
    sandbox: &Sandbox,
    name: &str,
    trainers: u32,
    checkpoint_seconds: u64,
) -> JobBuilder {
    let checkpoints = sandbox.dir().join("checkpoints").join(name);
    dlrm_job_checkpointed_at(name, trainers, checkpoints.display(), checkpoint_seconds)
}

/// The Job of [`dlrm_job`] with its checkpoints under `checkpoint_uri`.
pub fn dlrm_job_checkpointed_at(
    name: &str,
    trainers: u32,
    checkpoint_uri: impl std::fmt::Display,
    checkpoint_seconds: u64,
) -> JobBuilder {
    let table = TableSpec {
        initializer: Initializer::Uniform { scale: 0.1 },
        ..TableSpec::new("categorical", 16, OptimizerSpec::adagrad(0.3))
    };
    let model = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![table],
        dense: DenseSpec {
            optimizer: OptimizerSpec::adam(0.003),
            ..DenseSpec::new(vec![64, 16], vec![64, 1])
        },
    };
    job(name, "criteo", TrainingMode::Batch, model)
        .replicas(1, trainers, 2)
        .batch_size(256)
        // Each trainer scores its own samples: together they cover the newest 20,000.
        .with(|spec| spec.training.eval_window = 20_000 / trainers)
        .checkpoint(checkpoint_uri, checkpoint_seconds)
}
