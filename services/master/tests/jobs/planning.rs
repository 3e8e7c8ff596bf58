//! Planning a Dataset into the task queue and the queue's transitions, against a real
//! Redis: time order, every file once, stream bindings and their positions moving between
//! executors, and the rollback to a checkpoint's offsets and positions.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use primus_data_tasks::queue::{Acquired, Finished};
use primus_harness::Sandbox;
use primus_harness::resources::{dataset, hourly, jetstream, parquet};
use primus_proto::v1::{StreamPosition, data_task};
use primus_spec::time;
use primus_testkit::RedisServer;

use crate::common::{
    FILES_PER_HOUR, id_job, plan_dataset, queue_at, start_master, write_partitions,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_days_of_hourly_partitions_become_tasks_in_time_order_covering_each_file_once() {
    let redis = RedisServer::start().expect("redis-server");
    let data = tempfile::tempdir().expect("tempdir");
    let clicks = data.path().join("clicks");
    let views = data.path().join("views");
    write_partitions(&clicks, "2026-11-01", 3).await;
    write_partitions(&views, "2026-11-01", 3).await;
    let dataset = dataset("plan-test-data")
        .stream(
            "logs",
            hourly("2026-11-01T00", Some("2026-11-04T00")),
            vec![
                parquet("clicks", clicks.display()),
                parquet("views", views.display()),
            ],
        )
        .spec();
    let queue = queue_at(&redis.url(), "plan-test").await;
    plan_dataset(&queue, &dataset, "plan-test").await;
    let counts = queue.counts().await.expect("counts");
    assert_eq!(counts.total, 3 * 24 * 2, "one task per source and hour");

    let mut covered: HashMap<String, u32> = HashMap::new();
    let mut last_window = i64::MIN;
    let mut sources_in_window: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    while let Acquired::Task(task) = queue.acquire("reader", "", 0, 0).await.expect("acquire") {
        assert!(
            task.window_start_unix_s >= last_window,
            "tasks come in time order"
        );
        last_window = task.window_start_unix_s;
        sources_in_window
            .entry(task.window_start_unix_s)
            .or_default()
            .push(task.source.clone());
        let Some(data_task::Work::Batch(work)) = &task.work else {
            panic!("batch task expected")
        };
        for file in &work.files {
            *covered
                .entry(format!("{}/{}", work.dir, file.name))
                .or_default() += 1;
        }
    }
    assert_eq!(
        covered.len() as u64,
        3 * 24 * 2 * FILES_PER_HOUR,
        "every file, no marker"
    );
    assert!(covered.values().all(|n| *n == 1), "no file twice");
    assert!(covered.keys().all(|k| k.ends_with(".parquet")));
    assert!(
        sources_in_window
            .values()
            .all(|s| s == &["clicks", "views"]),
        "sources interleave within each window"
    );

    // Planning again (a restarted master) adds nothing: the cursor says it is done.
    plan_dataset(&queue, &dataset, "plan-test").await;
    assert_eq!(queue.counts().await.expect("counts").total, counts.total);
}

/// A stream binding belongs to one executor at a time: its progress is taken from that
/// executor only, a lost executor's binding goes to the next one, and a binding that
/// fails is recorded as a failed task (which fails the job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_binding_moves_between_executors_and_its_failure_is_recorded() {
    let redis = RedisServer::start().expect("redis-server");
    let dataset = dataset("stream-test-data")
        .stream(
            "live",
            hourly("2026-11-01T00", None),
            vec![jetstream("clicks", "CLICKS", "clicks.>")],
        )
        .spec();
    let queue = queue_at(&redis.url(), "stream-test").await;
    let bindings = primus_data_tasks::planning::stream_tasks("stream-test", &dataset);
    queue.add_stream_tasks(&bindings).await.expect("bindings");
    let Acquired::Task(task) = queue.acquire("de-0", "", 0, 0).await.expect("acquire") else {
        panic!("the binding is handed out first")
    };
    assert_eq!(task.id, "clicks/stream");
    let Some(data_task::Work::Stream(work)) = &task.work else {
        panic!("stream work expected")
    };
    assert_eq!(
        (work.stream.as_str(), work.durable.as_str()),
        ("CLICKS", "stream-test-clicks")
    );
    assert!(matches!(
        queue.acquire("de-1", "", 0, 0).await.expect("acquire"),
        Acquired::Empty
    ));
    assert!(
        queue
            .report_progress("de-0", &task.id, 10, None, 1)
            .await
            .expect("progress")
    );
    assert!(
        !queue
            .report_progress("de-1", &task.id, 10, None, 1)
            .await
            .expect("progress")
    );
    // Rows a trainer received from de-0 after its last report move the binding on, and
    // are no heartbeat of de-0.
    assert!(
        (queue.advance_received("de-0", &task.id, 15, None))
            .await
            .expect("received")
    );
    let silent = queue.silent_executors(2).await.expect("silent");
    assert!(silent.contains(&"de-0".to_owned()), "{silent:?}");

    // A sweep that found it silent before 1 ms leaves it its work: it heartbeated at 1 since.
    let kept = queue.requeue_silent_executor("de-0", 3, 1).await;
    assert_eq!(kept.expect("requeue"), None);
    assert!(
        (queue.advance_received("de-0", &task.id, 15, None))
            .await
            .expect("received"),
        "the binding is still de-0's"
    );
    let requeued = queue.requeue_silent_executor("de-0", 3, 2).await;
    assert!(requeued.expect("requeue").is_some());
    assert!(
        !(queue.advance_received("de-0", &task.id, 18, None))
            .await
            .expect("received"),
        "the binding is no longer de-0's"
    );
    let Acquired::Task(moved) = queue.acquire("de-1", "", 0, 0).await.expect("acquire") else {
        panic!("the lost executor's binding goes to the next")
    };
    assert_eq!(moved.id, task.id);
    assert!(
        !queue
            .report_progress("de-0", &task.id, 20, None, 2)
            .await
            .expect("progress")
    );
    // Rows read count the holder's forward moves only.
    let rows_read = |n: u64| std::collections::HashMap::from([("clicks".to_owned(), n)]);
    assert_eq!(queue.rows_read().await.expect("rows read"), rows_read(15));
    assert!(
        queue
            .report_progress("de-1", &task.id, 25, None, 2)
            .await
            .expect("progress")
    );
    assert_eq!(queue.rows_read().await.expect("rows read"), rows_read(25));
    assert_eq!(
        queue
            .finish("de-0", &task.id, "late", 3, 3)
            .await
            .expect("finish"),
        Finished::NotOwner
    );
    assert_eq!(
        queue
            .finish("de-1", &task.id, "stream \"CLICKS\": not found", 3, 3)
            .await
            .expect("finish"),
        Finished::Failed
    );
    assert_eq!(
        queue.failures().await.expect("failures"),
        vec![(task.id.clone(), "stream \"CLICKS\": not found".to_owned())]
    );
}

