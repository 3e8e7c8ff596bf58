//! A Job's start, end and lost executors.

use primus_backend::{ExecutorRole, Gang};
use primus_harness::condition;
use primus_scripted::{Call, Script};
use primus_spec::job::parse_memory;
use primus_spec::status::{ExecutorState, Phase};

use crate::{ScriptedJob, requested};

/// PS shards start before the data executors and trainers; the Job succeeds once its
/// tasks are done and its trainers exited 0, and every executor is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_job_succeeds_when_its_executors_drain_the_queue() {
    let job = ScriptedJob::start("drained", 4, (2, 2), Script::default(), |j| j).await;
    let status = job.wait_for_phase("drained", Phase::Succeeded).await;
    let complete = condition(&status, "Complete");
    assert_eq!(
        complete.message, "all 4 data tasks succeeded; 2 trainers finished",
        "{status:#?}"
    );
    let calls = job.backend.calls();
    let first = |id: &str| calls.iter().position(|c| requested(c, id));
    let ps = first("ps-0").expect("ps-0 requested");
    for id in [
        "data_executor-0",
        "data_executor-1",
        "trainer-0",
        "trainer-1",
    ] {
        assert!(
            first(id).is_some_and(|at| at > ps),
            "{id} after ps-0: {calls:#?}"
        );
    }
    let calls = job
        .wait_for_call(
            "releasing ps-0",
            |c| matches!(c, Call::Released { id, .. } if id == "ps-0"),
        )
        .await;
    assert!(job.backend.running("drained").is_empty(), "{calls:#?}");
}

/// An executor the backend gave up on fails the Job, naming it and how it exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_that_keeps_crashing_fails_the_job() {
    let slow = Script {
        rows_per_task: 1_000_000,
        ..Script::default()
    };
    let job = ScriptedJob::start("crashing", 4, (1, 1), slow, |j| j).await;
    job.wait_for_phase("crashing", Phase::Running).await;
    job.backend.give_up("crashing", "trainer-0");
    let status = job.wait_for_phase("crashing", Phase::Failed).await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "ExecutorFailed");
    assert_eq!(
        complete.message,
        "trainer-0 keeps crashing: exit status: 101"
    );
    let trainer = status.executors.iter().find(|e| e.id == "trainer-0");
    assert!(
        trainer.is_some_and(|t| t.state == ExecutorState::Failed),
        "{:#?}",
        status.executors
    );
}

/// An executor killed for its memory is given half as much again before its restart runs
/// into the same limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_for_its_memory_is_given_half_as_much_again() {
    let slow = Script {
        rows_per_task: 1_000_000,
        ..Script::default()
    };
    let job = ScriptedJob::start("killed", 4, (1, 1), slow, |j| j).await;
    job.wait_for_phase("killed", Phase::Running).await;
    job.backend.out_of_memory("killed", "data_executor-0");
    let given = parse_memory("1Gi").expect("memory");
    let calls = job
        .wait_for_call(
            "resizing data_executor-0",
            |c| matches!(c, Call::Resized { id, .. } if id == "data_executor-0"),
        )
        .await;
    let resized = calls.iter().find_map(|c| match c {
        Call::Resized { memory_bytes, .. } => Some(*memory_bytes),
        _ => None,
    });
    assert_eq!(resized, Some(given + given / 2));
    let event = job.wait_for_event("killed", "MemoryRaised").await;
    assert!(
        event
            .message
            .contains("data_executor-0 was killed for its memory"),
        "{event:?}"
    );
    assert_eq!(
        job.backend.running("killed"),
        [
            ExecutorRole::DataExecutor,
            ExecutorRole::Ps,
            ExecutorRole::Trainer
        ]
        .map(|role| format!("{}-0", role.as_str())),
        "nothing else stopped"
    );
}

/// A backend that places gangs gets the Job's whole gang declared, then every executor
/// requested before any PS shard opens (a gang partly requested would never be placed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_is_declared_and_requested_whole_before_its_shards_open() {
    let gangs = Script {
        gangs: true,
        ..Script::default()
    };
    let job = ScriptedJob::start("gang", 4, (2, 3), gangs, |j| j).await;
    job.wait_for_phase("gang", Phase::Succeeded).await;
    let calls = job.backend.calls();
    let gib = parse_memory("1Gi").expect("memory");
    let declared = Call::FormedGang {
        job: "gang".into(),
        gang: Gang {
            members: 6,
            cpu: 6.0,
            memory_bytes: 6 * gib,
        },
    };
    assert_eq!(calls.first(), Some(&declared), "{calls:#?}");
    let opened = calls.iter().position(|c| matches!(c, Call::Opened { .. }));
    let requested = calls
        .iter()
        .rposition(|c| matches!(c, Call::Requested { .. }));
    assert!(
        opened.is_some_and(|opened| requested.is_some_and(|last| last < opened)),
        "every executor requested before ps-0 opened: {calls:#?}"
    );
    let count = calls
        .iter()
        .filter(|c| matches!(c, Call::Requested { .. }))
        .count();
    assert_eq!(count, 6, "{calls:#?}");
}
