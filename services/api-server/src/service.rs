//! The ApiService RPCs: validation with primus-spec (and a Job's model against its
//! Dataset's schema with primus-model), storage through [`Store`], change events on NATS,
//! and Watch streams that replay from Redis. Each call is bounded by its token's [`Grant`]:
//! its scope by call, its labels by resource (a resource outside them is as absent).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use primus_bus::Bus;
use primus_proto::v1::api_service_server::ApiService;
use primus_proto::v1::{
    ApplyRequest, ApplyResponse, DeleteRequest, DeleteResponse, EventType, GetRequest, GetResponse,
    ListRequest, ListResponse, Resource, ResourceEvent, UpdateStatusRequest, UpdateStatusResponse,
    WatchRequest,
};
use primus_service::{Grant, Scope, Shutdown, grant_of, labels_text};
use primus_spec::dataset::DatasetSpec;
use primus_spec::metric::MetricSpec;
use primus_spec::status::Status as ResourceStatus;
use primus_spec::{Kind, MAX_DOCUMENT_BYTES, Metadata, check_resource_name};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::store::{Change, Reference, Store, StoreError};

/// Largest spec or status accepted: the same limit as a resource file.
pub const MAX_SPEC_BYTES: usize = MAX_DOCUMENT_BYTES;
/// Optimistic writes retried this often when a caller did not ask for compare-and-swap.
const WRITE_ATTEMPTS: usize = 16;
/// Log entries a Watch reads per Redis call.
const WATCH_PAGE: usize = 256;
/// Events buffered per Watch before the reader waits for its client.
const WATCH_BUFFER: usize = 64;

pub(crate) struct Api {
    store: Store,
    bus: Bus,
    /// Latest version known to have been written (by this server or, via NATS, another).
    changes: watch::Sender<u64>,
    poll_interval: Duration,
    shutdown: Shutdown,
}