/// A stream binding's position: taken from its holder only and only forward, handed to
/// the binding's next holder with the offset, and put back to a checkpoint's by a
/// rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_bindings_position_goes_to_its_next_holder_and_back_to_a_checkpoint() {
    let redis = RedisServer::start().expect("redis-server");
    let dataset = dataset("position-data")
        .stream(
            "live",
            hourly("2026-11-01T00", None),
            vec![jetstream("clicks", "CLICKS", "clicks.>")],
        )
        .spec();
    let queue = queue_at(&redis.url(), "position").await;
    let bindings = primus_data_tasks::planning::stream_tasks("position", &dataset);
    queue.add_stream_tasks(&bindings).await.expect("bindings");
    let at = |sequence, rows| StreamPosition { sequence, rows };
    let holder = |executor: &'static str| {
        let queue = queue.clone();
        async move {
            match queue.acquire(executor, "", 0, 0).await.expect("acquire") {
                Acquired::Task(task) => *task,
                other => panic!("{executor} gets the binding: {other:?}"),
            }
        }
    };
    let first = holder("de-0").await;
    assert_eq!((first.start_offset, first.stream_position), (0, None));
    let report = |executor: &'static str, offset, position| {
        let queue = queue.clone();
        async move {
            queue
                .report_progress(executor, "clicks/stream", offset, Some(&position), 1)
                .await
                .expect("progress")
        }
    };
    assert!(report("de-0", 10, at(5, 3)).await);
    assert!(!report("de-1", 40, at(9, 0)).await, "not the holder");
    queue.requeue_executor("de-0", 3).await.expect("requeue");
    let second = holder("de-1").await;
    assert_eq!(
        (second.start_offset, second.stream_position),
        (10, Some(at(5, 3)))
    );
    assert!(report("de-1", 10, at(4, 0)).await);
    assert!(report("de-1", 14, at(7, 0)).await);
    queue.stage_checkpoint(1).await.expect("stage");
    queue.commit_checkpoint(1, "{}").await.expect("commit");
    assert!(report("de-1", 20, at(9, 2)).await);
    let positions = queue.positions().await.expect("positions");
    assert_eq!(
        positions["clicks/stream"],
        at(9, 2),
        "an older position is ignored"
    );

    queue.requeue_executor("de-1", 3).await.expect("requeue");
    queue.rollback(Some(1)).await.expect("rollback");
    let third = holder("de-2").await;
    assert_eq!(
        (third.start_offset, third.stream_position),
        (14, Some(at(7, 0))),
        "the checkpoint's"
    );
    queue.requeue_executor("de-2", 3).await.expect("requeue");
    queue.rollback(None).await.expect("rollback");
    let fourth = holder("de-3").await;
    assert_eq!(
        (fourth.start_offset, fourth.stream_position),
        (0, None),
        "before any checkpoint: the stream's start"
    );
}

