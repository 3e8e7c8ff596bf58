//! Per-source serving buffers (Primus §5.2): bounded in rows (readers wait when full), and
//! served by Algorithm 2: the next minibatch comes from the non-empty buffer with the
//! highest `w_i * sigmoid(q_i)`, where `q_i` is its queued data in minibatches.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use primus_batch::Minibatch;
use primus_proto::v1::{ServedRange, SourceKind};
use primus_telemetry::propagation::TraceCarrier;
use tokio::sync::{Notify, Semaphore};

use crate::ledger::TaskLedger;

/// Rows read by one task, in task order.
pub struct Chunk {
    pub batch: Minibatch,
    pub task: Arc<TaskLedger>,
    /// The task offset of the chunk's first row.
    pub first_offset: u64,
}

/// What the dataset server hands to a trainer.
pub struct Served {
    pub source: String,
    pub kind: SourceKind,
    pub batch: Minibatch,
    /// The trace of the task that read the first rows.
    pub trace: TraceCarrier,
    /// The task rows it holds, in serving order, with their tasks.
    pub ranges: Vec<(Arc<TaskLedger>, ServedRange)>,
}

impl Served {
    /// Its trainer trained it and pushed the gradients (or will, the executor having
    /// ended the stream): its rows count as consumed in their tasks.
    pub fn consumed(&self) {
        for (task, range) in &self.ranges {
            task.consumed(range.first, range.end, range.end_position);
        }
    }
}

struct Queue {
    name: String,
    kind: SourceKind,
    weight: f64,
    chunks: VecDeque<Chunk>,
    /// Rows of the front chunk already served: a chunk is served in slices of it, never
    /// copied whole again for what remains.
    front_served: usize,
    /// Rows queued and not yet served.
    rows: usize,
    /// Runners currently reading into this buffer: while any is, a short buffer waits for
    /// more rows instead of serving a small minibatch.
    writers: usize,
    space: Arc<Semaphore>,
}

pub struct Buffers {
    queues: Mutex<Vec<Queue>>,
    capacity_rows: usize,
    arrived: Notify,
}

/// A source's place in [`Buffers`].
pub type SourceIndex = usize;

/// Counts a runner as writing into a source until dropped.
pub struct WriterGuard<'a> {
    buffers: &'a Buffers,
    source: SourceIndex,
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.buffers.with_queue(self.source, |q| q.writers -= 1);
        self.buffers.arrived.notify_waiters();
    }
}

/// Algorithm 2's priority of a buffer holding `queued` minibatches.
pub fn priority(weight: f64, queued: f64) -> f64 {
    weight / (1.0 + (-queued).exp())
}

impl Buffers {
    /// One buffer per `(name, kind, weight)`, each holding up to `capacity_rows` rows.
    pub fn new(sources: Vec<(String, SourceKind, f64)>, capacity_rows: usize) -> Self {
        let capacity_rows = capacity_rows.max(1);
        let queues = sources
            .into_iter()
            .map(|(name, kind, weight)| Queue {
                name,
                kind,
                weight,
                chunks: VecDeque::new(),
                front_served: 0,
                rows: 0,
                writers: 0,
                space: Arc::new(Semaphore::new(capacity_rows)),
            })
            .collect();
        Self {
            queues: Mutex::new(queues),
            capacity_rows,
            arrived: Notify::new(),
        }
    }

    pub fn capacity_rows(&self) -> usize {
        self.capacity_rows
    }

