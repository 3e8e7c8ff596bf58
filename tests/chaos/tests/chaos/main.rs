//! The chaos suite: real processes and servers, one fault per Job at a seeded moment (10%
//! to 80% of its rows, 30% for a deleted file, after its first checkpoint). Each Job is a
//! small mixture DLRM over 200,000 Criteo-like Parquet rows and 40,000 rows of a JetStream
//! subject, each row's `c26` replaced by its unique id
//! (`workload.rs`), with a serving replica kept in sync by a serving-sync process, and
//! `on_ps_failure` and `on_worker_failure: rollback`; one trainer, or for the hot-set
//! fault two trainers sharing a hot set (compared with an undisturbed run of the same). A
//! data executor and a trainer are also killed under `on_worker_failure: continue`, the
//! default, where nothing is rolled back, and so is a hot-set member, whose crash rolls
//! the Job back under either policy. After each fault the Job must catch
//! up on both sources with every row trained into its final model exactly once: each
//! row's own embedding updated exactly once (by id), and the Job's trained-sample count
//! equal to those updates. Its serving replica must then hold the training
//! PS's rows, row for row, and the AUC it serves on 20,000 held-out rows be within 0.005 of
//! an undisturbed run's. A deleted Parquet file must fail the Job naming it. The HDFS
//! faults' Jobs read their Parquet rows from, and checkpoint to, the testkit's HDFS
//! (`hdfs.rs`): a datanode stopped, the namenode restarted, and the checkpoint folder out
//! of space.
//! Prints a row per fault as it ends (fault, seconds to recover, rows lost, rows
//! duplicated, AUC delta), then the table, ending with
//! `chaos: F faults, L rows lost, D rows duplicated, max AUC delta X`.
//!
//! `PRIMUS_CHAOS_SEED` picks the fault moments (default 1); `PRIMUS_CHAOS_FAULTS` runs only
//! the faults whose names contain one of its comma-separated words (`ps shard,nats`).

#![allow(
    clippy::print_stdout,
    reason = "the suite's table and summary line are its report"
)]

mod hdfs;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use primus_chaos::{Outcome, Report, fault_draw};
use primus_config::MasterSettings;
use primus_harness::rows::{Rows, replica_rows, training_rows};
use primus_harness::{MasterProcess, Sandbox};
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{PredictRequest, Role, Sample};
use primus_spec::Kind;
use primus_spec::job::WorkerFailure;
use primus_spec::status::{Phase, Progress, Status};
use primus_testkit::service::{ServiceProcess, signal};
use tokio::time::Instant;

use hdfs::OnHdfs;
use workload::{
    Holdout, PARQUET_HOURS, ROWS, Store, Trained, Training, holdout, job_resource, prepare,
    trained_rows,
};

/// One fault the suite injects.
#[derive(Debug, Clone, Copy)]
enum Fault {
    KillDataExecutor,
    KillTrainer,
    /// As `KillDataExecutor` under `on_worker_failure: continue`: its successor goes on
    /// from the rows the trainer consumed.
    KillDataExecutorContinuing,
    /// As `KillTrainer` under `on_worker_failure: continue`: the minibatches it had not
    /// confirmed are served again and each PS shard applies them once.
    KillTrainerContinuing,
    KillPsShard,
    KillServingReplica,
    KillServingSync,
    KillMaster,
    KillApiServer,
    RestartNats,
    RestartRedis,
    /// SIGKILL of one of two trainers sharing a hot set, while the set is replicated, under
    /// `on_worker_failure: continue`: the Job rolls back all the same.
    KillHotSetTrainer,
    /// One of HDFS's two datanodes stopped, started again once the Job caught up.
    StopHdfsDatanode,
    /// HDFS's namenode stopped for a few seconds and started again.
    RestartHdfsNamenode,
    /// The Job's checkpoint folder on HDFS out of space until a checkpoint failed.
    FillHdfsCheckpoints,
    /// Last: the other Jobs read the same files.
    DeleteParquetFile,
}

