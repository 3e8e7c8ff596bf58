//! DLRover-RM's pre-scaling stage (§4.3, Alg. 1): a Job with `spec.scaling.policy: auto`
//! starts with the smoothed allocation of the most similar Jobs in the config DB, and
//! every Job that succeeds adds its own features and final allocation to the DB.

use primus_model::{ModelLayout, ParamSet};
use primus_resource_model::warm_start::{ConfigRecord, JobFeatures, RoleCounts, warm_start};
use primus_spec::job::{JobSpec, Topology};

use super::JobRun;
use crate::config_db::ConfigDb;
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// What the config DB compares Jobs by.
pub(super) fn features(spec: &JobSpec, layout: &ModelLayout) -> JobFeatures {
    JobFeatures {
        model_kind: format!("{:?}", spec.model.kind).to_lowercase(),
        tables: spec.model.tables.len() as u32,
        embedding_width: layout.embedding_width as u64,
        dense_parameters: dense_parameters(layout) as u64,
        batch_size: spec.training.batch_size,
    }
}

/// The dense network's parameter count.
pub(super) fn dense_parameters(layout: &ModelLayout) -> usize {
    ParamSet::init(layout, 0)
        .tensors()
        .iter()
        .map(|t| t.values.len())
        .sum()
}

/// Replaces `spec`'s data executors, trainers and PS shards (replicas and cores) with the
/// warm start from `db`; the `WarmStart` condition's (status, reason, message).
pub(super) async fn apply(
    db: &ConfigDb,
    spec: &mut JobSpec,
    layout: &ModelLayout,
) -> (bool, &'static str, String) {
    let own = |why: String| {
        (
            false,
            "OwnNumbers",
            format!("{why}: starting from the spec's topology"),
        )
    };
    let (records, unreadable) = match db.all().await {
        Ok(read) => read,
        Err(e) => return own(format!("the config DB cannot be read ({e})")),
    };
    let Some(start) = warm_start(
        &records,
        &features(spec, layout),
        primus_job_policy::WARM_START_NEIGHBOURS,
        primus_job_policy::WARM_START_SMOOTHING,
    ) else {
        return own("the config DB holds no finished Job".into());
    };
    let a = start.allocation;
    set_topology(&mut spec.topology, &a);
    let scaling = &spec.scaling;
    if scaling.enabled {
        // Load scaling keeps the data executors within its bounds.
        let bounds =
            scaling.min_data_executors..=scaling.max_data_executors.max(scaling.min_data_executors);
        spec.topology.data_executors.replicas =
            a.data_executors.clamp(*bounds.start(), *bounds.end());
    }
    let drawn: Vec<String> = start
        .drawn_on
        .iter()
        .map(|(job, similarity)| format!("{job} (similarity {similarity:.2})"))
        .collect();
    let mut message = format!(
        "{} data executors x {} cores, {} trainers x {} cores, {} PS shards x {} cores, smoothed from {}",
        spec.topology.data_executors.replicas,
        a.data_executor_cpu,
        a.trainers,
        a.trainer_cpu,
        a.ps,
        a.ps_cpu,
        drawn.join(", ")
    );
    if !unreadable.is_empty() {
        message.push_str(&format!(
            "; unreadable records left out: {}",
            unreadable.join(", ")
        ));
    }
    (true, "FromSimilarJobs", message)
}

fn set_topology(topology: &mut Topology, a: &RoleCounts) {
    topology.data_executors.replicas = a.data_executors;
    topology.data_executors.cpu = a.data_executor_cpu;
    topology.trainers.replicas = a.trainers;
    topology.trainers.cpu = a.trainer_cpu;
    topology.ps.replicas = a.ps;
    topology.ps.cpu = a.ps_cpu;
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Adds the succeeded Job to the config DB: its features, what ran at the end, and its
    /// trainers' last samples/s. A failure is logged: the Job succeeded all the same.
    pub(super) async fn record_in_config_db(&self) {
        let topology = &self.job.spec.topology;
        let count = |role| self.members(role).len() as u32;
        let record = ConfigRecord {
            job: self.name.clone(),
            features: features(&self.job.spec, &self.job.layout),
            allocation: RoleCounts {
                data_executors: count(ExecutorRole::DataExecutor).max(1),
                trainers: count(ExecutorRole::Trainer).max(1),
                ps: count(ExecutorRole::Ps).max(1),
                data_executor_cpu: topology.data_executors.cpu,
                trainer_cpu: topology.trainers.cpu,
                ps_cpu: topology.ps.cpu,
            },
            samples_per_second: self
                .writer
                .status
                .progress
                .as_ref()
                .map_or(0.0, |p| p.samples_per_second),
        };
        let db = ConfigDb::new(
            self.context.redis.clone(),
            &self.context.settings.redis.key_prefix,
        );
        if let Err(e) = db.put(&record).await {
            tracing::warn!(job = self.name, error = %e, "recording the Job in the config DB");
        }
    }
}
