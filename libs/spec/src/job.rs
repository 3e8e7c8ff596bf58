//! A training job: the model, its data, how it trains, where it runs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod graph;
mod scaling;
mod training;

pub use scaling::{AllocationPolicy, LoadWeights, MemoryPolicy, ScalingPolicy, StragglerPolicy};
pub use training::{HotExchange, HotSetSpec, StreamLoading, TrainingSpec};

use crate::defaults;
use crate::validate::{
    FieldError, Validate, check_name, check_non_negative, check_positive, check_probability,
    check_unique, fail, field, index,
};

/// A training Job (`kind: Job`): what model trains on which Dataset, how, and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The model: its kind, embedding tables and dense network.
    pub model: ModelSpec,
    /// Name of the Dataset resource the job reads.
    pub dataset: String,
    /// Which of the Dataset's sources are read, and when.
    pub mode: TrainingMode,
    /// How many processes of each role run, and what each may use.
    pub topology: Topology,
    /// Minibatches, evaluation, stream loading and the hot set.
    #[serde(default)]
    pub training: TrainingSpec,
    /// Horizontal scaling of data executors by their load.
    #[serde(default)]
    pub scaling: ScalingPolicy,
    /// Periodic checkpoints of the PS shards and data positions; unset: none (and no restore).
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// Whether and how often serving replicas follow training.
    #[serde(default)]
    pub serving_sync: ServingSyncSpec,
    /// A checkpoint folder of an earlier Job with the same tables and dense network
    /// (`<its checkpoint uri>/ckpt-<id>`, or `<its checkpoint uri>/final` once it
    /// succeeded): while this Job has no checkpoint of its own, its PS shards start from
    /// that model (rows, optimizer state, dense network) and its serving replicas serve it
    /// from the start. Data positions and counters start fresh.
    #[serde(default)]
    pub start_from: Option<String>,
    /// While true no executor of the Job runs: a Job created suspended waits (as a queue
    /// such as Kueue's holds a batch Job until it admits it); suspending a running Job
    /// stops its executors, and it goes on from its latest checkpoint when resumed.
    #[serde(default)]
    pub suspend: bool,
}

/// Which sources a Job reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TrainingMode {
    /// Bounded batch data only.
    Batch,
    /// Online training from streams only.
    Stream,
    /// Finish the batch data, then follow the streams without restarting.
    BatchThenStream,
    /// Batch and stream served together (Primus Alg. 1 and 2).
    Mixture,
}

/// The dense network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// DeepFM: factorization machine plus a deep network, with one-wide first-order weights.
    Deepfm,
    /// DLRM: a bottom MLP over dense features, dot interactions with the embeddings, a top MLP.
    Dlrm,
    /// Wide&Deep: one-wide first-order weights plus a deep network over the embeddings.
    WideDeep,
    /// Memory tower on batch data, adapt tower on stream data (Primus MTRM).
    Mtrm,
    /// The blocks and heads of `dense.graph`.
    Graph,
}

/// The model: embedding tables (on the PS) and the dense network (on the trainers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The dense network's kind.
    pub kind: ModelKind,
    /// Embedding tables; every sparse feature of the Dataset's schema names one.
    pub tables: Vec<TableSpec>,
    /// Layer widths and the dense parameters' optimizer.
    pub dense: DenseSpec,
}

/// One embedding table (Monolith's collisionless table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// Unique among the model's tables; sparse features refer to it.
    pub name: String,
    /// Floats per row.
    pub dim: u32,
    /// The optimizer the PS applies to pushed gradients, its state kept beside each row.
    pub optimizer: OptimizerSpec,
    /// How a new row's weights start (a pure function of key and seed).
    #[serde(default)]
    pub initializer: Initializer,
    /// Which keys get a row (Monolith's filters).
    #[serde(default)]
    pub admission: AdmissionSpec,
    /// Rows not updated for this long are evicted; unset keeps rows forever.
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    /// How a feature's keys in this table make its embedding (and its first-order weight
    /// in a wide model), in training and serving alike.
    #[serde(default)]
    pub pooling: TablePooling,
}