impl Api {
    pub(crate) fn new(
        store: Store,
        bus: Bus,
        changes: watch::Sender<u64>,
        poll_interval: Duration,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            store,
            bus,
            changes,
            poll_interval,
            shutdown,
        }
    }

    /// Stamps `state` with its new `version`, publishes the change (`logged` where the
    /// change log holds less than the whole state) on `primus.events.<kind>.<name>` and
    /// wakes local watchers; returns the stamped resource. Redis is the record: a failed
    /// publish is logged, and watchers still see the change on their next poll.
    async fn announce(
        &self,
        event: EventType,
        state: Resource,
        logged: Option<Resource>,
        version: u64,
    ) -> Resource {
        let resource = Resource {
            resource_version: version,
            ..state
        };
        self.changes
            .send_modify(|latest| *latest = (*latest).max(version));
        let event = ResourceEvent {
            r#type: event as i32,
            resource: Some(match logged {
                Some(logged) => Resource {
                    resource_version: version,
                    ..logged
                },
                None => resource.clone(),
            }),
        };
        let published = match self.bus.subjects().event(&resource.kind, &resource.name) {
            Ok(subject) => self.bus.publish(subject, &event).await,
            Err(e) => Err(e),
        };
        if let Err(e) = published {
            tracing::warn!(error = %e, version, "change stored but not published on NATS");
        }
        resource
    }

    /// A Job is refused when its model does not fit its Dataset's schema (a graph's input
    /// of a feature the schema lacks, a table no feature's, dims that do not match): the
    /// error names the path in the spec or the feature. A missing Dataset is the
    /// reference check's to refuse.
    async fn check_model_fits(&self, job: &primus_spec::job::JobSpec) -> Result<(), Status> {
        let Some(stored) = (self.store.get(Kind::Dataset, &job.dataset).await).map_err(status)?
        else {
            return Ok(());
        };
        let Ok(dataset) = serde_json::from_str::<DatasetSpec>(&stored.spec_json) else {
            return Ok(());
        };
        match primus_model::ModelLayout::new(&job.model, &dataset.schema) {
            Ok(_) => Ok(()),
            Err(e) => Err(Status::invalid_argument(format!(
                "the model does not fit Dataset {:?}: {e}",
                job.dataset
            ))),
        }
    }

    /// A Job of a label-limited token may only use a Dataset within its labels: another
    /// is refused as if it did not exist.
    async fn check_dataset_reachable(
        &self,
        job: &str,
        dataset: &str,
        grant: &Grant,
    ) -> Result<(), Status> {
        let stored = (self.store.get(Kind::Dataset, dataset).await).map_err(status)?;
        match stored {
            Some(stored) if !grant.covers(&stored.labels) => {
                Err(status(StoreError::DanglingReference {
                    kind: Kind::Job,
                    name: job.to_owned(),
                    target_kind: Kind::Dataset,
                    target: dataset.to_owned(),
                }))
            }
            _ => Ok(()),
        }
    }

    async fn apply(&self, request: ApplyRequest, grant: &Grant) -> Result<ApplyResponse, Status> {
        grant.require(Scope::Write, "Apply")?;
        let given = request
            .resource
            .ok_or_else(|| Status::invalid_argument("resource: missing"))?;
        let (kind, typed) = validate(&given)?;
        if !grant.covers(&given.labels) {
            return Err(Status::permission_denied(format!(
                "metadata.labels: this token writes only resources labelled {}",
                labels_text(&grant.labels)
            )));
        }
        if let primus_spec::Resource::Job(job) = &typed {
            if grant.is_limited() {
                self.check_dataset_reachable(&given.name, &job.spec.dataset, grant)
                    .await?;
            }
            self.check_model_fits(&job.spec).await?;
        }
        let reference = reference_of(&typed);
        let spec_json = typed
            .spec_json()
            .map_err(|e| Status::internal(format!("re-encoding the spec: {e}")))?;
        for _ in 0..WRITE_ATTEMPTS {
            let current = self.store.get(kind, &given.name).await.map_err(status)?;
            if let Some(current) = &current
                && !grant.covers(&current.labels)
            {
                return Err(Status::permission_denied(format!(
                    "{kind} {:?} exists outside this token's labels ({}); it cannot change it",
                    given.name,
                    labels_text(&grant.labels)
                )));
            }
            let current_version = current.as_ref().map_or(0, |c| c.resource_version);
            check_expected(kind, &given.name, request.expected_version, current_version)?;
            if let Some(current) = &current
                && current.spec_json == spec_json
                && current.labels == given.labels
            {
                // Nothing changed: no new version, no event (re-applying a file is free).
                return Ok(ApplyResponse {
                    resource: Some(current.clone()),
                    created: false,
                    changed: false,
                });
            }
            let now = primus_spec::time::unix_ms();
            let next = Resource {
                kind: kind.as_str().into(),
                name: given.name.clone(),
                labels: given.labels.clone(),
                resource_version: 0,
                generation: current.as_ref().map_or(1, |c| c.generation + 1),
                spec_json: spec_json.clone(),
                status_json: match &current {
                    Some(c) => c.status_json.clone(),
                    None => initial_status()?,
                },
                created_unix_ms: current.as_ref().map_or(now, |c| c.created_unix_ms),
                updated_unix_ms: now,
            };
            let previous_reference = current.as_ref().and_then(stored_reference);
            let appended = current
                .as_ref()
                .and_then(|current| appended_metric(current, &next, &typed));
            let event = match (&current, &appended) {
                (None, _) => EventType::Added,
                (Some(_), Some(_)) => EventType::Appended,
                (Some(_), None) => EventType::Modified,
            };
            let written = self
                .store
                .write(Change {
                    kind,
                    name: &given.name,
                    expected: current_version,
                    resource: &next,
                    event,
                    logged: appended.as_ref(),
                    reference: reference.as_ref(),
                    previous_reference: previous_reference.as_ref(),
                })
                .await;
            if let Some(version) = settled(written, request.expected_version)? {
                let resource = self.announce(event, next, appended, version).await;
                return Ok(ApplyResponse {
                    resource: Some(resource),
                    created: current.is_none(),
                    changed: true,
                });
            }
        }
        Err(too_contended(kind, &given.name))
    }

    async fn update_status(
        &self,
        request: UpdateStatusRequest,
        grant: &Grant,
    ) -> Result<UpdateStatusResponse, Status> {
        grant.require(Scope::Admin, "UpdateStatus")?;
        let kind = parse_kind(&request.kind)?;
        check_name(&request.name)?;
        let status_json = canonical_status(&request.status_json)?;
        for _ in 0..WRITE_ATTEMPTS {
            let current = self.get_reachable(kind, &request.name, grant).await?;
            check_expected(
                kind,
                &request.name,
                request.expected_version,
                current.resource_version,
            )?;
            let next = Resource {
                status_json: status_json.clone(),
                updated_unix_ms: primus_spec::time::unix_ms(),
                ..current.clone()
            };
            let written = self
                .store
                .write(Change {
                    kind,
                    name: &request.name,
                    expected: current.resource_version,
                    resource: &next,
                    event: EventType::Modified,
                    logged: None,
                    reference: None,
                    previous_reference: None,
                })
                .await;
            if let Some(version) = settled(written, request.expected_version)? {
                let resource = self
                    .announce(EventType::Modified, next, None, version)
                    .await;
                return Ok(UpdateStatusResponse {
                    resource: Some(resource),
                });
            }
        }
        Err(too_contended(kind, &request.name))
    }

    async fn delete(
        &self,
        request: DeleteRequest,
        grant: &Grant,
    ) -> Result<DeleteResponse, Status> {
        grant.require(Scope::Write, "Delete")?;
        let kind = parse_kind(&request.kind)?;
        check_name(&request.name)?;
        for _ in 0..WRITE_ATTEMPTS {
            let current = self.get_reachable(kind, &request.name, grant).await?;
            check_expected(
                kind,
                &request.name,
                request.expected_version,
                current.resource_version,
            )?;
            let reference = stored_reference(&current);
            let deleted = self
                .store
                .delete(&current, kind, current.resource_version, reference.as_ref())
                .await;
            if let Some(version) = settled(deleted, request.expected_version)? {
                let resource = self
                    .announce(EventType::Deleted, current, None, version)
                    .await;
                return Ok(DeleteResponse {
                    resource: Some(resource),
                });
            }
        }
        Err(too_contended(kind, &request.name))
    }

    /// Resource `name` of `kind` if it exists within the token's labels; NOT_FOUND alike
    /// when it does not exist and when it lies outside them.
    async fn get_reachable(
        &self,
        kind: Kind,
        name: &str,
        grant: &Grant,
    ) -> Result<Resource, Status> {
        (self.store.get(kind, name).await)
            .map_err(status)?
            .filter(|resource| grant.covers(&resource.labels))
            .ok_or_else(|| Status::not_found(format!("{kind} {name:?} does not exist")))
    }

    pub(crate) async fn get(&self, request: GetRequest, grant: &Grant) -> Result<Resource, Status> {
        let kind = parse_kind(&request.kind)?;
        check_name(&request.name)?;
        self.get_reachable(kind, &request.name, grant).await
    }

    pub(crate) async fn list(
        &self,
        request: ListRequest,
        grant: &Grant,
    ) -> Result<ListResponse, Status> {
        let kind = parse_kind(&request.kind)?;
        let (mut resources, version) = self.store.list(kind).await.map_err(status)?;
        resources.retain(|r| {
            grant.covers(&r.labels)
                && (request.label_selector.iter()).all(|(k, v)| r.labels.get(k) == Some(v))
        });
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ListResponse {
            resources,
            resource_version: version,
        })
    }

    pub(crate) async fn open_watch(
        &self,
        request: WatchRequest,
        grant: &Grant,
    ) -> Result<EventStream, Status> {
        let kind = match request.kind.as_str() {
            "" => None,
            text => Some(parse_kind(text)?),
        };
        if !request.name.is_empty() {
            check_name(&request.name)?;
        }
        // Subscribe to wake-ups before the first read, so no change falls in between.
        let wakeups = self.changes.subscribe();
        let since = match request.since_version {
            0 => self.store.latest_version().await.map_err(status)?,
            v => v,
        };
        // The first page is read here so a trimmed or future version fails the call itself.
        let first = self
            .store
            .events_after(since, WATCH_PAGE)
            .await
            .map_err(status)?;
        let (sender, receiver) = mpsc::channel(WATCH_BUFFER);
        let watcher = Watcher {
            store: self.store.clone(),
            kind,
            name: request.name,
            grant: grant.clone(),
            since,
            wakeups,
            poll_interval: self.poll_interval,
            shutdown: self.shutdown.clone(),
            sender,
        };
        tokio::spawn(watcher.run(first.events));
        Ok(Box::pin(ReceiverStream::new(receiver)))
    }
}

pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<ResourceEvent, Status>> + Send>>;

/// Feeds one Watch: replays the log from `since`, then follows it as it grows.
struct Watcher {
    store: Store,
    kind: Option<Kind>,
    name: String,
    /// Changes of resources outside its labels are not sent.
    grant: Grant,
    since: u64,
    wakeups: watch::Receiver<u64>,
    poll_interval: Duration,
    shutdown: Shutdown,
    sender: mpsc::Sender<Result<ResourceEvent, Status>>,
}

impl Watcher {
    async fn run(mut self, mut page: Vec<ResourceEvent>) {
        loop {
            let full = page.len() == WATCH_PAGE;
            for event in page {
                let Some(resource) = &event.resource else {
                    continue;
                };
                self.since = resource.resource_version;
                if self.wants(resource) && self.sender.send(Ok(event)).await.is_err() {
                    return; // the client went away
                }
            }
            if !full {
                tokio::select! {
                    changed = self.wakeups.changed() => {
                        // The notifier is gone (the server is stopping): poll until shutdown.
                        if changed.is_err() {
                            tokio::time::sleep(self.poll_interval).await;
                        }
                    }
                    _ = tokio::time::sleep(self.poll_interval) => {},
                    _ = self.sender.closed() => return,
                    _ = self.shutdown.wait() => {
                        let message = format!(
                            "API server shutting down; watch again from version {}",
                            self.since
                        );
                        let _ = self.sender.send(Err(Status::unavailable(message))).await;
                        return;
                    }
                }
            }
            page = match self.store.events_after(self.since, WATCH_PAGE).await {
                Ok(next) => next.events,
                Err(e) => {
                    let _ = self.sender.send(Err(status(e))).await;
                    return;
                }
            };
        }
    }

