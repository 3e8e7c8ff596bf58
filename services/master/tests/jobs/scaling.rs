//! A running Job's executors change while it runs: `apply` with other replicas scales it
//! live, and with `spec.scaling` its data executors follow their load.

use std::time::Duration;

use primus_spec::job::AllocationPolicy;
use primus_spec::status::{Phase, Replicas, Status};

use crate::common::{
    DLRM_ROWS, apply_criteo_dataset, apply_online_job, data_executor, dlrm_job, master_settings,
    publish_rows, start,
};
use primus_harness::{Sandbox, condition};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::topology_service_client::TopologyServiceClient;
use primus_proto::v1::{GetTopologyRequest, Role, StatsRequest};

/// One PS shard's memory in the OOM prevention test, under what the Job's keys grow to.
const PS_MEMORY: &str = "200Ki";

/// Waits until the Job reports `data_executors` data executors and `trainers` trainers
/// (and `ps` PS shards, when given).
async fn wait_for_replicas(
    sandbox: &Sandbox,
    job: &str,
    data_executors: u32,
    trainers: u32,
    ps: Option<u32>,
) -> Status {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let status = sandbox.status(job).await;
        let now = status
            .replicas
            .map(|r| (r.data_executors, r.trainers, ps.map(|_| r.ps)));
        if now == Some((data_executors, trainers, ps)) {
            return status;
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "expected {data_executors} data executors, {trainers} trainers, {ps:?} PS shards: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the DLRM Job `job` succeeds and checks it trained on every row exactly once.
async fn succeeds_with_every_row_once(sandbox: &Sandbox, job: &str) -> Status {
    let done = sandbox
        .wait_for_phase(job, Phase::Succeeded, Duration::from_secs(600))
        .await;
    let samples = done.progress.as_ref().map(|p| p.samples);
    assert_eq!(
        samples,
        Some(DLRM_ROWS),
        "every row trained once: {done:?}\n{}",
        sandbox.logs(job)
    );
    let fraction = done.progress.as_ref().and_then(|p| p.fraction);
    assert_eq!(fraction, Some(1.0), "every row counted: {done:?}");
    done
}

fn events<'a>(status: &'a Status, reason: &str) -> Vec<&'a str> {
    status
        .events
        .iter()
        .filter(|e| e.reason == reason)
        .map(|e| e.message.as_str())
        .collect()
}

/// A DLRM Job started with one data executor, one trainer and two PS shards goes to two,
/// two and three and back while it trains (the data executors read slowly, as from a slow
/// object store, so it is still training): `status.replicas` and the events follow each
/// step, the PS is resharded live both ways, and the Job trains on every row exactly once,
/// the rows of the removed data executor's unfinished tasks included, the samples of the
/// removed trainer counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_scaled_out_and_in_trains_on_every_row_once() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let job = |data_executors, trainers, ps| {
        dlrm_job(&sandbox, "elastic", 1, 3600)
            .replicas(data_executors, trainers, ps)
            .build()
    };
    sandbox.apply([job(1, 1, 2)]).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.status_interval_ms = 200;
    settings.master.fault_injection.data_read_delay_ms = 1_500;
    let master = start(&sandbox, &settings);
    let started = wait_for_replicas(&sandbox, "elastic", 1, 1, None).await;
    assert_eq!(
        started.replicas,
        Some(Replicas {
            ps: 2,
            data_executors: 1,
            trainers: 1,
            serving: 0
        })
    );
    sandbox.wait_for_at_least("elastic", 20_000).await;

    sandbox.apply([job(2, 2, 3)]).await;
    let scaled_out = wait_for_replicas(&sandbox, "elastic", 2, 2, Some(3)).await;
    let resharded = events(&scaled_out, "Resharded");
    assert!(
        resharded.iter().any(|m| m.starts_with("ps 2 -> 3")),
        "{scaled_out:?}"
    );
    let out = events(&scaled_out, "ScaledOut");
    assert!(
        out.iter()
            .any(|m| m.starts_with("started data_executor-1: data_executors 1 -> 2"))
            && out
                .iter()
                .any(|m| m.starts_with("started trainer-1: trainers 1 -> 2")),
        "{scaled_out:?}"
    );
    assert_eq!(condition(&scaled_out, "SpecChange").reason, "Applied");
    // Long enough for the resource model to count this allocation (it settles for 5 s).
    let samples = scaled_out.progress.map_or(0, |p| p.samples);
    let midway = sandbox
        .wait_for_at_least("elastic", samples + 160_000)
        .await;
    // Progress counts rows, not tasks (files are cut by bytes; some parts hold no rows).
    let progress = midway.progress.unwrap_or_default();
    let trained = progress.samples as f64 / DLRM_ROWS as f64;
    assert!(
        progress.fraction.is_some_and(|f| (f - trained).abs() < 0.1),
        "progress {:?} for {trained:.3} of the rows trained",
        progress.fraction
    );

    sandbox.apply([job(1, 1, 2)]).await;
    let scaled_in = wait_for_replicas(&sandbox, "elastic", 1, 1, Some(2)).await;
    let resharded = events(&scaled_in, "Resharded");
    assert!(
        resharded.iter().any(|m| m.starts_with("ps 3 -> 2")),
        "{scaled_in:?}"
    );
    let stopped = events(&scaled_in, "ScaledIn");
    assert!(
        stopped
            .iter()
            .any(|m| m.starts_with("stopped data_executor-1: data_executors 2 -> 1"))
            && stopped
                .iter()
                .any(|m| m.starts_with("stopped trainer-1: trainers 2 -> 1")),
        "{scaled_in:?}"
    );
    assert_ne!(
        scaled_in.phase,
        Phase::Succeeded,
        "scaled in while training"
    );

    let done = succeeds_with_every_row_once(&sandbox, "elastic").await;
    // Two allocations ran: the resource-performance model was fitted to them.
    let model = condition(&done, "ResourceModel");
    assert!(
        model.reason == "Fitted" && model.message.starts_with("from 2 allocations: T_iter = "),
        "{model:?}"
    );
    eprintln!("resource model: {}", model.message);
    master.stop();
}