impl Fault {
    const ALL: [Fault; 16] = [
        Fault::KillDataExecutor,
        Fault::KillTrainer,
        Fault::KillDataExecutorContinuing,
        Fault::KillTrainerContinuing,
        Fault::KillPsShard,
        Fault::KillServingReplica,
        Fault::KillServingSync,
        Fault::KillMaster,
        Fault::KillApiServer,
        Fault::RestartNats,
        Fault::RestartRedis,
        Fault::KillHotSetTrainer,
        Fault::StopHdfsDatanode,
        Fault::RestartHdfsNamenode,
        Fault::FillHdfsCheckpoints,
        Fault::DeleteParquetFile,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::KillDataExecutor => "SIGKILL data executor",
            Fault::KillTrainer => "SIGKILL trainer",
            Fault::KillDataExecutorContinuing => "SIGKILL data executor (continue)",
            Fault::KillTrainerContinuing => "SIGKILL trainer (continue)",
            Fault::KillPsShard => "SIGKILL PS shard",
            Fault::KillServingReplica => "SIGKILL serving replica",
            Fault::KillServingSync => "SIGKILL serving-sync",
            Fault::KillMaster => "SIGKILL master",
            Fault::KillApiServer => "SIGKILL API server",
            Fault::RestartNats => "restart NATS",
            Fault::RestartRedis => "restart Redis",
            Fault::DeleteParquetFile => "delete a Parquet file",
            Fault::KillHotSetTrainer => "SIGKILL hot-set trainer (continue)",
            Fault::StopHdfsDatanode => "stop an HDFS datanode",
            Fault::RestartHdfsNamenode => "restart the HDFS namenode",
            Fault::FillHdfsCheckpoints => "HDFS out of space for checkpoints",
        }
    }

    /// Whether its Job's data and checkpoints are on HDFS.
    fn on_hdfs(self) -> bool {
        matches!(
            self,
            Fault::StopHdfsDatanode | Fault::RestartHdfsNamenode | Fault::FillHdfsCheckpoints
        )
    }

    /// Who trains the Job it is injected into: small minibatches where the Job must still
    /// be reading or checkpointing seconds after the fault.
    fn training(self) -> Training {
        match self {
            Fault::KillHotSetTrainer => Training::HotSet,
            Fault::FillHdfsCheckpoints | Fault::DeleteParquetFile => Training::SmallBatches,
            _ => Training::OneTrainer,
        }
    }

    /// `spec.checkpoint.on_worker_failure` of the Job it is injected into.
    fn on_worker_failure(self) -> WorkerFailure {
        match self {
            Fault::KillDataExecutorContinuing
            | Fault::KillTrainerContinuing
            | Fault::KillHotSetTrainer => WorkerFailure::Continue,
            _ => WorkerFailure::Rollback,
        }
    }

    /// What the Job's `RolledBack` condition must say under `on_worker_failure: continue`
    /// (`None`: the Job must not roll back); unchecked under `rollback`.
    fn rollback_under_continue(self) -> Option<&'static str> {
        match self {
            Fault::KillHotSetTrainer => Some("trainer-0, a member of the hot set, crashed"),
            _ => None,
        }
    }
}

/// What the suite runs besides the sandbox: the master (started again on the same address
/// when killed) and serving-sync.
struct Cluster {
    master_settings: MasterSettings,
    master: MasterProcess,
    sync: ServiceProcess,
}

