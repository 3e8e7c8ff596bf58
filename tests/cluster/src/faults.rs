//! Faults of a cluster, one per Job, each counted as the chaos suite counts them: a mixture
//! DLRM Job over 200,000 Parquet rows in MinIO whose `c26` is each row's own id (and a live
//! JetStream subject that stays empty, so the Job keeps its PS shards after it trained every
//! row), with a serving replica and checkpoints every 2 s. Once it committed a checkpoint and
//! trained a share of its rows, the fault: its trainer's pod deleted, a PS shard's pod
//! deleted, the second node lost at once (kubelet, containerd, every container), the
//! Kubernetes API server stopped for 30 s, the master's pod deleted (its StatefulSet starts
//! it again and it takes the Job over); and a trainer given less memory than it uses, which
//! the kernel OOM-kills until the master gives it more. Every row must have been trained
//! exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::{JobPod, KubeDeployment, NAMESPACE, service_ip};
use primus_chaos::Outcome;
use primus_config::{NatsSettings, StorageSettings};
use primus_harness::criteo::{dlrm_job_checkpointed_at, write_criteo_rows_to};
use primus_harness::numbered::{Trained, number_parquet_rows, trained_rows};
use primus_harness::resources::{dataset, hourly, jetstream, parquet, served};
use primus_spec::Resource;
use primus_spec::job::{PsFailure, RoleSpec, TrainingMode, WorkerFailure};
use primus_spec::status::{Phase, Status};

const HOURS: usize = 2;
/// The Parquet rows every fault's Job trains.
pub const ROWS: u64 = 200_000;
const TABLE: &str = "categorical";
const DATA: &str = "s3://primus/faults/criteo";
const STREAM: &str = "FAULTS";
const SUBJECT: &str = "faults.rows";
const DATASET: &str = "criteo-faults";
/// The node the platform's services are not on (see `KubeDeployment`).
const LOST_NODE: &str = "node2";
/// How long the API server is away.
const API_SERVER_DOWN: Duration = Duration::from_secs(30);

/// A fault of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `kubectl delete pod` of the trainer.
    TrainerPodDeleted,
    /// `kubectl delete pod` of a PS shard.
    PsPodDeleted,
    /// The second node lost at once.
    NodeLost,
    /// The Kubernetes API server stopped for 30 s.
    ApiServerStopped,
    /// `kubectl delete pod master-0`.
    MasterRestarted,
    /// The trainer given less memory than it uses once it trains at full speed: the
    /// kernel OOM-kills it, and the master gives it more (`scaling.memory.vertical`).
    OutOfMemory,
}

impl Fault {
    /// Every fault, in the order the tests inject them.
    pub const ALL: [Fault; 6] = [
        Fault::TrainerPodDeleted,
        Fault::PsPodDeleted,
        Fault::NodeLost,
        Fault::ApiServerStopped,
        Fault::MasterRestarted,
        Fault::OutOfMemory,
    ];

    /// The fault in words.
    pub fn name(self) -> &'static str {
        match self {
            Fault::TrainerPodDeleted => "trainer pod deleted",
            Fault::PsPodDeleted => "PS pod deleted",
            Fault::NodeLost => "node lost (kubelet, containerd, containers)",
            Fault::ApiServerStopped => "Kubernetes API server stopped 30 s",
            Fault::MasterRestarted => "master pod deleted (restarted, takes over)",
            Fault::OutOfMemory => "trainer OOMKilled (given more memory)",
        }
    }

    fn job(self) -> &'static str {
        match self {
            Fault::TrainerPodDeleted => "fault-trainer-pod",
            Fault::PsPodDeleted => "fault-ps-pod",
            Fault::NodeLost => "fault-node-lost",
            Fault::ApiServerStopped => "fault-api-server",
            Fault::MasterRestarted => "fault-master",
            Fault::OutOfMemory => "fault-oom",
        }
    }
}

