//! Generated data laid out the way Parquet sources are read (`date=YYYY-MM-DD/hour=HH` or
//! `date=YYYY-MM-DD`, files `part-NNNNN.parquet`, zstd), one window at a time.

use arrow_array::RecordBatch;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use primus_metrics::auc;
use primus_spec::dataset::WindowUnit;
use primus_spec::time::{partition, window_seconds};
use primus_storage::Location;

use crate::criteo::{Criteo, CriteoOptions, Tasks};
use crate::sessions::{SessionOptions, Sessions};
use crate::{DatagenError, invalid};

/// Which windows to fill and how to cut them into files.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Hourly or daily partitions.
    pub unit: WindowUnit,
    /// Unix seconds of the first window.
    pub start_unix_s: i64,
    /// Windows written.
    pub windows: usize,
    /// Files per window.
    pub files_per_window: usize,
    /// Rows per row group.
    pub row_group_rows: usize,
}

impl Layout {
    fn check(&self) -> Result<(), DatagenError> {
        if self.windows == 0 {
            return Err(invalid("windows", "must be at least 1"));
        }
        if self.files_per_window == 0 {
            return Err(invalid("files_per_window", "must be at least 1"));
        }
        if self.row_group_rows == 0 {
            return Err(invalid("row_group_rows", "must be at least 1"));
        }
        Ok(())
    }

    fn window_start(&self, window: usize) -> i64 {
        self.start_unix_s + window as i64 * window_seconds(self.unit)
    }
}

/// What was written.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Rows written.
    pub rows: u64,
    /// Files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
    /// AUC of the hidden model's own probabilities: no model can do better on this data.
    pub best_auc: Option<f64>,
    /// Sessions written (session data).
    pub sessions: u64,
    /// With the Criteo-like data's `tasks`: what no model can beat on its further labels.
    pub tasks: Option<TaskBests>,
}

/// The best achievable scores of the further labels of Criteo-like data with `tasks`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TaskBests {
    /// AUC of the hidden conversion probabilities (none with a single class).
    pub conversion_auc: Option<f64>,
    /// RMSE of the hidden watch-time means: the noise's.
    pub watch_rmse: f64,
    /// RMSE of the best constant (the values' mean): their standard deviation.
    pub watch_deviation: f64,
}

impl TaskBests {
    fn of(tasks: &Tasks) -> Self {
        let n = tasks.watch.len().max(1) as f64;
        let rms =
            |errors: &mut dyn Iterator<Item = f64>| (errors.map(|e| e * e).sum::<f64>() / n).sqrt();
        let mean = tasks.watch.iter().sum::<f64>() / n;
        let pairs = tasks.watch.iter().zip(&tasks.watch_means);
        Self {
            conversion_auc: auc(&tasks.conversion_probabilities, &tasks.conversions),
            watch_rmse: rms(&mut pairs.map(|(value, hidden)| value - hidden)),
            watch_deviation: rms(&mut tasks.watch.iter().map(|value| value - mean)),
        }
    }
}

/// Writes one file; returns its size in bytes.
pub async fn write_file(
    location: &Location,
    relative: &str,
    batch: RecordBatch,
    row_group_rows: usize,
) -> Result<u64, DatagenError> {
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(row_group_rows.max(1)))
        .build();
    let path = location.path(relative);
    primus_storage::parquet::write(location, &path, batch.schema(), [batch], Some(properties))
        .await?;
    Ok(location.head(&path).await?.size)
}

fn file_name(layout: &Layout, window: usize, file: usize) -> String {
    format!(
        "{}/part-{file:05}.parquet",
        partition(layout.unit, layout.window_start(window))
    )
}

/// Criteo-like rows: `rows_per_window` per window, split evenly over its files.
pub async fn criteo(
    location: &Location,
    layout: &Layout,
    rows_per_window: usize,
    options: CriteoOptions,
) -> Result<Summary, DatagenError> {
    layout.check()?;
    let options_tasks = options.tasks;
    let mut generator = Criteo::new(options)?;
    let mut summary = Summary::default();
    let mut probabilities = Vec::new();
    let mut labels = Vec::new();
    let mut tasks = Tasks::default();
    for window in 0..layout.windows {
        for file in 0..layout.files_per_window {
            let rows = share(rows_per_window, layout.files_per_window, file);
            if rows == 0 {
                continue;
            }
            let generated = generator.generate(rows, layout.window_start(window))?;
            probabilities.extend(generated.probabilities);
            labels.extend(generated.labels);
            if let Some(generated) = generated.tasks {
                tasks.extend(generated);
            }
            let name = file_name(layout, window, file);
            summary.bytes +=
                write_file(location, &name, generated.batch, layout.row_group_rows).await?;
            summary.rows += rows as u64;
            summary.files += 1;
        }
    }
    summary.best_auc = auc(&probabilities, &labels);
    summary.tasks = options_tasks.then(|| TaskBests::of(&tasks));
    Ok(summary)
}

/// Session data: `sessions_per_window` sessions start in each window, split over its files
/// (a session's rows stay in one file).
pub async fn sessions(
    location: &Location,
    layout: &Layout,
    sessions_per_window: usize,
    options: SessionOptions,
) -> Result<Summary, DatagenError> {
    layout.check()?;
    let mut generator = Sessions::new(options)?;
    let mut summary = Summary::default();
    for window in 0..layout.windows {
        for file in 0..layout.files_per_window {
            let sessions = share(sessions_per_window, layout.files_per_window, file);
            if sessions == 0 {
                continue;
            }
            let batch = generator.generate(
                sessions,
                layout.window_start(window),
                window_seconds(layout.unit),
            )?;
            summary.rows += batch.num_rows() as u64;
            summary.sessions += sessions as u64;
            let name = file_name(layout, window, file);
            summary.bytes += write_file(location, &name, batch, layout.row_group_rows).await?;
            summary.files += 1;
        }
    }
    Ok(summary)
}

/// Part `index` of `total` split into `parts` nearly equal shares.
fn share(total: usize, parts: usize, index: usize) -> usize {
    total / parts + usize::from(index < total % parts)
}
