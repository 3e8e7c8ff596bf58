//! `primus replay`: publishes a time-partitioned Parquet data set onto a JetStream subject
//! as `SampleRows` messages, in path order (which is time order for `date=/hour=`
//! partitions), at a given rate: a live stream for demos, tests and benchmarks of online
//! training.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::TryStreamExt;
use primus_bus::Bus;
use primus_config::NatsSettings;
use primus_proto::v1::SampleRows;
use primus_storage::parquet::{ReadOptions, read};

use primus_config::StorageSettings;

use crate::Failure;

#[derive(Args)]
pub struct ReplayArgs {
    /// The data set: a path, file://, s3://bucket/prefix (every .parquet file under it).
    #[arg(long)]
    from: String,
    /// JetStream stream (created over --subject when it does not exist).
    #[arg(long)]
    stream: String,
    /// Subject the rows are published on.
    #[arg(long)]
    subject: String,
    #[arg(long, env = "PRIMUS_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Rows per second (0: as fast as the server acks).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Rows per message.
    #[arg(long, default_value_t = 100)]
    rows_per_message: usize,
}

/// What a replay published.
struct Replayed {
    files: usize,
    rows: u64,
    messages: u64,
    elapsed: Duration,
}

pub async fn replay(args: ReplayArgs) -> Result<(), Failure> {
    if args.rate.is_nan() || args.rate < 0.0 {
        return Err(Failure::input(anyhow::anyhow!(
            "--rate {}: must be 0 (unpaced) or a positive number of rows per second",
            args.rate
        )));
    }
    if args.rows_per_message == 0 {
        return Err(Failure::input(anyhow::anyhow!(
            "--rows-per-message: must be at least 1"
        )));
    }
    let from = || format!("--from {}", args.from);
    let location = primus_storage::open(&args.from, &StorageSettings::default())
        .with_context(from)
        .map_err(Failure::input)?;
    let files: Vec<_> = location
        .list("")
        .await
        .with_context(from)
        .map_err(Failure::input)?
        .into_iter()
        .filter(|f| f.location.as_ref().ends_with(".parquet"))
        .collect();
    if files.is_empty() {
        return Err(Failure::input(anyhow::anyhow!(
            "--from {}: no .parquet file under it",
            args.from
        )));
    }
    let settings = NatsSettings {
        url: args.nats_url.clone(),
        ..NatsSettings::default()
    };
    let server = |e: primus_bus::BusError| Failure::server(e.into());
    let js = Bus::connect(&settings).await.map_err(server)?.jetstream();
    js.ensure_stream(&args.stream, vec![args.subject.clone()])
        .await
        .map_err(server)?;
    let started = Instant::now();
    let mut replayed = Replayed {
        files: files.len(),
        rows: 0,
        messages: 0,
        elapsed: Duration::ZERO,
    };
    let options = ReadOptions {
        batch_size: args.rows_per_message,
        ..ReadOptions::default()
    };
    for file in &files {
        let url = location.url_of(&file.location);
        let mut records = std::pin::pin!(
            read(&location, &file.location, &options)
                .await
                .with_context(|| url.clone())
                .map_err(Failure::input)?
        );
        while let Some(rows) = records
            .try_next()
            .await
            .with_context(|| url.clone())
            .map_err(Failure::input)?
        {
            let message = SampleRows {
                arrow_ipc: primus_batch::ipc::encode_rows(&rows)
                    .with_context(|| url.clone())
                    .map_err(Failure::input)?,
            };
            js.publish(args.subject.clone(), &message)
                .await
                .map_err(server)?;
            replayed.rows += rows.num_rows() as u64;
            replayed.messages += 1;
            if args.rate > 0.0 {
                let due = Duration::from_secs_f64(replayed.rows as f64 / args.rate);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
    }
    replayed.elapsed = started.elapsed();
    let seconds = replayed.elapsed.as_secs_f64().max(1e-9);
    println!(
        "published {} rows in {} messages from {} files to {} (stream {}) in {:.1} s ({:.0} rows/s)",
        replayed.rows,
        replayed.messages,
        replayed.files,
        args.subject,
        args.stream,
        seconds,
        replayed.rows as f64 / seconds
    );
    Ok(())
}