impl Cluster {
    async fn start(sandbox: &Sandbox) -> Self {
        let master_settings = sandbox.recovering_master_settings();
        let master = MasterProcess::start(sandbox, &master_settings, &[]);
        let sync = sandbox.start_serving_sync(master.addr(), None).await;
        Self {
            master_settings,
            master,
            sync,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::disallowed_methods, reason = "PRIMUS_CHAOS_SEED replays a run")]
async fn every_fault_loses_and_repeats_no_row() {
    let seed: u64 = std::env::var("PRIMUS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    // A failure's message, not a backtrace through the runtime, ends the output.
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let faults = chosen_faults();
    let mut sandbox = Sandbox::start_restartable().await;
    let best = prepare(&sandbox).await;
    let holdout = holdout();
    let on_hdfs = match faults.iter().any(|(_, f)| f.on_hdfs()) {
        true => Some(OnHdfs::prepare(&sandbox).await),
        false => None,
    };
    let mut cluster = Cluster::start(&sandbox).await;

    // An undisturbed run of each way the chosen faults' Jobs train.
    let mut baselines: Vec<(Training, f64)> = Vec::new();
    let trainings =
        std::iter::once(Training::OneTrainer).chain(faults.iter().map(|(_, f)| f.training()));
    for training in trainings {
        if baselines.iter().all(|(done, _)| *done != training) {
            let auc = run_undisturbed(&sandbox, &cluster, &holdout, training).await;
            baselines.push((training, auc));
        }
    }
    let undisturbed: Vec<String> = (baselines.iter())
        .map(|(training, auc)| format!("{auc:.4} {}", training.name()))
        .collect();
    println!(
        "chaos seed {seed}; served AUC on {} held-out rows: {} (the Parquet data's best achievable {best:.4})",
        holdout.labels.len(),
        undisturbed.join(", ")
    );
    let mut report = Report::default();
    let width = (Fault::ALL.iter().map(|f| f.name().len())).fold(0, usize::max);
    println!("{}", Outcome::header(width));
    for (i, fault) in faults {
        // Somewhere between 10% and 80% of the rows, after the first checkpoint. A deleted
        // file fails the Job only while unread: the last hour's file goes once the first
        // sample is trained, in a Job of small minibatches that reads it seconds later. A full
        // checkpoint folder must meet another checkpoint, and a Job near its end takes none.
        let latest = match fault {
            Fault::FillHdfsCheckpoints => 20,
            _ => 80,
        };
        let at = match fault {
            Fault::DeleteParquetFile => 1,
            _ => ROWS / 100 * (10 + fault_draw(seed, i as u64) % (latest - 9)),
        };
        let job = format!("chaos-{i}");
        let baseline = (baselines.iter())
            .find(|(training, _)| *training == fault.training())
            .map(|(_, auc)| *auc)
            .expect("an undisturbed run of each way the faults' Jobs train");
        let run = Run {
            job: &job,
            fault,
            at,
            baseline,
            on_hdfs: on_hdfs.as_ref(),
        };
        let outcome = run_with(&mut sandbox, &mut cluster, &holdout, run).await;
        println!("{}", outcome.row(width));
        report.outcomes.push(outcome);
    }
    cluster.master.stop();

    println!("{}", report.table());
    assert_eq!(
        (report.lost(), report.duplicated()),
        (0, 0),
        "rows lost or trained twice"
    );
    let max_delta = report.max_auc_delta();
    assert!(
        max_delta <= MAX_AUC_DELTA,
        "an AUC moved {max_delta:.4} from the undisturbed run's (allowed {MAX_AUC_DELTA})"
    );
}

/// The faults `PRIMUS_CHAOS_FAULTS` names (a comma-separated list of parts of their names,
/// any case), each with its place in [`Fault::ALL`], which its moment is drawn for; every
/// fault when unset.
#[expect(
    clippy::disallowed_methods,
    reason = "PRIMUS_CHAOS_FAULTS picks the faults to run"
)]
fn chosen_faults() -> Vec<(usize, Fault)> {
    let all = Fault::ALL.into_iter().enumerate();
    let Ok(wanted) = std::env::var("PRIMUS_CHAOS_FAULTS") else {
        return all.collect();
    };
    let wanted: Vec<String> = wanted.split(',').map(|w| w.trim().to_lowercase()).collect();
    let chosen: Vec<(usize, Fault)> = all
        .filter(|(_, fault)| {
            let name = fault.name().to_lowercase();
            wanted
                .iter()
                .any(|w| !w.is_empty() && name.contains(w.as_str()))
        })
        .collect();
    assert!(
        !chosen.is_empty(),
        "PRIMUS_CHAOS_FAULTS: {wanted:?} names none of {:?}",
        Fault::ALL.map(Fault::name)
    );
    chosen
}