/// A `policy: auto` Job started with one trainer and one PS shard on a master given 16
/// cores: the optimizer first explores (a second trainer, so the model has two
/// allocations to fit), then moves the Job by its fitted model (the rows come slowly, so
/// more trainers gain nothing); each step is an event and the `ResourcePlan` condition,
/// and the Job still trains on every row exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_optimizer_moves_an_auto_job_by_its_fitted_model() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let job = dlrm_job(&sandbox, "optimized", 1, 3600)
        .replicas(1, 1, 1)
        .with(|spec| {
            let scaling = &mut spec.scaling;
            scaling.policy = AllocationPolicy::Auto;
            scaling.cooldown_seconds = 1;
            scaling.max_trainers = 3;
            scaling.max_ps = 2;
        });
    sandbox.apply([job.build()]).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.status_interval_ms = 200;
    settings.master.fault_injection.data_read_delay_ms = 1_000;
    settings.master.cluster.cpu = Some(16.0);
    let master = start(&sandbox, &settings);
    let explored = wait_for_replicas(&sandbox, "optimized", 1, 2, Some(1)).await;
    let steps = events(&explored, "Optimized");
    assert!(
        steps[0].starts_with("step 1 of at most 8: trainers 1 -> 2, PS shards 1 -> 1 (exploring"),
        "{steps:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let planned = loop {
        let status = sandbox.status("optimized").await;
        if events(&status, "Optimized").len() >= 2 {
            break status;
        }
        assert!(
            !status.phase.is_terminal() && tokio::time::Instant::now() < deadline,
            "a second step from the fitted model: {status:?}\n{}",
            sandbox.logs("optimized")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let second = events(&planned, "Optimized")[1].to_owned();
    assert!(
        second.starts_with("step 2 of at most 8: ")
            && (second.contains("(right-sizing: ")
                || second.contains("(selected among 1 Jobs' plans (rho 2.5)")),
        "{second}"
    );
    assert!(
        condition(&planned, "ResourcePlan")
            .message
            .starts_with("step ")
    );
    assert_eq!(condition(&planned, "ResourceModel").reason, "Fitted");
    let done = succeeds_with_every_row_once(&sandbox, "optimized").await;
    let taken = events(&done, "Optimized");
    assert!(taken.len() <= 8, "{taken:?}");
    eprintln!("optimizer steps: {taken:?}");
    master.stop();
}

/// A DLRM Job whose one data executor reads slowly (as from a slow object store) starves its
/// trainer: with `spec.scaling` on, the master adds data executors by their load, says so
/// with the figures it used, and the Job still trains on every row exactly once. The
/// backend's measurements of each executor are in the Metric resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starving_trainers_make_the_master_add_data_executors_by_load() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let autoscaled = dlrm_job(&sandbox, "autoscaled", 1, 3600).with(|spec| {
        let policy = &mut spec.scaling;
        policy.enabled = true;
        policy.min_data_executors = 1;
        policy.max_data_executors = 3;
        policy.cooldown_seconds = 2;
    });
    sandbox.apply([autoscaled.build()]).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.status_interval_ms = 200;
    settings.master.fault_injection.data_read_delay_ms = 2_000;
    let master = start(&sandbox, &settings);
    let scaled = wait_for_replicas(&sandbox, "autoscaled", 2, 1, None).await;
    let out = events(&scaled, "ScaledOut");
    assert!(
        out.iter().any(
            |m| m.starts_with("started data_executor-1: data_executors 1 -> 2 (load ")
                && m.contains(" > 0.60 over the last ")
                && m.contains("starvation ")
                && m.contains("tasks pending")
        ),
        "{scaled:?}"
    );
    succeeds_with_every_row_once(&sandbox, "autoscaled").await;
    let metric = sandbox
        .client()
        .await
        .get(primus_spec::Kind::Metric, "autoscaled")
        .await
        .expect("the Job's Metric resource");
    let spec: primus_spec::metric::MetricSpec =
        serde_json::from_str(&metric.spec_json).expect("metric spec");
    let measured = |name: &str, role: &str| {
        spec.series.iter().any(|s| {
            s.name == name
                && s.role.as_deref() == Some(role)
                && s.points.iter().any(|p| p.value > 0.0)
        })
    };
    assert!(
        measured("cpu_cores", "trainer")
            && measured("memory_bytes", "data_executor")
            && measured("memory_bytes", "ps"),
        "{:?}",
        spec.series
            .iter()
            .map(|s| (
                &s.name,
                &s.role,
                s.points.iter().map(|p| p.value).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
    );

    master.stop();
}

/// A DLRM Job with two data executors, one of which reads much slower than the other (a
/// straggler, by fault injection): the master finds it, says so with the rates it compared,
/// takes its task back once the faster executor is idle, and the Job trains on every row
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_straggling_data_executor_gives_its_task_to_a_faster_one() {
    let sandbox = Sandbox::start().await;
    apply_criteo_dataset(&sandbox).await;
    let straggling = dlrm_job(&sandbox, "straggling", 1, 3600).replicas(2, 1, 2);
    sandbox.apply([straggling.build()]).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.status_interval_ms = 200;
    let faults = &mut settings.master.fault_injection;
    (faults.slow_data_executor, faults.slow_read_delay_ms) = (Some(1), 20_000);
    let master = start(&sandbox, &settings);
    succeeds_with_every_row_once(&sandbox, "straggling").await;
    let status = sandbox.status("straggling").await;
    let found = events(&status, "Straggler");
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("data_executor-1 served ") && m.contains("median")),
        "{status:?}\n{}",
        sandbox.logs("straggling")
    );
    let moved = events(&status, "StragglerTaskMoved");
    assert!(
        moved
            .iter()
            .any(|m| m.contains("taken back from data_executor-1 at offset ")),
        "{status:?}"
    );
    master.stop();
}

