//! A seeded generator (SplitMix64): a trace and a Job's faults are reproducible from the
//! seed alone.

/// SplitMix64 with the distributions the trace draws from.
#[derive(Debug, Clone)]
pub(crate) struct Random(u64);

impl Random {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// An independent stream for `index` (a Job) of the same seed.
    pub(crate) fn stream(seed: u64, index: u64) -> Self {
        let mut mixed = Self(seed ^ index.wrapping_mul(0xa076_1d64_78bd_642f));
        mixed.next();
        mixed
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [low, high).
    pub(crate) fn between(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * self.unit()
    }

    /// Uniform integer in [low, high].
    pub(crate) fn integer(&mut self, low: u32, high: u32) -> u32 {
        low + (self.unit() * f64::from(high - low + 1)).floor() as u32
    }

    /// Whether an event of probability `p` happens.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Exponential with mean `mean`.
    pub(crate) fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let (u, v) = (1.0 - self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Log-normal whose median is `median`, with log-spread `sigma`.
    pub(crate) fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}
