//! `primus replay`: publishes a time-partitioned Parquet data set onto a JetStream subject
//! as `SampleRows` messages, in path order (which is time order for `date=/hour=`
//! partitions), at a given rate: a live stream for demos, tests and benchmarks of online
//! training. With `--actions-subject` it plays an online joiner's two logs instead: each
//! row's features with a request id on `--subject`, and an action (request id, label) for
//! every positive row on the actions subject, `--action-delay-ms` later.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow_array::{Array, ArrayRef, RecordBatch, UInt64Array};
use arrow_schema::DataType;
use clap::Args;
use futures::TryStreamExt;
use primus_bus::Bus;
use primus_bus::jetstream::JetStream;
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
    /// Publish as a joiner's two logs: features (no label, plus a request id) on
    /// --subject, an action (request id, label) for each positive row on this subject.
    #[arg(long)]
    actions_subject: Option<String>,
    /// With --actions-subject: the label column.
    #[arg(long, default_value = "label")]
    label: String,
    /// With --actions-subject: the request id column added to both logs.
    #[arg(long, default_value = "request_id")]
    request_id: String,
    /// With --actions-subject: how long after its features an action is published.
    #[arg(long, default_value_t = 0)]
    action_delay_ms: u64,
}

/// The joiner's logs of one replay: request ids count up from a per-replay prefix.
struct JoinLogs {
    subject: String,
    label: String,
    request_id: String,
    delay: Duration,
    next_id: u64,
    /// Actions not yet due, oldest first.
    delayed: VecDeque<(Instant, SampleRows)>,
    published: u64,
}

impl JoinLogs {
    fn new(args: &ReplayArgs, subject: String) -> Self {
        // A replay's ids must not meet another's still waiting in a joiner.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            subject,
            label: args.label.clone(),
            request_id: args.request_id.clone(),
            delay: Duration::from_millis(args.action_delay_ms),
            next_id: (nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) << 32,
            delayed: VecDeque::new(),
            published: 0,
        }
    }

    /// `rows` split into the features message (returned) and a delayed actions message.
    fn split(&mut self, rows: &RecordBatch) -> anyhow::Result<RecordBatch> {
        if rows.column_by_name(&self.request_id).is_some() {
            anyhow::bail!(
                "--request-id {}: the data set already has this column",
                self.request_id
            );
        }
        let labels = rows
            .column_by_name(&self.label)
            .with_context(|| format!("--label {}: no such column in the data set", self.label))?;
        let labels = arrow_cast::cast(labels, &DataType::Float64)
            .with_context(|| format!("--label {}: not numeric", self.label))?;
        let labels = labels
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .context("the label as f64")?;
        let ids =
            UInt64Array::from_iter_values(self.next_id..self.next_id + rows.num_rows() as u64);
        self.next_id += rows.num_rows() as u64;
        let positive: Vec<usize> = (0..labels.len())
            .filter(|&i| labels.is_valid(i) && labels.value(i) > 0.0)
            .collect();
        if !positive.is_empty() {
            let picked = UInt64Array::from_iter_values(positive.iter().map(|&i| i as u64));
            let action_ids = arrow_select::take::take(&ids, &picked, None)?;
            let action_labels = arrow_select::take::take(labels, &picked, None)?;
            let actions = RecordBatch::try_from_iter([
                (self.request_id.as_str(), action_ids),
                (self.label.as_str(), action_labels),
            ])?;
            let message = SampleRows {
                arrow_ipc: primus_batch::ipc::encode_rows(&actions)?,
            };
            self.delayed
                .push_back((Instant::now() + self.delay, message));
        }
        let mut columns: Vec<(String, ArrayRef)> = rows
            .schema()
            .fields()
            .iter()
            .zip(rows.columns())
            .filter(|(field, _)| *field.name() != self.label)
            .map(|(field, column)| (field.name().clone(), column.clone()))
            .collect();
        columns.push((self.request_id.clone(), Arc::new(ids)));
        Ok(RecordBatch::try_from_iter(columns)?)
    }

    /// Publishes the actions due by now, or all of them (waiting for each) with `all`.
    async fn publish_due(&mut self, js: &JetStream, all: bool) -> Result<(), primus_bus::BusError> {
        while let Some((due, _)) = self.delayed.front() {
            if !all && *due > Instant::now() {
                break;
            }
            tokio::time::sleep_until((*due).into()).await;
            if let Some((_, message)) = self.delayed.pop_front() {
                js.publish(self.subject.clone(), &message).await?;
                self.published += 1;
            }
        }
        Ok(())
    }
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
    let mut joiner = args
        .actions_subject
        .clone()
        .map(|subject| JoinLogs::new(&args, subject));
    let subjects = std::iter::once(args.subject.clone())
        .chain(joiner.as_ref().map(|j| j.subject.clone()))
        .collect();
    js.ensure_stream(&args.stream, subjects)
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
            let published = match &mut joiner {
                Some(joiner) => joiner
                    .split(&rows)
                    .with_context(|| url.clone())
                    .map_err(Failure::input)?,
                None => rows.clone(),
            };
            let message = SampleRows {
                arrow_ipc: primus_batch::ipc::encode_rows(&published)
                    .with_context(|| url.clone())
                    .map_err(Failure::input)?,
            };
            js.publish(args.subject.clone(), &message)
                .await
                .map_err(server)?;
            if let Some(joiner) = &mut joiner {
                joiner.publish_due(&js, false).await.map_err(server)?;
            }
            replayed.rows += rows.num_rows() as u64;
            replayed.messages += 1;
            if args.rate > 0.0 {
                let due = Duration::from_secs_f64(replayed.rows as f64 / args.rate);
                tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
            }
        }
    }
    if let Some(joiner) = &mut joiner {
        joiner.publish_due(&js, true).await.map_err(server)?;
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
    if let Some(joiner) = &joiner {
        println!(
            "published {} action messages (the positive rows) to {}",
            joiner.published, joiner.subject
        );
    }
    Ok(())
}
