//! The `kubernetes` backend: each executor is a pod with its settings file in a Secret,
//! all of a Job's objects owned by one ConfigMap per Job (deleting it removes them all).
//! A watch on this master's pods (its job shard's label) keeps the observed state; every
//! change reconciles the executor it concerns ([`reconcile`], plain code) and the backend
//! carries out the actions: create, delete, resize in place (or replace the pod where the
//! cluster cannot), and the events the Job reacts to.

mod metrics;
mod pods_watch;
pub mod reconcile;
pub mod render;
mod sweep;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams, PostParams,
};
use primus_config::KubernetesBackendSettings;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::{
    BackendError, BackendEvent, Executor, ExecutorRole, ExecutorSpec, ExecutorUsage, Gang,
    ResourceBackend,
};
use reconcile::{Action, Limits, ObservedPod, Tracked, Wanted};
use render::{JobOwner, RenderContext};

/// A pod with no wanted executor is adopted by a Job the master drives again within this
/// long of starting; after, it is deleted.
const ADOPTION: Duration = Duration::from_secs(120);
/// How long `request` waits for the pod to get an IP.
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(300);
/// Every executor is reconciled this often besides on each change (adoption deadlines,
/// creations that failed).
const RESYNC: Duration = Duration::from_secs(10);

type Key = (String, String);

/// The grace period of a kill: the least the kubelet honours (0 removes the pod object at
/// once, before its containers are dead).
const KILL_GRACE_SECONDS: u32 = 1;

/// How a pod is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deletion {
    /// With its termination grace period: SIGTERM, then SIGKILL.
    Graceful,
    /// Its containers killed at once. The pod object goes only once its kubelet confirmed
    /// the containers are dead, so nothing of it runs once it is gone (a rollback restores
    /// the PS shards only then).
    Kill,
    /// Removed from the API at once: its node is gone and will never confirm.
    Forced,
}

#[derive(Default)]
struct State {
    wanted: HashMap<Key, Wanted>,
    observed: HashMap<Key, ObservedPod>,
    tracked: HashMap<Key, Tracked>,
    owners: HashMap<String, JobOwner>,
    /// Jobs released whose objects could not all be deleted yet (the API server was out of
    /// reach): every resync tries again.
    owners_to_delete: BTreeSet<String>,
    /// The executors seen in a relist of the watch, while one is under way.
    relisted: Option<Vec<Key>>,
}

struct Inner {
    pods: Api<Pod>,
    config_maps: Api<ConfigMap>,
    secrets: Api<Secret>,
    pod_groups: Api<DynamicObject>,
    settings: KubernetesBackendSettings,
    shard: String,
    master_addr: String,
    started: Instant,
    state: Mutex<State>,
    events: broadcast::Sender<BackendEvent>,
    /// Bumped on every observed change, for `request` and `release` to wait on.
    changed: watch::Sender<u64>,
}

/// Executors as pods of a Kubernetes cluster.
pub struct KubernetesBackend {
    inner: Arc<Inner>,
    watcher: JoinHandle<()>,
}

impl Drop for KubernetesBackend {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl KubernetesBackend {
    /// Connects with `settings.kubeconfig`, else `KUBECONFIG`, else the in-cluster service
    /// account, and starts watching this master's pods (`shard` is `i/n`).
    pub async fn connect(
        settings: KubernetesBackendSettings,
        shard: (u32, u32),
        master_addr: String,
    ) -> Result<Self, BackendError> {
        let (client, namespace) = connect_client(&settings).await?;
        let mut settings = settings;
        settings.namespace = Some(namespace.clone());
        let inner = Arc::new(Inner {
            pods: Api::namespaced(client.clone(), &namespace),
            config_maps: Api::namespaced(client.clone(), &namespace),
            pod_groups: Api::namespaced_with(client.clone(), &namespace, &render::pod_group_api()),
            secrets: Api::namespaced(client, &namespace),
            settings,
            shard: format!("{}-{}", shard.0, shard.1),
            master_addr,
            started: Instant::now(),
            state: Mutex::new(State::default()),
            events: broadcast::channel(1024).0,
            changed: watch::channel(0).0,
        });
        let watcher = tokio::spawn(pods_watch::watch_pods(inner.clone()));
        Ok(Self { inner, watcher })
    }
}

impl KubernetesBackend {
    /// The pods of the backend's namespace.
    pub fn pods(&self) -> Api<Pod> {
        self.inner.pods.clone()
    }

