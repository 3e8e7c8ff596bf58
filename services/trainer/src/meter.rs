//! What a trainer counts and reports: samples, steps and samples per source since it
//! started, the totals its confirmed pushes hold, progressive-validation metrics (of the
//! head on the Dataset's label, and of each head of a model with several), and per
//! interval the loss, the time shares of lookup, compute and push, and the hot set's
//! share of accesses; and where the reports go ([`Reporter`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use primus_data_client::TrainerTotals;
use primus_metrics::{ErrorWindow, EvalWindow, Evaluation};
use primus_model::{HeadSlot, LabelColumn, StepOutput, StepTimes};
use primus_spec::job::graph::Loss;

/// Counters since the trainer started and since the last report.
#[derive(Debug, Clone)]
pub struct Meter {
    pub samples: u64,
    pub steps: u64,
    /// Samples per source, summing to `samples`.
    pub sources: BTreeMap<String, u64>,
    /// The totals of the minibatches whose pushes landed, as last confirmed: what reports
    /// say, so no count leaving the trainer holds a minibatch that is served again if it
    /// dies now.
    pub(crate) confirmed: TrainerTotals,
    /// Scores the head on the Dataset's label (the four kinds' one head).
    pub(crate) window: EvalWindow,
    /// That head's index, if the model has a binary one on the label.
    main_head: Option<usize>,
    /// Every head, where the model has another than the main one.
    heads: Vec<HeadMeter>,
    /// When the interval began: the last report, or this trainer's first step.
    pub(crate) since: Instant,
    /// Whether this trainer has begun a step.
    pub(crate) stepped: bool,
    pub(crate) interval_samples: u64,
    pub(crate) interval_loss: f64,
    pub(crate) interval_steps: u64,
    pub(crate) lookup: Duration,
    pub(crate) compute: Duration,
    pub(crate) push: Duration,
    /// The interval's compute, part by part.
    pub(crate) step_times: StepTimes,
    pub(crate) interval_accesses: u64,
    pub(crate) interval_hot_accesses: u64,
    pub(crate) hot_rows: usize,
}

/// One head's interval loss and progressive scores.
#[derive(Debug, Clone)]
struct HeadMeter {
    name: String,
    interval_loss: f64,
    scores: HeadScores,
}

#[derive(Debug, Clone)]
enum HeadScores {
    Binary(EvalWindow),
    Regression(ErrorWindow),
}

/// One head's figures in a report.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadReport {
    pub name: String,
    /// Mean training loss of the interval's steps (unweighted).
    pub loss: Option<f64>,
    /// Progressive AUC and log loss of a binary head.
    pub auc: Option<f64>,
    pub logloss: Option<f64>,
    /// Progressive root mean squared error of a regression head.
    pub rmse: Option<f64>,
}

/// What one report says.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Samples and steps of the minibatches confirmed consumed (their pushes landed); the
    /// one just trained is counted from the next confirmation.
    pub samples: u64,
    pub steps: u64,
    /// Samples per source, confirmed likewise.
    pub sources: BTreeMap<String, u64>,
    /// Samples trained in the interval, confirmed or not.
    pub samples_per_second: f64,
    /// Mean training loss of the interval's steps.
    pub loss: Option<f64>,
    /// The head on the Dataset's label, scored before each sample trained.
    pub evaluation: Evaluation,
    /// Each head, where the model has several (or one that is not a binary one on the
    /// Dataset's label).
    pub heads: Vec<HeadReport>,
    /// Shares of the interval's wall time spent looking up (the prefetch, and the late
    /// lookups with the dense pull beside them), computing and pushing (with the next
    /// minibatch's rows, read in the same calls, where no hot set is on).
    pub lookup_share: f64,
    pub compute_share: f64,
    pub push_share: f64,
    /// The interval's compute time by part, summed over its steps.
    pub step_times: StepTimes,
    /// Rows replicated in the hot set (0 without one).
    pub hot_rows: usize,
    /// Share of the interval's key accesses the hot rows served (`None` without a hot set).
    pub hot_share: Option<f64>,
}

