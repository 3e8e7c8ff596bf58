//! Jobs through real executor processes: every row read once through executor and master
//! kills (the `task_reader` example as data executor), a missing prefix and a model that
//! does not fit failing the Job, deletion stopping its processes, every row trained once
//! by the real data executor, trainer and PS, and one trace across them.

use std::collections::HashSet;
use std::time::Duration;

use primus_harness::resources::{served, small_wide_deep};
use primus_harness::{Sandbox, alive, condition, topology};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{PredictRequest, Role, Sample};
use primus_spec::status::{ExecutorState, Phase};
use primus_testkit::service::signal;
use primus_testkit::{OtlpReceiver, ReceivedSpan};

use crate::common::{
    FILES_PER_HOUR, ROWS_PER_FILE, data_executor, id_job, id_job_with, master_settings, start,
    start_master, start_master_with, write_partitions,
};
use crate::task_reads::{TaskReads, wait_until_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_reads_every_row_through_executor_and_master_kills() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    let rows = write_partitions(&data, "2026-11-01", 1).await;
    let window = ("2026-11-01T00", "2026-11-02T00");
    sandbox.apply(id_job("rows", &data, window, 2)).await;
    let master = start_master(&sandbox);
    sandbox
        .wait_for_phase("rows", Phase::Running, Duration::from_secs(60))
        .await;
    let work = sandbox.work_dir().join("rows");

    // SIGKILL one data executor mid-task: the backend restarts it, its task is re-queued
    // from the last reported offset.
    wait_until_rows(&work, "data_executor-0").await;
    let pid = sandbox.pids("rows")["data_executor-0"];
    signal(pid, "KILL").expect("kill executor");
    // The Job's status says which executor restarted, and how its last run ended.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = sandbox.status("rows").await;
        let killed = status.executors.iter().find(|e| e.id == "data_executor-0");
        if killed.is_some_and(|e| e.restarts == 1 && e.state == ExecutorState::Running) {
            let exit = killed.and_then(|e| e.last_exit.clone()).unwrap_or_default();
            assert!(exit.contains("signal: 9"), "{exit}");
            assert!(
                status
                    .executors
                    .iter()
                    .any(|e| e.id == "data_executor-1" && e.restarts == 0),
                "{:?}",
                status.executors
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restart in the status: {:?}",
            status.executors
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // SIGKILL the master too: the next one kills its orphans and resumes the queue.
    wait_until_rows(&work, "data_executor-1").await;
    master.kill();
    let master = start_master(&sandbox);

    let status = sandbox
        .wait_for_phase("rows", Phase::Succeeded, Duration::from_secs(120))
        .await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "DataExhausted", "{complete:?}");
    // Exactly once, counting what the master acknowledged: a killed attempt's rows past
    // its last acknowledged report are the only ones its task's next attempt reads again.
    let read_again = TaskReads::load(&work).assert_each_row_once(rows);
    eprintln!("{rows} rows read once; {read_again} read again past a killed attempt's last report");
    assert!(
        sandbox.pids("rows").values().all(|pid| !alive(*pid)),
        "executors stopped at job end"
    );
    master.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_prefix_fails_the_job_and_deleting_a_running_job_stops_its_processes() {
    let sandbox = Sandbox::start().await;
    let missing = sandbox.dir().join("no-such-data");
    let window = ("2026-11-01T00", "2026-11-02T00");
    sandbox.apply(id_job("lost", &missing, window, 1)).await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    sandbox.apply(id_job("doomed", &data, window, 1)).await;
    let master = start_master(&sandbox);

    let status = sandbox
        .wait_for_phase("lost", Phase::Failed, Duration::from_secs(60))
        .await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "DataSourceMissing");
    assert!(
        complete.message.contains(missing.to_str().expect("utf-8")),
        "names the prefix: {complete:?}"
    );

    sandbox
        .wait_for_phase("doomed", Phase::Running, Duration::from_secs(60))
        .await;
    let pids = sandbox.pids("doomed");
    assert_eq!(pids.len(), 3, "ps, trainer, data executor: {pids:?}");
    assert!(pids.values().all(|pid| alive(*pid)));
    sandbox.delete_job("doomed").await;
    master.stop();
}

/// Real data executors and a real trainer and PS: the job ends once the trainer has
/// trained on all it was served, and it was served every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_trains_on_every_row_once_through_real_data_executors_and_trainer() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    // Three hourly windows of one source: three tasks of 2 files (200 rows) each.
    let rows = 3 * FILES_PER_HOUR * ROWS_PER_FILE;
    let window = ("2026-11-01T00", "2026-11-01T03");
    sandbox.apply(id_job("served", &data, window, 2)).await;
    let master = start_master_with(&sandbox, &data_executor());
    let status = sandbox
        .wait_for_phase("served", Phase::Succeeded, Duration::from_secs(120))
        .await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.reason == "DataExhausted" && c.message.contains("1 trainers finished")),
        "{status:?}"
    );
    let progress = status.progress.expect("the trainer reported progress");
    assert_eq!(
        progress.samples, rows,
        "every row trained once: {progress:?}"
    );
    assert!(progress.steps >= 1);
    master.stop();
}

