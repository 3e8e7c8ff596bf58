//! The hidden model's weights: a deterministic normal draw per (seed, feature, id), so a
//! generator needs no table of weights however large the id space is.

use primus_batch::hash::mix64;

fn unit(bits: u64) -> f64 {
    // 53 random bits in (0, 1]: never 0, so the logarithm below is finite.
    ((bits >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A standard normal value determined by `(seed, feature, id)` (Box-Muller).
pub(crate) fn normal(seed: u64, feature: u64, id: u64) -> f64 {
    let a = mix64(seed ^ mix64(feature.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(id)));
    let b = mix64(a ^ 0x5851_f42d_4c95_7f2d);
    (-2.0 * unit(a).ln()).sqrt() * (std::f64::consts::TAU * unit(b)).cos()
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::normal;

    #[test]
    fn draws_are_standard_normal_and_deterministic() {
        let n = 200_000u64;
        let draws: Vec<f64> = (0..n).map(|id| normal(7, 3, id)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
        assert_eq!(normal(7, 3, 11), normal(7, 3, 11));
        assert_ne!(normal(7, 3, 11), normal(8, 3, 11));
    }
}