impl Meter {
    /// A meter of a model with `heads`, each scored over its latest `eval_window` samples.
    pub fn new(eval_window: usize, heads: &[HeadSlot]) -> Self {
        let main_head = (heads.iter())
            .position(|h| h.column == LabelColumn::Label && h.loss == Loss::BinaryCrossEntropy);
        let only_main = heads.len() == 1 && main_head.is_some();
        let heads = match only_main {
            true => Vec::new(),
            false => (heads.iter())
                .map(|head| HeadMeter {
                    name: head.name.clone(),
                    interval_loss: 0.0,
                    scores: match head.loss {
                        Loss::BinaryCrossEntropy => {
                            HeadScores::Binary(EvalWindow::new(eval_window))
                        }
                        Loss::SquaredError => HeadScores::Regression(ErrorWindow::new(eval_window)),
                    },
                })
                .collect(),
        };
        Self {
            main_head,
            heads,
            samples: 0,
            steps: 0,
            sources: BTreeMap::new(),
            confirmed: TrainerTotals::default(),
            window: EvalWindow::new(eval_window),
            since: Instant::now(),
            stepped: false,
            interval_samples: 0,
            interval_loss: 0.0,
            interval_steps: 0,
            lookup: Duration::ZERO,
            compute: Duration::ZERO,
            push: Duration::ZERO,
            step_times: StepTimes::default(),
            interval_accesses: 0,
            interval_hot_accesses: 0,
            hot_rows: 0,
        }
    }

    /// The counters since the trainer (or the Job it continues) started.
    pub fn totals(&self) -> TrainerTotals {
        TrainerTotals {
            steps: self.steps,
            samples: self.samples,
            sources: self.sources.clone(),
        }
    }

    /// Every minibatch counted so far has landed; returns the totals now confirmed.
    pub(crate) fn confirm(&mut self) -> &TrainerTotals {
        self.confirmed = self.totals();
        &self.confirmed
    }

    /// A step begins. The first one restarts the interval: until its first minibatch
    /// came (the data executors opening their files) the trainer was not training, and
    /// its rate would otherwise count that wait. Later waits for data do count.
    pub(crate) fn step_begins(&mut self) {
        if !self.stepped {
            self.stepped = true;
            self.since = Instant::now();
        }
    }

    /// Counts a trained minibatch of `rows` samples from `source`.
    pub(crate) fn count(&mut self, source: &str, rows: u64) {
        self.samples += rows;
        self.steps += 1;
        match self.sources.get_mut(source) {
            Some(samples) => *samples += rows,
            None => drop(self.sources.insert(source.to_owned(), rows)),
        }
    }

    /// Scores a step's predictions against each head's `labels` (before the step's
    /// update reached the model: progressive validation) and adds its losses.
    pub(crate) fn score(&mut self, output: &StepOutput, labels: &[&[f32]]) {
        self.interval_loss += f64::from(output.loss);
        if let Some(main) = self
            .main_head
            .and_then(|h| output.heads.get(h).zip(labels.get(h)))
        {
            self.window.add(&main.0.predictions, main.1);
        }
        for ((meter, head), labels) in self.heads.iter_mut().zip(&output.heads).zip(labels) {
            meter.interval_loss += f64::from(head.loss);
            match &mut meter.scores {
                HeadScores::Binary(window) => window.add(&head.predictions, labels),
                HeadScores::Regression(window) => window.add(&head.predictions, labels),
            }
        }
    }

    /// The interval's figures; starts a new interval.
    pub fn report(&mut self) -> Report {
        let elapsed = self.since.elapsed().as_secs_f64().max(1e-9);
        let share = |d: Duration| d.as_secs_f64() / elapsed;
        let report = Report {
            samples: self.confirmed.samples,
            steps: self.confirmed.steps,
            sources: self.confirmed.sources.clone(),
            samples_per_second: self.interval_samples as f64 / elapsed,
            loss: (self.interval_steps > 0)
                .then(|| self.interval_loss / self.interval_steps as f64),
            evaluation: self.window.evaluate(),
            heads: (self.heads.iter_mut())
                .map(|head| head.report(self.interval_steps))
                .collect(),
            lookup_share: share(self.lookup),
            compute_share: share(self.compute),
            push_share: share(self.push),
            step_times: std::mem::take(&mut self.step_times),
            hot_rows: self.hot_rows,
            hot_share: (self.hot_rows > 0 && self.interval_accesses > 0)
                .then(|| self.interval_hot_accesses as f64 / self.interval_accesses as f64),
        };
        self.since = Instant::now();
        self.interval_samples = 0;
        self.interval_loss = 0.0;
        self.interval_steps = 0;
        self.lookup = Duration::ZERO;
        self.compute = Duration::ZERO;
        self.push = Duration::ZERO;
        self.interval_accesses = 0;
        self.interval_hot_accesses = 0;
        report
    }
}