    fn with_queue<T>(&self, source: SourceIndex, f: impl FnOnce(&mut Queue) -> T) -> T {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut queues[source])
    }

    pub fn source_index(&self, name: &str) -> Option<SourceIndex> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().position(|q| q.name == name)
    }

    pub fn writer(&self, source: SourceIndex) -> WriterGuard<'_> {
        self.with_queue(source, |q| q.writers += 1);
        WriterGuard {
            buffers: self,
            source,
        }
    }

    /// Adds a chunk (at most `capacity_rows` rows), waiting while the buffer is full.
    pub async fn push(&self, source: SourceIndex, chunk: Chunk) {
        let rows = chunk.batch.rows().min(self.capacity_rows);
        let space = self.with_queue(source, |q| q.space.clone());
        if let Ok(permits) = space.acquire_many(rows as u32).await {
            // Given back by `pop` as the rows leave.
            permits.forget();
        }
        let taken_back = self.with_queue(source, |q| {
            // Checked under the lock `discard_task` takes: a chunk of a task taken back
            // never becomes servable after its rows were discarded.
            if chunk.task.is_taken_back() {
                q.space.add_permits(rows);
                return true;
            }
            q.rows += chunk.batch.rows();
            q.chunks.push_back(chunk);
            false
        });
        if !taken_back {
            self.arrived.notify_waiters();
        }
    }

    /// [`Self::push`], calling `waiting` every `interval` while a full buffer holds the
    /// chunk back (to keep the messages it came from alive).
    pub async fn push_ticking<F: Future<Output = ()>>(
        &self,
        source: SourceIndex,
        chunk: Chunk,
        interval: Duration,
        mut waiting: impl FnMut() -> F,
    ) {
        let push = self.push(source, chunk);
        let mut push = std::pin::pin!(push);
        let mut ticks = tokio::time::interval(interval);
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = &mut push => return,
                _ = ticks.tick() => waiting().await,
            }
        }
    }

    /// Rows queued per source, by name.
    pub fn fill(&self) -> Vec<(String, usize)> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().map(|q| (q.name.clone(), q.rows)).collect()
    }

    /// Drops the queued rows of a task that is no longer this executor's.
    pub fn discard_task(&self, task_id: &str) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for queue in queues.iter_mut() {
            let before = queue.rows;
            if queue.chunks.front().is_some_and(|c| c.task.id == task_id) {
                queue.front_served = 0;
            }
            queue.chunks.retain(|c| c.task.id != task_id);
            let held: usize = queue.chunks.iter().map(|c| c.batch.rows()).sum();
            queue.rows = held - queue.front_served;
            queue.space.add_permits(before - queue.rows);
        }
    }

    /// Takes up to `rows` rows for a minibatch, or `None` when nothing can be served now.
    /// A buffer with fewer rows than asked serves only when nobody is writing into it.
    pub fn try_pop(&self, rows: usize) -> Option<Served> {
        let rows = rows.clamp(1, self.capacity_rows);
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let chosen = queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.rows >= rows || (q.rows > 0 && q.writers == 0))
            .map(|(i, q)| (i, priority(q.weight, q.rows as f64 / rows as f64)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)?;
        let queue = &mut queues[chosen];
        let mut parts = Vec::new();
        let mut ranges = Vec::new();
        let mut taken = 0;
        let trace = queue.chunks.front().map(|c| c.task.trace.clone())?;
        while taken < rows {
            let Some(chunk) = queue.chunks.pop_front() else {
                break;
            };
            let want = rows - taken;
            let start = std::mem::take(&mut queue.front_served);
            let left = chunk.batch.rows() - start;
            let first = chunk.first_offset + start as u64;
            let part = if left > want {
                let head = chunk.batch.slice(start..start + want).ok()?;
                chunk.task.served_through(first + want as u64);
                add_range(&mut ranges, &chunk.task, first, want);
                queue.front_served = start + want;
                queue.chunks.push_front(chunk);
                head
            } else {
                let rest = match start {
                    0 => chunk.batch,
                    _ => chunk.batch.slice(start..start + left).ok()?,
                };
                chunk.task.served_through(first + left as u64);
                add_range(&mut ranges, &chunk.task, first, left);
                rest
            };
            taken += part.rows();
            parts.push(part);
        }
        queue.rows -= taken;
        queue.space.add_permits(taken.min(self.capacity_rows));
        let batch = match parts.len() {
            1 => parts.pop()?,
            _ => Minibatch::concat(&parts).ok()?,
        };
        Some(Served {
            source: queue.name.clone(),
            kind: queue.kind,
            batch,
            trace,
            ranges,
        })
    }

    /// Wakes servers waiting for rows (the data ended, so short buffers may now serve).
    pub fn wake(&self) {
        self.arrived.notify_waiters();
    }

    /// Waits until something may be servable (or a short while, as a safety net).
    pub async fn wait_for_rows(&self) {
        tokio::select! {
            _ = self.arrived.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().all(|q| q.rows == 0)
    }
}

