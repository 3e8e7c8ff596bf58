//! Where the dashboard reads resources (`dashboard.resources`): this API server's own
//! store, or the Primus custom resources of a Kubernetes namespace. Either answers list,
//! get and watch with the API's `Resource` and `ResourceEvent`, so the pages read both
//! alike, each bounded by the caller's token's labels as the gRPC API bounds them.

use std::collections::HashMap;
use std::sync::Arc;

#[cfg(feature = "kubernetes")]
use futures::StreamExt;
#[cfg(feature = "kubernetes")]
use primus_kube_resources::client::{CustomResources, KubeError};
use primus_proto::v1::{GetRequest, ListRequest, Resource, WatchRequest};
use primus_service::Grant;
use tonic::Status;

#[cfg(feature = "kubernetes")]
use crate::service::parse_kind;
use crate::service::{Api, EventStream};

pub(crate) enum Source {
    Store(Arc<Api>),
    #[cfg(feature = "kubernetes")]
    Kubernetes(CustomResources),
}

impl Source {
    /// Every resource of `kind` whose labels include `labels`, and the version to watch
    /// from.
    pub(super) async fn list(
        &self,
        kind: String,
        labels: HashMap<String, String>,
        grant: &Grant,
    ) -> Result<(u64, Vec<Resource>), Status> {
        match self {
            Self::Store(api) => {
                let request = ListRequest {
                    kind,
                    label_selector: labels,
                };
                let listed = api.list(request, grant).await?;
                Ok((listed.resource_version, listed.resources))
            }
            #[cfg(feature = "kubernetes")]
            Self::Kubernetes(custom) => {
                let (version, mut resources) =
                    (custom.list_at(parse_kind(&kind)?, &labels).await).map_err(kube_status)?;
                resources.retain(|resource| grant.covers(&resource.labels));
                Ok((version, resources))
            }
        }
    }

    pub(super) async fn get(
        &self,
        kind: String,
        name: String,
        grant: &Grant,
    ) -> Result<Resource, Status> {
        match self {
            Self::Store(api) => api.get(GetRequest { kind, name }, grant).await,
            #[cfg(feature = "kubernetes")]
            Self::Kubernetes(custom) => {
                let found = (custom.get(parse_kind(&kind)?, &name).await).map_err(kube_status)?;
                (found.filter(|resource| grant.covers(&resource.labels)))
                    .ok_or_else(|| Status::not_found(format!("{kind} {name} not found")))
            }
        }
    }

    /// The changes after version `since` (0: from now).
    pub(super) async fn watch(
        &self,
        request: WatchRequest,
        grant: &Grant,
    ) -> Result<EventStream, Status> {
        match self {
            Self::Store(api) => api.open_watch(request, grant).await,
            #[cfg(feature = "kubernetes")]
            Self::Kubernetes(custom) => {
                if request.kind.is_empty() {
                    return Err(Status::invalid_argument(
                        "kind: a watch of the Kubernetes source names its kind",
                    ));
                }
                let kind = parse_kind(&request.kind)?;
                let name = (!request.name.is_empty()).then_some(request.name.as_str());
                let since = request.since_version.to_string();
                let changes = (custom.watch(kind, name, &since).await).map_err(kube_status)?;
                let grant = grant.clone();
                Ok(Box::pin(changes.filter_map(move |change| {
                    let event = match change {
                        Err(error) => Some(Err(kube_status(error))),
                        Ok((kind_of_change, resource)) => {
                            grant.covers(&resource.labels).then(|| {
                                Ok(primus_proto::v1::ResourceEvent {
                                    r#type: kind_of_change as i32,
                                    resource: Some(resource),
                                })
                            })
                        }
                    };
                    std::future::ready(event)
                })))
            }
        }
    }
}

/// What a caller can act on: a version no longer held is OUT_OF_RANGE (the pages list
/// again), a refusal of this server's identity PERMISSION_DENIED.
#[cfg(feature = "kubernetes")]
fn kube_status(error: KubeError) -> Status {
    match &error {
        KubeError::Gone(_) => Status::out_of_range(error.to_string()),
        KubeError::Api(kube::Error::Api(response)) => match response.code {
            404 => Status::not_found(error.to_string()),
            401 | 403 => Status::permission_denied(format!(
                "the Kubernetes API refused this API server's identity: {error}"
            )),
            410 => Status::out_of_range(error.to_string()),
            _ => Status::unavailable(format!("the Kubernetes API: {error}")),
        },
        _ => Status::unavailable(format!("the Kubernetes API: {error}")),
    }
}