    fn wants(&self, resource: &Resource) -> bool {
        self.kind.is_none_or(|k| k.as_str() == resource.kind)
            && (self.name.is_empty() || self.name == resource.name)
            && self.grant.covers(&resource.labels)
    }
}

#[tonic::async_trait]
impl ApiService for Api {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let grant = grant_of(&request)?;
        (self.apply(request.into_inner(), &grant).await).map(Response::new)
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let grant = grant_of(&request)?;
        let resource = self.get(request.into_inner(), &grant).await?;
        Ok(Response::new(GetResponse {
            resource: Some(resource),
        }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let grant = grant_of(&request)?;
        (self.list(request.into_inner(), &grant).await).map(Response::new)
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let grant = grant_of(&request)?;
        (self.delete(request.into_inner(), &grant).await).map(Response::new)
    }

    async fn update_status(
        &self,
        request: Request<UpdateStatusRequest>,
    ) -> Result<Response<UpdateStatusResponse>, Status> {
        let grant = grant_of(&request)?;
        (self.update_status(request.into_inner(), &grant).await).map(Response::new)
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let grant = grant_of(&request)?;
        (self.open_watch(request.into_inner(), &grant).await).map(Response::new)
    }
}

/// Parses and validates a resource as sent; every problem is named with its field path.
fn validate(given: &Resource) -> Result<(Kind, primus_spec::Resource), Status> {
    let kind = parse_kind(&given.kind)?;
    if given.spec_json.len() > MAX_SPEC_BYTES {
        return Err(Status::invalid_argument(format!(
            "spec: {} bytes is over the {MAX_SPEC_BYTES}-byte limit for a resource",
            given.spec_json.len()
        )));
    }
    let metadata = Metadata {
        name: given.name.clone(),
        labels: given
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    };
    let typed = primus_spec::Resource::from_json(kind, metadata, &given.spec_json)
        .map_err(Status::invalid_argument)?;
    let problems = typed.problems();
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(Status::invalid_argument(lines.join("\n")));
    }
    Ok((kind, typed))
}

