//! Initial rows, deterministic per key: the same key and seed always give the same row, so a
//! trainer's lookup of a missing key and the row later created for it agree, and a replica
//! computes the same values without asking.

use primus_spec::job::Initializer;

use crate::hash::{mix, seeded};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    Zeros,
    Uniform(f32),
    Normal(f32),
}

impl Init {
    pub(crate) fn from_spec(spec: &Initializer) -> Self {
        match *spec {
            Initializer::Zeros => Self::Zeros,
            Initializer::Uniform { scale } => Self::Uniform(scale as f32),
            Initializer::Normal { std } => Self::Normal(std as f32),
        }
    }

    pub(crate) fn fill(&self, key: u64, seed: u64, out: &mut [f32]) {
        let base = seeded(key, seed);
        match *self {
            Self::Zeros => out.fill(0.0),
            Self::Uniform(scale) => {
                for (i, x) in out.iter_mut().enumerate() {
                    *x = (unit(mix(base.wrapping_add(i as u64))) * 2.0 - 1.0) * scale;
                }
            }
            Self::Normal(std) => {
                for (i, x) in out.iter_mut().enumerate() {
                    // Box-Muller from two independent uniforms.
                    let u1 = unit(mix(base.wrapping_add(2 * i as u64))).max(f32::MIN_POSITIVE);
                    let u2 = unit(mix(base.wrapping_add(2 * i as u64 + 1)));
                    *x = std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                }
            }
        }
    }
}

/// A uniform float in [0, 1) from the top 24 bits of a hash.
#[inline]
pub(crate) fn unit(hash: u64) -> f32 {
    (hash >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_seed_same_row() {
        let init = Init::Uniform(0.05);
        let (mut a, mut b, mut c) = ([0.0; 8], [0.0; 8], [0.0; 8]);
        init.fill(42, 7, &mut a);
        init.fill(42, 7, &mut b);
        init.fill(43, 7, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| x.abs() <= 0.05));
    }

    #[test]
    fn normal_has_the_asked_spread() {
        let init = Init::Normal(0.1);
        let mut values = Vec::new();
        for key in 0..2_000 {
            let mut row = [0.0; 8];
            init.fill(key, 1, &mut row);
            values.extend(row);
        }
        let n = values.len() as f32;
        let mean = values.iter().sum::<f32>() / n;
        let std = (values.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n).sqrt();
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((std - 0.1).abs() < 0.01, "std {std}");
    }
}
