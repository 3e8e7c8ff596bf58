//! A job's data tasks in Redis (Primus §4.3.1): the batch task queue (pending, running,
//! succeeded, failed, with attempt counts and reported offsets) and the stream task graph
//! (stream bindings, assigned or unassigned). Every transition is one Lua script, so a
//! master can die at any point and the next one resumes from exactly what Redis holds.
//!
//! Keys, under `<p>:job:<job>:` (`<p>` is `redis.key_prefix`):
//! - `task` hash id -> DataTask protobuf (as planned: offset 0, attempt 0)
//! - `order` hash id -> queue order; `pending` sorted set of ids by order
//! - `running` hash id -> executor; `offset` hash id -> rows consumed; `attempts` hash
//! - `read` hash source -> rows its tasks' offsets moved forward by (rows served to
//!   trainers, counting again those served again after a rollback or restore)
//! - `succeeded` set of ids; `failed` hash id -> last error
//! - `bytes` hash id -> bytes the task reads (as planned); `rows` hash id -> rows a
//!   succeeded task served; `totals` hash: `bytes` (every planned task's), `bytes_done` and
//!   `rows_done` (the succeeded tasks'): the rows per byte a Job's progress is estimated by
//! - `cursor` hash stream -> start of the next window to plan; `planned` hash stream -> 1
//!   once a bounded stream is fully planned
//! - `executors` hash executor -> last heartbeat (unix ms)
//! - `stream` hash source -> executor ("" when unassigned); `stream_task` hash source ->
//!   DataTask protobuf; `position` hash stream task id -> its StreamPosition as
//!   `"<sequence> <rows>"` (only grows; a binding's next holder starts there)
//! - `checkpoint` hash: `latest` -> id of the newest checkpoint, `<id>` -> its record
//!   (JSON), `staged` -> the checkpoint whose barrier state is staged; `checkpoint:<id>:offset`,
//!   `checkpoint:<id>:position` and `checkpoint:<id>:succeeded`: copies of `offset`,
//!   `position` and `succeeded` taken at its barrier (under `checkpoint:staged:*` until it
//!   commits), for [`TaskQueue::rollback`]

#![expect(
    clippy::disallowed_methods,
    reason = "the task queue: the one place that reads and writes a Job's queue keys"
)]

use primus_proto::v1::{DataTask, StreamPosition};
use prost::Message;
use redis::Script;
use redis::aio::ConnectionManager;

use std::collections::HashMap;
use std::sync::Arc;

use crate::plan::{ORDER_WINDOW_DIVISOR, PlannedTask, task_bytes};

mod scripts;
use scripts::{
    ACQUIRE, COMMIT_CHECKPOINT, COUNTS, ENQUEUE, FINISH, PROGRESS, REQUEUE_EXECUTOR, ROLLBACK,
    STAGE_CHECKPOINT, TOUCH_KNOWN, YIELD_TASK,
};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("corrupt task {id:?} in Redis: {message}")]
    Corrupt { id: String, message: String },
    #[error("executors still hold tasks: the queue cannot be rolled back under them")]
    Busy,
    #[error("checkpoint {0} is not the one staged: it cannot be committed")]
    NotStaged(u64),
}

/// What [`TaskQueue::acquire`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    Task(Box<DataTask>),
    /// Tasks are pending, but all are further ahead of the oldest open window than
    /// `max_lead_hours` allows.
    Throttled,
    Empty,
}

/// How a finish report was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    Succeeded,
    Requeued,
    /// Out of attempts: the task is failed for good.
    Failed,
    /// The task is not this executor's (anymore): nothing changed.
    NotOwner,
}

/// Counts of a job's batch tasks, and the bytes and rows behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    pub total: u64,
    pub pending: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Bytes every planned task reads.
    pub bytes: u64,
    /// Bytes and rows of the tasks that succeeded.
    pub bytes_done: u64,
    pub rows_done: u64,
}

impl QueueCounts {
    /// The share of the batch rows `trained` covers: the rows the planned tasks hold are
    /// estimated by the rows per byte of those that succeeded (exact once every task has;
    /// files are cut by bytes, so a task's rows are only known once it is read). Until a
    /// task that held rows succeeded, the share of the bytes read (None before any is
    /// planned).
    pub fn row_fraction(&self, trained: u64) -> Option<f64> {
        if self.bytes == 0 {
            return None;
        }
        if self.rows_done == 0 || self.bytes_done == 0 {
            return Some(self.bytes_done as f64 / self.bytes as f64);
        }
        let rows = self.rows_done as f64 * self.bytes as f64 / self.bytes_done as f64;
        Some((trained as f64 / rows.max(1.0)).min(1.0))
    }
}