/// How the rows of a sample's keys in one feature combine. One key gives its row either
/// way; no key gives zeros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TablePooling {
    /// Their sum.
    #[default]
    Sum,
    /// Their mean: a multi-hot feature's scale does not grow with its number of keys.
    Mean,
}

/// An optimizer and its hyperparameters (`kind` selects it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    /// Plain gradient descent.
    Sgd {
        /// Step size.
        learning_rate: f64,
    },
    /// Adagrad: per-coordinate steps shrink with the accumulated squared gradients.
    Adagrad {
        /// Step size.
        learning_rate: f64,
        /// The accumulator's starting value. 0, like PyTorch's and fbgemm's: the gradients of
        /// a mean loss are small (~1/batch per occurrence), and a starting value far above
        /// their squares shrinks every early step of a new row, so embeddings barely move
        /// from their initialisation for thousands of steps.
        #[serde(default = "defaults::initial_accumulator")]
        initial_accumulator: f64,
        /// Added to the accumulator's square root before dividing.
        #[serde(default = "defaults::epsilon")]
        epsilon: f64,
    },
    /// Adam with per-row bias correction.
    Adam {
        /// Step size.
        learning_rate: f64,
        /// Decay of the first moment.
        #[serde(default = "defaults::beta1")]
        beta1: f64,
        /// Decay of the second moment.
        #[serde(default = "defaults::beta2")]
        beta2: f64,
        /// Added to the second moment's square root before dividing.
        #[serde(default = "defaults::epsilon")]
        epsilon: f64,
    },
    /// FTRL-proximal.
    Ftrl {
        /// Step size (per-coordinate rate alpha / (beta + sqrt(n))).
        alpha: f64,
        /// Smooths the per-coordinate rate.
        #[serde(default = "defaults::ftrl_beta")]
        beta: f64,
        /// L1 regularisation (drives weights to exactly zero).
        #[serde(default)]
        l1: f64,
        /// L2 regularisation.
        #[serde(default)]
        l2: f64,
    },
}

/// How a new row's weights start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Initializer {
    /// All zeros.
    Zeros,
    /// Uniform in `[-scale, scale]`.
    Uniform {
        /// The largest magnitude.
        scale: f64,
    },
    /// Normal with mean 0 and standard deviation `std`.
    Normal {
        /// The standard deviation.
        std: f64,
    },
}

impl Default for Initializer {
    fn default() -> Self {
        Self::Uniform { scale: 0.01 }
    }
}

impl TableSpec {
    /// A table with the file defaults for everything but its name, width and optimizer.
    pub fn new(name: &str, dim: u32, optimizer: OptimizerSpec) -> Self {
        Self {
            name: name.to_owned(),
            dim,
            optimizer,
            initializer: Initializer::default(),
            admission: AdmissionSpec::default(),
            ttl_seconds: None,
            pooling: TablePooling::default(),
        }
    }
}

impl OptimizerSpec {
    /// Adagrad with the file defaults for its accumulator and epsilon.
    pub fn adagrad(learning_rate: f64) -> Self {
        Self::Adagrad {
            learning_rate,
            initial_accumulator: defaults::initial_accumulator(),
            epsilon: defaults::epsilon(),
        }
    }

    /// Adam with the file defaults for its betas and epsilon.
    pub fn adam(learning_rate: f64) -> Self {
        Self::Adam {
            learning_rate,
            beta1: defaults::beta1(),
            beta2: defaults::beta2(),
            epsilon: defaults::epsilon(),
        }
    }
}

/// Monolith's admission filters: a key gets a row only once seen `min_count` times
/// (counted in a count-min sketch), and then only with `probability`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSpec {
    /// A key gets a row once seen this many times (0 or 1: at once).
    #[serde(default)]
    pub min_count: u32,
    /// Then it gets one with this probability per occurrence.
    #[serde(default = "defaults::one")]
    pub probability: f64,
}

