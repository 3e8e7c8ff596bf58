//! A client of the Primus custom resources in one namespace, for whoever reads or writes
//! them as resources (the `primus` CLI, the master): each one as the API's `Resource`, so
//! the code that shows or drives resources from the Primus API server takes them as they
//! are.

use std::collections::HashMap;
use std::path::Path;

use futures::{Stream, StreamExt};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, WatchEvent,
    WatchParams,
};
use primus_proto::v1::{EventType, Resource};
use primus_spec::Kind;

use crate::convert::{ConvertError, custom_resource};
use crate::{API_VERSION, CustomKind, GROUP, VERSION};

/// Why the Kubernetes API could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No configuration or no client.
    #[error("{0}")]
    Connect(String),
    /// The API server refused or could not be reached.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// A watch's resource version is no longer held (Kubernetes' 410 Gone): list again.
    #[error("resource version {0} is gone: list again")]
    Gone(String),
    /// A resource could not be written as a custom resource.
    #[error(transparent)]
    Convert(#[from] ConvertError),
}

/// A client of the cluster `kubeconfig` names (else `KUBECONFIG`, else the pod's service
/// account), and the namespace to work in (`namespace`, else the configuration's).
pub async fn connect(
    kubeconfig: Option<&Path>,
    namespace: Option<&str>,
) -> Result<(kube::Client, String), KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| KubeError::Connect(format!("kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| KubeError::Connect(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            KubeError::Connect(format!(
                "no Kubernetes configuration (a kubeconfig, KUBECONFIG or in-cluster): {e}"
            ))
        })?,
    };
    let namespace = namespace.map_or(config.default_namespace.clone(), str::to_owned);
    let client = kube::Client::try_from(config)
        .map_err(|e| KubeError::Connect(format!("Kubernetes client: {e}")))?;
    Ok((client, namespace))
}

/// The API of `kind`'s custom resources in `namespace`.
pub fn api(client: kube::Client, namespace: &str, kind: Kind) -> Api<DynamicObject> {
    let custom = CustomKind::of(kind);
    let resource = ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: API_VERSION.into(),
        kind: custom.name.into(),
        plural: custom.plural.into(),
    };
    Api::namespaced_with(client, namespace, &resource)
}

/// What an apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// There was none of that name.
    Created,
    /// Its spec or labels changed.
    Configured,
    /// It was already so.
    Unchanged,
}

/// The Primus custom resources of one namespace.
#[derive(Clone)]
pub struct CustomResources {
    client: kube::Client,
    namespace: String,
}