/// A model that does not fit its Dataset's schema is refused at apply; a Job whose Dataset
/// changed under it after apply fails when its master starts it, naming the feature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_does_not_fit_the_schema_fails_the_job_naming_the_feature() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    let window = ("2026-11-01T00", "2026-11-01T01");
    let mut other = small_wide_deep();
    other.tables[0].name = "other".into();
    let [dataset, misfit] = id_job_with("misfit", &data, window, 1, other);
    sandbox.apply([dataset.clone()]).await;
    let client = sandbox.client().await;
    let refused = client
        .apply(&misfit, 0)
        .await
        .expect_err("refused at apply");
    let message = refused.to_string();
    assert!(
        message.contains("feature \"c1\"") && message.contains("\"t\""),
        "names the feature and its table: {message}"
    );

    let [_, fits] = id_job_with("misfit", &data, window, 1, small_wide_deep());
    sandbox.apply([fits]).await;
    let primus_spec::Resource::Dataset(mut changed) = dataset else {
        panic!("id_job_with gives the Dataset first");
    };
    changed.spec.schema.sparse[0].table = "other".into();
    sandbox
        .apply([primus_spec::Resource::Dataset(changed)])
        .await;
    let master = start_master(&sandbox);
    let status = sandbox
        .wait_for_phase("misfit", Phase::Failed, Duration::from_secs(60))
        .await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "ModelMismatch", "{complete:?}");
    assert!(
        complete.message.contains("\"c1\"") && complete.message.contains("\"other\""),
        "names the feature and its table: {complete:?}"
    );
    assert!(sandbox.pids("misfit").is_empty(), "nothing was started");
    master.stop();
}

/// The spans received so far that are called `name` (span names; server spans are
/// named by their gRPC path).
fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.span.name == name).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_trace_links_a_data_task_the_trainer_step_on_its_rows_and_the_ps_push() {
    let receiver = OtlpReceiver::start().await.expect("otlp receiver");
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    let window = ("2026-11-01T00", "2026-11-01T01");
    sandbox.apply(id_job("traced", &data, window, 1)).await;
    // The master hands its telemetry section to every executor it starts.
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.telemetry.otlp_endpoint = Some(receiver.endpoint().to_owned());
    let master = start(&sandbox, &settings);
    sandbox
        .wait_for_phase("traced", Phase::Succeeded, Duration::from_secs(120))
        .await;
    master.stop();

    // Executors flush their spans as they stop; the PS push of a step is the last link.
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = receiver.spans();
        if !named(&spans, "ps.push").is_empty() && !named(&spans, "trainer.step").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tasks = named(&spans, "data task clicks");
    assert!(!tasks.is_empty(), "a data.task span: {:?}", names(&spans));
    let child_of = |parent: &ReceivedSpan, name: &str| -> Vec<ReceivedSpan> {
        named(&spans, name)
            .into_iter()
            .filter(|s| {
                s.span.trace_id == parent.span.trace_id
                    && s.span.parent_span_id == parent.span.span_id
            })
            .cloned()
            .collect()
    };
    // Some task's rows were trained in a step whose push reached the PS, all one trace.
    let linked = tasks.iter().find_map(|task| {
        let step = child_of(task, "trainer.step").into_iter().next()?;
        let push = child_of(&step, "trainer.push").into_iter().next()?;
        let server = child_of(&push, "/primus.v1.ParameterServer/PushTables")
            .into_iter()
            .next()?;
        let tables = child_of(&server, "ps.push_tables").into_iter().next()?;
        let ps_push = child_of(&tables, "ps.push").into_iter().next()?;
        Some((task, step, server, ps_push))
    });
    let Some((task, step, server, ps_push)) = linked else {
        panic!(
            "no data task -> trainer.step -> trainer.push -> PS PushTables -> ps.push_tables -> ps.push chain in {:?}",
            names(&spans)
        );
    };
    assert_eq!(task.service, "primus-data-executor");
    assert_eq!(step.service, "primus-trainer");
    assert_eq!(server.service, "primus-ps");
    assert_eq!(ps_push.service, "primus-ps");
    assert!(
        !child_of(&step, "trainer.compute").is_empty(),
        "the step's compute is in the same trace"
    );
    // The first minibatch looks its rows up itself; the push before each next one reads
    // its rows.
    assert!(
        !named(&spans, "trainer.lookup").is_empty(),
        "a trainer.lookup span: {:?}",
        names(&spans)
    );
}

