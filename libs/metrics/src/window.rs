//! Progressive validation: every prediction is scored before the model trains on its sample,
//! over a sliding window of the most recent samples (Monolith and Primus report online AUC
//! this way; it needs no held-out split for a stream).

use std::collections::VecDeque;

/// The most recent `capacity` values pushed.
#[derive(Debug, Clone)]
struct Recent<T> {
    capacity: usize,
    values: VecDeque<T>,
}

impl<T> Recent<T> {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            values: VecDeque::with_capacity(capacity.max(1)),
        }
    }

    fn push(&mut self, value: T) {
        if self.values.len() == self.capacity {
            self.values.pop_front();
        }
        self.values.push_back(value);
    }
}

/// The most recent `capacity` (probability, label) pairs.
#[derive(Debug, Clone)]
pub struct EvalWindow {
    pairs: Recent<(f64, bool)>,
}

/// Metrics over the window's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Samples evaluated.
    pub samples: usize,
    /// Area under the ROC curve (none without both classes).
    pub auc: Option<f64>,
    /// Mean log loss.
    pub logloss: Option<f64>,
    /// Mean prediction over mean label.
    pub calibration: Option<f64>,
}

impl EvalWindow {
    /// A window of the last `capacity` samples.
    pub fn new(capacity: usize) -> Self {
        Self {
            pairs: Recent::new(capacity),
        }
    }

    /// Adds scored samples (each scored before it was trained on).
    pub fn add(&mut self, probabilities: &[f32], labels: &[f32]) {
        for (p, y) in probabilities.iter().zip(labels) {
            self.pairs.push((f64::from(*p), *y >= 0.5));
        }
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.pairs.values.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.pairs.values.is_empty()
    }

    /// AUC, log loss and calibration over the samples held.
    pub fn evaluate(&self) -> Evaluation {
        let (probabilities, labels): (Vec<f64>, Vec<bool>) =
            self.pairs.values.iter().copied().unzip();
        Evaluation {
            samples: probabilities.len(),
            auc: crate::auc(&probabilities, &labels),
            logloss: crate::logloss(&probabilities, &labels),
            calibration: crate::calibration(&probabilities, &labels),
        }
    }
}

/// The most recent `capacity` (prediction, target) pairs of a regression.
#[derive(Debug, Clone)]
pub struct ErrorWindow {
    pairs: Recent<(f64, f64)>,
}

impl ErrorWindow {
    /// A window of the last `capacity` samples.
    pub fn new(capacity: usize) -> Self {
        Self {
            pairs: Recent::new(capacity),
        }
    }

    /// Adds predictions (each made before the model trained on its sample) and targets.
    pub fn add(&mut self, predictions: &[f32], targets: &[f32]) {
        for (p, y) in predictions.iter().zip(targets) {
            self.pairs.push((f64::from(*p), f64::from(*y)));
        }
    }

    /// Root mean squared error over the samples held (none without samples).
    pub fn rmse(&self) -> Option<f64> {
        let n = self.pairs.values.len();
        let squares: f64 = self
            .pairs
            .values
            .iter()
            .map(|(p, y)| (p - y) * (p - y))
            .sum();
        (n > 0).then(|| (squares / n as f64).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_window_scores_only_the_newest_samples() {
        let mut window = ErrorWindow::new(2);
        assert_eq!(window.rmse(), None);
        window.add(&[10.0], &[0.0]);
        assert_eq!(window.rmse(), Some(10.0));
        // Errors 3 and 4 push the first out: sqrt((9 + 16) / 2).
        window.add(&[1.0, -2.0], &[-2.0, 2.0]);
        assert_eq!(window.rmse(), Some(12.5f64.sqrt()));
    }

    #[test]
    fn keeps_only_the_newest_samples() {
        let mut window = EvalWindow::new(4);
        // Four inverted pairs, then four perfectly ranked ones push them out.
        window.add(&[0.9, 0.8, 0.1, 0.2], &[0.0, 0.0, 1.0, 1.0]);
        assert_eq!(window.evaluate().auc, Some(0.0));
        window.add(&[0.1, 0.2, 0.8, 0.9], &[0.0, 0.0, 1.0, 1.0]);
        let evaluation = window.evaluate();
        assert_eq!(evaluation.samples, 4);
        assert_eq!(evaluation.auc, Some(1.0));
        let calibration = evaluation.calibration.expect("positives");
        assert!((calibration - 1.0).abs() < 1e-6, "{calibration}");
    }
}