impl Default for AdmissionSpec {
    fn default() -> Self {
        Self {
            min_count: 0,
            probability: defaults::one(),
        }
    }
}

/// Hidden layer widths of the dense network (`bottom` is DLRM's and MTRM's dense-feature MLP)
/// and the optimizer the PS applies to its parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DenseSpec {
    /// DLRM and MTRM: the MLP over dense features (its last width is the embedding dim).
    #[serde(default)]
    pub bottom: Vec<u32>,
    /// The MLP after the interaction; the last width is 1 (the logit). Every kind but
    /// `graph` has one.
    #[serde(default)]
    pub top: Vec<u32>,
    /// The optimizer the PS applies to the dense parameters.
    #[serde(default = "defaults::dense_optimizer")]
    pub optimizer: OptimizerSpec,
    /// `kind: graph`: the network as named inputs, blocks and heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<graph::GraphSpec>,
}

impl DenseSpec {
    /// Layers with the default optimizer.
    pub fn new(bottom: Vec<u32>, top: Vec<u32>) -> Self {
        Self {
            bottom,
            top,
            optimizer: defaults::dense_optimizer(),
            graph: None,
        }
    }
}

/// How many processes of each role the job runs, and what each may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Data executors: read the Dataset and serve minibatches.
    pub data_executors: RoleSpec,
    /// Trainers: compute gradients, data-parallel.
    pub trainers: RoleSpec,
    /// PS shards holding the embedding tables and the dense parameters.
    pub ps: RoleSpec,
    /// Serving replicas answering Predict; unset: none.
    #[serde(default)]
    pub serving: Option<RoleSpec>,
}

/// The processes of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// How many processes.
    pub replicas: u32,
    /// CPU cores.
    #[serde(default = "defaults::one")]
    pub cpu: f64,
    /// Memory as a Kubernetes quantity: `512Mi`, `4Gi`, `2G`, `1000000`.
    #[serde(default = "defaults::memory")]
    pub memory: String,
    /// Where the role's embedding work runs. `ps` and `trainers` may say `cuda`: a PS then
    /// keeps its rows in GPU memory; a trainer pools, runs the pooling backward and keeps
    /// its hot rows there, and runs its dense network there when built with its `cuda`
    /// feature.
    #[serde(default)]
    pub device: Device,
}

impl RoleSpec {
    /// `replicas` processes with the file defaults for CPU, memory and device.
    pub fn new(replicas: u32) -> Self {
        Self {
            replicas,
            cpu: defaults::one(),
            memory: defaults::memory(),
            device: Device::Cpu,
        }
    }
}

/// Host CPU, or an NVIDIA GPU through CUDA.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The host's CPU.
    #[default]
    Cpu,
    /// An NVIDIA GPU (CUDA).
    Cuda,
}

/// Bytes in a Kubernetes-style memory quantity, or why it is not one.
pub fn parse_memory(quantity: &str) -> Result<u64, String> {
    let units: [(&str, u64); 9] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        // Kubernetes writes the decimal kilo lowercase.
        ("k", 1_000),
        ("K", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, multiplier) = units
        .iter()
        .find_map(|(suffix, m)| quantity.strip_suffix(suffix).map(|d| (d, *m)))
        .unwrap_or((quantity, 1));
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{quantity:?} is not a memory quantity (e.g. 512Mi, 4Gi)"))?;
    value
        .checked_mul(multiplier)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("{quantity:?} must be > 0 and fit in 64 bits"))
}

/// Where and how often checkpoints are taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Object-store URL under which snapshots and task offsets are written.
    pub uri: String,
    /// Seconds between checkpoints.
    pub interval_seconds: u64,
    /// One checkpoint in this many writes full PS snapshots; the ones between write only
    /// the rows changed (and keys evicted) since the previous checkpoint, and a restore
    /// reads the chain back to the full one. 1: every checkpoint is full.
    #[serde(default = "defaults::full_every")]
    pub full_every: u32,
    /// What a crashed PS shard costs the Job.
    #[serde(default)]
    pub on_ps_failure: PsFailure,
    /// What a crashed data executor or trainer costs the Job.
    #[serde(default)]
    pub on_worker_failure: WorkerFailure,
}