/// How far a disturbed run's AUC may be from the undisturbed one: the rows trained again
/// after a rollback meet another model state than the first time.
const MAX_AUC_DELTA: f64 = 0.005;

/// Trains the suite's Job as `training` says with no fault until it caught up; the AUC it
/// serves on `holdout`.
async fn run_undisturbed(
    sandbox: &Sandbox,
    cluster: &Cluster,
    holdout: &Holdout,
    training: Training,
) -> f64 {
    let job = match training {
        Training::OneTrainer => "chaos-undisturbed",
        Training::HotSet => "chaos-undisturbed-hot-set",
        Training::SmallBatches => "chaos-undisturbed-small-batches",
    };
    let resource = job_resource(
        sandbox,
        job,
        training,
        WorkerFailure::Rollback,
        Store::Local,
    );
    sandbox.apply([resource]).await;
    let status = caught_up(sandbox, job).await;
    let progress = status.progress.expect("progress");
    let trained = trained_rows(&shards(cluster, job).await).await;
    assert_eq!(
        (trained.lost, trained.repeated),
        (0, 0),
        "undisturbed: {progress:?}, {trained:?}"
    );
    counted_as_trained(job, &progress, &trained);
    replica_converged(cluster, job, "undisturbed").await;
    let auc = served_auc(cluster, job, holdout).await;
    sandbox.delete_job(job).await;
    auc
}

/// The Job's trained-sample count is what its model trained (since its last rollback),
/// and its sources' counts add up to it.
fn counted_as_trained(job: &str, progress: &Progress, trained: &Trained) {
    let per_source: u64 = progress.sources.iter().map(|s| s.samples).sum();
    assert_eq!(per_source, progress.samples, "{job}: {progress:?}");
    assert_eq!(
        progress.samples, trained.trainings,
        "{job}: samples counted against row trainings in the model: {trained:?}"
    );
}

/// One faulty run: Job `job` with `fault` injected once it trained `at` samples, compared
/// with an undisturbed run that served AUC `baseline`.
struct Run<'a> {
    job: &'a str,
    fault: Fault,
    at: u64,
    baseline: f64,
    /// The data on HDFS, when the suite runs an HDFS fault.
    on_hdfs: Option<&'a OnHdfs>,
}

/// Runs `run`'s Job, injecting its fault once the Job trained its samples and committed a
/// checkpoint.
async fn run_with(
    sandbox: &mut Sandbox,
    cluster: &mut Cluster,
    holdout: &Holdout,
    run: Run<'_>,
) -> Outcome {
    let Run {
        job,
        fault,
        at,
        baseline,
        on_hdfs,
    } = run;
    let on_hdfs = on_hdfs.filter(|_| fault.on_hdfs());
    let store = on_hdfs.map_or(Store::Local, OnHdfs::store);
    let resource = job_resource(
        sandbox,
        job,
        fault.training(),
        fault.on_worker_failure(),
        store,
    );
    sandbox.apply([resource]).await;
    let checkpointed = !matches!(fault, Fault::DeleteParquetFile);
    let before = wait_for_fault_moment(sandbox, job, at, checkpointed).await;
    if fault.training() == Training::HotSet {
        wait_for_hot_set(sandbox, job).await;
    }
    let injected = Instant::now();
    let note = match on_hdfs {
        Some(on_hdfs) => inject_on_hdfs(sandbox, on_hdfs, job, fault).await,
        None => inject(sandbox, cluster, job, fault).await,
    };
    if let Fault::DeleteParquetFile = fault {
        let outcome = deleted_file_fails_the_job(sandbox, job, fault, note).await;
        sandbox.delete_job(job).await;
        return outcome;
    }
    let recovered_s = recovery(sandbox, job, before, injected).await;
    let status = caught_up(sandbox, job).await;
    if let (Fault::StopHdfsDatanode, Some(on_hdfs)) = (fault, on_hdfs) {
        on_hdfs.start_datanode().await;
    }
    let progress = status.progress.clone().expect("progress");
    let trained = trained_rows(&shards(cluster, job).await).await;
    counted_as_trained(job, &progress, &trained);
    if fault.on_worker_failure() == WorkerFailure::Continue {
        let rollback = rolled_back(&status);
        match fault.rollback_under_continue() {
            None => assert!(rollback.is_none(), "{job} rolled back: {rollback:?}"),
            Some(crash) => assert!(
                rollback.as_ref().is_some_and(|m| m.starts_with(crash)),
                "{job} did not roll back after {crash}: {rollback:?}"
            ),
        }
    }
    let (lost, duplicated) = (trained.lost, trained.repeated);
    replica_converged(cluster, job, fault.name()).await;
    let auc = served_auc(cluster, job, holdout).await;
    sandbox.delete_job(job).await;
    Outcome {
        fault: fault.name(),
        recovered_s,
        lost,
        duplicated,
        auc: Some(auc),
        auc_delta: Some((auc - baseline).abs()),
        note: rolled_back(&status).unwrap_or(note),
    }
}