/// New ids published after the first 500 rows, `NEW_IDS_PER_BATCH` at a time.
const NEW_IDS: u64 = 3_000;
const NEW_IDS_PER_BATCH: u64 = 100;

/// How the OOM prevention test's Jobs handle PS memory.
#[derive(Clone, Copy)]
enum Prevention {
    Off,
    /// More shards only.
    Horizontal,
    /// More memory for the shard, where the backend can give it.
    Vertical,
}

/// Runs the stream Job `name` on one PS shard with `topology.ps.memory` `PS_MEMORY` while its
/// key space grows: a batch of new ids every 300 ms. Returns its status once every row is
/// trained, and the most bytes any PS shard held.
async fn run_with_growing_keys(name: &str, prevention: Prevention) -> (Status, u64) {
    let sandbox = Sandbox::start().await;
    let js = apply_online_job(&sandbox, name, |spec| {
        spec.topology.ps.memory = PS_MEMORY.to_owned();
        let policy = &mut spec.scaling.memory;
        (policy.samples, policy.horizon_seconds) = (5, 5);
        policy.min_change = "1Ki".to_owned();
        policy.oom_prevention = !matches!(prevention, Prevention::Off);
        policy.vertical = matches!(prevention, Prevention::Vertical);
    })
    .await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.master.status_interval_ms = 200;
    let master = start(&sandbox, &settings);
    sandbox.wait_for_samples(name, 500).await;
    let mut most = 0;
    for batch in 0..NEW_IDS / NEW_IDS_PER_BATCH {
        let first = 1_000 + batch * NEW_IDS_PER_BATCH;
        publish_rows(&js, "clicks.live", first..first + NEW_IDS_PER_BATCH).await;
        most = most.max(most_held(master.addr(), name).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    sandbox.wait_for_samples(name, 500 + NEW_IDS).await;
    most = most.max(most_held(master.addr(), name).await);
    let status = sandbox.status(name).await;
    assert_eq!(
        status.phase,
        Phase::Running,
        "{status:?}\n{}",
        sandbox.logs(name)
    );
    sandbox.delete_job(name).await;
    master.stop();
    (status, most)
}

/// The most bytes any PS shard of `job` holds now.
async fn most_held(master: &str, job: &str) -> u64 {
    let Ok(mut client) = TopologyServiceClient::connect(format!("http://{master}")).await else {
        return 0;
    };
    let Ok(answer) = client
        .get_topology(GetTopologyRequest { job: job.into() })
        .await
    else {
        return 0;
    };
    let mut most = 0;
    for shard in primus_proto::role_addrs(&answer.into_inner().endpoints, Role::Ps) {
        if let Ok(mut client) = ParameterServerClient::connect(format!("http://{shard}")).await
            && let Ok(stats) = client.stats(StatsRequest {}).await
        {
            most = most.max(stats.into_inner().memory_bytes);
        }
    }
    most
}

/// A Job whose key space outgrows one PS shard's `topology.ps.memory`: with OOM prevention
/// off the shard refuses new keys at its limit (the `PsMemory` condition names it) and
/// never aborts; with it on, the master forecasts the growth and, before the limit, adds a
/// shard, or gives the shard more memory (this host has it); no key is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ps_outgrowing_its_memory_gets_another_shard_or_more_memory_before_it_refuses_keys() {
    let limit = primus_spec::job::parse_memory(PS_MEMORY).expect("memory");
    let (unprevented, most) = run_with_growing_keys("unprevented", Prevention::Off).await;
    let refused = condition(&unprevented, "PsMemory");
    assert!(
        refused.reason == "NewKeysRefused" && refused.message.contains(&format!("{limit} bytes")),
        "{unprevented:?}"
    );
    assert!(most >= limit, "{most} bytes held, limit {limit}");
    assert_eq!(unprevented.replicas.map(|r| r.ps), Some(1));
    let no_refusal = |status: &Status| status.conditions.iter().all(|c| c.kind != "PsMemory");

    let (resharded, most) = run_with_growing_keys("resharded", Prevention::Horizontal).await;
    assert!(
        events(&resharded, "MemoryForecast")
            .iter()
            .any(|m| m.starts_with("ps-0 holds ") && m.contains("adding a PS shard")),
        "{resharded:?}"
    );
    assert!(
        events(&resharded, "Resharded")
            .iter()
            .any(|m| m.starts_with("ps 1 -> 2")),
        "{resharded:?}"
    );
    assert!(no_refusal(&resharded), "{resharded:?}");
    assert!(most < limit, "{most} bytes held, limit {limit}");

    let (raised, most) = run_with_growing_keys("raised", Prevention::Vertical).await;
    let given = events(&raised, "MemoryRaised");
    assert!(
        given
            .iter()
            .any(|m| m.starts_with("ps-0 holds ") && m.contains("Primus Eq. 3")),
        "{raised:?}"
    );
    assert!(no_refusal(&raised), "{raised:?}");
    assert_eq!(raised.replicas.map(|r| r.ps), Some(1), "{raised:?}");
    assert!(
        most > limit,
        "grew past its first memory: {most} bytes, {limit}"
    );
}