/// The queue goes back to a checkpoint exactly: tasks finished after its barrier (also
/// before its commit) are pending again, tasks in progress restart from the offsets staged
/// at its barrier, and without a checkpoint from the beginning; a rollback under a running
/// task is refused.
/// A request retried because its answer was lost (the master's call to Redis timed out
/// after the script ran) is given the task the lost answer held, once: that task would
/// otherwise stay running in the executor's name and never be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_is_given_the_task_its_lost_answer_held() {
    let redis = RedisServer::start().expect("redis-server");
    let data = tempfile::tempdir().expect("tempdir");
    let clicks = data.path().join("clicks");
    write_partitions(&clicks, "2026-11-01", 1).await;
    let batch = dataset("retry-data")
        .stream(
            "logs",
            hourly("2026-11-01T00", Some("2026-11-02T00")),
            vec![parquet("clicks", clicks.display())],
        )
        .spec();
    let queue = queue_at(&redis.url(), "retry").await;
    plan_dataset(&queue, &batch, "retry").await;
    let acquire = |executor: &'static str, request: &'static str| {
        let queue = queue.clone();
        async move {
            match queue
                .acquire(executor, request, 0, 0)
                .await
                .expect("acquire")
            {
                Acquired::Task(task) => *task,
                other => panic!("a task expected, got {other:?}"),
            }
        }
    };
    let first = acquire("de-0", "p-1").await;
    let again = acquire("de-0", "p-1").await;
    assert_eq!((&again.id, again.attempt), (&first.id, first.attempt));
    assert_eq!(queue.counts().await.expect("counts").running, 1);
    // The same id from another executor, or a new id, acquires anew.
    let other = acquire("de-1", "p-1").await;
    let next = acquire("de-0", "p-2").await;
    assert!(
        other.id != first.id && next.id != first.id && next.id != other.id,
        "{} {} {}",
        first.id,
        other.id,
        next.id
    );
    // Once the task is no longer the executor's, a late retry of its request does not
    // take it back.
    let finished = queue.finish("de-0", &next.id, "", 3, 0).await;
    assert_eq!(finished.expect("finish"), Finished::Succeeded);
    let late = acquire("de-0", "p-2").await;
    assert_ne!(late.id, next.id);
    assert_eq!(queue.counts().await.expect("counts").running, 3);

    // A stream binding's lost answer the same.
    let live = dataset("retry-live")
        .stream(
            "live",
            hourly("2026-11-01T00", None),
            vec![jetstream("clicks", "CLICKS", "clicks.>")],
        )
        .spec();
    let queue = queue_at(&redis.url(), "retry-live").await;
    let bindings = primus_data_tasks::planning::stream_tasks("retry-live", &live);
    queue.add_stream_tasks(&bindings).await.expect("bindings");
    for _ in 0..2 {
        let acquired = queue.acquire("de-0", "s-1", 0, 0).await.expect("acquire");
        assert!(
            matches!(&acquired, Acquired::Task(task) if task.id == "clicks/stream"),
            "{acquired:?}"
        );
    }
    let taken = queue.acquire("de-1", "s-1", 0, 0).await.expect("acquire");
    assert!(matches!(taken, Acquired::Empty), "{taken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_queue_rolls_back_to_a_checkpoints_offsets() {
    let redis = RedisServer::start().expect("redis-server");
    let data = tempfile::tempdir().expect("tempdir");
    let clicks = data.path().join("clicks");
    write_partitions(&clicks, "2026-11-01", 1).await;
    let dataset = dataset("rollback-data")
        .stream(
            "logs",
            hourly("2026-11-01T00", Some("2026-11-02T00")),
            vec![parquet("clicks", clicks.display())],
        )
        .spec();
    let queue = queue_at(&redis.url(), "rollback").await;
    plan_dataset(&queue, &dataset, "rollback").await;
    let acquire = || async {
        match queue.acquire("r", "", 0, 0).await.expect("acquire") {
            Acquired::Task(task) => task,
            other => panic!("a task expected, got {other:?}"),
        }
    };
    let (a, b, c) = (acquire().await, acquire().await, acquire().await);
    let finish = |id: String| {
        let queue = queue.clone();
        async move {
            let finished = queue.finish("r", &id, "", 3, 0).await.expect("finish");
            assert_eq!(finished, Finished::Succeeded);
        }
    };
    assert!(
        queue
            .report_progress("r", &a.id, 25, None, 0)
            .await
            .expect("progress")
    );
    finish(a.id.clone()).await;
    assert!(queue.succeeded(&a.id).await.expect("succeeded"));
    assert!(!queue.succeeded(&b.id).await.expect("succeeded"));
    assert!(
        !(queue.advance_received("r", &a.id, 30, None))
            .await
            .expect("received"),
        "a task that succeeded is no executor's to move on"
    );
    let at_checkpoint = queue.counts().await.expect("counts");
    assert!(
        at_checkpoint.rows_done == 25 && at_checkpoint.bytes_done > 0,
        "the rows and bytes of the task done: {at_checkpoint:?}"
    );
    assert!(
        queue
            .report_progress("r", &b.id, 40, None, 0)
            .await
            .expect("progress")
    );
    queue.stage_checkpoint(1).await.expect("stage");

    // What happens between the barrier and the commit (while the snapshots are written) is
    // not the checkpoint's.
    finish(b.id.clone()).await;
    finish(c.id.clone()).await;
    let d = acquire().await;
    assert!(
        queue
            .report_progress("r", &d.id, 70, None, 0)
            .await
            .expect("progress")
    );
    assert!(
        queue.commit_checkpoint(2, "{}").await.is_err(),
        "only the staged checkpoint commits"
    );
    queue.commit_checkpoint(1, "{}").await.expect("commit");
    assert!(
        queue.rollback(Some(1)).await.is_err(),
        "refused while a task is held"
    );
    queue.requeue_previous_executors().await.expect("requeue");
    assert_eq!(queue.rollback(Some(1)).await.expect("rollback"), 2);
    let counts = queue.counts().await.expect("counts");
    assert_eq!((counts.succeeded, counts.running), (1, 0), "{counts:?}");
    assert_eq!(
        (counts.rows_done, counts.bytes_done),
        (at_checkpoint.rows_done, at_checkpoint.bytes_done),
        "the rows and bytes of the tasks reopened are no longer done"
    );
    let mut offsets = HashMap::new();
    while let Acquired::Task(task) = queue.acquire("r", "", 0, 0).await.expect("acquire") {
        offsets.insert(task.id.clone(), task.start_offset);
    }
    assert_eq!(
        offsets.len() as u64,
        counts.total - 1,
        "all but the task done before"
    );
    assert!(!offsets.contains_key(&a.id));
    assert_eq!(offsets[&b.id], 40, "from the checkpoint's offset");
    assert_eq!(offsets[&c.id], 0);
    assert_eq!(
        offsets[&d.id], 0,
        "progress after the checkpoint is forgotten"
    );

    queue.requeue_previous_executors().await.expect("requeue");
    queue.stage_checkpoint(2).await.expect("stage");
    queue
        .commit_checkpoint(2, "{\"id\": 2}")
        .await
        .expect("commit");
    assert_eq!(
        queue.latest_checkpoint().await.expect("latest").as_deref(),
        Some("{\"id\": 2}")
    );
    assert_eq!(queue.rollback(None).await.expect("rollback"), 1);
    assert_eq!(queue.counts().await.expect("counts").succeeded, 0);
    queue.delete().await.expect("delete");
    assert_eq!(queue.latest_checkpoint().await.expect("latest"), None);
}