impl CheckpointSpec {
    /// A checkpoint under `uri` every `interval_seconds`, with the file defaults.
    pub fn new(uri: &str, interval_seconds: u64) -> Self {
        Self {
            uri: uri.to_owned(),
            interval_seconds,
            full_every: defaults::full_every(),
            on_ps_failure: PsFailure::default(),
            on_worker_failure: WorkerFailure::default(),
        }
    }
}

/// What a Job does when one of its PS shards crashes and is restarted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PsFailure {
    /// The shard alone is restored from the latest checkpoint and loses its updates since
    /// (Monolith §2.3); the other shards, the trainers and the data position go on, and the
    /// `ShardRestored` condition says how many steps and samples the shard lost.
    #[default]
    RestoreShard,
    /// The whole Job returns to the latest checkpoint (every PS shard, the task offsets,
    /// the stream positions and the trainers' totals; to the start without one), so no
    /// row's update is lost or applied twice; the rows trained since are trained again.
    /// Stream sources of `rebalance` loading and online joins are not rewound: their rows
    /// trained since the checkpoint are lost.
    Rollback,
}

/// What a Job does when one of its data executors or trainers crashes and is restarted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerFailure {
    /// The restarted process continues: a data executor's tasks and stream bindings go on
    /// from the rows its trainers consumed, a trainer from its last confirmed totals. The
    /// minibatches a trainer was sent and had not confirmed are served again, and each PS
    /// shard applies a minibatch's gradients once. With a `training.hot_set` a crashed
    /// trainer rolls the Job back as `rollback` does: its gradients in the hot set's last
    /// round cannot be continued from exactly (docs/operations.md).
    #[default]
    Continue,
    /// The whole Job returns to the latest checkpoint, as `on_ps_failure: rollback` does,
    /// so no Parquet or stream row is lost or trained twice (`rebalance` loading and
    /// online joins excepted).
    Rollback,
}

/// The longest chain of incremental checkpoints `full_every` may ask for.
pub const MAX_FULL_EVERY: u32 = 64;

/// How the serving copy follows training (Monolith 2.2.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServingSyncSpec {
    /// Serving replicas follow training.
    #[serde(default)]
    pub enabled: bool,
    /// Rows changed on the PS reach the replicas at least this often (and on every delta notice).
    #[serde(default = "defaults::sparse_interval_ms")]
    pub sparse_interval_ms: u64,
    /// A fresh dense network reaches the replicas this often.
    #[serde(default = "defaults::dense_interval_seconds")]
    pub dense_interval_seconds: u64,
    /// Once the Job succeeds its serving replicas go on serving its final model (loaded
    /// from the final checkpoint when `spec.checkpoint` is set) for this many seconds; 0:
    /// they stop with the Job. Unset: until the Job is deleted.
    #[serde(default)]
    pub keep_serving_seconds: Option<u64>,
}

impl Default for ServingSyncSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            sparse_interval_ms: defaults::sparse_interval_ms(),
            dense_interval_seconds: defaults::dense_interval_seconds(),
            keep_serving_seconds: None,
        }
    }
}

impl JobSpec {
    /// Why embedding rows are trained in GPU memory, when they are: there only the fused
    /// adagrad and adam kernels can update them.
    fn rows_on_device(&self) -> Option<&'static str> {
        let topology = &self.topology;
        if topology.ps.device == Device::Cuda {
            Some("topology.ps.device cuda")
        } else if topology.trainers.device == Device::Cuda && self.training.hot_set.enabled {
            Some("topology.trainers.device cuda with training.hot_set")
        } else {
            None
        }
    }
}

