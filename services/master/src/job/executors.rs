//! A Job's executors as the backend starts them: each one's typed settings, built from the
//! master's own sections and the Job, its Dataset and its model layout; starting a role's
//! replicas; waiting until every executor's gRPC health says SERVING (or it is done).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use primus_config::{
    DataExecutorSettings, MasterSettings, PsRole, PsSettings, TableSettings, TrainerSettings,
};
pub(crate) use primus_job_policy::role_spec;
use primus_model::ModelLayout;
use primus_proto::v1::{Endpoint, Role};
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::{Device, JobSpec};

use tokio::sync::broadcast;

use super::Outcome;
use crate::context::Context;
use primus_backend::{
    BackendError, BackendEvent, ExecutorRole, ExecutorSettings, ExecutorSpec, Gang, ResourceBackend,
};
use primus_data_tasks::plan::Catalog;

/// How long a started executor has to report SERVING.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Each table shard of a PS on a GPU is one kernel launch per call: fewer, bigger ones.
const GPU_SHARDS_PER_TABLE: usize = 4;

/// A Job as its executors are configured from it.
pub(crate) struct JobParts<'a> {
    pub(crate) name: &'a str,
    pub(crate) spec: &'a JobSpec,
    pub(crate) dataset: &'a DatasetSpec,
    pub(crate) layout: &'a ModelLayout,
    /// Memory executors were given beyond their role's, by id: a raise outlives a restart
    /// under the same id (a rollback's, a scale-out's into a departed one's place).
    pub(crate) memory_given: &'a HashMap<String, u64>,
}

/// The settings of one executor of `role`: the master's NATS and telemetry sections, plus
/// the storage section, the PS tables (the model's and their companions), the dense
/// optimizer and the device for PS shards; the storage section and the Dataset for data
/// executors; the model, the Dataset's schema and the Job's training settings for
/// trainers; the storage section (they load checkpoints), the tables, model and schema for
/// serving replicas.
pub(crate) fn executor_settings(
    settings: &MasterSettings,
    role: ExecutorRole,
    job: &JobParts<'_>,
) -> ExecutorSettings {
    let (spec, dataset, layout) = (job.spec, job.dataset, job.layout);
    match role {
        ExecutorRole::Ps => {
            let device = spec.topology.ps.device;
            let defaults = TableSettings::default();
            ExecutorSettings::Ps(Box::new(PsSettings {
                nats: settings.nats.clone(),
                telemetry: settings.telemetry.clone(),
                storage: settings.storage.clone(),
                ps: TableSettings {
                    tables: layout.ps_tables(),
                    dense_optimizer: spec.model.dense.optimizer.clone(),
                    device,
                    shards_per_table: match device {
                        Device::Cuda => GPU_SHARDS_PER_TABLE,
                        Device::Cpu => defaults.shards_per_table,
                    },
                    memory_limit_bytes: primus_spec::job::parse_memory(&spec.topology.ps.memory)
                        .ok(),
                    // Every start, first or after a crash, trains only once the master
                    // restored or opened the shard.
                    await_restore: true,
                    ..defaults
                },
                ..PsSettings::default()
            }))
        }
        ExecutorRole::Serving => {
            let mut replica = PsSettings {
                nats: settings.nats.clone(),
                telemetry: settings.telemetry.clone(),
                storage: settings.storage.clone(),
                ..PsSettings::default()
            };
            replica.ps.role = PsRole::Serving;
            replica.ps.tables = layout.ps_tables();
            replica.serving.job = job.name.to_owned();
            replica.serving.model = Some(spec.model.clone());
            replica.serving.schema = Some(dataset.schema.clone());
            replica.serving.token_file = settings.master.predict_token_file.clone();
            ExecutorSettings::Ps(Box::new(replica))
        }
        ExecutorRole::DataExecutor => {
            let mut executor = DataExecutorSettings {
                nats: settings.nats.clone(),
                telemetry: settings.telemetry.clone(),
                storage: settings.storage.clone(),
                ..DataExecutorSettings::default()
            };
            executor.data.dataset = Some(dataset.clone());
            executor.data.stream_loading = spec.training.stream_loading;
            executor.data.read_delay_ms = settings.master.fault_injection.data_read_delay_ms;
            ExecutorSettings::DataExecutor(Box::new(executor))
        }
        ExecutorRole::Trainer => {
            let training = &spec.training;
            let mut trainer = TrainerSettings {
                nats: settings.nats.clone(),
                telemetry: settings.telemetry.clone(),
                ..TrainerSettings::default()
            };
            let train = &mut trainer.trainer;
            train.model = Some(spec.model.clone());
            train.schema = Some(dataset.schema.clone());
            train.batch_size = training.batch_size;
            train.dense_pull_every = training.dense_pull_every;
            train.eval_window = training.eval_window as usize;
            train.hot_set = training.hot_set.clone();
            train.device = spec.topology.trainers.device;
            ExecutorSettings::Trainer(Box::new(trainer))
        }
    }
}