/// A task taken back from a straggler goes back to pending at the rows it served, its
/// attempt refunded, and only from the executor that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yielded_task_is_pending_again_from_its_served_offset() {
    let redis = RedisServer::start().expect("redis-server");
    let data = tempfile::tempdir().expect("tempdir");
    let clicks = data.path().join("clicks");
    write_partitions(&clicks, "2026-11-01", 1).await;
    let dataset = dataset("yield-data")
        .stream(
            "logs",
            hourly("2026-11-01T00", Some("2026-11-02T00")),
            vec![parquet("clicks", clicks.display())],
        )
        .spec();
    let queue = queue_at(&redis.url(), "yield").await;
    plan_dataset(&queue, &dataset, "yield").await;
    let Acquired::Task(task) = queue.acquire("slow", "", 0, 0).await.expect("acquire") else {
        panic!("a task expected");
    };
    assert_eq!(
        queue.running().await.expect("running").get(&task.id),
        Some(&"slow".to_owned())
    );
    assert!(
        queue
            .report_progress("slow", &task.id, 10, None, 0)
            .await
            .expect("progress")
    );
    assert!(
        !queue.yield_task("fast", &task.id, 30).await.expect("yield"),
        "only its holder gives a task back"
    );
    assert!(queue.yield_task("slow", &task.id, 30).await.expect("yield"));
    assert!(
        !queue
            .running()
            .await
            .expect("running")
            .contains_key(&task.id)
    );
    let mut again = None;
    while let Acquired::Task(next) = queue.acquire("fast", "", 0, 0).await.expect("acquire") {
        if next.id == task.id {
            again = Some(next);
            break;
        }
    }
    let again = again.expect("the yielded task is pending again");
    assert_eq!(again.start_offset, 30, "from the rows the straggler served");
    assert_eq!(
        again.attempt, task.attempt,
        "the yielded attempt does not count"
    );
    assert!(
        !queue
            .report_progress("slow", &task.id, 40, None, 0)
            .await
            .expect("progress"),
        "the straggler no longer owns it"
    );
}

