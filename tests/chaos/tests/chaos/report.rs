//! The chaos report's table and summary line, and the seeded fault moments. They live in
//! the suite's binary, which `./scripts/test.sh` runs alone.

use primus_chaos::{Outcome, Report, fault_draw};

fn outcome(fault: &'static str, lost: u64, duplicated: u64, delta: Option<f64>) -> Outcome {
    Outcome {
        fault,
        recovered_s: delta.map(|_| 1.5),
        lost,
        duplicated,
        auc: delta.map(|d| 0.75 + d),
        auc_delta: delta,
        note: String::new(),
    }
}

#[test]
fn the_summary_adds_every_run_and_takes_the_largest_auc_delta_of_those_that_succeeded() {
    let report = Report {
        outcomes: vec![
            outcome("a", 0, 3, Some(0.002)),
            outcome("b", 5, 0, Some(0.004)),
            outcome("c", 0, 0, None),
        ],
    };
    assert_eq!(
        report.summary(),
        "chaos: 3 faults, 5 rows lost, 3 rows duplicated, max AUC delta 0.0040"
    );
    let table = report.table();
    assert!(table.ends_with(&report.summary()), "{table}");
    assert_eq!(table.lines().count(), 5, "{table}");
}

#[test]
fn the_columns_line_up_past_the_longest_fault() {
    let long = "a fault with a name longer than the header allows";
    let mut slow = outcome(long, 0, 0, Some(0.001));
    slow.recovered_s = Some(12.5);
    let report = Report {
        outcomes: vec![outcome("a", 0, 0, None), slow],
    };
    let table = report.table();
    let recovered: Vec<&str> = (table.lines().take(3))
        .map(|line| line[long.len() + 1..long.len() + 13].trim())
        .collect();
    assert_eq!(recovered, ["recovered s", "-", "12.5"], "{table}");
}

#[test]
fn fault_moments_follow_the_seed() {
    assert_eq!(fault_draw(1, 2), fault_draw(1, 2));
    assert_ne!(fault_draw(1, 2), fault_draw(2, 2));
    assert_ne!(fault_draw(1, 2), fault_draw(1, 3));
}
