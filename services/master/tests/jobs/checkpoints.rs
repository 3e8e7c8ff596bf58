//! Checkpoints and recovery through the real services: a Job restarted under a new master
//! continues from its checkpoint, a killed PS shard comes back with the checkpoint's rows
//! (or, with `on_ps_failure: rollback`, the whole Job goes back to the checkpoint), a killed
//! trainer continues its counters, a crash during a barrier abandons it at once, a stopped
//! PS shard holds up nothing else.

use std::path::Path;
use std::time::Duration;

use primus_harness::{Sandbox, condition};
use primus_master::checkpoint;
use primus_spec::job::{PsFailure, WorkerFailure};
use primus_spec::status::{ExecutorState, Phase, SourceProgress, Status};
use primus_testkit::service::signal;

use crate::common::{
    DLRM_ROWS, apply_criteo_dataset, checkpoint_where, data_executor, dlrm_job, job_queue,
    master_settings, start, start_master_with, wait_for_samples_past, wait_for_status,
};

/// A data executor killed while a checkpoint waits for the trainer to align: the barrier
/// can no longer complete and is abandoned as soon as the backend reports the crash, not
/// at the alignment timeout (10 minutes here); the Job then trains every row once. The
/// trainer is held stopped (SIGSTOP) so the barrier is surely waiting when the kill comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_barrier_abandons_the_checkpoint_at_once() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.checkpoint.align_timeout_ms = 600_000;
    let master = start(&sandbox, &settings);
    let job = "dlrm-barrier-crash";
    sandbox.apply([dlrm_job(&sandbox, job, 1, 1).build()]).await;
    let queue = job_queue(&sandbox, job).await;
    checkpoint_where(&sandbox, &queue, job, |_| true).await;
    let trainer = sandbox.pids(job)["trainer-0"];
    signal(trainer, "STOP").expect("stop trainer-0");
    // The next checkpoint (1 s interval) opens its barrier and waits for the trainer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = kill_data_executor_while_stopped(
        &sandbox,
        job,
        trainer,
        "a checkpoint abandoned",
        |status| {
            (status.events.iter())
                .find(|e| {
                    e.reason == "CheckpointAbandoned"
                        && e.message.contains("data_executor-0 crashed")
                })
                .map(|event| event.message.clone())
        },
    )
    .await;
    assert!(
        condition(&status, "Checkpoint").status,
        "checkpoints are taken again after the abandoned one: {:?}",
        status.conditions
    );
    master.stop();
}