/// Writes the rows into MinIO, numbered; makes the live subject's stream; applies Dataset
/// `criteo-faults`.
pub async fn prepare(deployment: &KubeDeployment) {
    let cluster = deployment.cluster;
    let minio = service_ip(cluster, "minio").expect("MinIO's Service");
    let mut storage = StorageSettings::default();
    storage.s3.endpoint = Some(format!("http://{minio}:9000"));
    storage.s3.region = Some("us-east-1".into());
    storage.s3.access_key_id = Some("primus".into());
    storage.s3.secret_access_key = Some("primus-dev-secret".into());
    storage.s3.allow_http = true;
    let location = primus_storage::open(DATA, &storage).expect("the data's location in MinIO");
    write_criteo_rows_to(&location, HOURS).await;
    assert_eq!(number_parquet_rows(&location, 0).await, 0..ROWS);

    let nats = service_ip(cluster, "nats").expect("NATS's Service");
    let settings = NatsSettings {
        url: format!("nats://{nats}:4222"),
        ..Default::default()
    };
    let bus = primus_bus::Bus::connect(&settings).await.expect("NATS");
    bus.jetstream()
        .ensure_stream(STREAM, vec![SUBJECT.into()])
        .await
        .expect("the live stream");

    let live_from = format!("2026-11-01T{HOURS:02}");
    let faults = dataset(DATASET)
        .schema(primus_datagen::criteo::feature_schema(TABLE))
        .simultaneous()
        .stream(
            "history",
            hourly("2026-11-01T00", Some(&live_from)),
            vec![parquet("criteo", DATA)],
        )
        .stream(
            "live",
            hourly(&live_from, None),
            vec![jetstream("live", STREAM, SUBJECT)],
        );
    let client = deployment.client().await;
    client.apply(&faults.build(), 0).await.expect("the Dataset");
}

/// The trainer's memory in the out-of-memory fault: it starts in less (about 13 MiB) and
/// uses more once it trains at full speed (about 17 MiB).
const TRAINER_MEMORY_SHORT: &str = "14Mi";

/// The Job of `fault`: small enough that every pod fits the first node when the second is
/// lost (1.5 CPUs beside the services' 0.45).
fn job_resource(fault: Fault) -> Resource {
    let job = fault.job();
    dlrm_job_checkpointed_at(job, 1, format!("s3://primus/checkpoints/{job}"), 2)
        .with(|spec| {
            spec.dataset = DATASET.into();
            spec.mode = TrainingMode::Mixture;
            served(spec);
            let topology = &mut spec.topology;
            topology.ps = sized(2, 0.25, "512Mi");
            topology.data_executors = sized(1, 0.25, "1Gi");
            topology.trainers = sized(1, 0.5, "1Gi");
            topology.serving = Some(sized(1, 0.25, "512Mi"));
            if fault == Fault::MasterRestarted {
                // Minibatches of 16 keep the Job training while the new master takes
                // over: at 256 a fast machine trains every row before it does.
                spec.training.batch_size = 16;
            }
            if fault == Fault::OutOfMemory {
                topology.trainers.memory = TRAINER_MEMORY_SHORT.into();
                spec.scaling.memory.vertical = true;
            }
            if let Some(checkpoint) = &mut spec.checkpoint {
                checkpoint.on_ps_failure = PsFailure::Rollback;
                checkpoint.on_worker_failure = WorkerFailure::Rollback;
            }
        })
        .build()
}

fn sized(replicas: u32, cpu: f64, memory: &str) -> RoleSpec {
    RoleSpec {
        cpu,
        memory: memory.into(),
        ..RoleSpec::new(replicas)
    }
}

