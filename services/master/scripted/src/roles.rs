//! What a scripted executor does beside answering calls. A data executor registers with
//! the master's task service, takes a task, reports its progress every
//! `Script::report_interval` and finishes it once it served `Script::rows_per_task` rows, and
//! publishes a heartbeat and its buffer fill each time; once the task service says the
//! Job's data is exhausted it holds nothing more. A trainer publishes a metrics report
//! (its samples per second and totals) each interval and exits 0 once the Job's data is
//! exhausted. PS shards and serving replicas only answer.

use std::collections::HashMap;
use std::sync::Arc;

use primus_backend::{BackendEvent, Executor, ExecutorRole};
use primus_proto::v1::task_service_client::TaskServiceClient;
use primus_proto::v1::{
    AcquireTaskRequest, Endpoint, FinishTaskRequest, Heartbeat, MetricsReport,
    RegisterExecutorRequest, ReportProgressRequest,
};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::{Key, Shared};

/// Starts `executor`'s role, for the roles that do more than answer.
pub(crate) fn play(shared: Arc<Shared>, executor: &Executor) -> Option<JoinHandle<()>> {
    let key = (executor.job.clone(), executor.id.clone());
    let endpoint = Endpoint {
        role: executor.role.proto() as i32,
        id: executor.id.clone(),
        grpc_addr: executor.grpc_addr.to_string(),
    };
    match executor.role {
        ExecutorRole::DataExecutor => Some(tokio::spawn(data_executor(shared, key, endpoint))),
        ExecutorRole::Trainer => Some(tokio::spawn(trainer(shared, key, endpoint))),
        ExecutorRole::Ps | ExecutorRole::Serving => None,
    }
}

async fn data_executor(shared: Arc<Shared>, key: Key, endpoint: Endpoint) {
    let (job, id) = key.clone();
    let client = TaskServiceClient::connect(shared.master.clone()).await;
    let Ok(mut client) = client else {
        return tracing::error!(job, id, "a scripted data executor cannot reach the master");
    };
    let register = RegisterExecutorRequest {
        job: job.clone(),
        endpoint: Some(endpoint.clone()),
    };
    if let Err(e) = client.register_executor(register).await {
        return tracing::error!(job, id, error = %e, "registering a scripted data executor");
    }
    loop {
        let interval = shared.lock().script.report_interval;
        tokio::time::sleep(interval).await;
        publish_executor_reports(&shared, &key, &endpoint).await;
        if let Err(e) = work(&shared, &key, &mut client).await {
            tracing::debug!(job, id, error = %e, "a scripted data executor's call");
        }
    }
}

/// One report's worth of work: take a task, or serve more of the one held.
async fn work(
    shared: &Shared,
    key: &Key,
    client: &mut TaskServiceClient<Channel>,
) -> Result<(), tonic::Status> {
    let (job, id) = key;
    let (held, rows, task_rows) = {
        let state = shared.lock();
        let held = state.executors.get(key).and_then(|r| r.held.clone());
        (
            held,
            state.script.rows_per_report(id),
            state.script.rows_per_task,
        )
    };
    let Some((task, offset)) = held else {
        let acquired = (client.acquire_task(AcquireTaskRequest {
            job: job.clone(),
            executor_id: id.clone(),
            ..AcquireTaskRequest::default()
        }))
        .await?
        .into_inner();
        let mut state = shared.lock();
        if acquired.exhausted {
            state.exhausted.insert(job.clone());
        }
        if let (Some(task), Some(running)) = (acquired.task, state.executors.get_mut(key)) {
            running.held = Some((task.id, task.start_offset));
        }
        return Ok(());
    };
    let offset = (offset + rows).min(task_rows);
    if !advance(shared, key, &task, offset) {
        return Ok(()); // given back meanwhile (YieldTask)
    }
    let progress = ReportProgressRequest {
        job: job.clone(),
        executor_id: id.clone(),
        task_id: task.clone(),
        offset,
        stream_position: None,
    };
    if let Err(e) = client.report_progress(progress).await {
        // Taken back (a missed heartbeat, a straggler's task): no longer this executor's.
        set_held(shared, key, None);
        return Err(e);
    }
    if offset == task_rows {
        set_held(shared, key, None);
        let finish = FinishTaskRequest {
            job: job.clone(),
            executor_id: id.clone(),
            task_id: task,
            error: String::new(),
        };
        client.finish_task(finish).await?;
    }
    Ok(())
}

fn set_held(shared: &Shared, key: &Key, held: Option<(String, u64)>) {
    if let Some(running) = shared.lock().executors.get_mut(key) {
        running.held = held;
    }
}

/// Moves the offset of `task` on to `offset`; false when the executor no longer holds it.
fn advance(shared: &Shared, key: &Key, task: &str, offset: u64) -> bool {
    let mut state = shared.lock();
    let held = (state.executors.get_mut(key)).and_then(|r| r.held.as_mut());
    match held {
        Some((held, served)) if held == task => {
            *served = offset;
            true
        }
        _ => false,
    }
}

/// A data executor's heartbeat and its metrics report (buffer fill).
async fn publish_executor_reports(shared: &Shared, key: &Key, endpoint: &Endpoint) {
    let (job, id) = key;
    let role = ExecutorRole::DataExecutor;
    let ((cpu_cores, memory_bytes), fill) = {
        let state = shared.lock();
        (state.script.usage_of(role, id), state.script.buffer_fill)
    };
    let unix_ms = primus_spec::time::unix_ms();
    let subjects = shared.bus.subjects();
    if let Ok(subject) = subjects.heartbeat(job, role.as_str(), id) {
        let beat = Heartbeat {
            job: job.clone(),
            endpoint: Some(endpoint.clone()),
            unix_ms,
            cpu_cores,
            memory_bytes,
        };
        publish(shared, subject, &beat).await;
    }
    if let Ok(subject) = subjects.metrics(job, role.as_str(), id) {
        let report = MetricsReport {
            job: job.clone(),
            endpoint: Some(endpoint.clone()),
            unix_ms,
            gauges: HashMap::from([("buffer_fill".to_owned(), fill)]),
            ..MetricsReport::default()
        };
        publish(shared, subject, &report).await;
    }
}

async fn trainer(shared: Arc<Shared>, key: Key, endpoint: Endpoint) {
    let (job, id) = key.clone();
    let Ok(subject) = shared.bus.subjects().metrics(&job, "trainer", &id) else {
        return tracing::error!(job, id, "not a subject token");
    };
    let (mut samples, mut steps) = (0.0, 0);
    loop {
        let (interval, rate, exhausted) = {
            let state = shared.lock();
            let script = &state.script;
            let exhausted = state.exhausted.contains(&job);
            (script.report_interval, script.trainer_rate(&id), exhausted)
        };
        tokio::time::sleep(interval).await;
        if exhausted {
            // Its minibatch streams ended: it exits 0.
            shared.lock().executors.remove(&key);
            return shared.send(BackendEvent::Completed { job, id });
        }
        samples += rate * interval.as_secs_f64();
        steps += 1;
        let report = MetricsReport {
            job: job.clone(),
            endpoint: Some(endpoint.clone()),
            unix_ms: primus_spec::time::unix_ms(),
            gauges: HashMap::from([("samples_per_second".to_owned(), rate)]),
            samples: samples as u64,
            steps,
            source_samples: HashMap::new(),
        };
        publish(&shared, subject.clone(), &report).await;
    }
}

async fn publish<M: prost::Message>(shared: &Shared, subject: String, message: &M) {
    if let Err(e) = shared.bus.publish(subject, message).await {
        tracing::warn!(error = %e, "a scripted executor's report");
    }
}
