//! A Job's progress as its status shows it: the trainers' totals folded from their
//! reports, the rows read and trained again per source, the share of a batch Job's rows
//! trained, its tasks by state, and its Metric resource.

use std::time::Duration;

use primus_spec::status::{Progress, SourceProgress, TaskProgress};
use primus_spec::time;

use super::JobRun;
use crate::metrics;
use primus_backend::ResourceBackend;
use primus_data_tasks::plan::{Catalog, StreamPlan};
use primus_data_tasks::queue::QueueCounts;
use primus_spec::time::unix_ms;
use tokio::time::Instant;

/// A pause in the reports this long means the last ones are in.
const REPORTS_SETTLED: Duration = Duration::from_millis(300);

/// The longest a succeeding Job waits for its last reports.
const FINAL_REPORTS_WAIT: Duration = Duration::from_secs(2);

/// Where a batch stream's windows start and how long each is: what tells a Job waiting
/// for a window to end from one that reads.
pub(super) struct BatchWindows {
    stream: String,
    start: i64,
    seconds: i64,
}

impl BatchWindows {
    pub(super) fn of(plan: &StreamPlan) -> Self {
        Self {
            stream: plan.name.clone(),
            start: plan.start,
            seconds: time::window_seconds(plan.unit),
        }
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// The `DataWindows` condition: true while the Job has read every window that has
    /// ended and waits for the next one to end (windows are planned once they are over),
    /// naming it; false once it reads again.
    pub(super) async fn show_waiting_windows(&mut self, counts: &QueueCounts) {
        let idle = counts.pending == 0 && counts.running == 0;
        let mut waiting = Vec::new();
        if idle && !self.planners.is_empty() {
            let now = unix_ms() / 1000;
            for windows in &self.batch_windows {
                let Ok((cursor, false)) = self.tasks.queue.cursor(&windows.stream).await else {
                    continue;
                };
                let next = cursor.unwrap_or(windows.start);
                if next + windows.seconds > now {
                    waiting.push(format!(
                        "stream {}: the window {} ends at {}:00 UTC",
                        windows.stream,
                        time::window_time(next),
                        time::window_time(next + windows.seconds)
                    ));
                }
            }
        }
        let before = self.writer.status.conditions.clone();
        let shown = before.iter().any(|c| c.kind == "DataWindows");
        match waiting.is_empty() {
            false => {
                let message = format!(
                    "every window that has ended is read; {} (a window is read once it has ended)",
                    waiting.join("; ")
                );
                self.writer
                    .condition("DataWindows", true, "WaitingForWindow", message);
            }
            true if shown => {
                let message = "reading the windows that have ended".to_owned();
                self.writer
                    .condition("DataWindows", false, "Reading", message);
            }
            true => {}
        }
        if self.writer.status.conditions != before {
            self.writer.write().await;
        }
    }

    /// Writes the Job's progress when it changed, and its Metric resource when new
    /// reports arrived.
    pub(super) async fn report_progress(&mut self, counts: &QueueCounts, all_planned: bool) {
        let metrics_changed = self.fold.tick(unix_ms());
        let progress = self.progress(counts, all_planned).await;
        if progress != self.writer.status.progress {
            self.writer.status.progress = progress;
            self.writer.write().await;
        }
        if metrics_changed {
            self.write_metric().await;
        }
    }

    /// The Job's progress: the trainers' totals, the rows read and trained again per
    /// source, the share of the rows trained (a batch Job whose windows are all planned)
    /// and its tasks. None before a trainer reported or a task with rows was read.
    async fn progress(&self, counts: &QueueCounts, all_planned: bool) -> Option<Progress> {
        let batch_only = all_planned && !self.has_streams;
        let mut progress = self.fold.progress();
        if progress.is_none() && batch_only && counts.rows_done > 0 {
            progress = Some(Progress::default());
        }
        let mut progress = progress?;
        self.count_retrained(&mut progress);
        self.count_read(&mut progress).await;
        // The trainers' totals continue from the checkpoint a rollback returned to, so
        // they already leave out what was trained again.
        if batch_only {
            progress.fraction = counts.row_fraction(progress.samples);
        }
        progress.tasks = self.job.reads_batch.then_some(TaskProgress {
            total: counts.total,
            pending: counts.pending,
            running: counts.running,
            succeeded: counts.succeeded,
            failed: counts.failed,
        });
        Some(progress)
    }

    /// Applies the Job's Metric resource from the fold, labelled as the Job is (a token
    /// limited to the Job's labels reads both).
    async fn write_metric(&self) {
        let labels = (self.specs.borrow().labels.iter())
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        metrics::write(&self.context.resources, &self.name, labels, &self.fold).await;
    }

    /// Folds the reports still in flight (a trainer's last one is sent just before it
    /// exits) into the Job's final progress and its Metric resource: those that come
    /// before a pause of [`REPORTS_SETTLED`], within [`FINAL_REPORTS_WAIT`] at most (the
    /// data executors report until they are stopped, so many of them never pause).
    pub(super) async fn write_final_metrics(&mut self, counts: &QueueCounts) {
        let deadline = Instant::now() + FINAL_REPORTS_WAIT;
        loop {
            let until = deadline.min(Instant::now() + REPORTS_SETTLED);
            match tokio::time::timeout_at(until, self.reports.recv()).await {
                Ok(Some(report)) => self.fold.add(report),
                Ok(None) | Err(_) => break,
            }
        }
        self.fold.tick(unix_ms());
        let progress = self.progress(counts, true).await;
        self.writer.status.progress = progress.or(self.writer.status.progress.take());
        self.write_metric().await;
    }

    /// The rows served to trainers per source, from the task queue.
    pub(super) async fn count_read(&self, progress: &mut Progress) {
        let rows_read = match self.tasks.queue.rows_read().await {
            Ok(rows_read) => rows_read,
            Err(e) => return tracing::warn!(job = self.name, error = %e, "reading rows read"),
        };
        for (source, rows) in rows_read {
            match progress.sources.iter_mut().find(|s| s.source == source) {
                Some(known) => known.rows_read = rows,
                None => progress.sources.push(SourceProgress {
                    source,
                    rows_read: rows,
                    ..SourceProgress::default()
                }),
            }
        }
        progress.sources.sort_by(|a, b| a.source.cmp(&b.source));
    }

    /// The samples trained again after rollbacks, in all and per source.
    pub(super) fn count_retrained(&self, progress: &mut Progress) {
        progress.retrained_samples = self.retrained_samples;
        for (source, retrained) in &self.retrained_sources {
            match progress.sources.iter_mut().find(|s| &s.source == source) {
                Some(known) => known.retrained_samples = *retrained,
                None => progress.sources.push(SourceProgress {
                    source: source.clone(),
                    retrained_samples: *retrained,
                    ..SourceProgress::default()
                }),
            }
        }
    }
}
