//! Where the master's Jobs and Datasets come from and where their status, metrics and
//! events go (`master.resources`): the Primus API server (`api_server`) or the
//! PrimusJob, PrimusDataset and PrimusMetric custom resources of the Kubernetes API
//! (`kubernetes`, the master as their operator; the `kubernetes` feature). Either way the controller sees one
//! stream of `JobEvent`s and each Job's run the same calls.

mod api_server;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "kubernetes")]
mod kueue;
#[cfg(feature = "kubernetes")]
mod lease;

use std::collections::BTreeMap;

use primus_api_client::{ApiClient, ClientError};
use primus_proto::v1::{EventType, Resource};
use primus_service::Shutdown;
use primus_spec::Kind;
use primus_spec::metric::MetricSpec;
use primus_spec::status::Status;
use tokio::sync::mpsc;

/// The condition of a Job held by `spec.suspend`.
pub(crate) const SUSPENDED: &str = "Suspended";

/// The source of a master's resources.
#[derive(Clone)]
pub enum Resources {
    /// The Primus API server.
    ApiServer(ApiClient),
    /// The Kubernetes API.
    #[cfg(feature = "kubernetes")]
    Kubernetes(std::sync::Arc<kubernetes::KubeResources>),
}

/// What the controller learns about Jobs.
#[derive(Debug)]
pub(crate) enum JobEvent {
    /// Every Job of this shard there is now (a first or fresh listing).
    Listed(Vec<Resource>),
    /// One Job added, changed or deleted (on Kubernetes, also one being deleted, held by
    /// the master's finalizer until [`Resources::released`]).
    Changed(EventType, Resource),
}

/// Why a Dataset could not be read.
#[derive(Debug)]
pub(crate) enum DatasetError {
    /// No Dataset of that name.
    Missing,
    /// The source could not be asked.
    Unreadable(String),
}

impl Resources {
    /// Follows the Jobs of `shard` until `shutdown`: a listing first (and again whenever
    /// the source lost track), then every change.
    pub(crate) fn follow_jobs(
        &self,
        shard: (u32, u32),
        shutdown: Shutdown,
    ) -> mpsc::Receiver<JobEvent> {
        let (events, received) = mpsc::channel(64);
        match self {
            Resources::ApiServer(api) => {
                tokio::spawn(api_server::follow_jobs(
                    api.clone(),
                    shard,
                    events,
                    shutdown,
                ));
            }
            #[cfg(feature = "kubernetes")]
            Resources::Kubernetes(kube) => {
                tokio::spawn(kube.clone().follow_jobs(shard, events, shutdown));
            }
        }
        received
    }

    /// Dataset `name`'s spec, as JSON.
    pub(crate) async fn dataset(&self, name: &str) -> Result<String, DatasetError> {
        match self {
            Resources::ApiServer(api) => match api.get(Kind::Dataset, name).await {
                Ok(resource) => Ok(resource.spec_json),
                Err(e @ ClientError::Status(_)) if e.code() == Some(tonic::Code::NotFound) => {
                    Err(DatasetError::Missing)
                }
                Err(e) => Err(DatasetError::Unreadable(e.to_string())),
            },
            #[cfg(feature = "kubernetes")]
            Resources::Kubernetes(kube) => kube.dataset(name).await,
        }
    }

    /// Replaces Job `job`'s status.
    pub(crate) async fn write_status(&self, job: &str, status: &Status) -> Result<(), String> {
        match self {
            Resources::ApiServer(api) => (api.update_status(Kind::Job, job, status, 0).await)
                .map(drop)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "kubernetes")]
            Resources::Kubernetes(kube) => kube.write_status(job, status).await,
        }
    }

    /// Creates or replaces Job `job`'s Metric resource, labelled `labels` (the Job's).
    pub(crate) async fn write_metric(
        &self,
        job: &str,
        labels: BTreeMap<String, String>,
        spec: MetricSpec,
    ) -> Result<(), String> {
        let resource = primus_spec::Resource::Metric(Box::new(primus_spec::Object {
            metadata: primus_spec::Metadata {
                name: job.to_owned(),
                labels,
            },
            spec,
        }));
        match self {
            Resources::ApiServer(api) => (api.apply(&resource, 0).await)
                .map(drop)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "kubernetes")]
            Resources::Kubernetes(kube) => kube.write_metric(job, &resource).await,
        }
    }

    /// Records that `reason` happened to Job `job` where the source keeps events (on
    /// Kubernetes, an Event on the PrimusJob; the status keeps the latest either way).
    #[cfg_attr(not(feature = "kubernetes"), allow(unused_variables))]
    pub(crate) fn record_event(&self, job: &str, reason: &str, message: &str, warning: bool) {
        #[cfg(feature = "kubernetes")]
        if let Resources::Kubernetes(kube) = self {
            kube.record_event(job, reason, message, warning);
        }
    }

    /// Job `job`'s executors are stopped and its queue dropped: a Job being deleted may go.
    #[cfg_attr(not(feature = "kubernetes"), allow(unused_variables))]
    pub(crate) async fn released(&self, job: &str) {
        #[cfg(feature = "kubernetes")]
        if let Resources::Kubernetes(kube) = self {
            kube.release(job).await;
        }
    }
}
