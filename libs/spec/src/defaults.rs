//! Values of fields a resource file may leave out (serde `default = "..."` targets).

pub(crate) fn one() -> f64 {
    1.0
}

pub(crate) fn one_u32() -> u32 {
    1
}

pub(crate) fn max_auto_replicas() -> u32 {
    8
}

pub(crate) fn memory() -> String {
    "1Gi".into()
}

pub(crate) fn initial_accumulator() -> f64 {
    0.0
}

pub(crate) fn epsilon() -> f64 {
    1e-8
}

pub(crate) fn beta1() -> f64 {
    0.9
}

pub(crate) fn beta2() -> f64 {
    0.999
}

pub(crate) fn ftrl_beta() -> f64 {
    1.0
}

/// Scale data executors out when their weighted load exceeds this (Primus Eq. 1).
pub(crate) fn load_threshold() -> f64 {
    0.6
}

/// Scale data executors in when their weighted load is below this.
pub(crate) fn scale_in_threshold() -> f64 {
    0.25
}

pub(crate) fn cooldown_seconds() -> u64 {
    30
}

pub(crate) fn true_bool() -> bool {
    true
}

pub(crate) fn memory_samples() -> u32 {
    10
}

pub(crate) fn memory_horizon_seconds() -> u64 {
    60
}

pub(crate) fn memory_safety_margin() -> f64 {
    0.1
}

pub(crate) fn memory_min_change() -> String {
    "16Mi".to_owned()
}

/// A data executor at a third of its peers' rate is a straggler.
pub(crate) fn straggler_slowdown() -> f64 {
    3.0
}

/// Starving trainers are the main reason for more data executors.
pub(crate) fn starvation_weight() -> f64 {
    0.7
}

pub(crate) fn cpu_weight() -> f64 {
    0.2
}

pub(crate) fn memory_weight() -> f64 {
    0.1
}

pub(crate) fn sparse_interval_ms() -> u64 {
    500
}

pub(crate) fn dense_interval_seconds() -> u64 {
    60
}

/// Adam at 0.001: the usual choice for MLP weights.
pub(crate) fn dense_optimizer() -> crate::job::OptimizerSpec {
    crate::job::OptimizerSpec::Adam {
        learning_rate: 0.001,
        beta1: beta1(),
        beta2: beta2(),
        epsilon: epsilon(),
    }
}

pub(crate) fn full_every() -> u32 {
    4
}

pub(crate) fn batch_size() -> u32 {
    2048
}

pub(crate) fn eval_window() -> u32 {
    100_000
}

/// How long a joiner's feature row waits for its action (Monolith keeps it minutes).
pub(crate) fn join_wait_seconds() -> f64 {
    600.0
}

pub(crate) fn join_memory_rows() -> u64 {
    100_000
}
