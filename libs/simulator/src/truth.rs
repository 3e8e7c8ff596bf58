//! What a Job really does under an allocation: the simulator's ground truth. Its form is
//! deliberately not the fitted model's: cores saturate (each added core helps less),
//! dense synchronisation contends as trainers are added, a hot PS shard slows lookups,
//! a straggling trainer slows its share, and every measured iteration carries noise.

use primus_resource_model::{Allocation, JobShape};

/// One Job's true behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Truth {
    /// Seconds of gradient computation per sample per effective trainer core.
    pub grad: f64,
    /// Seconds of parameter update per trainer per effective PS core.
    pub update: f64,
    /// Seconds per (dense bytes per shard / bandwidth per trainer).
    pub sync: f64,
    /// Seconds per looked-up float per shard.
    pub embedding: f64,
    /// Seconds per iteration that no allocation changes.
    pub base: f64,
    /// Cores at which a process's effective cores reach half their count.
    pub saturation: f64,
    /// Growth of the synchronisation time per trainer (contention on the PS links).
    pub contention: f64,
    /// Memory of the embedding tables and their optimizer state once they hold every key,
    /// GiB over all shards.
    pub table_gib: f64,
    /// Share of the Job's samples after which its tables hold every key: they grow as
    /// new keys arrive until then.
    pub table_fill: f64,
    /// Memory a trainer uses, GiB.
    pub trainer_gib: f64,
    /// Log-spread of a measured iteration time.
    pub noise: f64,
}

/// Faults in effect while a Job runs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// One trainer runs at 3% of its cores.
    pub straggler: bool,
    /// One PS shard holds a hot share of the lookups (3x its part).
    pub hot_ps: bool,
}

/// A process's cores that do work: `cores / (1 + cores / saturation)`.
fn effective(cores: f64, saturation: f64) -> f64 {
    cores / (1.0 + cores / saturation)
}

impl Truth {
    /// Each part of one iteration, seconds: gradient, update, synchronisation, lookups
    /// and the rest.
    fn parts(&self, shape: &JobShape, a: &Allocation, faults: Faults) -> [f64; 5] {
        let (w, p) = (f64::from(a.trainers), f64::from(a.ps));
        let hot = if faults.hot_ps && a.ps > 1 { 3.0 } else { 1.0 };
        [
            self.grad * shape.batch / effective(a.trainer_cpu, self.saturation),
            self.update * w / (p * effective(a.ps_cpu, self.saturation)),
            self.sync * (shape.model_bytes / p) / (shape.bandwidth / w)
                * (1.0 + self.contention * w),
            self.embedding * shape.batch * shape.embedding_width / p * hot,
            self.base,
        ]
    }

    /// Seconds per iteration, without noise.
    pub fn iteration_seconds(&self, shape: &JobShape, a: &Allocation, faults: Faults) -> f64 {
        self.parts(shape, a, faults).iter().sum()
    }

    /// Samples per second: every trainer's minibatch per iteration, less a straggler's
    /// lost share (trainers do not wait for each other on a PS).
    pub fn throughput(&self, shape: &JobShape, a: &Allocation, faults: Faults) -> f64 {
        let w = f64::from(a.trainers);
        let working = if faults.straggler { w - 1.0 + 0.03 } else { w };
        working * shape.batch / self.iteration_seconds(shape, a, faults)
    }

    /// Cores busy on average: trainers during their gradient computation, PS shards
    /// during updates and lookups, each with its effective cores.
    pub fn busy_cores(&self, shape: &JobShape, a: &Allocation, faults: Faults) -> f64 {
        let parts = self.parts(shape, a, faults);
        let total: f64 = parts.iter().sum();
        let trainers = f64::from(a.trainers) * effective(a.trainer_cpu, self.saturation);
        let ps = f64::from(a.ps) * effective(a.ps_cpu, self.saturation);
        trainers * parts[0] / total + ps * (parts[1] + parts[3]) / total
    }

    /// Memory one PS shard needs once its tables hold every key, GiB, with `shards` of
    /// them.
    pub fn ps_gib(&self, shards: u32) -> f64 {
        self.ps_gib_at(shards, 1.0)
    }

    /// Memory one PS shard uses with `fill` (0..=1) of the keys in its tables, GiB.
    pub fn ps_gib_at(&self, shards: u32, fill: f64) -> f64 {
        self.table_gib * fill.clamp(0.0, 1.0) / f64::from(shards.max(1)) + 1.0
    }

    /// Memory the Job uses under `a` with `fill` of the keys in its tables, GiB.
    pub fn used_gib(&self, a: &Allocation, fill: f64) -> f64 {
        f64::from(a.ps) * self.ps_gib_at(a.ps, fill) + f64::from(a.trainers) * self.trainer_gib
    }
}