    /// Deletes executor `id`'s pod as `deletion` says (forced where its node is gone) and
    /// waits until it is gone, then its settings Secret.
    async fn delete_executor(
        &self,
        job: &str,
        id: &str,
        deletion: Deletion,
    ) -> Result<(), BackendError> {
        let key = (job.to_owned(), id.to_owned());
        let inner = &self.inner;
        let (known, node_gone) = {
            let mut state = inner.lock();
            let node_gone = state.observed.get(&key).is_some_and(ObservedPod::node_gone);
            (state.wanted.remove(&key).is_some(), node_gone)
        };
        if !known {
            return Err(BackendError::Unknown {
                job: job.into(),
                id: id.into(),
            });
        }
        let deletion = if node_gone {
            Deletion::Forced
        } else {
            deletion
        };
        let name = render::pod_name(job, id);
        inner.delete_pod(&name, deletion).await?;
        let grace = match deletion {
            Deletion::Forced => RESYNC,
            Deletion::Kill => Duration::from_secs(u64::from(KILL_GRACE_SECONDS)) + RESYNC,
            Deletion::Graceful => Duration::from_millis(inner.settings.stop_grace_ms) + RESYNC,
        };
        inner
            .wait_for(grace, |state| {
                (!state.observed.contains_key(&key)).then_some(())
            })
            .await;
        inner.delete_secret(&name).await
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn render_context(&self) -> RenderContext<'_> {
        RenderContext {
            settings: &self.settings,
            shard: self.shard.clone(),
            master_addr: self.master_addr.clone(),
        }
    }

    fn selector(&self) -> String {
        format!(
            "{}={},{}={}",
            render::LABEL_MANAGED_BY,
            render::MANAGER,
            render::LABEL_SHARD,
            self.shard
        )
    }

    fn limits(&self) -> Limits {
        Limits {
            max_restarts: self.settings.max_restarts,
            adoption: ADOPTION,
        }
    }

    /// Reconciles one executor and carries out the actions.
    async fn reconcile(self: &Arc<Self>, key: &Key) {
        let (actions, wanted) = {
            let mut state = self.lock();
            let wanted = state.wanted.get(key).cloned();
            let observed = state.observed.get(key).cloned();
            let tracked = state.tracked.entry(key.clone()).or_default();
            let since = self.started.elapsed();
            let actions = reconcile::reconcile(
                wanted.as_ref(),
                observed.as_ref(),
                tracked,
                self.limits(),
                since,
            );
            if wanted.is_none() && observed.is_none() {
                state.tracked.remove(key);
            }
            (actions, wanted)
        };
        for action in actions {
            if let Err(e) = self.act(action, wanted.as_ref()).await {
                tracing::warn!(job = key.0, id = key.1, error = %e, "reconciling an executor's pod");
            }
        }
    }

    async fn act(&self, action: Action, wanted: Option<&Wanted>) -> Result<(), BackendError> {
        match action {
            Action::Create => match wanted {
                Some(wanted) => self.create(wanted).await,
                None => Ok(()),
            },
            Action::Delete { name, force } => {
                let deletion = if force {
                    Deletion::Forced
                } else {
                    Deletion::Graceful
                };
                self.delete_pod(&name, deletion).await
            }
            Action::Resize { name } => match wanted {
                Some(wanted) => self.resize_pod(&name, wanted).await,
                None => Ok(()),
            },
            Action::Report { event, log_of } => {
                let event = match log_of {
                    Some(pod) => with_log(event, self.last_log(&pod).await),
                    None => event,
                };
                let _ = self.events.send(event);
                Ok(())
            }
        }
    }