/// Checkpoint and restore through the real services: the job is stopped with its master
/// after an incremental checkpoint of its two PS shards was committed and applied again
/// with three; the next master restores the three shards from the two snapshots (through
/// the chain back to the full snapshot, each keeping the rows the new layout gives it),
/// rolls the task queue back to the checkpoint's offsets and starts the trainer from its
/// totals. The sample count ends at exactly the data set's rows: the rows trained before
/// the barrier are the ones the offsets skip, no more and no fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlrm_job_restarted_from_its_checkpoint_continues_instead_of_starting_over() {
    let sandbox = Sandbox::start().await;
    let best = apply_criteo_dataset(&sandbox).await;
    let data_executor = data_executor();
    let master = start_master_with(&sandbox, &data_executor);
    let job = "dlrm-restart";
    sandbox.apply([dlrm_job(&sandbox, job, 1, 1).build()]).await;
    let queue = job_queue(&sandbox, job).await;
    let record = checkpoint_where(&sandbox, &queue, job, |r| r.chain_start < r.id).await;
    master.stop();
    let total = DLRM_ROWS;
    let status = sandbox.status(job).await;
    assert_eq!(status.phase, Phase::Running, "stopped mid-job: {status:?}");
    assert_eq!(record.ps.len(), 2, "{record:?}");
    let trained = record.samples();
    assert!(trained > 0 && trained < total, "{record:?}");
    let written = std::fs::read_to_string(Path::new(&record.uri).join("checkpoint.json"))
        .expect("checkpoint.json beside the snapshots");
    assert_eq!(
        serde_json::from_str::<checkpoint::CheckpointRecord>(&written).expect("record"),
        record
    );
    for manifest in record.ps.values() {
        let file = manifest.strip_prefix("file://").unwrap_or(manifest);
        assert!(Path::new(file).is_file(), "{manifest}");
    }

    sandbox
        .apply([dlrm_job(&sandbox, job, 1, 1).replicas(1, 1, 3).build()])
        .await;
    let master = start_master_with(&sandbox, &data_executor);
    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    assert_eq!(status.replicas.map(|r| r.ps), Some(3), "{status:?}");
    let restored = condition(&status, "Restored");
    assert!(
        restored
            .message
            .starts_with(&format!("from checkpoint {} ", record.id)),
        "{restored:?}"
    );
    let progress = status.progress.clone().expect("progress");
    assert_eq!(
        progress.samples, total,
        "the restored trainer continues from {trained} samples and the data from the same rows: {progress:?}"
    );
    let steps = record.trainers.values().map(|t| t.steps).sum::<u64>();
    assert!(progress.steps > steps, "{progress:?} vs {record:?}");
    let auc = progress.auc.expect("an AUC");
    assert!(
        auc > best - 0.02,
        "AUC {auc:.4} after the restart is not within 0.02 of the best achievable {best:.4}"
    );
    // Only the newest 3 checkpoints (the default `master.checkpoint.keep`) keep files, and
    // the ones their incremental snapshots chain back to (`full_every` 4 by default).
    let retained = checkpoint::retained(3, 4);
    let latest = checkpoint::latest(&queue)
        .await
        .expect("record")
        .expect("a checkpoint");
    let root = sandbox.dir().join("checkpoints").join(job);
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(&root).expect("checkpoints").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("ckpt-")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if has_files(&entry.path()) {
            kept.push(id);
        }
    }
    kept.sort();
    assert!(
        kept.iter().all(|id| id + retained > latest.id)
            && (latest.chain_start..=latest.id).all(|id| kept.contains(&id)),
        "checkpoints with files: {kept:?}, latest {} (chained to {})",
        latest.id,
        latest.chain_start
    );
    eprintln!(
        "checkpoint {}: {trained} samples, {steps} steps; after the restart {} samples, {} steps, AUC {auc:.4} (best {best:.4}); {} checkpoints, files kept of {kept:?}",
        record.id, progress.samples, progress.steps, latest.id
    );
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_ps_shard_comes_back_with_the_rows_of_the_latest_checkpoint() {
    let sandbox = Sandbox::start().await;
    let best = apply_criteo_dataset(&sandbox).await;
    let master = start_master_with(&sandbox, &data_executor());
    let job = "dlrm-ps-crash";
    sandbox.apply([dlrm_job(&sandbox, job, 1, 1).build()]).await;
    let queue = job_queue(&sandbox, job).await;
    let record = checkpoint_where(&sandbox, &queue, job, |_| true).await;
    signal(sandbox.pids(job)["ps-0"], "KILL").expect("kill ps-0");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let restored = loop {
        let status = sandbox.status(job).await;
        if let Some(c) = status.conditions.iter().find(|c| c.kind == "ShardRestored") {
            break c.clone();
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "ps-0 not restored: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(restored.reason, "FromCheckpoint", "{restored:?}");
    let (checkpoint_id, rows, lost_steps) = restored
        .message
        .strip_prefix("ps-0 restarted and restored from checkpoint ")
        .and_then(|rest| {
            let (id, rest) = rest.split_once(' ')?;
            let (rows, lost) = rest.split_once("): ")?.1.split_once(" rows; ")?;
            let lost = lost.strip_prefix("its updates of the ")?;
            // The steps trained since the checkpoint, as last reported (0 when the kill
            // followed the checkpoint closely).
            let (steps, _) = lost.split_once(" steps (")?;
            Some((
                id.parse::<u64>().ok()?,
                rows.parse::<u64>().ok()?,
                steps.parse::<u64>().ok()?,
            ))
        })
        .unwrap_or_else(|| panic!("unexpected message: {restored:?}"));
    assert!(checkpoint_id >= record.id, "{restored:?} vs {record:?}");
    assert!(
        rows > 0,
        "the checkpoint's rows of ps-0 are back: {restored:?}"
    );
    eprintln!("ps-0 lost the updates of {lost_steps} steps");

    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    let auc = status.progress.and_then(|p| p.auc).expect("an AUC");
    assert!(
        auc > best - 0.03,
        "AUC {auc:.4} after losing ps-0's updates since checkpoint {checkpoint_id} is not within 0.03 of the best achievable {best:.4}"
    );
    eprintln!("{}; AUC {auc:.4} (best {best:.4})", restored.message);
    master.stop();
}

/// `on_ps_failure: rollback`: a PS shard killed mid-job returns the whole Job to its latest
/// checkpoint (every shard restored, data and trainers back to its offsets and totals), so
/// every row is trained into the final model exactly once: the trained count ends at the
/// data set's row count exactly, and the samples trained since the checkpoint are counted
/// as trained again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_ps_shard_under_rollback_returns_the_job_to_its_checkpoint_and_trains_each_row_once()
 {
    let sandbox = Sandbox::start().await;
    let best = apply_criteo_dataset(&sandbox).await;
    let master = start_master_with(&sandbox, &data_executor());
    let job = "dlrm-ps-rollback";
    let spec = dlrm_job(&sandbox, job, 1, 3).with(|spec| {
        if let Some(checkpoint) = &mut spec.checkpoint {
            checkpoint.on_ps_failure = PsFailure::Rollback;
        }
    });
    sandbox.apply([spec.build()]).await;
    let queue = job_queue(&sandbox, job).await;
    let record = checkpoint_where(&sandbox, &queue, job, |_| true).await;
    // Killed once the trainer reported samples past the checkpoint: those are lost with
    // ps-0's updates and must be trained again.
    wait_for_samples_past(&sandbox, job, record.samples()).await;
    signal(sandbox.pids(job)["ps-0"], "KILL").expect("kill ps-0");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let rolled_back = loop {
        let status = sandbox.status(job).await;
        if let Some(c) = status.conditions.iter().find(|c| c.kind == "RolledBack") {
            break c.clone();
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "no rollback after ps-0 was killed: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rolled_back.reason, "ToCheckpoint", "{rolled_back:?}");
    let to = rolled_back
        .message
        .strip_prefix("ps-0 crashed: the Job returned to checkpoint ")
        .and_then(|rest| rest.split_once(' '))
        .and_then(|(id, _)| id.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("unexpected message: {rolled_back:?}"));
    assert!(to >= record.id, "{rolled_back:?} vs {record:?}");

    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    assert!(
        !status.conditions.iter().any(|c| c.kind == "ShardRestored"),
        "ps-0 was not restored alone: {status:?}"
    );
    let progress = status.progress.clone().expect("progress");
    assert_eq!(
        progress.samples, DLRM_ROWS,
        "every row trained once into the final model: {progress:?}"
    );
    assert_eq!(
        progress.fraction,
        Some(1.0),
        "every row trained, some of them twice, is all of them: {progress:?}"
    );
    assert!(
        progress.retrained_samples > 0
            && rolled_back
                .message
                .ends_with(&format!("{} in all", progress.retrained_samples)),
        "the samples trained after the checkpoint are counted as trained again: {progress:?}, {rolled_back:?}"
    );
    let auc = progress.auc.expect("an AUC");
    assert!(
        auc > best - 0.02,
        "AUC {auc:.4} after the rollback is not within 0.02 of the best achievable {best:.4}"
    );
    eprintln!(
        "{}; {} samples trained again; AUC {auc:.4} (best {best:.4})",
        rolled_back.message, progress.retrained_samples
    );
    master.stop();
}

/// `on_worker_failure: rollback`: a trainer, then (in a second Job) a data executor,
/// killed mid-job returns the Job to its latest checkpoint; either way every row is
/// trained into the final model exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_trainer_or_data_executor_under_rollback_loses_and_repeats_no_row() {
    let sandbox = Sandbox::start().await;
    let best = apply_criteo_dataset(&sandbox).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    // Each Parquet read (7 row groups a file) waits 1 s: a Job outlasts its first
    // checkpoint (3 s) on any machine, so the kill lands mid-job.
    settings.master.fault_injection.data_read_delay_ms = 1_000;
    let master = start(&sandbox, &settings);
    for (job, killed) in [
        ("dlrm-trainer-rollback", "trainer-0"),
        ("dlrm-data-rollback", "data_executor-0"),
    ] {
        let spec = dlrm_job(&sandbox, job, 1, 3).with(|spec| {
            if let Some(checkpoint) = &mut spec.checkpoint {
                checkpoint.on_worker_failure = WorkerFailure::Rollback;
            }
        });
        sandbox.apply([spec.build()]).await;
        let queue = job_queue(&sandbox, job).await;
        let record = checkpoint_where(&sandbox, &queue, job, |_| true).await;
        wait_for_samples_past(&sandbox, job, record.samples()).await;
        signal(sandbox.pids(job)[killed], "KILL").expect("kill");

        let status = sandbox
            .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
            .await;
        let rolled_back = condition(&status, "RolledBack");
        assert!(
            rolled_back.message.starts_with(&format!(
                "{killed} crashed: the Job returned to checkpoint "
            )),
            "{rolled_back:?}"
        );
        let progress = status.progress.clone().expect("progress");
        assert_eq!(
            progress.samples, DLRM_ROWS,
            "{job}: every row trained once into the final model: {progress:?}"
        );
        assert!(progress.retrained_samples > 0, "{progress:?}");
        assert_eq!(progress.fraction, Some(1.0), "{job}: {progress:?}");
        let per_source =
            |count: fn(&SourceProgress) -> u64| -> u64 { progress.sources.iter().map(count).sum() };
        assert_eq!(per_source(|s| s.samples), progress.samples, "{progress:?}");
        assert_eq!(
            per_source(|s| s.retrained_samples),
            progress.retrained_samples,
            "{progress:?}"
        );
        // The rows read since the checkpoint were read again.
        assert!(per_source(|s| s.rows_read) > DLRM_ROWS, "{progress:?}");
        let auc = progress.auc.expect("an AUC");
        assert!(
            auc > best - 0.02,
            "{job}: AUC {auc:.4} is not within 0.02 of the best achievable {best:.4}"
        );
        eprintln!("{}; AUC {auc:.4} (best {best:.4})", rolled_back.message);
    }
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_trainer_continues_its_counters_instead_of_restarting_them() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let master = start_master_with(&sandbox, &data_executor());
    let job = "dlrm-trainer-crash";
    let (before, status) = train_through_a_kill(&sandbox, job, "trainer-0").await;
    // The minibatches the dead trainer had not confirmed were served again; those it had
    // are in the totals it continued from.
    let progress = status.progress.clone().unwrap_or_default();
    assert_eq!(
        progress.samples, DLRM_ROWS,
        "samples counted of {DLRM_ROWS} rows ({before} before the kill)"
    );
    let per_source: Vec<(&str, u64)> = (progress.sources.iter())
        .map(|s| (s.source.as_str(), s.samples))
        .collect();
    assert_eq!(per_source, [("criteo", DLRM_ROWS)], "{progress:?}");
    // No executor died and nothing rolled back: every row was read once.
    assert_eq!(progress.sources[0].rows_read, DLRM_ROWS, "{progress:?}");
    eprintln!("{before} samples before the kill, {DLRM_ROWS} at the end");
    master.stop();
}

/// Without a rollback, a data executor killed while serving loses and repeats no row: the
/// rows it served after its last progress report are reported by the trainer that
/// received them, so its successor reads on after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_data_executor_is_succeeded_without_losing_or_repeating_a_row() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let master = start_master_with(&sandbox, &data_executor());
    let job = "dlrm-data-crash";
    let (before, status) = train_through_a_kill(&sandbox, job, "data_executor-0").await;
    let progress = status.progress.clone().unwrap_or_default();
    assert_eq!(
        progress.samples, DLRM_ROWS,
        "samples trained of {DLRM_ROWS} rows ({before} before the kill): {progress:?}"
    );
    let killed = status.executors.iter().find(|e| e.id == "data_executor-0");
    assert!(
        killed.is_some_and(|e| e.restarts == 1),
        "{:?}",
        status.executors
    );
    // The trainer exits at the end of its data; the master stops the rest.
    for executor in &status.executors {
        let ended = match executor.id.starts_with("trainer-") {
            true => ExecutorState::Completed,
            false => ExecutorState::Stopped,
        };
        assert_eq!(executor.state, ended, "{:?}", status.executors);
    }
    eprintln!(
        "{before} samples before the kill, {} of {DLRM_ROWS} rows read",
        progress.sources[0].rows_read
    );
    master.stop();
}

/// A PS shard that stops answering (SIGSTOP: its socket still accepts) does not hold up
/// the Job's loop, which asks every shard for its memory each status tick: a data executor
/// killed meanwhile is seen restarting, and once the shard continues every row is trained
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_ps_shard_does_not_hold_up_the_job() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let master = start_master_with(&sandbox, &data_executor());
    let job = "dlrm-stopped-shard";
    sandbox
        .apply([dlrm_job(&sandbox, job, 1, 3600).build()])
        .await;
    wait_for_samples_past(&sandbox, job, 0).await;
    let shard = sandbox.pids(job)["ps-0"];
    signal(shard, "STOP").expect("stop ps-0");
    // Status ticks (200 ms) reach the stopped shard.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let what = "the restart of data_executor-0 in the Job's status, with ps-0 stopped";
    kill_data_executor_while_stopped(&sandbox, job, shard, what, |status| {
        (status.executors.iter())
            .any(|e| e.id == "data_executor-0" && e.restarts == 1)
            .then_some(())
    })
    .await;
    master.stop();
}

/// How long a stopped process stays stopped after what a test waits for: longer than a
/// silent data executor's tasks wait for its trainers' reports.
const STALL: Duration = Duration::from_secs(12);

/// SIGKILLs `job`'s data_executor-0 while the process `stopped` is held (SIGSTOP), waits
/// up to 30 s for `found` in the Job's status (printing how soon it came), holds `stopped`
/// for [`STALL`] more, continues it, and waits for the Job to succeed. Rows the killed
/// executor served that never reached the stalled trainer are served again by its
/// successor, and rows the trainer received are not, however long it stalled: every row
/// is trained once. Returns the final status.
async fn kill_data_executor_while_stopped<T>(
    sandbox: &Sandbox,
    job: &str,
    stopped: u32,
    what: &str,
    found: impl Fn(&Status) -> Option<T>,
) -> Status {
    signal(sandbox.pids(job)["data_executor-0"], "KILL").expect("kill data_executor-0");
    let killed = tokio::time::Instant::now();
    wait_for_status(sandbox, job, Duration::from_secs(30), what, found).await;
    eprintln!(
        "{what}: {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    tokio::time::sleep(STALL).await;
    signal(stopped, "CONT").expect("continue the stopped process");
    let status = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(300))
        .await;
    let progress = status.progress.clone().unwrap_or_default();
    assert_eq!(
        progress.samples,
        DLRM_ROWS,
        "{progress:?}\n{}",
        sandbox.logs(job)
    );
    status
}

/// Runs DLRM Job `job` (no checkpoint within its run), SIGKILLs `killed` a third of the
/// way in, and waits for it to succeed; the Job's sample count never goes back. Returns
/// the samples trained before the kill and the final status.
async fn train_through_a_kill(sandbox: &Sandbox, job: &str, killed: &str) -> (u64, Status) {
    sandbox
        .apply([dlrm_job(sandbox, job, 1, 3600).build()])
        .await;
    let samples = |status: &Status| status.progress.as_ref().map_or(0, |p| p.samples);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let before = loop {
        let status = sandbox.status(job).await;
        if samples(&status) >= DLRM_ROWS / 3 {
            break samples(&status);
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "{status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    signal(sandbox.pids(job)[killed], "KILL").expect("kill");
    let mut highest = before;
    loop {
        let status = sandbox.status(job).await;
        assert!(
            samples(&status) >= highest,
            "progress went back from {highest}: {status:?}"
        );
        highest = samples(&status);
        if status.phase == Phase::Succeeded {
            return (before, status);
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "{status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().is_file() || has_files(&e.path()))
    })
}
