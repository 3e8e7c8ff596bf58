//! The master as the operator of PrimusJob and PrimusDataset custom resources: once it
//! holds its shard's Lease (`lease.rs`), Jobs followed by a watch in one namespace, a finalizer on each Job of this shard so that
//! deleting it waits until its executors are stopped, status through the status
//! subresource, the Metric as a PrimusMetric owned by its Job, events as Kubernetes
//! Events. A spec the schema let through but primus-spec refuses fails the Job with the
//! problems named.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use kube::runtime::watcher::{self, watcher};
use primus_config::KubernetesBackendSettings;
use primus_kube_resources::{API_VERSION, CustomKind, client, convert};
use primus_proto::v1::{EventType, Resource};
use primus_service::Shutdown;
use primus_spec::Kind;
use primus_spec::job::JobSpec;
use primus_spec::status::{Phase, Status};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::kueue::{self, WorkloadStep};
use super::lease::ShardLease;
use super::{DatasetError, JobEvent, SUSPENDED};
use crate::shard::owns_job;

/// Held on every Job this master drives, until its executors are stopped.
pub const FINALIZER: &str = "primus.dev/master";
/// The field manager of what the master applies.
const MANAGER: &str = "primus-master";

/// The master's handle on its namespace's Primus custom resources.
pub struct KubeResources {
    jobs: Api<DynamicObject>,
    datasets: Api<DynamicObject>,
    metrics: Api<DynamicObject>,
    leases: Api<Lease>,
    /// Kueue's Workloads (the API may not be served: Kueue need not be installed).
    workloads: Api<DynamicObject>,
    /// The Jobs of this master that are in a Kueue queue.
    queued: Mutex<HashSet<String>>,
    /// The Jobs Kueue evicted that are stopping before their quota is given back.
    evicting: Mutex<HashSet<String>>,
    recorder: Recorder,
    namespace: String,
    /// This master's identity in its shard's Lease (its address and process).
    identity: String,
    lease_duration: Duration,
    /// Each Job's reference as last seen (Events and the Metric's owner need its uid).
    references: Arc<Mutex<HashMap<String, ObjectReference>>>,
}

