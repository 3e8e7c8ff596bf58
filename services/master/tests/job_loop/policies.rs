//! The status tick's policies, each driven by what the scripted executors report.

use std::collections::HashMap;

use primus_backend::ExecutorRole;
use primus_harness::resources::JobBuilder;
use primus_scripted::{Call, Script};
use primus_spec::job::parse_memory;
use primus_spec::status::Phase;

use crate::{ScriptedJob, requested};

/// Tasks that stay pending: each takes ten thousand reports.
fn busy() -> Script {
    Script {
        rows_per_task: 1_000_000,
        ..Script::default()
    }
}

/// Scaling by load between 1 and 2 data executors, with no cooldown.
fn scaling_by_load(job: JobBuilder) -> JobBuilder {
    job.with(|spec| {
        let scaling = &mut spec.scaling;
        (
            scaling.enabled,
            scaling.max_data_executors,
            scaling.cooldown_seconds,
        ) = (true, 2, 0);
    })
}

/// Starved, busy data executors with tasks waiting get one more (Primus Eq. 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starved_data_executors_are_scaled_out() {
    let starved = Script {
        buffer_fill: 0.0,
        usage: HashMap::from([(ExecutorRole::DataExecutor, (1.0, 1 << 30))]),
        ..busy()
    };
    let job = ScriptedJob::start("starved", 8, (1, 1), starved, scaling_by_load).await;
    job.wait_for_call("requesting data_executor-1", |c| {
        requested(c, "data_executor-1")
    })
    .await;
    let event = job.wait_for_event("starved", "ScaledOut").await;
    assert!(event.message.contains("starvation 1.00"), "{event:?}");
    let calls = job.backend.calls();
    let more = calls
        .iter()
        .filter(|c| requested(c, "data_executor-2"))
        .count();
    assert_eq!(more, 0, "max_data_executors is 2: {calls:#?}");
}

/// Full buffers and idle data executors: one fewer, down to `min_data_executors`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_data_executors_are_scaled_in() {
    let idle = Script {
        buffer_fill: 1.0,
        usage: HashMap::from([(ExecutorRole::DataExecutor, (0.0, 1 << 20))]),
        ..busy()
    };
    let job = ScriptedJob::start("idle", 8, (2, 1), idle, scaling_by_load).await;
    job.wait_for_call(
        "releasing data_executor-1",
        |c| matches!(c, Call::Released { id, .. } if id == "data_executor-1"),
    )
    .await;
    job.wait_for_event("idle", "ScaledIn").await;
    assert_eq!(
        job.backend.running("idle"),
        ["data_executor-0", "ps-0", "trainer-0"],
        "min_data_executors is 1"
    );
}

/// A trainer whose memory forecast crosses its allotment is given more before it runs
/// out (Primus Eq. 2-3, vertical scaling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trainer_outgrowing_its_memory_is_given_more_first() {
    let memory = parse_memory("1Gi").expect("memory");
    let near_limit = Script {
        usage_of: HashMap::from([("trainer-0".to_owned(), (1.0, memory - (24 << 20)))]),
        ..busy()
    };
    let job = ScriptedJob::start("growing", 8, (1, 1), near_limit, |j| j).await;
    let calls = job
        .wait_for_call(
            "resizing trainer-0",
            |c| matches!(c, Call::Resized { id, .. } if id == "trainer-0"),
        )
        .await;
    let raised = calls.iter().find_map(|c| match c {
        Call::Resized { memory_bytes, .. } => Some(*memory_bytes),
        _ => None,
    });
    // The most it used plus the 10% safety margin (no growth forecast).
    let needed = memory - (24 << 20) + memory / 10;
    assert!(
        raised.is_some_and(|bytes| bytes.abs_diff(needed) < 1 << 20),
        "{calls:#?}"
    );
    let event = job.wait_for_event("growing", "MemoryRaised").await;
    assert!(event.message.starts_with("trainer-0"), "{event:?}");
    let others = calls
        .iter()
        .filter(|c| matches!(c, Call::Resized { id, .. } if id != "trainer-0"));
    assert_eq!(others.count(), 0, "only trainer-0 grows: {calls:#?}");
}

/// A data executor serving at a tenth of its peers' rate is marked a straggler, and once
/// nothing waits and a faster one is idle, its task is taken back for it (DLRover-RM §5.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggler_is_marked_and_its_task_taken_back() {
    let script = Script {
        served_rates: HashMap::from([("data_executor-2".to_owned(), 10)]),
        rows_per_task: 6_000,
        ..Script::default()
    };
    let job = ScriptedJob::start("straggling", 4, (3, 1), script, |j| j).await;
    let event = job.wait_for_event("straggling", "Straggler").await;
    assert!(event.message.contains("data_executor-2"), "{event:?}");
    let moved = job.wait_for_event("straggling", "StragglerTaskMoved").await;
    assert!(
        moved.message.contains("taken back from data_executor-2"),
        "{moved:?}"
    );
    job.wait_for_phase("straggling", Phase::Succeeded).await;
}