/// Injects `fault` into the running `job`; what was done.
async fn inject(sandbox: &mut Sandbox, cluster: &mut Cluster, job: &str, fault: Fault) -> String {
    match fault {
        Fault::KillDataExecutor | Fault::KillDataExecutorContinuing => {
            kill(sandbox, job, "data_executor-0")
        }
        Fault::KillTrainer | Fault::KillTrainerContinuing => kill(sandbox, job, "trainer-0"),
        Fault::KillPsShard => kill(sandbox, job, "ps-0"),
        Fault::KillServingReplica => kill(sandbox, job, "serving-0"),
        Fault::KillServingSync => {
            signal(cluster.sync.pid(), "KILL").expect("SIGKILL serving-sync");
            cluster.sync = sandbox
                .start_serving_sync(cluster.master.addr(), None)
                .await;
            "killed serving-sync, started another".to_owned()
        }
        Fault::KillMaster => {
            cluster
                .master
                .kill_and_start(sandbox, &cluster.master_settings, &[]);
            "killed the master, started another on its address".to_owned()
        }
        Fault::KillApiServer => {
            sandbox.restart_api_server().await;
            "killed the API server, started another on its address".to_owned()
        }
        Fault::RestartNats => {
            sandbox.nats.restart().expect("NATS back");
            "NATS killed and started again on its data".to_owned()
        }
        Fault::RestartRedis => {
            sandbox.restart_redis();
            "Redis killed and started again on its append-only file".to_owned()
        }
        Fault::DeleteParquetFile => {
            let file = last_hour_file(sandbox.dir());
            std::fs::remove_file(&file).expect("delete");
            file.display().to_string()
        }
        Fault::KillHotSetTrainer => kill(sandbox, job, "trainer-0"),
        Fault::StopHdfsDatanode | Fault::RestartHdfsNamenode | Fault::FillHdfsCheckpoints => {
            panic!("{}: a fault of a Job on HDFS", fault.name())
        }
    }
}

/// Injects an HDFS `fault` into the running `job`, whose data and checkpoints are there.
async fn inject_on_hdfs(sandbox: &Sandbox, on_hdfs: &OnHdfs, job: &str, fault: Fault) -> String {
    match fault {
        Fault::StopHdfsDatanode => on_hdfs.stop_datanode().await,
        Fault::RestartHdfsNamenode => on_hdfs.restart_namenode().await,
        Fault::FillHdfsCheckpoints => on_hdfs.fill_checkpoint_folder(sandbox, job).await,
        other => panic!("{}: not an HDFS fault", other.name()),
    }
}