/// Runs `fault`'s Job, injecting the fault once the Job committed a checkpoint and trained
/// `at` samples (the out-of-memory fault comes by itself); counts what it trained once it
/// trained every row, and deletes it.
pub async fn run(deployment: &KubeDeployment, fault: Fault, at: u64) -> Outcome {
    let job = fault.job();
    let client = deployment.client().await;
    let mut injected_unix_s = 0;
    client
        .apply(&job_resource(fault), 0)
        .await
        .expect("the Job");
    let (before, pods, injected, note) = if fault == Fault::OutOfMemory {
        let (before, note) = wait_for_oom_kill(deployment, job).await;
        (before, deployment.job_pods(job), Instant::now(), note)
    } else {
        let before = wait_for_fault_moment(deployment, job, at).await;
        let pods = deployment.job_pods(job);
        injected_unix_s = primus_spec::time::unix_ms() / 1000;
        let injected = Instant::now();
        let note = inject(deployment, fault, &pods).await;
        (before, pods, injected, note)
    };
    let recovered_s = recovery(deployment, job, before, injected).await;
    let status = caught_up(deployment, job).await;
    let progress = status.progress.clone().expect("progress");
    let shards: Vec<String> = (deployment.job_pods(job).iter())
        .filter(|p| p.executor.starts_with("ps-") && !p.ip.is_empty())
        .map(|p| format!("{}:7080", p.ip))
        .collect();
    assert_eq!(
        shards.len(),
        2,
        "{job}: its PS shards' pods: {:?}",
        deployment.job_pods(job)
    );
    let trained = trained_rows(&shards, TABLE, 0..ROWS).await;
    let events: Vec<String> = (status.events.iter())
        .map(|e| format!("{} {}: {}", e.unix_ms, e.reason, e.message))
        .collect();
    eprintln!("{job}: {trained:?}, events:\n{}", events.join("\n"));
    if trained.lost > 0 || trained.repeated > 0 || progress.samples != trained.trainings {
        let cluster = deployment.cluster;
        let master = (cluster.kubectl_run(&["-n", NAMESPACE, "logs", "master-0", "--tail=300"]))
            .unwrap_or_else(|e| e.to_string());
        let previous = (cluster.kubectl_run(&[
            "-n",
            NAMESPACE,
            "logs",
            "master-0",
            "--previous",
            "--tail=100",
        ]))
        .unwrap_or_else(|e| e.to_string());
        eprintln!(
            "{job}: {status:#?}\n{}\n--- master-0:\n{master}\n--- master-0, its previous container:\n{previous}",
            cluster.diagnostics(NAMESPACE)
        );
    }
    counted_as_trained(job, &progress, &trained);
    if fault == Fault::MasterRestarted {
        // The PS shards and the serving replica are taken over; the data executors and
        // trainers, whose work since the checkpoint the Job does again, are replaced.
        let (before, after) = (uids(&pods), uids(&deployment.job_pods(job)));
        for (executor, uid) in &before {
            let kept = after.get(executor) == Some(uid);
            let adopted = executor.starts_with("ps-") || executor.starts_with("serving-");
            assert_eq!(
                kept, adopted,
                "{job}: {executor}: before {before:?}, after {after:?}"
            );
        }
        assert!(
            status.events.iter().any(|e| e.reason == "TakenOver"),
            "{job}: {:?}",
            status.events
        );
    }
    if fault == Fault::OutOfMemory {
        given_more_memory(deployment, job, &status);
    }
    if fault == Fault::NodeLost {
        deployment
            .cluster
            .rejoin_node(LOST_NODE)
            .expect("the lost node joins again");
    }
    if fault == Fault::ApiServerStopped {
        // The next fault meets a cluster whose nodes are all back in it: each kubelet
        // reported after the API server came back.
        let back = injected_unix_s + API_SERVER_DOWN.as_secs() as i64;
        let since = format!(
            "{}:{:02}:{:02}Z",
            primus_spec::time::window_time(back),
            back.rem_euclid(3600) / 60,
            back.rem_euclid(60)
        );
        (deployment.cluster.wait_nodes_reported_since(&since)).expect("every node reporting again");
    }
    deployment.delete_job(job).await;
    Outcome {
        fault: fault.name(),
        recovered_s,
        lost: trained.lost,
        duplicated: trained.repeated,
        auc: progress.auc,
        auc_delta: None,
        note,
    }
}