impl CustomResources {
    /// See [`connect`].
    pub async fn connect(
        kubeconfig: Option<&Path>,
        namespace: Option<&str>,
    ) -> Result<Self, KubeError> {
        let (client, namespace) = connect(kubeconfig, namespace).await?;
        Ok(Self { client, namespace })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api(&self, kind: Kind) -> Api<DynamicObject> {
        api(self.client.clone(), &self.namespace, kind)
    }

    /// Every resource of `kind` whose labels include `selector`, by name.
    pub async fn list(
        &self,
        kind: Kind,
        selector: &HashMap<String, String>,
    ) -> Result<Vec<Resource>, KubeError> {
        Ok(self.list_at(kind, selector).await?.1)
    }

    /// [`CustomResources::list`], and the list's resource version (where a watch of what
    /// changed since starts; 0 when the API server gave none that is a number).
    pub async fn list_at(
        &self,
        kind: Kind,
        selector: &HashMap<String, String>,
    ) -> Result<(u64, Vec<Resource>), KubeError> {
        let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let params = ListParams::default().labels(&labels.join(","));
        let listed = self.api(kind).list(&params).await?;
        let version = (listed.metadata.resource_version.as_deref())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut resources: Vec<Resource> = (listed.items.iter())
            .map(|object| api_resource(kind, object))
            .collect();
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((version, resources))
    }

    /// Resource `name` of `kind`, if there is one.
    pub async fn get(&self, kind: Kind, name: &str) -> Result<Option<Resource>, KubeError> {
        let object = self.api(kind).get_opt(name).await?;
        Ok(object.map(|object| api_resource(kind, &object)))
    }

    /// Creates or updates `resource` (server-side apply as `manager`).
    pub async fn apply(
        &self,
        resource: &primus_spec::Resource,
        manager: &str,
    ) -> Result<Applied, KubeError> {
        let object = custom_resource(resource, None)?;
        let api = self.api(resource.kind());
        let before = api.get_opt(resource.name()).await?;
        let params = PatchParams::apply(manager).force();
        let after = api
            .patch(resource.name(), &params, &Patch::Apply(&object))
            .await?;
        Ok(match before {
            None => Applied::Created,
            Some(before) if same_content(&before, &after) => Applied::Unchanged,
            Some(_) => Applied::Configured,
        })
    }

    /// Deletes resource `name` of `kind` (a Job's master stops its executors before it
    /// goes); false when there was none.
    pub async fn delete(&self, kind: Kind, name: &str) -> Result<bool, KubeError> {
        match self.api(kind).delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl CustomResources {
    /// The changes of `kind`'s resources (only `name`'s, when given) after resource version
    /// `since` (empty: from now), as the API's event types. The stream ends when the API
    /// server closes the watch (after a few minutes); a caller resumes from the last
    /// version it saw.
    pub async fn watch(
        &self,
        kind: Kind,
        name: Option<&str>,
        since: &str,
    ) -> Result<
        impl Stream<Item = Result<(EventType, Resource), KubeError>> + Send + use<>,
        KubeError,
    > {
        let api = self.api(kind);
        let since = match since {
            "" | "0" => (api.list_metadata(&ListParams::default().limit(1)).await?)
                .metadata
                .resource_version
                .unwrap_or_default(),
            since => since.to_owned(),
        };
        let mut params = WatchParams::default().timeout(290);
        if let Some(name) = name {
            params = params.fields(&format!("metadata.name={name}"));
        }
        let events = api.watch(&params, &since).await?;
        let gone = since.clone();
        Ok(events.filter_map(move |event| {
            let change = match event {
                Ok(WatchEvent::Added(object)) => Some(Ok((EventType::Added, object))),
                Ok(WatchEvent::Modified(object)) => Some(Ok((EventType::Modified, object))),
                Ok(WatchEvent::Deleted(object)) => Some(Ok((EventType::Deleted, object))),
                Ok(WatchEvent::Bookmark(_)) => None,
                Ok(WatchEvent::Error(status)) if status.code == 410 => {
                    Some(Err(KubeError::Gone(gone.clone())))
                }
                Ok(WatchEvent::Error(status)) => Some(Err(kube::Error::Api(status).into())),
                Err(e) => Some(Err(e.into())),
            };
            let change = change.map(|c| {
                c.map(|(kind_of_change, object)| (kind_of_change, api_resource(kind, &object)))
            });
            std::future::ready(change)
        }))
    }
}

fn same_content(before: &DynamicObject, after: &DynamicObject) -> bool {
    before.data.get("spec") == after.data.get("spec")
        && before.metadata.labels == after.metadata.labels
}

/// A custom resource as the API's `Resource`: kind, name, labels, generation, the
/// Kubernetes resource version where it is a number, creation and last write time, spec
/// and status as JSON.
pub fn api_resource(kind: Kind, object: &DynamicObject) -> Resource {
    let json = |field: &str| match object.data.get(field) {
        Some(value) if !value.is_null() => value.to_string(),
        _ => String::new(),
    };
    let created =
        (object.metadata.creation_timestamp.as_ref()).map_or(0, |time| time.0.as_millisecond());
    Resource {
        kind: kind.as_str().into(),
        name: object.metadata.name.clone().unwrap_or_default(),
        labels: (object
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter())
        .collect(),
        resource_version: (object.metadata.resource_version.as_deref())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        generation: object.metadata.generation.unwrap_or(0).max(0) as u64,
        spec_json: json("spec"),
        status_json: json("status"),
        created_unix_ms: created,
        updated_unix_ms: last_written(object).unwrap_or(created),
    }
}

/// When `object` was last written (the newest time among its field managers' entries).
fn last_written(object: &DynamicObject) -> Option<i64> {
    (object.metadata.managed_fields.iter().flatten())
        .filter_map(|entry| entry.time.as_ref())
        .map(|time| time.0.as_millisecond())
        .max()
}
