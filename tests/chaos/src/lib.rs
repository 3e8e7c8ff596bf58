//! The chaos suite's report. The suite itself (`tests/chaos.rs`) injects one fault per Job
//! into a real cluster (the master, data executors, trainers and PS shards as processes,
//! NATS and Redis as servers); each run's [`Outcome`] goes into a [`Report`]: a table of
//! fault, seconds to recover, rows lost, rows duplicated and AUC delta, ending with the
//! summary line `chaos: F faults, L rows lost, D rows duplicated, max AUC delta X`.

#![warn(missing_docs)]

use std::fmt::Write;

/// What one faulty run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The fault, in words.
    pub fault: &'static str,
    /// Seconds from the fault until the Job trained past where it was (none: it failed).
    pub recovered_s: Option<f64>,
    /// How many fewer samples the final model was trained on than the data has rows.
    pub lost: u64,
    /// How many more samples the final model was trained on than the data has rows.
    pub duplicated: u64,
    /// The AUC its final model served (none: the Job failed).
    pub auc: Option<f64>,
    /// |AUC - the undisturbed run's AUC| (none: the Job failed).
    pub auc_delta: Option<f64>,
    /// What happened (the rollback's message, or the failure's).
    pub note: String,
}

impl Outcome {
    /// The header of [`Report::table`] over rows of [`Outcome::row`]`(width)`.
    pub fn header(width: usize) -> String {
        format!(
            "{:<width$} {:>12} {:>10} {:>16} {:>7} {:>10}  note",
            "fault", "recovered s", "rows lost", "rows duplicated", "AUC", "AUC delta"
        )
    }

    /// Its row of [`Report::table`], the fault's name padded to `width`.
    pub fn row(&self, width: usize) -> String {
        let recovered = self
            .recovered_s
            .map_or("-".to_owned(), |s| format!("{s:.1}"));
        let auc = self.auc.map_or("-".to_owned(), |a| format!("{a:.4}"));
        let delta = self.auc_delta.map_or("-".to_owned(), |d| format!("{d:.4}"));
        format!(
            "{:<width$} {recovered:>12} {:>10} {:>16} {auc:>7} {delta:>10}  {}",
            self.fault, self.lost, self.duplicated, self.note
        )
    }
}

/// Every run's outcome.
#[derive(Debug, Default)]
pub struct Report {
    /// In the order the faults were injected.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// Rows lost over every run.
    pub fn lost(&self) -> u64 {
        self.outcomes.iter().map(|o| o.lost).sum()
    }

    /// Rows duplicated over every run.
    pub fn duplicated(&self) -> u64 {
        self.outcomes.iter().map(|o| o.duplicated).sum()
    }

    /// The largest AUC delta of a run that succeeded (0 when none did).
    pub fn max_auc_delta(&self) -> f64 {
        self.outcomes
            .iter()
            .filter_map(|o| o.auc_delta)
            .fold(0.0, f64::max)
    }

    /// The table, one row per fault, then the summary line.
    pub fn table(&self) -> String {
        let width = (self.outcomes.iter().map(|o| o.fault.len())).fold("fault".len(), usize::max);
        let mut out = format!("{}\n", Outcome::header(width));
        for o in &self.outcomes {
            let _ = writeln!(out, "{}", o.row(width));
        }
        out.push_str(&self.summary());
        out
    }

    /// `chaos: F faults, L rows lost, D rows duplicated, max AUC delta X`.
    pub fn summary(&self) -> String {
        format!(
            "chaos: {} faults, {} rows lost, {} rows duplicated, max AUC delta {:.4}",
            self.outcomes.len(),
            self.lost(),
            self.duplicated(),
            self.max_auc_delta()
        )
    }
}

/// SplitMix64: the moment of the `index`th fault from the suite's seed.
pub fn fault_draw(seed: u64, index: u64) -> u64 {
    let mut z =
        (seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