/// Injects `fault` into the Job whose pods are `pods`; what was done.
async fn inject(deployment: &KubeDeployment, fault: Fault, pods: &[JobPod]) -> String {
    let cluster = deployment.cluster;
    let pod_of = |prefix: &str| {
        (pods.iter())
            .find(|p| p.executor.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} pod: {pods:?}"))
            .name
            .clone()
    };
    match fault {
        Fault::TrainerPodDeleted | Fault::PsPodDeleted => {
            let prefix = if fault == Fault::PsPodDeleted {
                "ps-"
            } else {
                "trainer-"
            };
            let pod = pod_of(prefix);
            cluster
                .kubectl_run(&["-n", NAMESPACE, "delete", "pod", &pod, "--wait=false"])
                .expect("kubectl delete pod");
            format!("kubectl delete pod {pod}")
        }
        Fault::NodeLost => {
            let on_node: Vec<&str> = (pods.iter())
                .filter(|p| p.node == LOST_NODE)
                .map(|p| p.executor.as_str())
                .collect();
            assert!(
                !on_node.is_empty(),
                "no pod of the Job on {LOST_NODE}: {pods:?}"
            );
            cluster.lose_node(LOST_NODE).expect("the node lost");
            format!("{LOST_NODE} lost with {}", on_node.join(", "))
        }
        Fault::ApiServerStopped => {
            cluster.stop_api_server();
            tokio::time::sleep(API_SERVER_DOWN).await;
            cluster.start_api_server().expect("the API server again");
            "kube-apiserver stopped for 30 s".into()
        }
        Fault::MasterRestarted => {
            cluster
                .kubectl_run(&["-n", NAMESPACE, "delete", "pod", "master-0", "--wait=false"])
                .expect("kubectl delete pod master-0");
            "kubectl delete pod master-0".into()
        }
        Fault::OutOfMemory => unreachable!("the kernel injects it"),
    }
}

/// The trainer's pod of `job`: its name, its container's id and restarts, the reason its
/// previous run ended, and its memory limit.
fn trainer_container(deployment: &KubeDeployment, job: &str) -> Option<[String; 5]> {
    let template = "{range .items[*]}{.metadata.name} \
                    {.status.containerStatuses[0].containerID}- \
                    {.status.containerStatuses[0].restartCount}- \
                    {.status.containerStatuses[0].lastState.terminated.reason}- \
                    {.spec.containers[0].resources.limits.memory}{\"\\n\"}{end}";
    let listed = deployment.job_pods_listed(job, template).ok()?;
    let line = listed.lines().find(|l| l.contains("-trainer-"))?;
    let mut parts = line.split_whitespace().map(|p| p.trim_end_matches('-'));
    let mut next = || parts.next().unwrap_or_default().to_owned();
    let name = next();
    let id = next().trim_start_matches("containerd://").to_owned();
    Some([name, id, next(), next(), next()])
}

