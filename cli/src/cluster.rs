//! `primus cluster`: RecD's clustering of stored Parquet data (primus-datagen's
//! `cluster`): each session's rows written together, and the storage ratio it achieved.

use clap::Args;
use primus_datagen::cluster::{ClusterOptions, cluster};

use crate::Failure;
use crate::datagen::{input, open_as};

#[derive(Args)]
pub struct ClusterArgs {
    /// The Parquet data set: a path, file://, s3://bucket/prefix, memory://.
    #[arg(long)]
    from: String,
    /// Where the clustered files go, at the same relative paths.
    #[arg(long)]
    out: String,
    /// The column naming a row's session (integers or strings).
    #[arg(long)]
    session_key: String,
    /// The column of a row's time (a timestamp, or Int64 Unix milliseconds): with
    /// --max-span-seconds, a session's rows are grouped only within that span.
    #[arg(long, requires = "max_span_seconds")]
    time_column: Option<String>,
    /// The longest time a group of one session's rows may cover.
    #[arg(long, requires = "time_column")]
    max_span_seconds: Option<f64>,
}

pub async fn run(args: ClusterArgs) -> Result<(), Failure> {
    let from = open_as("--from", &args.from)?;
    let out = open_as("--out", &args.out)?;
    let options = ClusterOptions {
        session_key: args.session_key.clone(),
        time_bound: args.time_column.zip(args.max_span_seconds),
    };
    let clustered = cluster(&from, &out, &options).await.map_err(input)?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "clustered {} rows of {} files by {} into {} groups: {:.1} MiB -> {:.1} MiB in {}, storage ratio {:.2}x",
        clustered.rows,
        clustered.files,
        args.session_key,
        clustered.groups,
        mib(clustered.bytes_before),
        mib(clustered.bytes_after),
        args.out,
        clustered.storage_ratio()
    );
    Ok(())
}