fn names(spans: &[ReceivedSpan]) -> Vec<(String, String)> {
    spans
        .iter()
        .map(|s| (s.service.clone(), s.span.name.clone()))
        .collect()
}

/// A Parquet file that does not read fails its task and so the Job, and the Job's
/// condition names the file once: each cause of the error appears once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_read_fails_the_job_naming_it_once() {
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    let broken = data.join("date=2026-11-01/hour=00/part-1.parquet");
    std::fs::write(&broken, b"not a parquet file").expect("overwrite a file");
    let window = ("2026-11-01T00", "2026-11-01T01");
    sandbox.apply(id_job("broken", &data, window, 1)).await;
    let master = start_master_with(&sandbox, &data_executor());
    let status = sandbox
        .wait_for_phase("broken", Phase::Failed, Duration::from_secs(120))
        .await;
    let complete = condition(&status, "Complete");
    assert_eq!(complete.reason, "TaskFailed", "{complete:?}");
    let file = broken.to_str().expect("utf-8");
    assert_eq!(
        complete.message.matches(file).count(),
        1,
        "the file is named once: {complete:?}"
    );
    master.stop();
}

/// The attribute `key` of a received span, as text (None when it has none).
fn attribute(span: &ReceivedSpan, key: &str) -> Option<String> {
    (span.span.attributes.iter())
        .find(|kv| kv.key == key)
        .map(|kv| format!("{:?}", kv.value))
}

/// From a push to the prediction that used it: a serving-sync cycle links (OpenTelemetry
/// span links) to the `ps.push_tables` spans whose rows it moves, the push records the
/// shard's version after it, and a Predict's span records the version of every training
/// shard (and of the dense model) the replica answered with.
#[tokio::test(flavor = "multi_thread")]
async fn a_sync_cycle_links_the_pushes_it_moves_and_a_predict_records_what_it_used() {
    let receiver = OtlpReceiver::start().await.expect("otlp receiver");
    let sandbox = Sandbox::start().await;
    let data = sandbox.dir().join("data");
    write_partitions(&data, "2026-11-01", 1).await;
    let window = ("2026-11-01T00", "2026-11-02T00");
    let [dataset, job] = id_job("synced", &data, window, 1);
    let job = match job {
        primus_spec::Resource::Job(mut job) => {
            served(&mut job.spec);
            primus_spec::Resource::Job(job)
        }
        other => other,
    };
    sandbox.apply([dataset, job]).await;
    let mut settings = master_settings(&sandbox, &data_executor());
    settings.telemetry.otlp_endpoint = Some(receiver.endpoint().to_owned());
    // Slow reads: the Job trains over several sync cycles.
    settings.master.fault_injection.data_read_delay_ms = 300;
    let master = start(&sandbox, &settings);
    let sync = sandbox
        .start_serving_sync(master.addr(), Some(receiver.endpoint()))
        .await;
    sandbox
        .wait_for_phase("synced", Phase::Succeeded, Duration::from_secs(180))
        .await;
    let replica = topology(master.addr(), "synced")
        .await
        .into_iter()
        .find(|e| e.role == Role::Serving as i32)
        .expect("a serving replica");
    let mut client = ServingServiceClient::connect(format!("http://{}", replica.grpc_addr))
        .await
        .expect("replica");
    let predicted = client
        .predict(PredictRequest {
            job: "synced".into(),
            samples: vec![Sample::default()],
        })
        .await
        .expect("predict")
        .into_inner();
    assert_eq!(predicted.probabilities.len(), 1);
    sandbox.delete_job("synced").await;
    drop(sync);
    master.stop();

    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = receiver.spans();
        if !named(&spans, "serving.predict").is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pushes: HashSet<(Vec<u8>, Vec<u8>)> = named(&spans, "ps.push_tables")
        .into_iter()
        .map(|s| (s.span.trace_id.clone(), s.span.span_id.clone()))
        .collect();
    let cycles = named(&spans, "serving_sync.sparse");
    let linked = (cycles.iter())
        .flat_map(|c| &c.span.links)
        .filter(|l| pushes.contains(&(l.trace_id.clone(), l.span_id.clone())))
        .count();
    assert!(
        linked > 0,
        "a sync cycle links to a push it moves: {} cycles, {} pushes",
        cycles.len(),
        pushes.len()
    );
    let push = named(&spans, "ps.push_tables")[0];
    assert!(attribute(push, "primus.version").is_some(), "{push:?}");
    let predict = named(&spans, "serving.predict");
    let applied = predict.iter().find_map(|s| attribute(s, "primus.applied"));
    assert!(
        applied.as_deref().is_some_and(|a| a.contains("ps-0=")),
        "the Predict span names the shard versions it used: {applied:?}"
    );
    assert!(attribute(predict[0], "primus.dense_version").is_some());
}