/// Adds `task`'s rows `first..first + rows`, just served, to `ranges` (extending its last
/// range when they continue it). Called right after the task's served offset moved to
/// their end, so the stream position read now is the one at that end.
fn add_range(
    ranges: &mut Vec<(Arc<TaskLedger>, ServedRange)>,
    task: &Arc<TaskLedger>,
    first: u64,
    rows: usize,
) {
    let end = first + rows as u64;
    let end_position = task.stream_position();
    if let Some((_, last)) = ranges.last_mut()
        && last.task_id == task.id
        && last.end == first
    {
        (last.end, last.end_position) = (end, end_position);
        return;
    }
    let range = ServedRange {
        task_id: task.id.clone(),
        first,
        end,
        end_position,
    };
    ranges.push((task.clone(), range));
}

#[cfg(test)]
mod tests {
    use primus_batch::{DenseMatrix, JaggedFeature, Kjt, Sparse};

    use super::*;

    fn rows(n: usize, label: f32) -> Minibatch {
        Minibatch {
            labels: vec![label; n],
            targets: Vec::new(),
            dense: DenseMatrix::default(),
            sparse: Sparse::Jagged(Kjt {
                rows: n,
                features: vec![],
            }),
        }
    }

    fn chunk(n: usize, label: f32, task: &Arc<TaskLedger>, first_offset: u64) -> Chunk {
        Chunk {
            batch: rows(n, label),
            task: task.clone(),
            first_offset,
        }
    }

    /// Task `id`'s ledger, its rows starting at `offset`.
    fn ledger(id: &str, offset: u64) -> Arc<TaskLedger> {
        Arc::new(TaskLedger::new(id.into(), offset))
    }

    /// A minibatch names the task rows it holds: a chunk split between two minibatches,
    /// chunks of one task joined into one range, and two tasks in one minibatch. A task's
    /// offset to report is what was consumed without a gap, not what was served.
    #[tokio::test]
    async fn a_minibatch_names_the_task_rows_it_holds() {
        let buffers = Buffers::new(vec![("batch".into(), SourceKind::Batch, 1.0)], 1000);
        let (a, b) = (ledger("a", 40), ledger("b", 0));
        buffers.push(0, chunk(30, 0.0, &a, 40)).await;
        buffers.push(0, chunk(30, 0.0, &a, 70)).await;
        buffers.push(0, chunk(50, 0.0, &b, 0)).await;
        let ranges = |served: Served| -> Vec<(String, u64, u64)> {
            (served.ranges.into_iter())
                .map(|(_, r)| (r.task_id, r.first, r.end))
                .collect()
        };
        let first = buffers.try_pop(45).expect("a minibatch");
        let second = buffers.try_pop(45).expect("a minibatch");
        assert_eq!((a.served(), b.served()), (100, 30));
        assert_eq!(
            (a.progress_to_report(), b.progress_to_report()),
            (None, None)
        );
        // Confirmed out of order: a's rows 85..100 wait for 40..85.
        second.consumed();
        assert_eq!(a.progress_to_report(), None);
        assert_eq!(b.progress_to_report(), Some((30, None)));
        first.consumed();
        assert_eq!(a.progress_to_report(), Some((100, None)));
        assert_eq!(ranges(first), [("a".to_owned(), 40, 85)]);
        assert_eq!(
            ranges(second),
            [("a".to_owned(), 85, 100), ("b".to_owned(), 0, 30)]
        );
    }