/// Starts every replica of `roles` and adds each to the Job's topology.
pub(crate) async fn start_executors<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &JobParts<'_>,
    roles: &[ExecutorRole],
) -> Result<(), Outcome> {
    for &role in roles {
        let Some(role_spec) = role_spec(job.spec, role) else {
            continue;
        };
        for index in 0..role_spec.replicas {
            start_executor(context, job, role, index)
                .await
                .map_err(|e| Outcome::failed("ExecutorStartFailed", e.to_string()))?;
        }
    }
    Ok(())
}

/// Starts every executor of `roles` at once: a gang's members are placed only together,
/// so none may wait for another to be placed first.
pub(crate) async fn start_executors_together<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &JobParts<'_>,
    roles: &[ExecutorRole],
) -> Result<(), Outcome> {
    let starts = members(job, roles).map(|(role, index)| start_executor(context, job, role, index));
    futures::future::try_join_all(starts)
        .await
        .map_err(|e| Outcome::failed("ExecutorStartFailed", e.to_string()))?;
    Ok(())
}

/// The Job's executors of `roles` as one gang: their count and their requests together.
pub(crate) fn gang(settings: &MasterSettings, job: &JobParts<'_>, roles: &[ExecutorRole]) -> Gang {
    let specs: Vec<ExecutorSpec> = (members(job, roles))
        .map(|(role, index)| executor_spec(settings, job, role, index))
        .collect();
    Gang {
        members: specs.len() as u32,
        cpu: specs.iter().map(|s| s.cpu).sum(),
        memory_bytes: specs.iter().map(|s| s.memory_bytes).sum(),
    }
}

/// (role, index) of every executor of `roles` the Job's spec asks for.
fn members<'a>(
    job: &'a JobParts<'_>,
    roles: &'a [ExecutorRole],
) -> impl Iterator<Item = (ExecutorRole, u32)> + 'a {
    roles.iter().flat_map(move |&role| {
        let replicas = role_spec(job.spec, role).map_or(0, |spec| spec.replicas);
        (0..replicas).map(move |index| (role, index))
    })
}

/// Starts executor `index` of `role` and adds it to the Job's topology.
pub(crate) async fn start_executor<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &JobParts<'_>,
    role: ExecutorRole,
    index: u32,
) -> Result<Endpoint, BackendError> {
    let endpoint = request_executor(context, job, role, index).await?;
    context.topologies.add(job.name, endpoint.clone());
    Ok(endpoint)
}

/// Starts executor `index` of `role`, not yet in the Job's topology.
pub(crate) async fn request_executor<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &JobParts<'_>,
    role: ExecutorRole,
    index: u32,
) -> Result<Endpoint, BackendError> {
    let request = executor_spec(&context.settings, job, role, index);
    let executor = context.backend.request(request).await?;
    Ok(Endpoint {
        role: role.proto() as i32,
        id: executor.id,
        grpc_addr: executor.grpc_addr.to_string(),
    })
}

