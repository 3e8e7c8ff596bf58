//! The master's Job loop over scripted executors: the real master (in this process), NATS,
//! Redis and API server, with `primus-scripted`'s backend in place of processes. Each test
//! scripts what the executors report and what happens to them, and checks what the
//! master's policies and recovery paths did: what it asked of the backend, and the Job's
//! status. They run in about a second each; the suites in `tests/jobs` run the same paths
//! with real executor processes.

mod policies;
mod recovery;
mod stores;

use std::sync::Arc;
use std::time::Duration;

use primus_bus::Bus;
use primus_config::MasterSettings;
use primus_harness::Sandbox;
use primus_harness::partitions::write_partitions;
use primus_harness::resources::{JobBuilder, dataset, hourly, job, parquet, small_wide_deep};
use primus_master::TickTimes;
use primus_scripted::{Call, Script, ScriptedBackend};
use primus_service::Shutdown;
use primus_spec::Resource;
use primus_spec::job::TrainingMode;
use primus_spec::status::{Event, Phase, Status};

/// How long any awaited state may take.
const PATIENCE: Duration = Duration::from_secs(30);

/// A sandbox, a master in this process over scripted executors, and hourly partitions.
struct ScriptedJob {
    sandbox: Sandbox,
    backend: ScriptedBackend,
    shutdown: Shutdown,
}

impl Drop for ScriptedJob {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

impl ScriptedJob {
    /// Starts the master and applies Job `name` over `hours` hourly tasks with
    /// `data_executors` and `trainers`, after `change` to the Job.
    async fn start(
        name: &str,
        hours: u32,
        executors: (u32, u32),
        script: Script,
        change: impl FnOnce(JobBuilder) -> JobBuilder,
    ) -> Self {
        let sandbox = Sandbox::start().await;
        let data = sandbox.dir().join("data");
        write_partitions(&data, "2026-01-01", 1).await;
        let settings = sandbox.master_settings();
        let resources = id_job(name, &data.display(), hours, executors, change);
        Self::start_master(sandbox, settings, script, resources).await
    }

    /// Starts a master with `settings` (status and planning every 50 ms) in `sandbox` and
    /// applies `resources`.
    async fn start_master(
        sandbox: Sandbox,
        mut settings: MasterSettings,
        script: Script,
        resources: [Resource; 2],
    ) -> Self {
        settings.master.status_interval_ms = 50;
        settings.master.planner.poll_interval_ms = 50;
        let bus = Bus::connect(&settings.nats).await.expect("nats");
        let backend = ScriptedBackend::new(bus, settings.server.grpc_addr, script);
        let shutdown = Shutdown::new();
        let master = primus_master::serve_on(
            settings,
            Arc::new(backend.clone()),
            TickTimes::default(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = master.await {
                panic!("the master stopped: {e:#}");
            }
        });
        sandbox.apply(resources).await;
        Self {
            sandbox,
            backend,
            shutdown,
        }
    }

    async fn wait_for_phase(&self, job: &str, phase: Phase) -> Status {
        self.sandbox.wait_for_phase(job, phase, PATIENCE).await
    }

    /// Waits until the backend was asked `wanted`; returns every call so far.
    async fn wait_for_call(&self, what: &str, wanted: impl Fn(&Call) -> bool) -> Vec<Call> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let calls = self.backend.calls();
            if calls.iter().any(&wanted) {
                return calls;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no call {what} within {PATIENCE:?}; calls: {calls:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the Job's status holds an event of `reason`; returns it.
    async fn wait_for_event(&self, job: &str, reason: &str) -> Event {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let status = self.sandbox.status(job).await;
            if let Some(event) = status.events.iter().find(|e| e.reason == reason) {
                return event.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {reason} event within {PATIENCE:?}; events: {:#?}",
                status.events
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Dataset `<name>-data` (the first `hours` hours of the partitions under `data`, one task
/// each) and batch Job `name` over it.
fn id_job(
    name: &str,
    data: &dyn std::fmt::Display,
    hours: u32,
    (data_executors, trainers): (u32, u32),
    change: impl FnOnce(JobBuilder) -> JobBuilder,
) -> [Resource; 2] {
    let dataset_name = format!("{name}-data");
    let end = format!("2026-01-01T{hours:02}");
    let window = hourly("2026-01-01T00", Some(&end));
    let source = parquet("clicks", data);
    let job = job(name, &dataset_name, TrainingMode::Batch, small_wide_deep()).replicas(
        data_executors,
        trainers,
        1,
    );
    [
        dataset(&dataset_name)
            .stream("logs", window, vec![source])
            .build(),
        change(job).build(),
    ]
}

/// Whether `call` requested executor `id`.
fn requested(call: &Call, id: &str) -> bool {
    matches!(call, Call::Requested { id: requested, .. } if requested == id)
}