impl Validate for JobSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        self.model.validate(&field(path, "model"), errors);
        if let Some(why) = self.rows_on_device() {
            for (i, table) in self.model.tables.iter().enumerate() {
                if matches!(
                    table.optimizer,
                    OptimizerSpec::Sgd { .. } | OptimizerSpec::Ftrl { .. }
                ) {
                    fail(
                        errors,
                        field(
                            &index(&field(&field(path, "model"), "tables"), i),
                            "optimizer",
                        ),
                        format!(
                            "{why} updates rows with fused adagrad or adam kernels; use one of those"
                        ),
                    );
                }
            }
        }
        check_name(errors, field(path, "dataset"), &self.dataset, false);
        self.topology.validate(&field(path, "topology"), errors);
        self.training.validate(&field(path, "training"), errors);
        self.scaling.validate(&field(path, "scaling"), errors);
        let (scaling, replicas) = (&self.scaling, self.topology.data_executors.replicas);
        let bounds = scaling.min_data_executors..=scaling.max_data_executors;
        if scaling.enabled && !bounds.is_empty() && !bounds.contains(&replicas) {
            fail(
                errors,
                field(
                    &field(&field(path, "topology"), "data_executors"),
                    "replicas",
                ),
                format!(
                    "must be within spec.scaling's {}..={} while scaling is enabled (got {replicas})",
                    scaling.min_data_executors, scaling.max_data_executors
                ),
            );
        }
        if self
            .start_from
            .as_ref()
            .is_some_and(|uri| uri.trim().is_empty())
        {
            fail(
                errors,
                field(path, "start_from"),
                "must not be empty when set",
            );
        }
        if let Some(checkpoint) = &self.checkpoint {
            let at = field(path, "checkpoint");
            if checkpoint.uri.trim().is_empty() {
                fail(errors, field(&at, "uri"), "must not be empty");
            }
            if checkpoint.interval_seconds == 0 {
                fail(errors, field(&at, "interval_seconds"), "must be > 0");
            }
            if !(1..=MAX_FULL_EVERY).contains(&checkpoint.full_every) {
                fail(
                    errors,
                    field(&at, "full_every"),
                    format!("must be between 1 and {MAX_FULL_EVERY}"),
                );
            }
        }
        let sync = &self.serving_sync;
        let at = field(path, "serving_sync");
        if sync.sparse_interval_ms == 0 {
            fail(errors, field(&at, "sparse_interval_ms"), "must be > 0");
        }
        if sync.dense_interval_seconds == 0 {
            fail(errors, field(&at, "dense_interval_seconds"), "must be > 0");
        }
        if sync.enabled
            && self
                .topology
                .serving
                .as_ref()
                .is_none_or(|s| s.replicas == 0)
        {
            fail(
                errors,
                field(&at, "enabled"),
                "serving sync needs topology.serving with at least one replica",
            );
        }
    }
}

impl Validate for ModelSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let tables = field(path, "tables");
        if self.tables.is_empty() {
            fail(
                errors,
                tables.clone(),
                "a model needs at least one embedding table",
            );
        }
        check_unique(
            errors,
            &tables,
            "table",
            self.tables.iter().map(|t| t.name.as_str()),
        );
        for (i, table) in self.tables.iter().enumerate() {
            table.validate(&index(&tables, i), errors);
        }
        let dense = field(path, "dense");
        match (self.kind, &self.dense.graph) {
            (ModelKind::Graph, Some(graph)) => {
                graph.validate(&field(&dense, "graph"), errors);
                for (name, layers) in [("bottom", &self.dense.bottom), ("top", &self.dense.top)] {
                    if !layers.is_empty() {
                        fail(
                            errors,
                            field(&dense, name),
                            "a graph model declares its layers in dense.graph",
                        );
                    }
                }
            }
            (ModelKind::Graph, None) => fail(
                errors,
                field(&dense, "graph"),
                "kind graph needs the graph of its blocks",
            ),
            (_, Some(_)) => fail(
                errors,
                field(&dense, "graph"),
                "only kind graph reads a graph (the other kinds are presets of one)",
            ),
            (_, None) if self.dense.top.is_empty() => {
                fail(errors, field(&dense, "top"), "needs at least one layer")
            }
            (_, None) => {}
        }
        if matches!(self.kind, ModelKind::Dlrm | ModelKind::Mtrm) && self.dense.bottom.is_empty() {
            fail(
                errors,
                field(&dense, "bottom"),
                "dlrm and mtrm need a bottom MLP",
            );
        }
        self.dense
            .optimizer
            .validate(&field(&dense, "optimizer"), errors);
        for (name, layers) in [("bottom", &self.dense.bottom), ("top", &self.dense.top)] {
            for (i, width) in layers.iter().enumerate() {
                if *width == 0 {
                    fail(errors, index(&field(&dense, name), i), "must be > 0");
                }
            }
        }
    }
}