impl KubeResources {
    /// Connects with `settings`' kubeconfig (or `KUBECONFIG`, or the pod's service
    /// account) to `settings`' namespace (or the kubeconfig's); `instance` names this
    /// master in the Events it records.
    pub async fn connect(
        settings: &KubernetesBackendSettings,
        instance: String,
    ) -> Result<Self, String> {
        let (client, namespace) = primus_backend::kubernetes::connect_client(settings)
            .await
            .map_err(|e| e.to_string())?;
        let api = |kind| client::api(client.clone(), &namespace, kind);
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: Some(instance.clone()),
        };
        Ok(Self {
            jobs: api(Kind::Job),
            datasets: api(Kind::Dataset),
            metrics: api(Kind::Metric),
            leases: Api::namespaced(client.clone(), &namespace),
            workloads: Api::namespaced_with(client.clone(), &namespace, &kueue::workload_api()),
            queued: Mutex::default(),
            evicting: Mutex::default(),
            recorder: Recorder::new(client.clone(), reporter),
            namespace,
            identity: format!("{instance}/{}", std::process::id()),
            lease_duration: Duration::from_millis(settings.lease_duration_ms.max(1_000)),
            references: Arc::default(),
        })
    }

    /// Once this master holds its shard's Lease, follows the PrimusJobs of `shard` until
    /// `shutdown` (the watcher lists again by itself when it lost track). A Lease lost
    /// shuts the master down: its Jobs go to the master that holds it next.
    pub(super) async fn follow_jobs(
        self: Arc<Self>,
        shard: (u32, u32),
        events: mpsc::Sender<JobEvent>,
        shutdown: Shutdown,
    ) {
        let lease = ShardLease::new(
            self.leases.clone(),
            shard,
            self.identity.clone(),
            self.lease_duration,
        );
        if !lease.acquire(&shutdown).await {
            return;
        }
        if self
            .workloads
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
        {
            tokio::spawn(self.clone().follow_workloads(shard, shutdown.clone()));
        }
        let held = shutdown.clone();
        tokio::spawn(async move {
            lease.hold(&held).await;
            if !held.is_triggered() {
                tracing::error!("stopping: this master no longer holds its shard's Lease");
                held.trigger();
            }
        });
        let mut stream = watcher(self.jobs.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut listing = Vec::new();
        let mut deleting = Vec::new();
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = shutdown.wait() => return,
            };
            let sent = match event {
                None => return,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching PrimusJobs; retrying");
                    continue;
                }
                Some(Ok(watcher::Event::Init)) => {
                    listing.clear();
                    deleting.clear();
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(object))) => {
                    if let Some((kind, resource)) = self.observe(shard, object).await {
                        match kind {
                            EventType::Deleted => deleting.push(resource),
                            _ => listing.push(resource),
                        }
                    }
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    let mut sent = events
                        .send(JobEvent::Listed(std::mem::take(&mut listing)))
                        .await;
                    for resource in deleting.drain(..) {
                        if sent.is_ok() {
                            sent = events
                                .send(JobEvent::Changed(EventType::Deleted, resource))
                                .await;
                        }
                    }
                    sent
                }
                Some(Ok(watcher::Event::Apply(object))) => {
                    match self.observe(shard, object).await {
                        Some((kind, resource)) => {
                            events.send(JobEvent::Changed(kind, resource)).await
                        }
                        None => continue,
                    }
                }
                Some(Ok(watcher::Event::Delete(object))) => {
                    let name = object.metadata.name.clone().unwrap_or_default();
                    if !owns_job(shard, &name) {
                        continue;
                    }
                    self.references.lock().map(|mut r| r.remove(&name)).ok();
                    let resource = api_resource(&object, String::new());
                    events
                        .send(JobEvent::Changed(EventType::Deleted, resource))
                        .await
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }

    /// A PrimusJob of this shard as the controller takes it: its finalizer added, its spec
    /// checked (a refused one is failed here and not passed on), `Deleted` once it is
    /// being deleted.
    async fn observe(
        &self,
        shard: (u32, u32),
        object: DynamicObject,
    ) -> Option<(EventType, Resource)> {
        let name = object.metadata.name.clone()?;
        if !owns_job(shard, &name) {
            return None;
        }
        self.remember(&object);
        let value = serde_json::to_value(&object).ok()?;
        let status: Status = serde_json::from_value(value["status"].clone()).unwrap_or_default();
        if object.metadata.deletion_timestamp.is_some() {
            return Some((EventType::Deleted, api_resource(&object, String::new())));
        }
        let generation = object.metadata.generation.unwrap_or(0).max(0) as u64;
        match convert::resource(&value) {
            Ok(resource) => {
                if !has_finalizer(&object) {
                    self.hold(&name).await;
                }
                if let (Some(queue), primus_spec::Resource::Job(job)) =
                    (queue_of(&object), &resource)
                    && job.spec.suspend
                    && !status.phase.is_terminal()
                {
                    self.queue(&object, &queue, &job.spec).await;
                }
                let spec_json = resource.spec_json().unwrap_or_default();
                Some((EventType::Modified, api_resource(&object, spec_json)))
            }
            Err(e) => {
                let failed_already =
                    status.phase == Phase::Failed && status.observed_generation == generation;
                if !failed_already {
                    self.fail_invalid(&name, generation, e.to_string()).await;
                }
                None
            }
        }
    }

    fn remember(&self, object: &DynamicObject) {
        let Some(name) = object.metadata.name.clone() else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(API_VERSION.into()),
            kind: Some(CustomKind::of(Kind::Job).name.into()),
            name: Some(name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: object.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        self.references
            .lock()
            .map(|mut r| r.insert(name, reference))
            .ok();
    }

    fn reference(&self, job: &str) -> Option<ObjectReference> {
        self.references.lock().ok()?.get(job).cloned()
    }

    /// Adds the master's finalizer (a field of its own manager, so removing it later
    /// touches no one else's).
    async fn hold(&self, job: &str) {
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": CustomKind::of(Kind::Job).name,
            "metadata": {"name": job, "finalizers": [FINALIZER]},
        });
        let params = PatchParams::apply(&finalizer_manager());
        if let Err(e) = self.jobs.patch(job, &params, &Patch::Apply(patch)).await {
            tracing::warn!(job, error = %e, "adding the master's finalizer");
        }
    }

    /// Removes the master's finalizer: the Job's executors are stopped.
    pub(super) async fn release(&self, job: &str) {
        let Ok(object) = self.jobs.get_opt(job).await else {
            return;
        };
        if !object.as_ref().is_some_and(has_finalizer) {
            return;
        }
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": CustomKind::of(Kind::Job).name,
            "metadata": {"name": job},
        });
        let params = PatchParams::apply(&finalizer_manager());
        match self.jobs.patch(job, &params, &Patch::Apply(patch)).await {
            Ok(_) => tracing::info!(job, "the master's finalizer removed"),
            Err(e) => tracing::warn!(job, error = %e, "removing the master's finalizer"),
        }
    }

    async fn fail_invalid(&self, job: &str, generation: u64, message: String) {
        tracing::warn!(job, %message, "PrimusJob refused");
        let mut status = Status {
            phase: Phase::Failed,
            observed_generation: generation,
            ..Status::default()
        };
        status.conditions.push(primus_spec::status::Condition {
            kind: "Complete".into(),
            status: false,
            reason: "InvalidSpec".into(),
            message: message.clone(),
            last_transition_unix_ms: primus_spec::time::unix_ms(),
        });
        if let Err(e) = self.write_status(job, &status).await {
            tracing::warn!(job, error = %e, "writing the status of a refused PrimusJob");
        }
        self.record_event(job, "InvalidSpec", &message, true);
    }

    pub(super) async fn dataset(&self, name: &str) -> Result<String, DatasetError> {
        let object = match self.datasets.get_opt(name).await {
            Ok(Some(object)) => object,
            Ok(None) => return Err(DatasetError::Missing),
            Err(e) => return Err(DatasetError::Unreadable(e.to_string())),
        };
        let value =
            serde_json::to_value(&object).map_err(|e| DatasetError::Unreadable(e.to_string()))?;
        let resource =
            convert::resource(&value).map_err(|e| DatasetError::Unreadable(e.to_string()))?;
        resource
            .spec_json()
            .map_err(|e| DatasetError::Unreadable(e.to_string()))
    }

    /// A suspended Job of a Kueue queue: its Workload made if it has none, and the Job
    /// resumed once Kueue admitted it.
    async fn queue(&self, object: &DynamicObject, queue: &str, spec: &JobSpec) {
        let Some(name) = object.metadata.name.as_deref() else {
            return;
        };
        self.queued
            .lock()
            .map(|mut q| q.insert(name.to_owned()))
            .ok();
        let workload_name = kueue::workload_name(name);
        let workload = match self.workloads.get_opt(&workload_name).await {
            Ok(Some(workload)) => workload,
            Ok(None) => {
                let uid = object.metadata.uid.as_deref().unwrap_or_default();
                let wanted = Patch::Apply(kueue::workload(name, uid, queue, spec));
                let params = PatchParams::apply(MANAGER).force();
                match self.workloads.patch(&workload_name, &params, &wanted).await {
                    Ok(_) => tracing::info!(job = name, queue, "Kueue Workload made"),
                    Err(e) => {
                        tracing::warn!(job = name, error = %e, "making the Job's Kueue Workload");
                        self.record_event(name, "WorkloadRefused", &e.to_string(), true);
                    }
                }
                return;
            }
            Err(e) => {
                tracing::warn!(job = name, error = %e, "reading the Job's Kueue Workload");
                return;
            }
        };
        if kueue::admitted(&serde_json::to_value(&workload).unwrap_or_default()) {
            self.resume(name).await;
        }
    }

    /// Follows the Workloads of this namespace: an admitted one resumes its suspended Job.
    async fn follow_workloads(self: Arc<Self>, shard: (u32, u32), shutdown: Shutdown) {
        let mut stream = watcher(self.workloads.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                _ = shutdown.wait() => return,
            };
            let workload = match event {
                None => return,
                Some(Ok(watcher::Event::Apply(w) | watcher::Event::InitApply(w))) => w,
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching Kueue Workloads; retrying");
                    continue;
                }
            };
            let owner = (workload.metadata.owner_references.iter().flatten())
                .find(|o| o.kind == CustomKind::of(Kind::Job).name)
                .map(|o| o.name.clone());
            let Some(job) = owner.filter(|job| owns_job(shard, job)) else {
                continue;
            };
            let workload = serde_json::to_value(&workload).unwrap_or_default();
            match kueue::decide(&workload) {
                WorkloadStep::Resume => self.resume(&job).await,
                WorkloadStep::Stop { reason, message } => {
                    let first = (self.evicting.lock()).is_ok_and(|mut e| e.insert(job.clone()));
                    if first {
                        tokio::spawn(self.clone().stop_evicted(job, workload, reason, message));
                    }
                }
                WorkloadStep::Wait => {}
            }
        }
    }

    fn is_evicting(&self, job: &str) -> bool {
        self.evicting.lock().is_ok_and(|e| e.contains(job))
    }

    /// Suspends a Job Kueue evicted, waits until its executors stopped (its `Suspended`
    /// condition), then gives its Workload's quota back; Kueue admits it again later.
    async fn stop_evicted(
        self: Arc<Self>,
        job: String,
        workload: Value,
        reason: String,
        message: String,
    ) {
        let suspend = json!({"spec": {"suspend": true}});
        let params = PatchParams::default();
        if let Err(e) = self.jobs.patch(&job, &params, &Patch::Merge(suspend)).await {
            tracing::warn!(job, error = %e, "suspending a Job Kueue evicted");
        } else {
            let why = format!("evicted by Kueue ({reason}): {message}; spec.suspend set to true");
            tracing::info!(job, %why, "evicted");
            self.record_event(&job, "Evicted", &why, true);
            if self.wait_until_suspended(&job).await {
                let now = Timestamp::now().to_string();
                let released = kueue::quota_released(&workload, &reason, &message, &now);
                let name = kueue::workload_name(&job);
                let patched = (self.workloads)
                    .patch_status(&name, &params, &Patch::Merge(released))
                    .await;
                match patched {
                    Ok(_) => tracing::info!(job, "the evicted Job's quota given back"),
                    Err(e) => tracing::warn!(job, error = %e, "giving an evicted Job's quota back"),
                }
            }
        }
        self.evicting.lock().map(|mut e| e.remove(&job)).ok();
    }

    /// Whether Job `job` says it is suspended (its executors stopped) within 5 minutes.
    async fn wait_until_suspended(&self, job: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(object)) = self.jobs.get_opt(job).await {
                let conditions = object.data["status"]["conditions"].as_array().cloned();
                let suspended = (conditions.into_iter().flatten())
                    .any(|c| c["type"] == SUSPENDED && c["status"] == true);
                if suspended {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::warn!(
            job,
            "the evicted Job did not stop within 5 minutes; its quota stays"
        );
        false
    }

    /// Sets a queued Job's `spec.suspend` to false (Kueue admitted it, as its Workload
    /// says now: an event may be older than an eviction that followed it).
    async fn resume(&self, job: &str) {
        let name = kueue::workload_name(job);
        let now = match self.workloads.get_opt(&name).await {
            Ok(Some(workload)) => serde_json::to_value(&workload).unwrap_or_default(),
            _ => return,
        };
        if kueue::decide(&now) != WorkloadStep::Resume || self.is_evicting(job) {
            return;
        }
        let suspended = match self.jobs.get_opt(job).await {
            Ok(Some(object)) => {
                object.data["spec"]["suspend"] == true && queue_of(&object).is_some()
            }
            _ => false,
        };
        if !suspended {
            return;
        }
        let patch = json!({"spec": {"suspend": false}});
        match self
            .jobs
            .patch(job, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(job, "admitted by Kueue: resumed");
                self.record_event(
                    job,
                    "Admitted",
                    "admitted by Kueue: spec.suspend set to false",
                    false,
                );
            }
            Err(e) => tracing::warn!(job, error = %e, "resuming a Job Kueue admitted"),
        }
    }

    /// Marks a queued Job's Workload Finished, so that Kueue gives its quota back.
    async fn finish_workload(&self, job: &str, status: &Status) {
        let queued = self.queued.lock().map(|q| q.contains(job)).unwrap_or(false);
        if !queued {
            return;
        }
        let message = (status.conditions.iter())
            .find(|c| c.kind == "Complete")
            .map_or(String::new(), |c| c.message.clone());
        let now = Timestamp::now().to_string();
        let body = kueue::finished(job, status.phase == Phase::Succeeded, &message, &now);
        let params = PatchParams::apply(MANAGER).force();
        let name = kueue::workload_name(job);
        match self
            .workloads
            .patch_status(&name, &params, &Patch::Apply(body))
            .await
        {
            Ok(_) => {
                tracing::info!(job, "Kueue Workload finished");
                self.queued.lock().map(|mut q| q.remove(job)).ok();
            }
            Err(e) => tracing::warn!(job, error = %e, "marking the Job's Kueue Workload finished"),
        }
    }

    /// Applies `status` through the status subresource (server-side apply: the fields the
    /// master wrote before and leaves out now go, a custom resource takes no unconditional
    /// update).
    pub(super) async fn write_status(&self, job: &str, status: &Status) -> Result<(), String> {
        let object = json!({
            "apiVersion": API_VERSION,
            "kind": CustomKind::of(Kind::Job).name,
            "metadata": {"name": job},
            "status": status,
        });
        let params = PatchParams::apply(MANAGER).force();
        (self
            .jobs
            .patch_status(job, &params, &Patch::Apply(object))
            .await)
            .map_err(|e| e.to_string())?;
        if status.phase.is_terminal() {
            self.finish_workload(job, status).await;
        }
        Ok(())
    }

    /// The Metric as a PrimusMetric owned by its Job (deleted with it).
    pub(super) async fn write_metric(
        &self,
        job: &str,
        resource: &primus_spec::Resource,
    ) -> Result<(), String> {
        let mut object = convert::custom_resource(resource, None).map_err(|e| e.to_string())?;
        if let Some(owner) = self.reference(job).filter(|r| r.uid.is_some()) {
            object["metadata"]["ownerReferences"] = json!([{
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
            }]);
        }
        let params = PatchParams::apply(MANAGER).force();
        (self
            .metrics
            .patch(job, &params, &Patch::Apply(object))
            .await)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    pub(super) fn record_event(&self, job: &str, reason: &str, message: &str, warning: bool) {
        let Some(reference) = self.reference(job) else {
            return;
        };
        let recorder = self.recorder.clone();
        let event = Event {
            type_: if warning {
                KubeEventType::Warning
            } else {
                KubeEventType::Normal
            },
            reason: reason.into(),
            note: Some(truncated(message, 1000)),
            action: "Drive".into(),
            secondary: None,
        };
        let job = job.to_owned();
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(%job, error = %e, "recording a Kubernetes Event");
            }
        });
    }
}

/// The finalizer's own field manager (the Metric's is [`MANAGER`]).
fn finalizer_manager() -> String {
    format!("{MANAGER}-finalizer")
}

/// The Kueue LocalQueue a Job names, if any.
fn queue_of(object: &DynamicObject) -> Option<String> {
    let labels = object.metadata.labels.as_ref()?;
    labels
        .get(kueue::QUEUE_LABEL)
        .filter(|q| !q.is_empty())
        .cloned()
}

fn has_finalizer(object: &DynamicObject) -> bool {
    (object.metadata.finalizers.iter().flatten()).any(|f| f == FINALIZER)
}

/// The controller's view of a PrimusJob, its spec as primus-spec read it.
fn api_resource(object: &DynamicObject, spec_json: String) -> Resource {
    Resource {
        spec_json,
        ..client::api_resource(Kind::Job, object)
    }
}

fn truncated(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}
