//! DLRover-RM's resource-performance model of a running Job, fitted online
//! ([`primus_job_policy::performance`]): once the Job has run under two allocations the
//! `ResourceModel` condition gives the model's coefficients, its RMSLE and the samples/s
//! it predicts for the allocation running now.

use primus_job_policy::Snapshot;
use primus_model::ModelLayout;
use primus_resource_model::JobShape;
use primus_spec::job::JobSpec;

use super::JobRun;
use primus_backend::ResourceBackend;
use primus_data_tasks::plan::Catalog;

/// Bandwidth between trainers and PS shards assumed by Eq. 4 (10 Gb/s); the sync
/// coefficient absorbs what it really is, as the paper takes B as a constant.
const BANDWIDTH: f64 = 1.25e9;

/// The Job's shape as the resource model sees it: its batch, dense bytes and embedding
/// width.
pub(super) fn job_shape(spec: &JobSpec, layout: &ModelLayout) -> JobShape {
    let dense_floats = super::warm_start::dense_parameters(layout);
    JobShape {
        batch: f64::from(spec.training.batch_size.max(1)),
        model_bytes: (4 * dense_floats.max(1)) as f64,
        embedding_width: layout.embedding_width.max(1) as f64,
        bandwidth: BANDWIDTH,
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Adds this tick's throughput to the log and, once the model fits, says what it found.
    pub(super) fn record_performance(&mut self, snapshot: &Snapshot) {
        let Some((allocation, fitted, rmsle, allocations)) = self.policies.record(snapshot) else {
            return;
        };
        let (trainers, ps) = (allocation.trainers, allocation.ps);
        let c = fitted.coefficients;
        let predicted = fitted.throughput(&allocation).unwrap_or(0.0);
        let message = format!(
            "from {allocations} allocations: T_iter = {:.3e}·m/λw + {:.3e}·w/(p·λp) + {:.3e}·(M/p)/(B/w) + {:.3e}·m·D/p + {:.3e} s; RMSLE {rmsle:.3}; predicts {predicted:.0} samples/s for {trainers} trainers x {} cores, {ps} PS shards x {} cores",
            c.grad,
            c.update,
            c.sync,
            c.embedding,
            c.base,
            allocation.trainer_cpu,
            allocation.ps_cpu
        );
        self.writer
            .condition("ResourceModel", true, "Fitted", message);
    }
}
