//! `primus datagen`: synthetic data sets written as time-partitioned Parquet to any object
//! store URL (see primus-datagen).

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand, ValueEnum};
use primus_config::StorageSettings;
use primus_datagen::criteo::CriteoOptions;
use primus_datagen::sessions::{RowOrder, SessionLength, SessionOptions};
use primus_datagen::write::{Layout, Summary, criteo, sessions};
use primus_spec::dataset::WindowUnit;
use primus_spec::time::parse_window_time;

use crate::Failure;

#[derive(Subcommand)]
pub enum DatagenCommand {
    /// Criteo-like clicks: label, i1..i13 counts, c1..c26 Zipf ids; prints the best achievable
    /// AUC. With --drift-per-day the hidden model drifts over time (online/mixture data).
    /// With --tasks two more labels correlated with the click: `conversion` (0/1, only
    /// among clicks) and `log_watch_seconds` (continuous), and each one's best score.
    Criteo {
        #[command(flatten)]
        layout: LayoutArgs,
        #[arg(long, default_value_t = 100_000)]
        rows_per_window: usize,
        /// Multiplies Criteo's per-column cardinalities (10M for the largest).
        #[arg(long, default_value_t = 1.0)]
        cardinality_scale: f64,
        /// Zipf exponent of the ids.
        #[arg(long, default_value_t = 1.1)]
        zipf: f64,
        /// Radians the hidden weights rotate per day (0: no drift).
        #[arg(long, default_value_t = 0.0)]
        drift_per_day: f64,
        /// Adds the `conversion` and `log_watch_seconds` labels.
        #[arg(long)]
        tasks: bool,
    },
    /// RecD sessions: user features (dedup group `user`) change between a session's samples
    /// with --change-probability; item features are new for every sample.
    Sessions {
        #[command(flatten)]
        layout: LayoutArgs,
        #[arg(long, default_value_t = 5_000)]
        sessions_per_window: usize,
        /// Mean samples per session (heavy-tailed).
        #[arg(long, default_value_t = 16.5)]
        mean_session_len: f64,
        #[arg(long, default_value_t = 0.3)]
        change_probability: f64,
        #[arg(long, value_enum, default_value_t = Order::Time)]
        order: Order,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Order {
    Time,
    Clustered,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Unit {
    Hourly,
    Daily,
}

/// Where and how the files go. S3 URLs use the AWS_* environment (AWS_ENDPOINT,
/// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP).
#[derive(Args)]
pub struct LayoutArgs {
    /// Destination URL: a path, file://, s3://bucket/prefix, memory://.
    #[arg(long)]
    out: String,
    /// First window: YYYY-MM-DDTHH (hourly) or YYYY-MM-DD (daily).
    #[arg(long)]
    start: String,
    #[arg(long, value_enum, default_value_t = Unit::Hourly)]
    unit: Unit,
    #[arg(long, default_value_t = 24)]
    windows: usize,
    #[arg(long, default_value_t = 2)]
    files_per_window: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rows per Parquet row group.
    #[arg(long, default_value_t = 65_536)]
    row_group_rows: usize,
}

impl LayoutArgs {
    fn layout(&self) -> Result<Layout, Failure> {
        let start_unix_s = parse_window_time(&self.start).ok_or_else(|| {
            Failure::input(anyhow!(
                "--start {:?} is not YYYY-MM-DD or YYYY-MM-DDTHH",
                self.start
            ))
        })?;
        Ok(Layout {
            unit: match self.unit {
                Unit::Hourly => WindowUnit::Hourly,
                Unit::Daily => WindowUnit::Daily,
            },
            start_unix_s,
            windows: self.windows,
            files_per_window: self.files_per_window,
            row_group_rows: self.row_group_rows,
        })
    }
}

pub(crate) fn input(error: primus_datagen::DatagenError) -> Failure {
    match error {
        primus_datagen::DatagenError::Option { .. }
        | primus_datagen::DatagenError::Source { .. } => Failure::input(error.into()),
        other => Failure::server(other.into()),
    }
}

pub async fn datagen(command: DatagenCommand) -> Result<(), Failure> {
    let (args, summary) = match command {
        DatagenCommand::Criteo {
            layout,
            rows_per_window,
            cardinality_scale,
            zipf,
            drift_per_day,
            tasks,
        } => {
            let spec = layout.layout()?;
            let location = open(&layout.out)?;
            let options = CriteoOptions {
                seed: layout.seed,
                cardinality_scale,
                zipf_exponent: zipf,
                drift_radians_per_day: drift_per_day,
                epoch_unix_s: spec.start_unix_s,
                tasks,
            };
            let summary = criteo(&location, &spec, rows_per_window, options)
                .await
                .map_err(input)?;
            (layout, summary)
        }
        DatagenCommand::Sessions {
            layout,
            sessions_per_window,
            mean_session_len,
            change_probability,
            order,
        } => {
            let spec = layout.layout()?;
            let location = open(&layout.out)?;
            let options = SessionOptions {
                seed: layout.seed,
                length: SessionLength::HeavyTail {
                    mean: mean_session_len,
                },
                change_probability,
                order: match order {
                    Order::Time => RowOrder::Time,
                    Order::Clustered => RowOrder::Clustered,
                },
                ..Default::default()
            };
            let summary = sessions(&location, &spec, sessions_per_window, options)
                .await
                .map_err(input)?;
            (layout, summary)
        }
    };
    report(&args.out, &summary);
    Ok(())
}

pub(crate) fn open(url: &str) -> Result<primus_storage::Location, Failure> {
    open_as("--out", url)
}

/// The location of command-line flag `flag`'s URL.
pub(crate) fn open_as(flag: &str, url: &str) -> Result<primus_storage::Location, Failure> {
    primus_storage::open(url, &StorageSettings::default())
        .with_context(|| format!("{flag} {url}"))
        .map_err(Failure::input)
}

fn report(out: &str, summary: &Summary) {
    println!(
        "wrote {} rows in {} files ({:.1} MiB) to {out}",
        summary.rows,
        summary.files,
        summary.bytes as f64 / (1024.0 * 1024.0)
    );
    if let Some(auc) = summary.best_auc {
        println!("best achievable AUC (the hidden model's own): {auc:.4}");
    }
    if let Some(tasks) = summary.tasks {
        if let Some(auc) = tasks.conversion_auc {
            println!("conversion: best achievable AUC {auc:.4}");
        }
        println!(
            "log_watch_seconds: best achievable RMSE {:.4} (the best constant's {:.4})",
            tasks.watch_rmse, tasks.watch_deviation
        );
    }
    if summary.sessions > 0 {
        println!(
            "{} sessions, {:.2} samples per session",
            summary.sessions,
            summary.rows as f64 / summary.sessions as f64
        );
    }
}