    /// Row `i` of the chunk at `first_offset` has label `first_offset + i` and, in feature
    /// `f`, `i % 3` keys of value `first_offset + i`.
    fn numbered(n: usize, task: &Arc<TaskLedger>, first_offset: u64) -> Chunk {
        let ids = (0..n as u64).map(|i| first_offset + i);
        let mut feature = JaggedFeature::new("f");
        for id in ids.clone() {
            feature
                .values
                .extend(std::iter::repeat_n(id, (id % 3) as usize));
            feature.offsets.push(feature.values.len() as u32);
        }
        Chunk {
            batch: Minibatch {
                labels: ids.map(|id| id as f32).collect(),
                targets: Vec::new(),
                dense: DenseMatrix::default(),
                sparse: Sparse::Jagged(Kjt {
                    rows: n,
                    features: vec![feature],
                }),
            },
            task: task.clone(),
            first_offset,
        }
    }

    #[tokio::test]
    async fn chunks_served_in_slices_hand_out_each_row_once_in_order() {
        let buffers = Buffers::new(vec![("batch".into(), SourceKind::Batch, 1.0)], 1000);
        let task = ledger("t", 0);
        buffers.push(0, numbered(50, &task, 0)).await;
        buffers.push(0, numbered(50, &task, 50)).await;
        let mut labels = Vec::new();
        let mut keys = Vec::new();
        while let Some(served) = buffers.try_pop(30) {
            let kjt = served.batch.to_kjt().expect("jagged");
            assert_eq!(kjt.rows, served.batch.rows());
            let feature = &kjt.features[0];
            assert_eq!(feature.offsets.len(), kjt.rows + 1);
            for (row, label) in served.batch.labels.iter().enumerate() {
                let row_keys = &feature.values
                    [feature.offsets[row] as usize..feature.offsets[row + 1] as usize];
                assert!(row_keys.iter().all(|&k| k as f32 == *label), "row {label}");
                assert_eq!(row_keys.len() as u64, *label as u64 % 3);
            }
            labels.extend_from_slice(&served.batch.labels);
            keys.extend_from_slice(&feature.values);
            served.consumed();
        }
        assert_eq!(labels, (0..100).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(keys.len(), (0..100).map(|i| i % 3).sum::<usize>());
        assert_eq!(task.progress_to_report(), Some((100, None)));
        assert!(buffers.is_empty());
    }

    #[tokio::test]
    async fn the_heavier_source_serves_first_and_a_backlog_drains() {
        let buffers = Buffers::new(
            vec![
                ("batch".into(), SourceKind::Batch, 1.0),
                ("stream".into(), SourceKind::Stream, 4.0),
            ],
            1000,
        );
        let batch_task = ledger("b", 0);
        let stream_task = ledger("s", 0);
        // A backlog of 500 batch rows, 100 stream rows.
        for i in 0..5 {
            buffers.push(0, chunk(100, 0.0, &batch_task, i * 100)).await;
        }
        buffers.push(1, chunk(100, 1.0, &stream_task, 0)).await;
        let order: Vec<String> = std::iter::from_fn(|| buffers.try_pop(50))
            .inspect(Served::consumed)
            .map(|s| s.source)
            .collect();
        assert_eq!(
            order[..2],
            ["stream", "stream"],
            "weight 4 beats a 10x backlog of weight 1"
        );
        assert_eq!(
            order.len(),
            2 + 10,
            "the backlog drains once the stream is empty"
        );
        assert!(order[2..].iter().all(|s| s == "batch"));
        assert!(buffers.is_empty());
        assert_eq!(batch_task.progress_to_report(), Some((500, None)));
    }

    #[tokio::test]
    async fn a_short_buffer_waits_for_its_writer_and_a_full_one_blocks_it() {
        let buffers = Arc::new(Buffers::new(
            vec![("a".into(), SourceKind::Batch, 1.0)],
            100,
        ));
        let task = ledger("t", 0);
        let writer = buffers.writer(0);
        buffers.push(0, chunk(30, 0.0, &task, 0)).await;
        assert!(
            buffers.try_pop(50).is_none(),
            "30 of 50 rows while a writer is active"
        );
        buffers.push(0, chunk(70, 0.0, &task, 30)).await;
        // Full: a third push waits until rows are served.
        let pusher = {
            let (buffers, task) = (buffers.clone(), task.clone());
            tokio::spawn(async move { buffers.push(0, chunk(40, 0.0, &task, 100)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!pusher.is_finished(), "the buffer is full");
        let served = buffers.try_pop(50).expect("a full minibatch");
        assert_eq!(served.batch.rows(), 50);
        served.consumed();
        pusher.await.expect("push after space was freed");
        drop(writer);
        let sizes: Vec<usize> = std::iter::from_fn(|| buffers.try_pop(50))
            .inspect(Served::consumed)
            .map(|s| s.batch.rows())
            .collect();
        assert_eq!(sizes, [50, 40], "with no writer the short rest is served");
        assert_eq!(task.progress_to_report(), Some((140, None)));
    }

    #[tokio::test]
    async fn rows_of_a_task_taken_back_are_dropped() {
        let buffers = Buffers::new(vec![("a".into(), SourceKind::Batch, 1.0)], 200);
        let (kept, lost) = (ledger("kept", 0), ledger("lost", 0));
        buffers.push(0, chunk(60, 0.0, &lost, 0)).await;
        buffers.push(0, chunk(40, 1.0, &kept, 0)).await;
        buffers.push(0, chunk(20, 0.0, &lost, 60)).await;
        // The front chunk is part served when its task is taken back.
        assert_eq!(buffers.try_pop(25).expect("a minibatch").batch.rows(), 25);
        buffers.discard_task("lost");
        assert_eq!(buffers.fill(), [("a".to_owned(), 40)]);
        let served = buffers.try_pop(100).expect("the kept rows");
        assert_eq!(served.batch.labels, vec![1.0; 40]);
        assert!(buffers.is_empty());
    }

    #[tokio::test]
    async fn a_part_served_chunk_stays_at_the_front_when_another_task_is_taken_back() {
        let buffers = Buffers::new(vec![("a".into(), SourceKind::Batch, 1.0)], 100);
        let (kept, lost) = (ledger("kept", 0), ledger("lost", 0));
        buffers.push(0, numbered(60, &kept, 0)).await;
        buffers.push(0, chunk(40, 1.0, &lost, 0)).await;
        let first = buffers.try_pop(25).expect("a minibatch");
        buffers.discard_task("lost");
        assert_eq!(buffers.fill(), [("a".to_owned(), 35)]);
        let rest = buffers.try_pop(100).expect("the kept rows");
        assert_eq!(
            rest.batch.labels,
            (25..60).map(|i| i as f32).collect::<Vec<_>>()
        );
        first.consumed();
        rest.consumed();
        assert_eq!(kept.progress_to_report(), Some((60, None)));
    }

    #[tokio::test]
    async fn a_chunk_of_a_task_taken_back_is_not_buffered_and_frees_its_space() {
        let buffers = Buffers::new(vec![("a".into(), SourceKind::Batch, 1.0)], 100);
        let gone = ledger("gone", 0);
        gone.take_back();
        buffers.push(0, chunk(100, 0.0, &gone, 0)).await;
        assert!(buffers.is_empty());
        let kept = ledger("kept", 0);
        // Would wait forever if the refused chunk kept its space.
        tokio::time::timeout(
            Duration::from_secs(5),
            buffers.push(0, chunk(100, 1.0, &kept, 0)),
        )
        .await
        .expect("the space is free");
        assert_eq!(buffers.fill(), [("a".to_owned(), 100)]);
    }
}