/// What the backend is asked to start for executor `index` of `role`: its settings and
/// the Job's resources for its role, with the memory it was given since where it was.
pub(crate) fn executor_spec(
    settings: &MasterSettings,
    job: &JobParts<'_>,
    role: ExecutorRole,
    index: u32,
) -> ExecutorSpec {
    let (cpu, memory_bytes) = role_spec(job.spec, role).map_or((0.0, 0), |spec| {
        let memory = primus_spec::job::parse_memory(&spec.memory).unwrap_or(0);
        (spec.cpu, memory)
    });
    let mut executor_settings = executor_settings(settings, role, job);
    let faults = &settings.master.fault_injection;
    if let ExecutorSettings::DataExecutor(executor) = &mut executor_settings
        && faults.slow_data_executor == Some(index)
    {
        executor.data.read_delay_ms += faults.slow_read_delay_ms;
    }
    let mut spec = ExecutorSpec {
        job: job.name.to_owned(),
        role,
        index,
        settings: executor_settings,
        cpu,
        memory_bytes,
    };
    if let Some(given) = job.memory_given.get(&spec.id()) {
        spec.memory_bytes = *given;
    }
    spec
}

/// Every executor a Job starts with, as the backend is asked for them.
pub fn job_executors(
    settings: &MasterSettings,
    name: &str,
    spec: &JobSpec,
    dataset: &DatasetSpec,
) -> Result<Vec<ExecutorSpec>, String> {
    let layout = ModelLayout::new(&spec.model, &dataset.schema).map_err(|e| e.to_string())?;
    let none_given = HashMap::new();
    let job = JobParts {
        name,
        spec,
        dataset,
        layout: &layout,
        memory_given: &none_given,
    };
    Ok((ExecutorRole::ALL.into_iter())
        .filter_map(|role| Some((role, role_spec(spec, role)?.replicas)))
        .flat_map(|(role, replicas)| (0..replicas).map(move |index| (role, index)))
        .map(|(role, index)| executor_spec(settings, &job, role, index))
        .collect())
}