    /// The pod and its settings Secret (replaced when it exists already).
    async fn create(&self, wanted: &Wanted) -> Result<(), BackendError> {
        let settings = &wanted.settings;
        match self.secrets.create(&PostParams::default(), settings).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let name = settings.metadata.name.clone().unwrap_or_default();
                self.secrets
                    .replace(&name, &PostParams::default(), settings)
                    .await
                    .map_err(api_error("replacing the settings Secret"))?;
            }
            Err(e) => return Err(api_error("creating the settings Secret")(e)),
        }
        match self.pods.create(&PostParams::default(), &wanted.pod).await {
            Ok(_) => Ok(()),
            // Created already (a pod not observed yet): the watch brings it.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(BackendError::Start {
                id: wanted.id.clone(),
                binary: self.settings.image.clone(),
                message: kube_message(&e),
            }),
        }
    }

    /// Deletes an executor's settings Secret (gone already is fine).
    async fn delete_secret(&self, name: &str) -> Result<(), BackendError> {
        match self.secrets.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(api_error("deleting the settings Secret")(e)),
        }
    }

    /// Deletes the owner of `job`'s objects (a missing one is deleted already).
    async fn delete_owner(&self, job: &str) -> Result<(), kube::Error> {
        let owner = render::owner_name(job);
        match (self.config_maps)
            .delete(&owner, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Tries again to delete the objects of released Jobs that could not all be deleted.
    async fn delete_owners_left(&self) {
        let jobs: Vec<String> = self.lock().owners_to_delete.iter().cloned().collect();
        for job in jobs {
            let still = {
                let state = self.lock();
                state.owners_to_delete.contains(&job) && !state.owners.contains_key(&job)
            };
            if still && self.delete_job_objects(&job).await.is_ok() {
                tracing::info!(job, "the Job's objects deleted on a later try");
                self.lock().owners_to_delete.remove(&job);
            }
        }
    }

    async fn delete_pod(&self, name: &str, deletion: Deletion) -> Result<(), BackendError> {
        let params = DeleteParams {
            grace_period_seconds: match deletion {
                Deletion::Graceful => None,
                Deletion::Kill => Some(KILL_GRACE_SECONDS),
                Deletion::Forced => Some(0),
            },
            ..DeleteParams::background()
        };
        match self.pods.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(api_error("deleting pod")(e)),
        }
    }

    /// Changes the pod's resources through the resize subresource; where the cluster has
    /// none (or refuses), replaces the pod by one with the new resources.
    async fn resize_pod(&self, name: &str, wanted: &Wanted) -> Result<(), BackendError> {
        let resources = render::resources(wanted.cpu, wanted.memory_bytes);
        let patch = serde_json::json!({
            "spec": {"containers": [{"name": "executor", "resources": resources}]}
        });
        let params = PatchParams::default();
        match (self.pods)
            .patch_subresource("resize", name, &params, &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) => {
                tracing::info!(pod = name, error = %kube_message(&e), "no in-place resize: replacing the pod");
                self.delete_pod(name, Deletion::Graceful).await?;
                let key = (wanted.job.clone(), wanted.id.clone());
                let mut state = self.lock();
                let tracked = state.tracked.entry(key).or_default();
                tracked.pending = Some(reconcile::replaced(wanted, tracked, "resized"));
            }
        }
        let _ = self.events.send(BackendEvent::Resized {
            job: wanted.job.clone(),
            id: wanted.id.clone(),
            cpu: wanted.cpu,
            memory_bytes: wanted.memory_bytes,
        });
        Ok(())
    }

    /// The last lines of the previous run of `pod`'s container.
    async fn last_log(&self, pod: &str) -> String {
        let params = LogParams {
            container: Some("executor".into()),
            previous: true,
            tail_lines: Some(i64::from(self.settings.log_lines)),
            ..LogParams::default()
        };
        match self.pods.logs(pod, &params).await {
            Ok(log) => log.lines().collect::<Vec<_>>().join(" | "),
            Err(e) => format!("(log unavailable: {})", kube_message(&e)),
        }
    }

    /// The Job's owner object, created the first time.
    async fn owner(&self, job: &str) -> Result<JobOwner, BackendError> {
        {
            let mut state = self.lock();
            // A Job started again under its name keeps the owner it finds.
            state.owners_to_delete.remove(job);
            if let Some(owner) = state.owners.get(job) {
                return Ok(owner.clone());
            }
        }
        let wanted = render::job_owner(&self.render_context(), job);
        let name = render::owner_name(job);
        let existing = self.owner_not_deleting(&name).await?;
        let object = match existing {
            Some(object) => object,
            None => (self
                .config_maps
                .create(&PostParams::default(), &wanted)
                .await)
                .map_err(api_error("creating the Job's owner"))?,
        };
        let owner = JobOwner {
            name,
            uid: object.metadata.uid.unwrap_or_default(),
        };
        self.lock().owners.insert(job.to_owned(), owner.clone());
        Ok(owner)
    }

    /// The owner object `name` unless it is being deleted (a Job of the same name that
    /// was released just before): then once it is gone, so nothing new is owned by it.
    async fn owner_not_deleting(&self, name: &str) -> Result<Option<ConfigMap>, BackendError> {
        let deadline = Instant::now() + SCHEDULE_TIMEOUT;
        loop {
            let existing = (self.config_maps.get_opt(name).await)
                .map_err(api_error("reading the Job's owner"))?;
            match existing {
                Some(owner) if owner.metadata.deletion_timestamp.is_some() => {
                    if Instant::now() > deadline {
                        return Err(BackendError::Io(format!(
                            "{name} of an earlier run of the Job is still being deleted"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => return Ok(other),
            }
        }
    }

    fn wanted(&self, spec: &ExecutorSpec, owner: &JobOwner) -> Result<Wanted, BackendError> {
        let context = self.render_context();
        let pod = render::executor_pod(&context, spec, owner)?;
        let digest = (pod.metadata.annotations.as_ref())
            .and_then(|a| a.get(render::ANNOTATION_SPEC).cloned())
            .unwrap_or_default();
        let settings = render::executor_settings(&context, spec, owner)?;
        Ok(Wanted {
            job: spec.job.clone(),
            id: spec.id(),
            pod,
            settings,
            digest,
            cpu: spec.cpu,
            memory_bytes: spec.memory_bytes,
            port: self.settings.grpc_port,
        })
    }

    /// Waits until `check` holds of the state (re-checked on every observed change).
    async fn wait_for<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&State) -> Option<T>,
    ) -> Option<T> {
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(found) = check(&self.lock()) {
                return Some(found);
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }
}

fn with_log(event: BackendEvent, log: String) -> BackendEvent {
    let add = |status: String| match log.is_empty() {
        true => status,
        false => format!("{status}; log: {log}"),
    };
    match event {
        BackendEvent::Restarting {
            job,
            id,
            status,
            restart,
        } => BackendEvent::Restarting {
            job,
            id,
            status: add(status),
            restart,
        },
        BackendEvent::GaveUp { job, id, status } => BackendEvent::GaveUp {
            job,
            id,
            status: add(status),
        },
        other => other,
    }
}

fn kube_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

fn api_error(what: &'static str) -> impl Fn(kube::Error) -> BackendError {
    move |e| BackendError::Io(format!("{what}: {}", kube_message(&e)))
}

impl ResourceBackend for KubernetesBackend {
    async fn request(&self, spec: ExecutorSpec) -> Result<Executor, BackendError> {
        let inner = &self.inner;
        let owner = inner.owner(&spec.job).await?;
        let wanted = inner.wanted(&spec, &owner)?;
        let key = (wanted.job.clone(), wanted.id.clone());
        {
            let mut state = inner.lock();
            state.wanted.insert(key.clone(), wanted);
            // A new request starts its count afresh (a released executor may come back).
            if let Some(tracked) = state.tracked.get_mut(&key) {
                tracked.done = false;
            }
        }
        inner.reconcile(&key).await;
        let port = inner.settings.grpc_port;
        let ip = inner
            .wait_for(SCHEDULE_TIMEOUT, |state| {
                let pod = state.observed.get(&key)?;
                let wanted = state.wanted.get(&key)?;
                (!pod.deleting && pod.digest.as_deref() == Some(wanted.digest.as_str()))
                    .then_some(pod.ip)
                    .flatten()
            })
            .await
            .ok_or_else(|| BackendError::Start {
                id: key.1.clone(),
                binary: inner.settings.image.clone(),
                message: format!(
                    "its pod got no IP within {}s (unschedulable, or the image cannot be pulled?)",
                    SCHEDULE_TIMEOUT.as_secs()
                ),
            })?;
        tracing::info!(job = %spec.job, id = %key.1, %ip, "executor pod running");
        Ok(Executor {
            job: spec.job,
            id: key.1,
            role: spec.role,
            grpc_addr: SocketAddr::new(ip, port),
        })
    }

    async fn release(&self, job: &str, id: &str) -> Result<(), BackendError> {
        self.delete_executor(job, id, Deletion::Graceful).await
    }

    async fn kill(&self, job: &str, id: &str) -> Result<(), BackendError> {
        self.delete_executor(job, id, Deletion::Kill).await
    }

    async fn release_jobs_not_listed(&self, listed: &[String]) {
        self.inner.delete_jobs_not_listed(listed).await;
    }

    /// Deletes the Job's pods, settings Secrets and owner, each by its labels.
    async fn release_job(&self, job: &str) {
        let inner = &self.inner;
        {
            let mut state = inner.lock();
            state.wanted.retain(|(j, _), _| j != job);
            state.owners.remove(job);
        }
        if let Err(e) = inner.delete_job_objects(job).await {
            tracing::warn!(job, error = %kube_message(&e), "deleting the Job's objects; trying again every resync");
            inner.lock().owners_to_delete.insert(job.to_owned());
        }
        let grace = Duration::from_millis(inner.settings.stop_grace_ms) + RESYNC;
        inner
            .wait_for(grace, |state| {
                (!state.observed.keys().any(|(j, _)| j == job)).then_some(())
            })
            .await;
    }

    async fn resize(
        &self,
        job: &str,
        id: &str,
        cpu: f64,
        memory_bytes: u64,
    ) -> Result<(), BackendError> {
        let key = (job.to_owned(), id.to_owned());
        let inner = &self.inner;
        {
            let mut state = inner.lock();
            let wanted = state
                .wanted
                .get_mut(&key)
                .ok_or_else(|| BackendError::Unknown {
                    job: job.into(),
                    id: id.into(),
                })?;
            wanted.cpu = cpu;
            wanted.memory_bytes = memory_bytes;
            let resources = render::resources(cpu, memory_bytes);
            if let Some(spec) = &mut wanted.pod.spec {
                for container in &mut spec.containers {
                    container.resources = resources.clone();
                }
            }
        }
        inner.reconcile(&key).await;
        Ok(())
    }

    fn schedules_gangs(&self) -> bool {
        self.inner.settings.pod_group
    }

    /// Applies the Job's PodGroup (server-side, so a Job started again updates it).
    async fn form_gang(&self, job: &str, gang: &Gang) -> Result<(), BackendError> {
        let inner = &self.inner;
        let owner = inner.owner(job).await?;
        let group = render::pod_group(&inner.render_context(), job, &owner, gang);
        let params = PatchParams::apply(render::MANAGER).force();
        match inner
            .pod_groups
            .patch(&owner.name, &params, &Patch::Apply(&group))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Err(BackendError::Io(format!(
                "kubernetes.pod_group: the cluster has no PodGroup API (scheduling.volcano.sh/v1beta1): install Volcano, or turn kubernetes.pod_group off ({})",
                e.message
            ))),
            Err(e) => Err(api_error("applying the Job's PodGroup")(e)),
        }
    }

    fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.inner.events.subscribe()
    }

    /// Pods belong to the Job's owner ConfigMap, not to the master.
    fn executors_outlive_master(&self) -> bool {
        true
    }

    /// Asks the API server (not the watch, which may not have listed yet) for the Job's
    /// pods of `roles` that no request of this master claims, kills them and waits until
    /// each is gone.
    async fn kill_previous(
        &self,
        job: &str,
        roles: &[ExecutorRole],
    ) -> Result<Vec<String>, BackendError> {
        let inner = &self.inner;
        let selector = format!(
            "{},{}={}",
            inner.selector(),
            render::LABEL_JOB,
            render::dns_label(job, 63)
        );
        let pods = (inner
            .pods
            .list(&ListParams::default().labels(&selector))
            .await)
            .map_err(api_error("listing a Job's pods"))?;
        let mut killed = Vec::new();
        for pod in (pods.items.iter()).filter_map(ObservedPod::of) {
            let role = pod.id.rsplit_once('-').map(|(role, _)| role);
            let claimed = (inner.lock().wanted).contains_key(&(job.to_owned(), pod.id.clone()));
            if pod.job != job || claimed || !roles.iter().any(|r| Some(r.as_str()) == role) {
                continue;
            }
            let deletion = if pod.node_gone() {
                Deletion::Forced
            } else {
                Deletion::Kill
            };
            inner.delete_pod(&pod.name, deletion).await?;
            killed.push((pod.id, pod.name));
        }
        let deadline = Instant::now() + Duration::from_secs(u64::from(KILL_GRACE_SECONDS)) + RESYNC;
        for (id, name) in &killed {
            loop {
                match inner.pods.get_opt(name).await {
                    Ok(None) => break,
                    _ if Instant::now() >= deadline => {
                        return Err(BackendError::Io(format!(
                            "pod {name} of {id} was killed and is still there"
                        )));
                    }
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        Ok(killed.into_iter().map(|(id, _)| id).collect())
    }

    /// From the cluster's metrics API (metrics-server); none where it has none.
    async fn usage(&self, job: &str) -> Vec<ExecutorUsage> {
        let inner = &self.inner;
        let namespace = inner.settings.namespace.clone().unwrap_or_default();
        let selector = format!(
            "{},{}={}",
            inner.selector(),
            render::LABEL_JOB,
            render::dns_label(job, 63)
        );
        let names: HashMap<String, String> = {
            let state = inner.lock();
            (state.observed.values())
                .filter(|pod| pod.job == job)
                .map(|pod| (pod.name.clone(), pod.id.clone()))
                .collect()
        };
        match metrics::pod_metrics(inner.pods.clone().into_client(), &namespace, &selector).await {
            Ok(metrics) => (metrics.into_iter())
                .filter_map(|(pod, cpu_cores, memory_bytes)| {
                    Some(ExecutorUsage {
                        id: names.get(&pod)?.clone(),
                        cpu_cores,
                        memory_bytes,
                    })
                })
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "no pod metrics");
                Vec::new()
            }
        }
    }
}

/// A client of the cluster `settings` name (`kubernetes.kubeconfig`, else `KUBECONFIG`,
/// else the pod's service account) and the namespace to work in (`kubernetes.namespace`,
/// else the configuration's).
pub async fn connect_client(
    settings: &KubernetesBackendSettings,
) -> Result<(kube::Client, String), BackendError> {
    let kubeconfig = settings.kubeconfig.as_deref();
    primus_kube_resources::client::connect(kubeconfig, settings.namespace.as_deref())
        .await
        .map_err(|e| BackendError::Io(e.to_string()))
}

#[cfg(test)]
mod tests;