impl HeadMeter {
    /// The interval's figures of `steps` steps; starts a new interval.
    fn report(&mut self, steps: u64) -> HeadReport {
        let loss = std::mem::take(&mut self.interval_loss);
        let (evaluation, rmse) = match &self.scores {
            HeadScores::Binary(window) => (Some(window.evaluate()), None),
            HeadScores::Regression(window) => (None, window.rmse()),
        };
        HeadReport {
            name: self.name.clone(),
            loss: (steps > 0).then(|| loss / steps as f64),
            auc: evaluation.and_then(|e| e.auc),
            logloss: evaluation.and_then(|e| e.logloss),
            rmse,
        }
    }
}

/// Where a trainer's periodic reports go (NATS and the master in the service, a table in
/// benchmarks).
pub trait Reporter: Sync {
    fn report(&self, report: &Report) -> impl std::future::Future<Output = ()> + Send;

    /// Every minibatch before checkpoint `checkpoint_id`'s barrier is trained and pushed;
    /// `totals` are the trainer's at that moment. A failure is the checkpoint's (it is
    /// logged), never the training's.
    fn aligned(
        &self,
        checkpoint_id: u64,
        totals: &TrainerTotals,
    ) -> impl std::future::Future<Output = ()> + Send;
}

#[cfg(test)]
mod tests {
    use primus_model::HeadOutput;

    use super::*;

    fn slot(name: &str, column: LabelColumn, loss: Loss) -> HeadSlot {
        HeadSlot {
            name: name.into(),
            column,
            column_name: name.into(),
            loss,
        }
    }

    fn step(loss: f32, heads: Vec<HeadOutput>) -> StepOutput {
        StepOutput {
            loss,
            heads,
            dense_grads: Vec::new(),
            embedded_grad: Vec::new(),
            wide_grad: Vec::new(),
            times: StepTimes::default(),
        }
    }

    fn head(name: &str, loss: f32, predictions: &[f32]) -> HeadOutput {
        HeadOutput {
            name: name.into(),
            loss,
            predictions: predictions.to_vec(),
        }
    }

    #[test]
    fn a_model_of_several_heads_is_scored_head_by_head() {
        let slots = [
            slot("click", LabelColumn::Label, Loss::BinaryCrossEntropy),
            slot("watch", LabelColumn::Target(0), Loss::SquaredError),
        ];
        let mut meter = Meter::new(100, &slots);
        let output = step(
            3.0,
            vec![
                head("click", 0.5, &[0.9, 0.2, 0.7, 0.1]),
                head("watch", 5.0, &[1.0, 2.0, 3.0, 4.0]),
            ],
        );
        meter.interval_steps += 1;
        meter.score(&output, &[&[1.0, 0.0, 1.0, 0.0], &[1.0, 2.0, 3.0, 6.0]]);
        let report = meter.report();
        assert_eq!(report.loss, Some(3.0));
        assert_eq!(
            report.evaluation.auc,
            Some(1.0),
            "the click head is the Job's"
        );
        let click = HeadReport {
            name: "click".into(),
            loss: Some(0.5),
            auc: Some(1.0),
            logloss: report.evaluation.logloss,
            rmse: None,
        };
        // Errors 0, 0, 0 and 2: sqrt(4 / 4).
        let watch = HeadReport {
            name: "watch".into(),
            loss: Some(5.0),
            auc: None,
            logloss: None,
            rmse: Some(1.0),
        };
        assert_eq!(report.heads, [click, watch]);
        assert_eq!(meter.report().heads[0].loss, None, "a new interval");
    }

    #[test]
    fn the_one_head_of_the_four_kinds_is_the_job_s_evaluation_alone() {
        let slots = [slot("label", LabelColumn::Label, Loss::BinaryCrossEntropy)];
        let mut meter = Meter::new(100, &slots);
        meter.interval_steps += 1;
        meter.score(
            &step(0.4, vec![head("label", 0.4, &[0.8, 0.3])]),
            &[&[1.0, 0.0]],
        );
        let report = meter.report();
        assert_eq!(report.evaluation.auc, Some(1.0));
        assert!(report.heads.is_empty(), "{:?}", report.heads);
    }
}