/// Waits until the kernel OOM-killed `job`'s trainer; the Job's samples then, and what
/// happened.
async fn wait_for_oom_kill(deployment: &KubeDeployment, job: &str) -> (u64, String) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let status = deployment.status(job).await;
        if let Some([name, _, restarts, reason, _]) = trainer_container(deployment, job)
            && reason == "OOMKilled"
        {
            let samples = status.progress.as_ref().map_or(0, |p| p.samples);
            let note = format!("{name} OOMKilled at {TRAINER_MEMORY_SHORT} ({restarts} restarts)");
            return (samples, note);
        }
        assert!(
            !status.phase.is_terminal() && Instant::now() < deadline,
            "{job}: its trainer was never OOM-killed at {TRAINER_MEMORY_SHORT}: {status:#?}\n{}",
            deployment.cluster.diagnostics(NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The Job's events say the trainer was given more memory, its pod's limit is what it
/// was given, and so is its container's cgroup's: the kernel enforces the new limit.
fn given_more_memory(deployment: &KubeDeployment, job: &str, status: &Status) {
    let raised: Vec<&str> = (status.events.iter())
        .filter(|e| e.reason == "MemoryRaised" && e.message.starts_with("trainer-0"))
        .map(|e| e.message.as_str())
        .collect();
    let given: u64 = (raised.last())
        .and_then(|m| m.rsplit_once("given "))
        .and_then(|(_, bytes)| bytes.trim_end_matches(" bytes").parse().ok())
        .unwrap_or_else(|| panic!("{job}: no MemoryRaised for trainer-0: {:?}", status.events));
    let short = primus_spec::job::parse_memory(TRAINER_MEMORY_SHORT).expect("a quantity");
    assert!(given > short, "{job}: {raised:?}");
    let [name, id, _, _, limit] = trainer_container(deployment, job).expect("the trainer's pod");
    assert_eq!(
        primus_spec::job::parse_memory(&limit).ok(),
        Some(given),
        "{job}: {name}'s memory limit {limit}, given {raised:?}"
    );
    let cgroup = (deployment.cluster.container_cgroup("memory", &id))
        .unwrap_or_else(|| panic!("{job}: no cgroup of {name}'s container {id}"));
    let enforced = std::fs::read_to_string(cgroup.join("memory.limit_in_bytes"))
        .expect("memory.limit_in_bytes");
    assert_eq!(
        enforced.trim().parse::<u64>().ok(),
        Some(given),
        "{job}: {name}'s cgroup"
    );
}

/// Waits until `job` committed a checkpoint and trained `at` samples; its samples then.
async fn wait_for_fault_moment(deployment: &KubeDeployment, job: &str, at: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = deployment.status(job).await;
        let committed = (status.conditions.iter()).any(|c| c.kind == "Checkpoint" && c.status);
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if committed && samples >= at {
            return samples;
        }
        assert!(
            !status.phase.is_terminal() && Instant::now() < deadline,
            "{job}: no checkpoint or not {at} samples: {status:?}\n{}",
            deployment.cluster.diagnostics(NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Seconds from the fault until the Job reported more samples than `before` again.
async fn recovery(
    deployment: &KubeDeployment,
    job: &str,
    before: u64,
    injected: Instant,
) -> Option<f64> {
    let deadline = injected + Duration::from_secs(600);
    loop {
        let status = deployment.status(job).await;
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if samples > before || samples >= ROWS {
            return Some(injected.elapsed().as_secs_f64());
        }
        if status.phase.is_terminal() || Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the Job trained as many samples as the Parquet rows, and a few seconds more
/// for any sample trained twice to be counted; its status then.
async fn caught_up(deployment: &KubeDeployment, job: &str) -> Status {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let status = deployment.status(job).await;
        let samples = status.progress.as_ref().map_or(0, |p| p.samples);
        if samples >= ROWS {
            break;
        }
        assert!(
            status.phase != Phase::Failed && Instant::now() < deadline,
            "{job}: {samples} of {ROWS} rows trained: {status:#?}\n{}",
            deployment.cluster.diagnostics(NAMESPACE)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    deployment.status(job).await
}

/// The Job's trained-sample count is what its model trained (since its last rollback),
/// and its sources' counts add up to it.
fn counted_as_trained(job: &str, progress: &primus_spec::status::Progress, trained: &Trained) {
    let per_source: u64 = progress.sources.iter().map(|s| s.samples).sum();
    assert_eq!(per_source, progress.samples, "{job}: {progress:?}");
    assert_eq!(
        progress.samples, trained.trainings,
        "{job}: samples counted against row trainings in the model: {trained:?}"
    );
}

fn uids(pods: &[JobPod]) -> BTreeMap<String, String> {
    (pods.iter())
        .map(|p| (p.executor.clone(), p.uid.clone()))
        .collect()
}