/// A Metric whose new version only appends points to `current`: `next` with those points
/// alone, what its change carries (a watcher's traffic then grows with the points, not
/// with the square of the series' age).
fn appended_metric(
    current: &Resource,
    next: &Resource,
    typed: &primus_spec::Resource,
) -> Option<Resource> {
    let primus_spec::Resource::Metric(metric) = typed else {
        return None;
    };
    if current.labels != next.labels {
        return None;
    }
    let previous: MetricSpec = serde_json::from_str(&current.spec_json).ok()?;
    let appended = metric.spec.appended_to(&previous)?;
    Some(Resource {
        spec_json: serde_json::to_string(&appended).ok()?,
        ..next.clone()
    })
}

pub(crate) fn parse_kind(text: &str) -> Result<Kind, Status> {
    Kind::parse(text).ok_or_else(|| {
        Status::invalid_argument(format!(
            "kind: {text:?} is not a resource kind (Job, Dataset, Metric)"
        ))
    })
}

fn check_name(name: &str) -> Result<(), Status> {
    check_resource_name("name", name).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// What a validated resource references (a Job its Dataset).
fn reference_of(resource: &primus_spec::Resource) -> Option<Reference> {
    match resource {
        primus_spec::Resource::Job(job) => Some(Reference {
            kind: Kind::Dataset,
            name: job.spec.dataset.clone(),
        }),
        _ => None,
    }
}

/// What a stored resource references; read back from its spec.
fn stored_reference(resource: &Resource) -> Option<Reference> {
    #[derive(serde::Deserialize)]
    struct JobDataset {
        dataset: String,
    }
    if resource.kind != Kind::Job.as_str() {
        return None;
    }
    let spec: JobDataset = serde_json::from_str(&resource.spec_json).ok()?;
    Some(Reference {
        kind: Kind::Dataset,
        name: spec.dataset,
    })
}

fn check_expected(kind: Kind, name: &str, expected: u64, actual: u64) -> Result<(), Status> {
    if expected == 0 || expected == actual {
        Ok(())
    } else {
        Err(status(StoreError::Conflict {
            kind,
            name: name.to_owned(),
            expected,
            actual,
        }))
    }
}

fn initial_status() -> Result<String, Status> {
    serde_json::to_string(&ResourceStatus::default())
        .map_err(|e| Status::internal(format!("encoding a status: {e}")))
}

/// Validates a status document and returns it re-encoded (defaults filled in).
fn canonical_status(status_json: &str) -> Result<String, Status> {
    if status_json.len() > MAX_SPEC_BYTES {
        return Err(Status::invalid_argument(format!(
            "status: {} bytes is over the {MAX_SPEC_BYTES}-byte limit",
            status_json.len()
        )));
    }
    let mut input = serde_json::Deserializer::from_str(status_json);
    let parsed: ResourceStatus = serde_path_to_error::deserialize(&mut input)
        .map_err(|e| Status::invalid_argument(format!("status.{}: {}", e.path(), e.inner())))?;
    serde_json::to_string(&parsed).map_err(|e| Status::internal(format!("encoding a status: {e}")))
}

/// The new version of a write, or `None` when it lost a race to another writer and the
/// caller did not ask for compare-and-swap (so the read-modify-write goes again).
fn settled(written: Result<u64, StoreError>, expected_version: u64) -> Result<Option<u64>, Status> {
    match written {
        Ok(version) => Ok(Some(version)),
        Err(StoreError::Conflict { .. }) if expected_version == 0 => Ok(None),
        Err(e) => Err(status(e)),
    }
}

fn too_contended(kind: Kind, name: &str) -> Status {
    Status::aborted(format!(
        "{kind} {name:?} changed {WRITE_ATTEMPTS} times while this call tried to write it; retry"
    ))
}

/// Maps store errors to codes a caller can act on.
fn status(error: StoreError) -> Status {
    let message = error.to_string();
    match error {
        StoreError::Conflict { .. } => {
            Status::aborted(format!("{message}; get it again and retry"))
        }
        StoreError::DanglingReference { .. } => {
            Status::failed_precondition(format!("spec.dataset: {message}; apply it first"))
        }
        StoreError::Referenced { .. } => {
            Status::failed_precondition(format!("{message}; delete those first"))
        }
        StoreError::Gone { .. } | StoreError::Ahead { .. } => Status::out_of_range(message),
        StoreError::Redis(_) => Status::unavailable(format!("resource store: {message}")),
        StoreError::Corrupt { .. } => Status::data_loss(message),
    }
}