/// Waits until every executor of `roles` in the Job's topology serves, or has already
/// finished its work (exited 0: a small Job's executors may be done before they are
/// asked); returns how many there are. `events` is subscribed before the executors
/// started, so no exit is missed.
pub(crate) async fn wait_ready<B: ResourceBackend, C: Catalog>(
    context: &Arc<Context<B, C>>,
    job: &str,
    roles: &[ExecutorRole],
    events: &mut broadcast::Receiver<BackendEvent>,
) -> Result<usize, Outcome> {
    let endpoints: Vec<Endpoint> = (endpoints(context, job).into_iter())
        .filter(|e| roles.iter().any(|role| role.proto() as i32 == e.role))
        .collect();
    let mut completed = HashSet::new();
    for endpoint in &endpoints {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            completed.extend(completions(events, job));
            if completed.contains(&endpoint.id) || serving(&endpoint.grpc_addr).await {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Outcome::failed("ExecutorsNotReady", not_serving(endpoint)));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(endpoints.len())
}

/// The executors of `job` that `events` says exited 0 since it was last read.
fn completions(events: &mut broadcast::Receiver<BackendEvent>, job: &str) -> Vec<String> {
    let mut completed = Vec::new();
    loop {
        match events.try_recv() {
            Ok(BackendEvent::Completed { job: of, id }) if of == job => completed.push(id),
            Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
            Err(_) => return completed,
        }
    }
}

/// Waits until `endpoint`'s gRPC health says SERVING, for up to [`READY_TIMEOUT`].
pub(crate) async fn wait_serving(endpoint: &Endpoint) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while !serving(&endpoint.grpc_addr).await {
        if tokio::time::Instant::now() > deadline {
            return Err(not_serving(endpoint));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn not_serving(endpoint: &Endpoint) -> String {
    format!(
        "{} at {} did not report SERVING within {}s",
        endpoint.id,
        endpoint.grpc_addr,
        READY_TIMEOUT.as_secs()
    )
}

/// Every executor of the Job's topology.
pub(crate) fn endpoints<B, C>(context: &Context<B, C>, job: &str) -> Vec<Endpoint> {
    context
        .topologies
        .get(job)
        .map(|(_, endpoints)| endpoints)
        .unwrap_or_default()
}

pub(crate) fn with_role(endpoints: &[Endpoint], role: Role) -> Vec<&Endpoint> {
    endpoints.iter().filter(|e| e.role == role as i32).collect()
}

/// How long an executor has to answer a call the Job's loop waits on. Everything else the
/// loop handles waits meanwhile: an executor that stopped answering (a stopped or wedged
/// process, whose socket still accepts) must not hold it up for longer.
pub(crate) const ANSWER_DEADLINE: Duration = Duration::from_secs(2);

/// `call` to executor `who`, given up after [`ANSWER_DEADLINE`] with an error saying so.
pub(crate) async fn answered<T>(
    who: &str,
    call: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    (tokio::time::timeout(ANSWER_DEADLINE, call).await)
        .unwrap_or_else(|_| Err(format!("{who} did not answer within {ANSWER_DEADLINE:?}")))
}

/// Whether the gRPC health service at `addr` says SERVING (within [`ANSWER_DEADLINE`]).
pub(crate) async fn serving(addr: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{addr}")) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_secs(1))
        .timeout(ANSWER_DEADLINE)
        .connect()
        .await
    else {
        return false;
    };
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    matches!(
        health.check(request).await.map(|r| r.into_inner().status),
        Ok(status) if status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_spec::{Resource, parse_documents};

    const EXAMPLE: &str = include_str!("../../../../examples/criteo-like.yaml");

    /// Only the Job's own executors that exited 0 count as done; a crash does not.
    #[test]
    fn the_executors_done_are_the_jobs_that_exited_0() {
        let (sender, mut events) = broadcast::channel(8);
        let completed = |job: &str, id: &str| BackendEvent::Completed {
            job: job.into(),
            id: id.into(),
        };
        sender.send(completed("a", "trainer-0")).expect("send");
        sender.send(completed("b", "trainer-1")).expect("send");
        let crashed = BackendEvent::Restarting {
            job: "a".into(),
            id: "data_executor-0".into(),
            status: "signal: 9".into(),
            restart: 1,
        };
        sender.send(crashed).expect("send");
        assert_eq!(completions(&mut events, "a"), ["trainer-0"]);
        assert!(
            completions(&mut events, "a").is_empty(),
            "each event read once"
        );
    }

    fn settings_of(example: &str, role: ExecutorRole) -> ExecutorSettings {
        settings_with(&MasterSettings::default(), example, role)
    }

    /// The Job, Dataset and model layout of `example`.
    fn example_job(example: &str) -> (JobSpec, DatasetSpec, ModelLayout) {
        let resources = parse_documents("criteo-like.yaml", example).expect("example parses");
        let (mut job, mut dataset) = (None, None);
        for resource in resources {
            match resource {
                Resource::Job(j) => job = Some(j.spec),
                Resource::Dataset(d) => dataset = Some(d.spec),
                _ => {}
            }
        }
        let (spec, dataset) = (job.expect("a job"), dataset.expect("a dataset"));
        let layout = ModelLayout::new(&spec.model, &dataset.schema).expect("layout");
        (spec, dataset, layout)
    }

    fn settings_with(
        master: &MasterSettings,
        example: &str,
        role: ExecutorRole,
    ) -> ExecutorSettings {
        let (spec, dataset, layout) = example_job(example);
        let none_given = HashMap::new();
        let parts = JobParts {
            name: "criteo-like",
            spec: &spec,
            dataset: &dataset,
            layout: &layout,
            memory_given: &none_given,
        };
        executor_settings(master, role, &parts)
    }

    /// A trainer given more memory after an OOM kill starts again with it; its role's
    /// other replicas keep the role's memory.
    #[test]
    fn an_executor_started_again_keeps_the_memory_it_was_given() {
        let (spec, dataset, layout) = example_job(EXAMPLE);
        let role_memory = primus_spec::job::parse_memory(&spec.topology.trainers.memory)
            .expect("the example's trainer memory");
        let given = HashMap::from([("trainer-0".to_owned(), role_memory * 3 / 2)]);
        let parts = JobParts {
            name: "criteo-like",
            spec: &spec,
            dataset: &dataset,
            layout: &layout,
            memory_given: &given,
        };
        let settings = MasterSettings::default();
        let memory = |index| executor_spec(&settings, &parts, ExecutorRole::Trainer, index);
        assert_eq!(memory(0).memory_bytes, role_memory * 3 / 2);
        assert_eq!(memory(1).memory_bytes, role_memory);
        let ps_memory = primus_spec::job::parse_memory(&spec.topology.ps.memory)
            .expect("the example's PS memory");
        let ps = executor_spec(&settings, &parts, ExecutorRole::Ps, 0);
        assert_eq!(ps.memory_bytes, ps_memory, "ps-0 was given nothing");
    }

    fn ps_section(example: &str) -> TableSettings {
        match settings_of(example, ExecutorRole::Ps) {
            ExecutorSettings::Ps(settings) => settings.ps,
            other => panic!("not a PS's settings: {other:?}"),
        }
    }

    /// PS shards write checkpoints, data executors read data, serving replicas load
    /// checkpoints: each gets the master's storage section (endpoint, credentials).
    #[test]
    fn executors_that_touch_the_object_store_get_the_masters_storage_section() {
        let mut master = MasterSettings::default();
        master.storage.s3.endpoint = Some("http://minio:9000".into());
        for role in [
            ExecutorRole::Ps,
            ExecutorRole::Serving,
            ExecutorRole::DataExecutor,
        ] {
            let storage = match settings_with(&master, EXAMPLE, role) {
                ExecutorSettings::Ps(ps) => ps.storage,
                ExecutorSettings::DataExecutor(executor) => executor.storage,
                other => panic!("{role:?}: {other:?}"),
            };
            assert_eq!(storage, master.storage, "{role:?}");
        }
    }

    #[test]
    fn a_trainer_is_told_its_device() {
        let device = |example: &str| match settings_of(example, ExecutorRole::Trainer) {
            ExecutorSettings::Trainer(settings) => settings.trainer.device,
            other => panic!("not a trainer's settings: {other:?}"),
        };
        assert_eq!(device(EXAMPLE), Device::Cpu);
        let on_gpu = EXAMPLE.replace(
            "trainers: {replicas: 1, cpu: 1, memory: 2Gi}",
            "trainers: {replicas: 1, cpu: 1, memory: 2Gi, device: cuda}",
        );
        assert_ne!(on_gpu, EXAMPLE, "the example's trainers line changed");
        assert_eq!(device(&on_gpu), Device::Cuda);
    }

    #[test]
    fn a_ps_is_told_its_device_and_gets_few_shards_on_a_gpu() {
        let on_cpu = ps_section(EXAMPLE);
        assert_eq!(on_cpu.device, Device::Cpu);
        assert_eq!(
            on_cpu.shards_per_table,
            TableSettings::default().shards_per_table
        );
        let on_gpu = ps_section(&EXAMPLE.replace(
            "ps: {replicas: 2, cpu: 0.5, memory: 2Gi}",
            "ps: {replicas: 2, cpu: 0.5, memory: 2Gi, device: cuda}",
        ));
        assert_eq!(on_gpu.device, Device::Cuda);
        assert_eq!(on_gpu.shards_per_table, 4);
        assert_eq!(
            on_cpu.memory_limit_bytes,
            Some(2 << 30),
            "topology.ps.memory is the PS's memory limit"
        );
    }

    #[test]
    fn every_executors_settings_file_loads_as_that_executors_settings() {
        for role in ExecutorRole::ALL {
            let settings = settings_of(EXAMPLE, role);
            let text = settings.to_toml().expect("settings as TOML");
            let file = tempfile::NamedTempFile::with_suffix(".toml").expect("temp file");
            std::fs::write(file.path(), &text).expect("write");
            // Loaded as the executor loads it: over its own defaults.
            let loaded = match &settings {
                ExecutorSettings::Ps(_) => {
                    let loaded: PsSettings = primus_config::load(
                        &PsSettings::default(),
                        Some(file.path()),
                        std::iter::empty(),
                    )
                    .expect("loads");
                    ExecutorSettings::Ps(Box::new(loaded))
                }
                ExecutorSettings::DataExecutor(_) => {
                    let defaults = DataExecutorSettings::default();
                    let loaded: DataExecutorSettings =
                        primus_config::load(&defaults, Some(file.path()), std::iter::empty())
                            .expect("loads");
                    ExecutorSettings::DataExecutor(Box::new(loaded))
                }
                ExecutorSettings::Trainer(_) => {
                    let defaults = TrainerSettings::default();
                    let loaded: TrainerSettings =
                        primus_config::load(&defaults, Some(file.path()), std::iter::empty())
                            .expect("loads");
                    ExecutorSettings::Trainer(Box::new(loaded))
                }
            };
            assert_eq!(loaded, settings, "{role:?}: {text}");
        }
    }
}