impl Validate for OptimizerSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        match self {
            OptimizerSpec::Sgd { learning_rate } => {
                check_positive(errors, field(path, "learning_rate"), *learning_rate)
            }
            OptimizerSpec::Adagrad {
                learning_rate,
                initial_accumulator,
                epsilon,
            } => {
                check_positive(errors, field(path, "learning_rate"), *learning_rate);
                check_non_negative(
                    errors,
                    field(path, "initial_accumulator"),
                    *initial_accumulator,
                );
                check_positive(errors, field(path, "epsilon"), *epsilon);
            }
            OptimizerSpec::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => {
                check_positive(errors, field(path, "learning_rate"), *learning_rate);
                for (name, beta) in [("beta1", beta1), ("beta2", beta2)] {
                    if !(0.0..1.0).contains(beta) {
                        fail(
                            errors,
                            field(path, name),
                            format!("must be within 0..1 (got {beta})"),
                        );
                    }
                }
                check_positive(errors, field(path, "epsilon"), *epsilon);
            }
            OptimizerSpec::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                check_positive(errors, field(path, "alpha"), *alpha);
                check_positive(errors, field(path, "beta"), *beta);
                for (name, value) in [("l1", l1), ("l2", l2)] {
                    check_non_negative(errors, field(path, name), *value);
                }
            }
        }
    }
}

impl Validate for TableSpec {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        check_name(errors, field(path, "name"), &self.name, true);
        if self.dim == 0 {
            fail(errors, field(path, "dim"), "must be > 0");
        } else if self.dim > 4096 {
            fail(
                errors,
                field(path, "dim"),
                format!("must be <= 4096 (got {})", self.dim),
            );
        }
        self.optimizer.validate(&field(path, "optimizer"), errors);
        let at = field(path, "initializer");
        match &self.initializer {
            Initializer::Zeros => {}
            Initializer::Uniform { scale } => check_positive(errors, field(&at, "scale"), *scale),
            Initializer::Normal { std } => check_positive(errors, field(&at, "std"), *std),
        }
        check_probability(
            errors,
            field(&field(path, "admission"), "probability"),
            self.admission.probability,
        );
        if self.ttl_seconds == Some(0) {
            fail(
                errors,
                field(path, "ttl_seconds"),
                "must be > 0 (leave it out to keep rows forever)",
            );
        }
    }
}

impl Validate for Topology {
    fn validate(&self, path: &str, errors: &mut Vec<FieldError>) {
        let roles = [
            ("data_executors", Some(&self.data_executors), 1),
            ("trainers", Some(&self.trainers), 1),
            ("ps", Some(&self.ps), 1),
            ("serving", self.serving.as_ref(), 0),
        ];
        for (name, role, minimum) in roles {
            let Some(role) = role else { continue };
            let at = field(path, name);
            if role.replicas < minimum {
                fail(
                    errors,
                    field(&at, "replicas"),
                    format!("must be >= {minimum}"),
                );
            }
            check_positive(errors, field(&at, "cpu"), role.cpu);
            if let Err(message) = parse_memory(&role.memory) {
                fail(errors, field(&at, "memory"), message);
            }
            if role.device == Device::Cuda && !matches!(name, "ps" | "trainers") {
                fail(
                    errors,
                    field(&at, "device"),
                    "only ps and trainers run on a GPU in this build; use cpu",
                );
            }
        }
    }
}
