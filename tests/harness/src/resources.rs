//! Typed Job and Dataset resources for end-to-end tests: builders over the primus-spec
//! types, so a test states what differs from a small default and never formats YAML.

use std::collections::BTreeMap;

use primus_spec::dataset::{
    DataSource, DataStream, DatasetSpec, FeatureSchema, JetStreamSource, JoinSource, ParquetSource,
    SparseFeature, StreamOrder, Window, WindowUnit,
};
use primus_spec::job::{
    CheckpointSpec, DenseSpec, JobSpec, ModelKind, ModelSpec, OptimizerSpec, RoleSpec,
    ScalingPolicy, ServingSyncSpec, TableSpec, Topology, TrainingMode, TrainingSpec,
};
use primus_spec::{Metadata, Object, Resource};

/// A Dataset under construction: no streams yet, the [`id_schema`].
pub struct DatasetBuilder {
    name: String,
    spec: DatasetSpec,
}

/// Dataset `name`.
pub fn dataset(name: &str) -> DatasetBuilder {
    DatasetBuilder {
        name: name.to_owned(),
        spec: DatasetSpec {
            streams: Vec::new(),
            order: StreamOrder::Sequential,
            schema: id_schema(),
        },
    }
}

impl DatasetBuilder {
    pub fn schema(mut self, schema: FeatureSchema) -> Self {
        self.spec.schema = schema;
        self
    }

    /// Adds stream `name` over `sources` in `window`.
    pub fn stream(mut self, name: &str, window: Window, sources: Vec<DataSource>) -> Self {
        self.spec.streams.push(DataStream {
            name: name.to_owned(),
            window,
            sources,
        });
        self
    }

    /// All streams are served together.
    pub fn simultaneous(mut self) -> Self {
        self.spec.order = StreamOrder::Simultaneous;
        self
    }

    pub fn spec(self) -> DatasetSpec {
        self.spec
    }

    pub fn build(self) -> Resource {
        Resource::Dataset(Box::new(object(&self.name, self.spec)))
    }
}

/// A label column `label` and one id column `c1` looked up in table `t`.
pub fn id_schema() -> FeatureSchema {
    FeatureSchema {
        label: "label".into(),
        negative_sample_rate: None,
        targets: Vec::new(),
        dense: Vec::new(),
        sparse: vec![SparseFeature {
            name: "c1".into(),
            table: "t".into(),
            multi_hot: false,
            dedup_group: None,
            sequence: None,
            same_ids_as: None,
        }],
    }
}

/// Hourly windows from `start` (`YYYY-MM-DDTHH`) up to `end` (exclusive; none: open-ended).
pub fn hourly(start: &str, end: Option<&str>) -> Window {
    window(WindowUnit::Hourly, start, end)
}

/// Daily windows from `start` (`YYYY-MM-DD`) up to `end` (exclusive; none: open-ended).
pub fn daily(start: &str, end: Option<&str>) -> Window {
    window(WindowUnit::Daily, start, end)
}

fn window(unit: WindowUnit, start: &str, end: Option<&str>) -> Window {
    Window {
        unit,
        start: start.to_owned(),
        end: end.map(str::to_owned),
    }
}

/// Source `name`: the Parquet files under `uri`.
pub fn parquet(name: &str, uri: impl std::fmt::Display) -> DataSource {
    DataSource {
        parquet: Some(ParquetSource {
            uri: uri.to_string(),
        }),
        ..source(name)
    }
}

/// Source `name`: the JetStream `stream`'s messages on `subject`.
pub fn jetstream(name: &str, stream: &str, subject: &str) -> DataSource {
    DataSource {
        jetstream: Some(JetStreamSource {
            stream: stream.to_owned(),
            subject: subject.to_owned(),
        }),
        ..source(name)
    }
}

/// Source `name`: an online joiner.
pub fn join(name: &str, join: JoinSource) -> DataSource {
    DataSource {
        join: Some(join),
        ..source(name)
    }
}