/// A Dataset whose window reaches past now: the Job reads every hour that has ended, then
/// says which window it waits for (the `DataWindows` condition) instead of sitting in
/// Running at 0 samples/s without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_a_window_to_end_names_it() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let today = time::date_of(now);
    write_partitions(&data, &today, 1).await;
    let window = (
        format!("{today}T00"),
        format!("{}T00", time::date_of(now + time::DAY)),
    );
    sandbox
        .apply(id_job("waiting", &data, (&window.0, &window.1), 1))
        .await;
    let master = start_master(&sandbox);
    // The hour in progress (or the next, should it end meanwhile).
    let hour = now - now.rem_euclid(time::HOUR);
    let named = [hour, hour + time::HOUR].map(|h| format!("the window {}", time::window_time(h)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let status = sandbox.status("waiting").await;
        let waiting = (status.conditions.iter())
            .find(|c| c.kind == "DataWindows" && c.status && c.reason == "WaitingForWindow");
        if let Some(waiting) = waiting {
            assert!(
                named.iter().any(|n| waiting.message.contains(n.as_str()))
                    && waiting
                        .message
                        .starts_with("every window that has ended is read; stream logs: "),
                "{}",
                waiting.message
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline && !status.phase.is_terminal(),
            "the Job says which window it waits for: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sandbox.delete_job("waiting").await;
    master.stop();
}
