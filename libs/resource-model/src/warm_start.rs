//! DLRover-RM's warm start (§4.3, Alg. 1, Eq. 10): a new Job's first allocation from the
//! final allocations of the most similar finished Jobs, exponentially smoothed so the most
//! similar weighs most.

use serde::{Deserialize, Serialize};

/// What the config DB knows of a Job before it runs: its model and data, not its numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFeatures {
    /// The dense network's kind (`dlrm`, `deepfm`, ...).
    pub model_kind: String,
    /// Embedding tables.
    pub tables: u32,
    /// Embedding floats looked up per sample, over every feature.
    pub embedding_width: u64,
    /// Dense parameters.
    pub dense_parameters: u64,
    /// Samples per trainer per step.
    pub batch_size: u32,
}

/// How many processes of each role a Job runs with, and their cores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoleCounts {
    /// Data executors.
    pub data_executors: u32,
    /// Trainers.
    pub trainers: u32,
    /// PS shards.
    pub ps: u32,
    /// Cores per data executor.
    pub data_executor_cpu: f64,
    /// Cores per trainer.
    pub trainer_cpu: f64,
    /// Cores per PS shard.
    pub ps_cpu: f64,
}

/// One finished Job in the config DB.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigRecord {
    /// The Job's name.
    pub job: String,
    /// What it was.
    pub features: JobFeatures,
    /// What it ended with.
    pub allocation: RoleCounts,
    /// Its trainers' samples per second at the end.
    pub samples_per_second: f64,
}

/// A warm start: the smoothed allocation and the Jobs it drew on, most similar first.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    /// The allocation to start with.
    pub allocation: RoleCounts,
    /// The Jobs it came from, with their similarity (0..=1), most similar first.
    pub drawn_on: Vec<(String, f64)>,
}

/// How alike two Jobs are, 0..=1: the mean over their features, each 1 when equal (a
/// numeric feature falls with the ratio of the two values: 1/2 at a factor of e).
pub fn similarity(a: &JobFeatures, b: &JobFeatures) -> f64 {
    let ratio = |x: f64, y: f64| {
        let (x, y) = (x.max(1.0), y.max(1.0));
        1.0 / (1.0 + (x / y).ln().abs())
    };
    let parts = [
        f64::from(u8::from(a.model_kind == b.model_kind)),
        ratio(f64::from(a.tables), f64::from(b.tables)),
        ratio(a.embedding_width as f64, b.embedding_width as f64),
        ratio(a.dense_parameters as f64, b.dense_parameters as f64),
        ratio(f64::from(a.batch_size), f64::from(b.batch_size)),
    ];
    parts.iter().sum::<f64>() / parts.len() as f64
}

/// Alg. 1: the `k` records most similar to `job`, smoothed with factor `mu` (0 < mu < 1)
/// from the least similar to the most, by Eq. 10; None when `records` is empty. Counts
/// are rounded and at least 1; cores keep two decimals.
pub fn warm_start(
    records: &[ConfigRecord],
    job: &JobFeatures,
    k: usize,
    mu: f64,
) -> Option<WarmStart> {
    let mut ranked: Vec<(&ConfigRecord, f64)> = records
        .iter()
        .map(|r| (r, similarity(&r.features, job)))
        .collect();
    // Most similar first; ties by name, so the choice does not depend on the DB's order.
    ranked.sort_by(|(a, x), (b, y)| y.total_cmp(x).then_with(|| a.job.cmp(&b.job)));
    ranked.truncate(k.max(1));
    // A^0 is the least similar of the k, A^(k-1) the most.
    let mut order = ranked.iter().rev();
    let (first, _) = order.next()?;
    let mut smoothed = as_vector(&first.allocation);
    for (record, _) in order {
        let next = as_vector(&record.allocation);
        for (s, n) in smoothed.iter_mut().zip(next) {
            *s = mu * n + (1.0 - mu) * *s;
        }
    }
    Some(WarmStart {
        allocation: from_vector(smoothed),
        drawn_on: ranked
            .iter()
            .map(|(r, similarity)| (r.job.clone(), *similarity))
            .collect(),
    })
}

fn as_vector(a: &RoleCounts) -> [f64; 6] {
    [
        f64::from(a.data_executors),
        f64::from(a.trainers),
        f64::from(a.ps),
        a.data_executor_cpu,
        a.trainer_cpu,
        a.ps_cpu,
    ]
}

fn from_vector(v: [f64; 6]) -> RoleCounts {
    let count = |x: f64| x.round().max(1.0) as u32;
    let cores = |x: f64| ((x * 100.0).round() / 100.0).max(0.01);
    RoleCounts {
        data_executors: count(v[0]),
        trainers: count(v[1]),
        ps: count(v[2]),
        data_executor_cpu: cores(v[3]),
        trainer_cpu: cores(v[4]),
        ps_cpu: cores(v[5]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(kind: &str, tables: u32, width: u64) -> JobFeatures {
        JobFeatures {
            model_kind: kind.into(),
            tables,
            embedding_width: width,
            dense_parameters: 500_000,
            batch_size: 2048,
        }
    }

    fn record(job: &str, features: JobFeatures, trainers: u32, ps: u32) -> ConfigRecord {
        ConfigRecord {
            job: job.into(),
            features,
            allocation: RoleCounts {
                data_executors: 2,
                trainers,
                ps,
                data_executor_cpu: 1.0,
                trainer_cpu: 2.0,
                ps_cpu: 1.0,
            },
            samples_per_second: 10_000.0,
        }
    }

    #[test]
    fn similarity_is_one_for_equal_jobs_and_falls_with_every_difference() {
        let a = features("dlrm", 26, 416);
        assert_eq!(similarity(&a, &a), 1.0);
        let other_kind = features("deepfm", 26, 416);
        let wider = features("dlrm", 26, 416 * 8);
        assert!(similarity(&a, &other_kind) < 1.0);
        assert!(similarity(&a, &wider) < 1.0);
        assert!(similarity(&a, &features("deepfm", 2, 16)) < similarity(&a, &other_kind));
    }

    #[test]
    fn the_most_similar_jobs_weigh_most_by_eq_10() {
        let job = features("dlrm", 26, 416);
        let records = vec![
            record("far", features("wide_deep", 1, 8), 9, 9),
            record("near", features("dlrm", 26, 416), 4, 2),
            record("nearish", features("dlrm", 26, 832), 2, 4),
        ];
        let start = warm_start(&records, &job, 2, 0.6).expect("records");
        // k = 2: "nearish" is A^0, "near" A^1: 0.6 * near + 0.4 * nearish.
        assert_eq!(start.allocation.trainers, 3); // 0.6*4 + 0.4*2 = 3.2
        assert_eq!(start.allocation.ps, 3); // 0.6*2 + 0.4*4 = 2.8
        let names: Vec<&str> = start.drawn_on.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["near", "nearish"]);
        assert_eq!(start.drawn_on[0].1, 1.0);
    }

    #[test]
    fn an_empty_db_gives_no_warm_start_and_one_record_gives_itself() {
        let job = features("dlrm", 26, 416);
        assert_eq!(warm_start(&[], &job, 3, 0.5), None);
        let only = record("only", features("mtrm", 3, 48), 5, 3);
        let start = warm_start(std::slice::from_ref(&only), &job, 3, 0.5).expect("one");
        assert_eq!(start.allocation, only.allocation);
    }
}
