//! Evaluation metrics of binary classifiers and regressions, shared by the data generator
//! (the best achievable AUC of a data set), the trainer (progressive validation) and the
//! benchmarks.

#![warn(missing_docs)]

pub mod auc;
mod window;

pub use auc::auc;
pub use window::{ErrorWindow, EvalWindow, Evaluation};

/// Mean binary cross-entropy of probabilities against 0/1 labels; probabilities are clamped
/// away from 0 and 1 so one confident miss gives a large but finite loss.
pub fn logloss(probabilities: &[f64], labels: &[bool]) -> Option<f64> {
    let n = probabilities.len().min(labels.len());
    if n == 0 {
        return None;
    }
    let total: f64 = probabilities
        .iter()
        .zip(labels)
        .map(|(p, y)| {
            let p = p.clamp(1e-7, 1.0 - 1e-7);
            if *y { -p.ln() } else { -(1.0 - p).ln() }
        })
        .sum();
    Some(total / n as f64)
}

/// Mean prediction over mean label (1.0 is perfectly calibrated); `None` without positives.
pub fn calibration(probabilities: &[f64], labels: &[bool]) -> Option<f64> {
    let n = probabilities.len().min(labels.len());
    let positives = labels[..n].iter().filter(|y| **y).count();
    if positives == 0 {
        return None;
    }
    let predicted: f64 = probabilities[..n].iter().sum();
    Some(predicted / positives as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logloss_and_calibration_of_known_predictions() {
        let labels = [true, false];
        let loss = logloss(&[0.5, 0.5], &labels).expect("defined");
        assert!((loss - std::f64::consts::LN_2).abs() < 1e-12);
        assert!(logloss(&[1.0, 0.0], &labels).expect("defined") < 1e-6);
        assert!(logloss(&[0.0, 1.0], &labels).expect("defined").is_finite());
        assert_eq!(calibration(&[0.25, 0.25], &labels), Some(0.5));
        assert_eq!(calibration(&[0.25], &[false]), None);
        assert_eq!(logloss(&[], &[]), None);
    }
}