/// Every key of a job's queue, for [`TaskQueue::delete`].
const KEYS: [&str; 24] = [
    "task",
    "bytes",
    "rows",
    "totals",
    "read",
    "order",
    "pending",
    "running",
    "offset",
    "attempts",
    "succeeded",
    "failed",
    "cursor",
    "planned",
    "executors",
    "stream",
    "stream_task",
    "position",
    "checkpoint",
    "checkpoint:staged:offset",
    "checkpoint:staged:position",
    "checkpoint:staged:succeeded",
    "acquired_request",
    "acquired_task",
];

struct Scripts {
    stage_checkpoint: Script,
    commit_checkpoint: Script,
    rollback: Script,
    enqueue: Script,
    acquire: Script,
    progress: Script,
    finish: Script,
    requeue_executor: Script,
    yield_task: Script,
    counts: Script,
    touch_known: Script,
}

/// One job's task queue.
#[derive(Clone)]
pub struct TaskQueue {
    redis: ConnectionManager,
    prefix: String,
    scripts: Arc<Scripts>,
}

impl TaskQueue {
    pub fn new(redis: ConnectionManager, key_prefix: &str, job: &str) -> Self {
        Self {
            redis,
            prefix: format!("{key_prefix}:job:{job}:"),
            scripts: Arc::new(Scripts {
                stage_checkpoint: Script::new(STAGE_CHECKPOINT),
                commit_checkpoint: Script::new(COMMIT_CHECKPOINT),
                rollback: Script::new(ROLLBACK),
                enqueue: Script::new(ENQUEUE),
                acquire: Script::new(ACQUIRE),
                progress: Script::new(PROGRESS),
                finish: Script::new(FINISH),
                requeue_executor: Script::new(REQUEUE_EXECUTOR),
                yield_task: Script::new(YIELD_TASK),
                counts: Script::new(COUNTS),
                touch_known: Script::new(TOUCH_KNOWN),
            }),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// An invocation of `script` with the given keys of this job.
    fn invoke<'a>(&self, script: &'a Script, keys: &[&str]) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(self.key(key));
        }
        invocation
    }

    /// Adds one planned window and moves the stream's planning cursor past it, atomically.
    /// Tasks already known (planned before a restart) are not added twice.
    pub async fn enqueue_window(
        &self,
        stream: &str,
        next_cursor: i64,
        planned_all: bool,
        tasks: &[PlannedTask],
    ) -> Result<u64, QueueError> {
        let mut script = self.invoke(
            &self.scripts.enqueue,
            &[
                "task", "order", "pending", "cursor", "planned", "bytes", "totals",
            ],
        );
        script.arg(stream).arg(next_cursor);
        for planned in tasks {
            script
                .arg(&planned.task.id)
                .arg(planned.order)
                .arg(planned.task.encode_to_vec())
                .arg(task_bytes(&planned.task));
        }
        script.arg(if planned_all { "1" } else { "0" });
        Ok(script.invoke_async(&mut self.redis.clone()).await?)
    }

    /// Where planning of `stream` resumes, and whether it is complete.
    pub async fn cursor(&self, stream: &str) -> Result<(Option<i64>, bool), QueueError> {
        let mut redis = self.redis.clone();
        let cursor: Option<i64> = redis::cmd("HGET")
            .arg(self.key("cursor"))
            .arg(stream)
            .query_async(&mut redis)
            .await?;
        let planned: Option<String> = redis::cmd("HGET")
            .arg(self.key("planned"))
            .arg(stream)
            .query_async(&mut redis)
            .await?;
        Ok((cursor, planned.is_some()))
    }

    /// Declares stream bindings (unassigned unless already known).
    pub async fn add_stream_tasks(&self, tasks: &[DataTask]) -> Result<(), QueueError> {
        let mut redis = self.redis.clone();
        for task in tasks {
            redis::pipe()
                .atomic()
                .cmd("HSETNX")
                .arg(self.key("stream"))
                .arg(&task.source)
                .arg("")
                .ignore()
                .cmd("HSET")
                .arg(self.key("stream_task"))
                .arg(&task.source)
                .arg(task.encode_to_vec())
                .ignore()
                .query_async::<()>(&mut redis)
                .await?;
        }
        Ok(())
    }

    /// Hands `executor` an unassigned stream binding, else the first pending batch task
    /// (unless throttled). Counts as a heartbeat of `executor`. A `request` (non-empty)
    /// that was given a task before, which `executor` still holds, is given it again: its
    /// answer was lost on the way.
    pub async fn acquire(
        &self,
        executor: &str,
        request: &str,
        now_ms: i64,
        max_lead_hours: u64,
    ) -> Result<Acquired, QueueError> {
        let mut script = self.invoke(
            &self.scripts.acquire,
            &[
                "pending",
                "running",
                "task",
                "offset",
                "attempts",
                "executors",
                "order",
                "stream",
                "stream_task",
                "position",
                "acquired_request",
                "acquired_task",
            ],
        );
        script
            .arg(executor)
            .arg(now_ms)
            .arg(max_lead_hours)
            .arg(ORDER_WINDOW_DIVISOR)
            .arg(request);
        let reply: Vec<Vec<u8>> = script.invoke_async(&mut self.redis.clone()).await?;
        match reply.first().map(Vec::as_slice) {
            Some(b"batch" | b"stream") => {
                let field = |i: usize| reply.get(i).map(Vec::as_slice).unwrap_or_default();
                let mut task = DataTask::decode(field(1)).map_err(|e| QueueError::Corrupt {
                    id: String::from_utf8_lossy(field(1)).into_owned(),
                    message: e.to_string(),
                })?;
                task.start_offset = parse_number(field(2));
                task.attempt = parse_number(field(3)) as u32;
                task.stream_position = parse_position(field(4));
                Ok(Acquired::Task(Box::new(task)))
            }
            Some(b"throttled") => Ok(Acquired::Throttled),
            _ => Ok(Acquired::Empty),
        }
    }

    /// Records that `executor` consumed `offset` rows of `task_id` (a stream binding: up to
    /// `position`; an older position than the one known is ignored). False when the task
    /// is not this executor's.
    pub async fn report_progress(
        &self,
        executor: &str,
        task_id: &str,
        offset: u64,
        position: Option<&StreamPosition>,
        now_ms: i64,
    ) -> Result<bool, QueueError> {
        self.advance(executor, task_id, offset, position, Some(now_ms))
            .await
    }

    /// Moves task `task_id`, still `executor`'s, on to `offset` (and `position`) for rows
    /// a trainer received from it after it died; no heartbeat of the executor. False when
    /// the executor no longer holds the task.
    pub async fn advance_received(
        &self,
        executor: &str,
        task_id: &str,
        offset: u64,
        position: Option<&StreamPosition>,
    ) -> Result<bool, QueueError> {
        self.advance(executor, task_id, offset, position, None)
            .await
    }

    /// The progress script; `heartbeat_ms` records the executor as alive at that time.
    async fn advance(
        &self,
        executor: &str,
        task_id: &str,
        offset: u64,
        position: Option<&StreamPosition>,
        heartbeat_ms: Option<i64>,
    ) -> Result<bool, QueueError> {
        let mut script = self.invoke(
            &self.scripts.progress,
            &[
                "running",
                "offset",
                "executors",
                "stream",
                "position",
                "read",
            ],
        );
        script
            .arg(task_id)
            .arg(executor)
            .arg(offset)
            .arg(heartbeat_ms.unwrap_or(0));
        match position {
            Some(p) => script.arg(p.sequence).arg(p.rows),
            None => script.arg("").arg(""),
        };
        script.arg(if heartbeat_ms.is_some() { "1" } else { "0" });
        let owned: i64 = script.invoke_async(&mut self.redis.clone()).await?;
        Ok(owned == 1)
    }

    /// Ends an attempt: success, or a failure that re-queues the task (from its last
    /// offset) until it has had `max_attempts`.
    pub async fn finish(
        &self,
        executor: &str,
        task_id: &str,
        error: &str,
        max_attempts: u32,
        now_ms: i64,
    ) -> Result<Finished, QueueError> {
        let mut script = self.invoke(
            &self.scripts.finish,
            &[
                "running",
                "succeeded",
                "failed",
                "pending",
                "order",
                "attempts",
                "offset",
                "executors",
                "stream",
                "bytes",
                "rows",
                "totals",
            ],
        );
        script
            .arg(task_id)
            .arg(executor)
            .arg(error)
            .arg(max_attempts)
            .arg(now_ms);
        let reply: String = script.invoke_async(&mut self.redis.clone()).await?;
        Ok(match reply.as_str() {
            "succeeded" => Finished::Succeeded,
            "requeued" => Finished::Requeued,
            "failed" => Finished::Failed,
            _ => Finished::NotOwner,
        })
    }

    /// Records a heartbeat of an executor the queue already knows; an executor declared
    /// lost comes back only by registering again.
    pub async fn touch_known(&self, executor: &str, now_ms: i64) -> Result<(), QueueError> {
        let mut script = self.invoke(&self.scripts.touch_known, &["executors"]);
        script.arg(executor).arg(now_ms);
        script.invoke_async::<()>(&mut self.redis.clone()).await?;
        Ok(())
    }

    /// Records a heartbeat of `executor` (registration).
    pub async fn touch(&self, executor: &str, now_ms: i64) -> Result<(), QueueError> {
        redis::cmd("HSET")
            .arg(self.key("executors"))
            .arg(executor)
            .arg(now_ms)
            .query_async::<()>(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// Executors whose last heartbeat is older than `deadline_ms`.
    pub async fn silent_executors(&self, deadline_ms: i64) -> Result<Vec<String>, QueueError> {
        let seen: Vec<(String, i64)> = redis::cmd("HGETALL")
            .arg(self.key("executors"))
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(seen
            .into_iter()
            .filter(|(_, at)| *at < deadline_ms)
            .map(|(executor, _)| executor)
            .collect())
    }

    /// Takes every task and stream binding away from a lost executor: running tasks go
    /// back to pending (keeping their offsets) or fail if out of attempts.
    pub async fn requeue_executor(
        &self,
        executor: &str,
        max_attempts: u32,
    ) -> Result<u64, QueueError> {
        let requeued = self.take_back(executor, max_attempts, false, None).await?;
        Ok(requeued.unwrap_or(0))
    }

    /// [`TaskQueue::requeue_executor`] for an executor found silent since `silent_before_ms`,
    /// unless it heartbeated (or registered again) since: then None, and it keeps its work.
    pub async fn requeue_silent_executor(
        &self,
        executor: &str,
        max_attempts: u32,
        silent_before_ms: i64,
    ) -> Result<Option<u64>, QueueError> {
        (self.take_back(executor, max_attempts, false, Some(silent_before_ms))).await
    }

    /// Takes every task and stream binding back from an executor the Job no longer runs
    /// (scaled in): its tasks go back to pending at their offsets, the attempt refunded.
    pub async fn release_executor(&self, executor: &str) -> Result<u64, QueueError> {
        let released = self.take_back(executor, u32::MAX, true, None).await?;
        Ok(released.unwrap_or(0))
    }

    /// Takes back the work of every executor recorded by a previous master, refunding the
    /// interrupted attempts. Returns how many tasks went back to pending.
    pub async fn requeue_previous_executors(&self) -> Result<u64, QueueError> {
        let executors: Vec<String> = redis::cmd("HKEYS")
            .arg(self.key("executors"))
            .query_async(&mut self.redis.clone())
            .await?;
        let mut requeued = 0;
        for executor in executors {
            requeued += (self.take_back(&executor, u32::MAX, true, None).await?).unwrap_or(0);
        }
        Ok(requeued)
    }

    async fn take_back(
        &self,
        executor: &str,
        max_attempts: u32,
        refund: bool,
        silent_before_ms: Option<i64>,
    ) -> Result<Option<u64>, QueueError> {
        let mut script = self.invoke(
            &self.scripts.requeue_executor,
            &[
                "running",
                "executors",
                "pending",
                "order",
                "attempts",
                "failed",
                "stream",
            ],
        );
        script
            .arg(executor)
            .arg(max_attempts)
            .arg(format!(
                "executor {executor} stopped heartbeating on its last allowed attempt ({max_attempts})"
            ))
            .arg(if refund { "1" } else { "0" })
            .arg(silent_before_ms.map_or(String::new(), |ms| ms.to_string()));
        let requeued: i64 = script.invoke_async(&mut self.redis.clone()).await?;
        Ok(u64::try_from(requeued).ok())
    }

    /// Puts task `task_id`, which `executor` gave back after serving its rows up to
    /// `served_offset`, back to pending from there (the attempt refunded). False when the
    /// executor no longer held it.
    pub async fn yield_task(
        &self,
        executor: &str,
        task_id: &str,
        served_offset: u64,
    ) -> Result<bool, QueueError> {
        let mut script = self.invoke(
            &self.scripts.yield_task,
            &["running", "offset", "attempts", "pending", "order", "read"],
        );
        script.arg(task_id).arg(executor).arg(served_offset);
        let yielded: i64 = script.invoke_async(&mut self.redis.clone()).await?;
        Ok(yielded == 1)
    }

    /// Running tasks (task id -> the executor holding it).
    /// Whether `executor` holds a running task or a stream binding.
    pub async fn holds_work(&self, executor: &str) -> Result<bool, QueueError> {
        let mut holders: Vec<String> = redis::cmd("HVALS")
            .arg(self.key("running"))
            .query_async(&mut self.redis.clone())
            .await?;
        let bindings: Vec<String> = redis::cmd("HVALS")
            .arg(self.key("stream"))
            .query_async(&mut self.redis.clone())
            .await?;
        holders.extend(bindings);
        Ok(holders.iter().any(|holder| holder == executor))
    }

    /// Whether `task_id` succeeded: its last reported offset covered every row it served.
    pub async fn succeeded(&self, task_id: &str) -> Result<bool, QueueError> {
        Ok(redis::cmd("SISMEMBER")
            .arg(self.key("succeeded"))
            .arg(task_id)
            .query_async(&mut self.redis.clone())
            .await?)
    }

    pub async fn running(&self) -> Result<HashMap<String, String>, QueueError> {
        Ok(redis::cmd("HGETALL")
            .arg(self.key("running"))
            .query_async(&mut self.redis.clone())
            .await?)
    }

    pub async fn counts(&self) -> Result<QueueCounts, QueueError> {
        let script = self.invoke(
            &self.scripts.counts,
            &[
                "task",
                "pending",
                "running",
                "succeeded",
                "failed",
                "totals",
            ],
        );
        let c: Vec<i64> = script.invoke_async(&mut self.redis.clone()).await?;
        let at = |i: usize| {
            c.get(i)
                .copied()
                .map_or(0, |n| u64::try_from(n).unwrap_or(0))
        };
        Ok(QueueCounts {
            total: at(0),
            pending: at(1),
            running: at(2),
            succeeded: at(3),
            failed: at(4),
            bytes: at(5),
            bytes_done: at(6),
            rows_done: at(7),
        })
    }

    /// Failed tasks and their last errors.
    pub async fn failures(&self) -> Result<Vec<(String, String)>, QueueError> {
        Ok(redis::cmd("HGETALL")
            .arg(self.key("failed"))
            .query_async(&mut self.redis.clone())
            .await?)
    }

    /// Reported offsets of the tasks not finished (task id -> rows consumed).
    pub async fn offsets(&self) -> Result<HashMap<String, u64>, QueueError> {
        Ok(redis::cmd("HGETALL")
            .arg(self.key("offset"))
            .query_async(&mut self.redis.clone())
            .await?)
    }

    /// Rows served to trainers per source (see `read` in the module doc).
    pub async fn rows_read(&self) -> Result<HashMap<String, u64>, QueueError> {
        Ok(redis::cmd("HGETALL")
            .arg(self.key("read"))
            .query_async(&mut self.redis.clone())
            .await?)
    }

    /// Stream positions of the bindings read in order (stream task id -> position).
    pub async fn positions(&self) -> Result<HashMap<String, StreamPosition>, QueueError> {
        let known: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.key("position"))
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(known
            .into_iter()
            .filter_map(|(id, position)| Some((id, parse_position(position.as_bytes())?)))
            .collect())
    }

    /// Stages the queue's offsets, stream positions and succeeded set as they are now, at
    /// checkpoint `id`'s barrier (replacing what an abandoned checkpoint staged).
    pub async fn stage_checkpoint(&self, id: u64) -> Result<(), QueueError> {
        let mut script = self.invoke(
            &self.scripts.stage_checkpoint,
            &["offset", "position", "succeeded", "checkpoint"],
        );
        script.arg(&self.prefix).arg(id);
        script.invoke_async::<()>(&mut self.redis.clone()).await?;
        Ok(())
    }

    /// Commits checkpoint `id`: `record` becomes the latest, together with the queue state
    /// staged at its barrier. Refused when another checkpoint was staged since.
    pub async fn commit_checkpoint(&self, id: u64, record: &str) -> Result<(), QueueError> {
        let mut script = self.invoke(&self.scripts.commit_checkpoint, &["checkpoint"]);
        script.arg(&self.prefix).arg(id).arg(record);
        let committed: i64 = script.invoke_async(&mut self.redis.clone()).await?;
        match committed {
            1 => Ok(()),
            _ => Err(QueueError::NotStaged(id)),
        }
    }

    /// The latest checkpoint's record, if one was committed.
    pub async fn latest_checkpoint(&self) -> Result<Option<String>, QueueError> {
        let mut redis = self.redis.clone();
        let latest: Option<String> = redis::cmd("HGET")
            .arg(self.key("checkpoint"))
            .arg("latest")
            .query_async(&mut redis)
            .await?;
        let Some(latest) = latest else {
            return Ok(None);
        };
        Ok(redis::cmd("HGET")
            .arg(self.key("checkpoint"))
            .arg(latest)
            .query_async(&mut redis)
            .await?)
    }

    /// Puts the queue back to checkpoint `id` (`None`: to before any data was read): the
    /// offsets it recorded, and every task that succeeded since pending again. Returns
    /// how many tasks were reopened. Refused while an executor holds a task.
    pub async fn rollback(&self, id: Option<u64>) -> Result<u64, QueueError> {
        let mut script = self.invoke(
            &self.scripts.rollback,
            &[
                "offset",
                "succeeded",
                "pending",
                "order",
                "running",
                "position",
                "bytes",
                "rows",
                "totals",
            ],
        );
        script.arg(&self.prefix).arg(id.unwrap_or(0));
        let reopened: i64 = script.invoke_async(&mut self.redis.clone()).await?;
        u64::try_from(reopened).map_err(|_| QueueError::Busy)
    }

    /// Removes every key of this job (after the Job is deleted).
    pub async fn delete(&self) -> Result<(), QueueError> {
        let latest: Option<String> = redis::cmd("HGET")
            .arg(self.key("checkpoint"))
            .arg("latest")
            .query_async(&mut self.redis.clone())
            .await?;
        let mut keys: Vec<String> = KEYS.iter().map(|k| self.key(k)).collect();
        if let Some(latest) = latest {
            for saved in ["offset", "position", "succeeded"] {
                keys.push(self.key(&format!("checkpoint:{latest}:{saved}")));
            }
        }
        redis::cmd("DEL")
            .arg(keys)
            .query_async::<()>(&mut self.redis.clone())
            .await?;
        Ok(())
    }
}

