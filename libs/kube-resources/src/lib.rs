//! `primus-kube-resources`: Jobs, Datasets and Metrics as Kubernetes custom resources of
//! group `primus.dev`, version `v1` (`PrimusJob`, `PrimusDataset`, `PrimusMetric`; the
//! `Primus` prefix keeps them apart from `batch/v1` Jobs in `kubectl get jobs`).
//!
//! [`crd`] owns their CustomResourceDefinitions: the OpenAPI schema of each `spec` and
//! `status` is generated from primus-spec's own types, so the API server refuses a
//! malformed spec, naming the field, before any master reads it. [`convert`] turns a
//! primus-spec resource into its custom resource and back; [`client`] lists, reads,
//! applies and deletes them as the API's `Resource`s.

#![warn(missing_docs)]

pub mod client;
pub mod convert;
pub mod crd;
mod structural;

use primus_spec::Kind;

/// The API group of every Primus custom resource.
pub const GROUP: &str = "primus.dev";
/// The served and stored version.
pub const VERSION: &str = "v1";
/// `apiVersion` of every Primus custom resource.
pub const API_VERSION: &str = "primus.dev/v1";

/// How one of primus-spec's kinds is named as a custom resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CustomKind {
    /// The kind it carries.
    pub kind: Kind,
    /// Its `kind` (`PrimusJob`).
    pub name: &'static str,
    /// Its plural, the resource's path segment and `kubectl get` name (`primusjobs`).
    pub plural: &'static str,
    /// What `kubectl get` also takes (`pjob`).
    pub short_names: &'static [&'static str],
}

impl CustomKind {
    /// Every Primus custom resource kind.
    pub const ALL: [CustomKind; 3] = [
        Self::of(Kind::Job),
        Self::of(Kind::Dataset),
        Self::of(Kind::Metric),
    ];

    /// The custom resource kind carrying `kind`.
    pub const fn of(kind: Kind) -> CustomKind {
        match kind {
            Kind::Job => CustomKind {
                kind,
                name: "PrimusJob",
                plural: "primusjobs",
                short_names: &["pjob"],
            },
            Kind::Dataset => CustomKind {
                kind,
                name: "PrimusDataset",
                plural: "primusdatasets",
                short_names: &["pds"],
            },
            Kind::Metric => CustomKind {
                kind,
                name: "PrimusMetric",
                plural: "primusmetrics",
                short_names: &["pmetric"],
            },
        }
    }

    /// The kind whose custom resource is named `name` (`PrimusJob`).
    pub fn named(name: &str) -> Option<CustomKind> {
        Self::ALL.into_iter().find(|k| k.name == name)
    }

    /// The CustomResourceDefinition's name (`primusjobs.primus.dev`).
    pub fn definition_name(&self) -> String {
        format!("{}.{GROUP}", self.plural)
    }
}
