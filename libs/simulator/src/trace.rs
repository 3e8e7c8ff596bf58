//! Seeded Job traces: arrivals, sizes, the allocations users ask for (over-provisioned, as
//! DLRover-RM §2.2 observes: most Jobs use under half the CPU and memory they hold, and a
//! few ask for too little memory), and each Job's faults.

use primus_resource_model::warm_start::JobFeatures;
use primus_resource_model::{Allocation, JobShape};

use crate::random::Random;
use crate::truth::Truth;

/// What the cluster holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    /// Cores.
    pub cpu: f64,
    /// Memory, GiB.
    pub memory_gib: f64,
}

/// What a Job asks for: processes, cores and memory per process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Processes and their cores.
    pub allocation: Allocation,
    /// Memory per PS shard, GiB.
    pub ps_gib: f64,
    /// Memory per trainer, GiB.
    pub trainer_gib: f64,
}

impl Request {
    /// Memory of every process, GiB.
    pub fn memory_gib(&self) -> f64 {
        let a = &self.allocation;
        f64::from(a.ps) * self.ps_gib + f64::from(a.trainers) * self.trainer_gib
    }

    /// Cores of every process.
    pub fn cores(&self) -> f64 {
        primus_resource_model::plans::cores(&self.allocation)
    }
}

/// One Job of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTrace {
    /// Its name (`job-<n>`).
    pub name: String,
    /// Seconds from the trace's start to its submission.
    pub arrival: f64,
    /// Samples it trains.
    pub samples: f64,
    /// Its shape, as the resource model sees it.
    pub shape: JobShape,
    /// What the config DB knows of it.
    pub features: JobFeatures,
    /// How it really runs.
    pub truth: Truth,
    /// What its user asks for.
    pub user: Request,
    /// Share of its samples after which a trainer straggles, if one does.
    pub straggler_at: Option<f64>,
    /// Share of its samples after which a PS shard turns hot, if one does.
    pub hot_ps_at: Option<f64>,
    /// Process failures per process-hour.
    pub failure_rate: f64,
}

/// A cluster and the Jobs submitted to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Capacity.
    pub cluster: Cluster,
    /// Jobs in order of arrival.
    pub jobs: Vec<JobTrace>,
}

/// Mean seconds between submissions: at this rate Jobs under their users' allocations
/// queue at the busier times (static allocation's mean JCT is above their mean run time).
const MEAN_INTERARRIVAL_SECONDS: f64 = 480.0;

/// A trace of `jobs` Jobs from `seed`.
pub fn generate(jobs: usize, seed: u64) -> Trace {
    let mut arrivals = Random::new(seed);
    let mut at = 0.0;
    let jobs = (0..jobs)
        .map(|i| {
            at += arrivals.exponential(MEAN_INTERARRIVAL_SECONDS);
            job(i, at, &mut Random::stream(seed, i as u64))
        })
        .collect();
    Trace {
        cluster: Cluster {
            cpu: 4_000.0,
            memory_gib: 5_600.0,
        },
        jobs,
    }
}

fn job(index: usize, arrival: f64, random: &mut Random) -> JobTrace {
    let batch = f64::from(512 << random.integer(0, 3));
    let embedding_width = random.between(200.0, 1_200.0).round();
    let model_bytes = random.log_normal(16e6, 0.8);
    let shape = JobShape {
        batch,
        model_bytes,
        embedding_width,
        bandwidth: 1.25e9,
    };
    let truth = Truth {
        grad: random.log_normal(6e-4, 0.4),
        update: random.log_normal(0.2, 0.5),
        sync: random.log_normal(1.5, 0.5),
        embedding: random.log_normal(3e-7, 0.5),
        base: random.between(0.01, 0.05),
        saturation: random.between(8.0, 24.0),
        contention: random.between(0.01, 0.05),
        table_gib: random.log_normal(40.0, 0.8).clamp(4.0, 400.0),
        trainer_gib: random.between(2.0, 8.0),
        table_fill: random.between(0.2, 0.6),
        noise: 0.05,
    };
    let allocation = Allocation {
        trainers: random.integer(4, 16),
        ps: random.integer(2, 8),
        trainer_cpu: [8.0, 12.0, 16.0, 24.0][random.integer(0, 3) as usize],
        ps_cpu: [8.0, 12.0, 16.0][random.integer(0, 2) as usize],
    };
    // Most users ask for 1.5-4x the memory a PS shard needs; some for too little.
    let ps_factor = match random.chance(0.08) {
        true => random.between(0.6, 0.95),
        false => random.between(1.5, 4.0),
    };
    let user = Request {
        allocation,
        ps_gib: truth.ps_gib(allocation.ps) * ps_factor,
        trainer_gib: truth.trainer_gib * random.between(1.5, 3.0),
    };
    let hours = random.log_normal(1.5, 0.7).clamp(1.0 / 6.0, 12.0);
    let samples = truth.throughput(&shape, &allocation, Default::default()) * hours * 3_600.0;
    let kinds = ["dlrm", "deepfm", "wide_deep"];
    JobTrace {
        name: format!("job-{index}"),
        arrival,
        samples,
        shape,
        features: JobFeatures {
            model_kind: kinds[random.integer(0, 2) as usize].to_owned(),
            tables: random.integer(8, 40),
            embedding_width: embedding_width as u64,
            dense_parameters: (model_bytes / 4.0) as u64,
            batch_size: batch as u32,
        },
        truth,
        user,
        straggler_at: random.chance(0.1).then(|| random.between(0.1, 0.8)),
        hot_ps_at: random.chance(0.1).then(|| random.between(0.1, 0.8)),
        failure_rate: 0.005,
    }
}