/// A position as the scripts store it (`"<sequence> <rows>"`); `None` when absent.
fn parse_position(bytes: &[u8]) -> Option<StreamPosition> {
    let (sequence, rows) = std::str::from_utf8(bytes).ok()?.split_once(' ')?;
    Some(StreamPosition {
        sequence: sequence.parse().ok()?,
        rows: rows.parse().ok()?,
    })
}

fn parse_number(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::QueueCounts;

    #[test]
    fn progress_is_rows_trained_over_the_rows_estimated_by_bytes() {
        let counts = |bytes_done, rows_done| QueueCounts {
            total: 8,
            succeeded: 2,
            bytes: 8_000,
            bytes_done,
            rows_done,
            ..QueueCounts::default()
        };
        let unplanned = QueueCounts::default();
        assert_eq!(unplanned.row_fraction(100), None, "nothing planned");
        assert_eq!(
            counts(0, 0).row_fraction(100),
            Some(0.0),
            "nothing read yet"
        );
        assert_eq!(
            counts(1_000, 0).row_fraction(100),
            Some(0.125),
            "parts without rows"
        );
        // 500 rows in 2,000 bytes: 2,000 rows in all.
        assert_eq!(counts(2_000, 500).row_fraction(600), Some(0.3));
        assert_eq!(
            counts(8_000, 2_000).row_fraction(2_000),
            Some(1.0),
            "exact at the end"
        );
        assert_eq!(
            counts(2_000, 500).row_fraction(9_000),
            Some(1.0),
            "at most all of it"
        );
    }
}