/// Source `name`: an online joiner of stream `LOG`'s feature rows on `log.features` with
/// its actions on `log.actions` by request id `rid`, each row waiting 1 s.
pub fn log_join(name: &str) -> DataSource {
    join(
        name,
        JoinSource {
            stream: "LOG".into(),
            features: "log.features".into(),
            actions: "log.actions".into(),
            request_id: "rid".into(),
            wait_seconds: 1.0,
            memory_rows: 100_000,
        },
    )
}

fn source(name: &str) -> DataSource {
    DataSource {
        name: name.to_owned(),
        weight: 1.0,
        parquet: None,
        jetstream: None,
        join: None,
    }
}

/// A Job under construction: one data executor, one trainer, one PS.
pub struct JobBuilder {
    name: String,
    labels: BTreeMap<String, String>,
    spec: JobSpec,
}

/// Job `name` training `model` on Dataset `dataset` in `mode`.
pub fn job(name: &str, dataset: &str, mode: TrainingMode, model: ModelSpec) -> JobBuilder {
    JobBuilder {
        name: name.to_owned(),
        labels: BTreeMap::new(),
        spec: JobSpec {
            model,
            dataset: dataset.to_owned(),
            mode,
            topology: Topology {
                data_executors: RoleSpec::new(1),
                trainers: RoleSpec::new(1),
                ps: RoleSpec::new(1),
                serving: None,
            },
            training: TrainingSpec::default(),
            scaling: ScalingPolicy::default(),
            checkpoint: None,
            serving_sync: ServingSyncSpec::default(),
            start_from: None,
            suspend: false,
        },
    }
}

impl JobBuilder {
    /// Data executors, trainers and PS shards.
    pub fn replicas(mut self, data_executors: u32, trainers: u32, ps: u32) -> Self {
        let topology = &mut self.spec.topology;
        topology.data_executors.replicas = data_executors;
        topology.trainers.replicas = trainers;
        topology.ps.replicas = ps;
        self
    }

    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.spec.training.batch_size = batch_size;
        self
    }

    /// A checkpoint under `uri` every `interval_seconds`.
    pub fn checkpoint(mut self, uri: impl std::fmt::Display, interval_seconds: u64) -> Self {
        self.spec.checkpoint = Some(CheckpointSpec::new(&uri.to_string(), interval_seconds));
        self
    }

    /// Any other change to the spec.
    pub fn with(mut self, change: impl FnOnce(&mut JobSpec)) -> Self {
        change(&mut self.spec);
        self
    }

    /// Label `key` with `value`.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn build(self) -> Resource {
        let mut job = object(&self.name, self.spec);
        job.metadata.labels = self.labels;
        Resource::Job(Box::new(job))
    }
}

/// The smallest model over the [`id_schema`]: Wide&Deep with table `t` (dim 4, SGD 0.1)
/// and a top network of 8 then 1.
/// One serving replica kept in sync quickly (rows every 200 ms, the dense network every
/// second): a change for [`JobBuilder::with`].
pub fn served(spec: &mut JobSpec) {
    spec.topology.serving = Some(RoleSpec::new(1));
    let sync = &mut spec.serving_sync;
    (
        sync.enabled,
        sync.sparse_interval_ms,
        sync.dense_interval_seconds,
    ) = (true, 200, 1);
}

pub fn small_wide_deep() -> ModelSpec {
    ModelSpec {
        kind: ModelKind::WideDeep,
        tables: vec![TableSpec::new(
            "t",
            4,
            OptimizerSpec::Sgd { learning_rate: 0.1 },
        )],
        dense: DenseSpec::new(Vec::new(), vec![8, 1]),
    }
}

fn object<S>(name: &str, spec: S) -> Object<S> {
    Object {
        metadata: Metadata {
            name: name.to_owned(),
            labels: BTreeMap::new(),
        },
        spec,
    }
}