/// Waits until `job`'s trainers report the hot set replicated.
async fn wait_for_hot_set(sandbox: &Sandbox, job: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let rows = sandbox.latest_metrics(job, &["hot_rows"]).await;
        if rows.is_some_and(|rows| rows.first().is_some_and(|r| *r > 0.0)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{job}: no hot set replicated: {:?}",
            status(sandbox, job).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILLs executor `id` of `job`.
fn kill(sandbox: &Sandbox, job: &str, id: &str) -> String {
    let pid = sandbox.pids(job)[id];
    signal(pid, "KILL").unwrap_or_else(|e| panic!("SIGKILL {id}: {e}"));
    format!("killed {id}")
}

/// A file of the data's last hour, which the Job reads last.
fn last_hour_file(dir: &Path) -> PathBuf {
    let hour = format!("hour={:02}", PARQUET_HOURS - 1);
    let hour = dir.join("criteo").join("date=2026-11-01").join(hour);
    std::fs::read_dir(&hour)
        .unwrap_or_else(|e| panic!("{}: {e}", hour.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap_or_else(|| panic!("no Parquet file in {}", hour.display()))
}

/// A deleted input file fails the Job, naming it.
async fn deleted_file_fails_the_job(
    sandbox: &Sandbox,
    job: &str,
    fault: Fault,
    file: String,
) -> Outcome {
    let status = sandbox
        .wait_for_phase(job, Phase::Failed, Duration::from_secs(600))
        .await;
    let complete = primus_harness::condition(&status, "Complete");
    let name = Path::new(&file)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        complete.message.contains(&name),
        "the failure names the deleted file {name}: {complete:?}"
    );
    Outcome {
        fault: fault.name(),
        recovered_s: None,
        lost: 0,
        duplicated: 0,
        auc: None,
        auc_delta: None,
        note: format!("failed {}: {}", complete.reason, complete.message),
    }
}

/// Waits until the Job trained `at` samples and, with `checkpointed`, committed a
/// checkpoint; the samples then.
async fn wait_for_fault_moment(sandbox: &Sandbox, job: &str, at: u64, checkpointed: bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let status = status(sandbox, job).await;
        let committed = status
            .conditions
            .iter()
            .any(|c| c.kind == "Checkpoint" && c.status)
            || !checkpointed;
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if committed && samples >= at {
            return samples;
        }
        assert!(
            !status.phase.is_terminal() && Instant::now() < deadline,
            "{job}: no checkpoint or not {at} samples: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the Job trained as many samples as both sources have rows (a mixture Job
/// goes on following its stream), and a few seconds more for any sample trained twice to
/// be counted; its status then.
async fn caught_up(sandbox: &Sandbox, job: &str) -> Status {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = status(sandbox, job).await;
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if samples >= ROWS {
            break;
        }
        assert!(
            !status.phase.is_terminal() && Instant::now() < deadline,
            "{job}: {samples} of {ROWS} rows trained: {status:?}\n{}",
            sandbox.logs(job)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    status(sandbox, job).await
}

/// Seconds from the fault until the Job reported more samples than `before` again (or
/// caught up); `None` when it failed.
async fn recovery(sandbox: &Sandbox, job: &str, before: u64, injected: Instant) -> Option<f64> {
    let deadline = injected + Duration::from_secs(600);
    loop {
        let status = status(sandbox, job).await;
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if samples > before || samples >= ROWS {
            return Some(injected.elapsed().as_secs_f64());
        }
        if status.phase.is_terminal() || Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `job`'s status; while the API server or Redis comes back from a fault, asked again (for
/// 30 s at most).
async fn status(sandbox: &Sandbox, job: &str) -> Status {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match sandbox.client().await.get(Kind::Job, job).await {
            Ok(resource) => return serde_json::from_str(&resource.status_json).unwrap_or_default(),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{job}: status: {e}"),
        }
    }
}

/// `job`'s training PS shards, host:port.
async fn shards(cluster: &Cluster, job: &str) -> Vec<String> {
    primus_proto::role_addrs(
        &primus_harness::topology(cluster.master.addr(), job).await,
        Role::Ps,
    )
}

/// Waits until `job`'s serving replica holds its training PS shards' rows, row for row
/// (60 s at most); `run` says which run it is in the failure.
async fn replica_converged(cluster: &Cluster, job: &str, run: &str) {
    let (held, served) = served_rows(cluster, job).await;
    assert!(
        held == served,
        "{job} ({run}): the serving replica differs from the training PS ({} rows): {}",
        held.len(),
        differences(&held, &served)
    );
}

/// Every training row of `job` and every row of its serving replica, once they are equal
/// (or after 60 s).
async fn served_rows(cluster: &Cluster, job: &str) -> (Rows, Rows) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let endpoints = primus_harness::topology(cluster.master.addr(), job).await;
        let mut trained = Rows::new();
        for shard in primus_proto::role_addrs(&endpoints, Role::Ps) {
            trained.extend(training_rows(&shard).await);
        }
        let replicas = primus_proto::role_addrs(&endpoints, Role::Serving);
        let held = match replicas.first() {
            Some(replica) => replica_rows(replica).await,
            None => Rows::new(),
        };
        if held == trained || Instant::now() > deadline {
            return (trained, held);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The AUC `job`'s serving replica answers on `holdout`, once its dense network settled:
/// two answers 1.5 s apart agree (serving-sync exports it every second).
async fn served_auc(cluster: &Cluster, job: &str, holdout: &Holdout) -> f64 {
    let endpoints = primus_harness::topology(cluster.master.addr(), job).await;
    let [replica] = &primus_proto::role_addrs(&endpoints, Role::Serving)[..] else {
        panic!("{job}: one serving replica expected: {endpoints:?}");
    };
    let mut serving = ServingServiceClient::connect(format!("http://{replica}"))
        .await
        .unwrap_or_else(|e| panic!("{job}: serving replica {replica}: {e}"));
    let request = |samples: &[Sample]| PredictRequest {
        job: job.to_owned(),
        samples: samples.to_vec(),
    };
    let probe = request(&holdout.samples[..256]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        let now = (serving.predict(probe.clone()).await).map(|r| r.into_inner().probabilities);
        match (&last, now) {
            (Some(before), Ok(now)) if *before == now => break,
            (_, now) => last = now.ok(),
        }
        assert!(
            Instant::now() < deadline,
            "{job}: no settled answer from its serving replica"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let mut scores = Vec::with_capacity(holdout.samples.len());
    for samples in holdout.samples.chunks(2000) {
        let answer = (serving.predict(request(samples)).await)
            .unwrap_or_else(|e| panic!("{job}: Predict: {e}"));
        scores.extend(answer.into_inner().probabilities.into_iter().map(f64::from));
    }
    primus_metrics::auc(&scores, &holdout.labels).expect("held-out rows of both classes")
}

/// How the rows of `served` differ from `trained`, by kind, with a few examples: what a
/// failure must show to be understood from CI's output alone.
fn differences(trained: &Rows, served: &Rows) -> String {
    let (mut missing, mut extra, mut older, mut newer, mut same_version) = (0, 0, 0, 0, 0);
    let mut examples = Vec::new();
    for (key, row) in trained {
        let kind = match served.get(key) {
            None => {
                missing += 1;
                "missing"
            }
            Some(held) if held == row => continue,
            Some(held) if held.0 < row.0 => {
                older += 1;
                "older"
            }
            Some(held) if held.0 > row.0 => {
                newer += 1;
                "newer"
            }
            Some(_) => {
                same_version += 1;
                "same version, other values"
            }
        };
        if examples.len() < 5 {
            let held = served.get(key).map(|(version, _)| *version);
            examples.push(format!(
                "{key:?} {kind}: trained version {}, served {held:?}",
                row.0
            ));
        }
    }
    for (key, (version, _)) in served {
        if !trained.contains_key(key) {
            extra += 1;
            if examples.len() < 10 {
                examples.push(format!("{key:?} only served, version {version}"));
            }
        }
    }
    format!(
        "{missing} missing, {extra} only served, {older} older, {newer} newer, {same_version} \
         of the same version with other values; {}",
        examples.join("; ")
    )
}

/// The `RolledBack` condition's message, if the Job rolled back.
fn rolled_back(status: &Status) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.kind == "RolledBack")
        .map(|c| c.message.clone())
}
