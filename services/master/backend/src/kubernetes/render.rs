//! The objects the Kubernetes backend creates, as plain values: a Job's owner (a ConfigMap
//! whose deletion garbage-collects everything of the Job), and per executor a Secret with
//! its settings file (a Secret, as it may hold storage credentials) and a Pod; with
//! `kubernetes.pod_group`, a Volcano PodGroup per Job that its pods name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerPort, ContainerResizePolicy, EnvVar, EnvVarSource, GRPCAction,
    ObjectFieldSelector, Pod, PodSpec, Probe, ResourceRequirements, Secret, SecretVolumeSource,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ApiResource, DynamicObject};
use primus_config::KubernetesBackendSettings;

use super::super::local::{ENV_EXECUTOR_ID, ENV_JOB, ENV_MASTER_ADDR};
use super::super::{BackendError, ExecutorRole, ExecutorSpec, Gang};

/// Label and annotation keys. Labels carry DNS-safe forms; annotations the exact names.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const LABEL_JOB: &str = "primus.dev/job";
pub const LABEL_ROLE: &str = "primus.dev/role";
pub const LABEL_EXECUTOR: &str = "primus.dev/executor";
pub const LABEL_SHARD: &str = "primus.dev/master-shard";
pub const ANNOTATION_JOB: &str = "primus.dev/job-name";
pub const ANNOTATION_EXECUTOR: &str = "primus.dev/executor-id";
/// A digest of the executor's image, command, settings and resources: a pod whose digest
/// differs from the wanted one is replaced, one that matches is adopted.
pub const ANNOTATION_SPEC: &str = "primus.dev/spec-digest";
pub const MANAGER: &str = "primus-master";
/// The annotation naming a pod's PodGroup (Volcano's, also read by the coscheduling
/// plugin's Volcano compatibility).
pub const ANNOTATION_POD_GROUP: &str = "scheduling.k8s.io/group-name";

const CONTAINER: &str = "executor";
const SETTINGS_DIR: &str = "/etc/primus/executor";
const SETTINGS_FILE: &str = "settings.toml";

/// What every object of this master carries: its settings and its job shard.
#[derive(Debug, Clone)]
pub struct RenderContext<'a> {
    pub settings: &'a KubernetesBackendSettings,
    /// `i-n` of `--shard i/n`: a master watches only the pods of its shard.
    pub shard: String,
    /// How executors reach the master.
    pub master_addr: String,
}

/// The owner of a Job's objects, with the uid the API server gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobOwner {
    pub name: String,
    pub uid: String,
}

/// The DNS label form of `name` (lowercase, `[a-z0-9-]`, at most `max` characters), with a
/// digest of the original appended when anything had to change, so distinct names stay
/// distinct.
pub fn dns_label(name: &str, max: usize) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    let cleaned = cleaned.trim_matches('-').to_owned();
    if cleaned == name && !cleaned.is_empty() && cleaned.len() <= max {
        return cleaned;
    }
    let digest = format!("{:08x}", crc32fast::hash(name.as_bytes()));
    let keep = max.saturating_sub(digest.len() + 1);
    let head: String = cleaned.chars().take(keep).collect();
    let head = head.trim_matches('-');
    match head.is_empty() {
        true => format!("x-{digest}"),
        false => format!("{head}-{digest}"),
    }
}

/// Name of the object owning everything of `job`.
pub fn owner_name(job: &str) -> String {
    format!("primus-job-{}", dns_label(job, 52))
}

/// Name of the pod (and settings Secret) of executor `id` of `job`: the same for every
/// pod that executor has, so a replacement keeps it.
pub fn pod_name(job: &str, id: &str) -> String {
    format!("{}-{}", dns_label(job, 40), dns_label(id, 20))
}

fn labels(
    context: &RenderContext<'_>,
    job: &str,
    more: &[(&str, String)],
) -> BTreeMap<String, String> {
    let mut labels = context.settings.labels.clone();
    labels.insert(LABEL_MANAGED_BY.into(), MANAGER.into());
    labels.insert(LABEL_JOB.into(), dns_label(job, 63));
    labels.insert(LABEL_SHARD.into(), context.shard.clone());
    for (key, value) in more {
        labels.insert((*key).into(), value.clone());
    }
    labels
}

/// The object that owns a Job's pods and ConfigMaps.
pub fn job_owner(context: &RenderContext<'_>, job: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(owner_name(job)),
            namespace: context.settings.namespace.clone(),
            labels: Some(labels(context, job, &[])),
            annotations: Some(BTreeMap::from([(ANNOTATION_JOB.into(), job.into())])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("job".into(), job.into())])),
        ..ConfigMap::default()
    }
}

/// Volcano's PodGroup API (`scheduling.volcano.sh/v1beta1`).
pub fn pod_group_api() -> ApiResource {
    ApiResource {
        group: "scheduling.volcano.sh".into(),
        version: "v1beta1".into(),
        api_version: "scheduling.volcano.sh/v1beta1".into(),
        kind: "PodGroup".into(),
        plural: "podgroups".into(),
    }
}

/// The PodGroup of `job`'s executors, named and owned as its owner: every member must be
/// placed before any runs.
pub fn pod_group(
    context: &RenderContext<'_>,
    job: &str,
    owner: &JobOwner,
    gang: &Gang,
) -> DynamicObject {
    let mut object = DynamicObject::new(&owner.name, &pod_group_api());
    object.metadata = ObjectMeta {
        name: Some(owner.name.clone()),
        namespace: context.settings.namespace.clone(),
        labels: Some(labels(context, job, &[])),
        annotations: Some(BTreeMap::from([(ANNOTATION_JOB.into(), job.into())])),
        owner_references: Some(owned_by(owner)),
        ..ObjectMeta::default()
    };
    let requests = resources(gang.cpu, gang.memory_bytes).and_then(|r| r.requests);
    object.data = serde_json::json!({
        "spec": {
            "minMember": gang.members,
            "minResources": requests.unwrap_or_default(),
        }
    });
    object
}

fn owned_by(owner: &JobOwner) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]
}

fn executor_meta(
    context: &RenderContext<'_>,
    spec: &ExecutorSpec,
    owner: &JobOwner,
    digest: Option<String>,
) -> ObjectMeta {
    let id = spec.id();
    let mut annotations = BTreeMap::from([
        (ANNOTATION_JOB.to_owned(), spec.job.clone()),
        (ANNOTATION_EXECUTOR.to_owned(), id.clone()),
    ]);
    if let Some(digest) = digest {
        annotations.insert(ANNOTATION_SPEC.into(), digest);
    }
    if context.settings.pod_group {
        annotations.insert(ANNOTATION_POD_GROUP.into(), owner.name.clone());
    }
    let component = spec.role.as_str().replace('_', "-");
    ObjectMeta {
        name: Some(pod_name(&spec.job, &id)),
        namespace: context.settings.namespace.clone(),
        labels: Some(labels(
            context,
            &spec.job,
            &[
                (LABEL_ROLE, component.clone()),
                (LABEL_COMPONENT, component),
                (LABEL_EXECUTOR, dns_label(&id, 63)),
            ],
        )),
        annotations: Some(annotations),
        owner_references: Some(owned_by(owner)),
        ..ObjectMeta::default()
    }
}

/// The settings file of the executor, with its listener on every interface of its pod.
pub fn settings_file(
    context: &RenderContext<'_>,
    spec: &ExecutorSpec,
) -> Result<String, BackendError> {
    let mut settings = spec.settings.clone();
    let server = settings.server_mut();
    server.grpc_addr = std::net::SocketAddr::from(([0, 0, 0, 0], context.settings.grpc_port));
    settings
        .to_toml()
        .map_err(|e| BackendError::Io(format!("{}: {e}", spec.id())))
}

/// The Secret holding the executor's settings file.
pub fn executor_settings(
    context: &RenderContext<'_>,
    spec: &ExecutorSpec,
    owner: &JobOwner,
) -> Result<Secret, BackendError> {
    Ok(Secret {
        metadata: executor_meta(context, spec, owner, None),
        string_data: Some(BTreeMap::from([(
            SETTINGS_FILE.into(),
            settings_file(context, spec)?,
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    })
}

/// The program the image's entrypoint runs for `role`.
fn program(role: ExecutorRole) -> &'static str {
    match role {
        ExecutorRole::Ps | ExecutorRole::Serving => "ps",
        ExecutorRole::DataExecutor => "data-executor",
        ExecutorRole::Trainer => "trainer",
    }
}

/// CPU in millicores (at least 1m) and memory in bytes, as Kubernetes quantities; `None`
/// when the topology gives neither.
pub fn resources(cpu: f64, memory_bytes: u64) -> Option<ResourceRequirements> {
    let mut amounts = BTreeMap::new();
    if cpu > 0.0 {
        let millis = (cpu * 1000.0).ceil().max(1.0) as u64;
        amounts.insert("cpu".to_owned(), Quantity(format!("{millis}m")));
    }
    if memory_bytes > 0 {
        amounts.insert("memory".to_owned(), Quantity(memory_bytes.to_string()));
    }
    (!amounts.is_empty()).then(|| ResourceRequirements {
        requests: Some(amounts.clone()),
        limits: Some(amounts),
        ..ResourceRequirements::default()
    })
}

fn env(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

fn grpc_probe(port: u16, initial_delay_seconds: Option<i32>) -> Probe {
    Probe {
        grpc: Some(GRPCAction {
            port: i32::from(port),
            service: None,
        }),
        initial_delay_seconds,
        period_seconds: Some(5),
        failure_threshold: Some(6),
        ..Probe::default()
    }
}

/// The executor's pod: its program with the mounted settings file, its identity and the
/// master's address in the environment, its pod IP as the address it advertises, the
/// Job's resources for it, gRPC health probes, restarted in place when it fails.
pub fn executor_pod(
    context: &RenderContext<'_>,
    spec: &ExecutorSpec,
    owner: &JobOwner,
) -> Result<Pod, BackendError> {
    let settings = context.settings;
    let id = spec.id();
    let settings_name = pod_name(&spec.job, &id);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(settings.image.clone()),
        image_pull_policy: Some(settings.image_pull_policy.clone()),
        args: Some(vec![
            program(spec.role).into(),
            "--config".into(),
            format!("{SETTINGS_DIR}/{SETTINGS_FILE}"),
        ]),
        env: Some(vec![
            env(ENV_JOB, spec.job.clone()),
            env(ENV_EXECUTOR_ID, id.clone()),
            env(ENV_MASTER_ADDR, context.master_addr.clone()),
            EnvVar {
                name: "PRIMUS_SERVER__ADVERTISE_IP".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: "status.podIP".into(),
                    }),
                    ..EnvVarSource::default()
                }),
            },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("grpc".into()),
            container_port: i32::from(settings.grpc_port),
            ..ContainerPort::default()
        }]),
        resources: resources(spec.cpu, spec.memory_bytes),
        // CPU and memory change in place where the cluster can (in-place pod resize).
        resize_policy: Some(
            ["cpu", "memory"]
                .map(|resource| ContainerResizePolicy {
                    resource_name: resource.into(),
                    restart_policy: "NotRequired".into(),
                })
                .to_vec(),
        ),
        readiness_probe: Some(grpc_probe(settings.grpc_port, None)),
        liveness_probe: Some(grpc_probe(settings.grpc_port, Some(30))),
        volume_mounts: Some(vec![VolumeMount {
            name: "settings".into(),
            mount_path: SETTINGS_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let grace_seconds = i64::try_from(settings.stop_grace_ms.div_ceil(1000)).unwrap_or(i64::MAX);
    let pod_spec = PodSpec {
        containers: vec![container],
        // A trainer that finishes stays finished; a crash restarts the container in place
        // with the kubelet's backoff.
        restart_policy: Some("OnFailure".into()),
        termination_grace_period_seconds: Some(grace_seconds),
        service_account_name: settings.service_account.clone(),
        // Executors never call the Kubernetes API.
        automount_service_account_token: Some(false),
        node_selector: (!settings.node_selector.is_empty()).then(|| settings.node_selector.clone()),
        scheduler_name: settings.scheduler_name.clone(),
        volumes: Some(vec![Volume {
            name: "settings".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(settings_name),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    };
    let digest = spec_digest(&pod_spec, &settings_file(context, spec)?)?;
    Ok(Pod {
        metadata: executor_meta(context, spec, owner, Some(digest)),
        spec: Some(pod_spec),
        status: None,
    })
}

/// Digest of what a pod runs: its spec (resources left out: they change in place) and
/// its settings file.
fn spec_digest(spec: &PodSpec, settings: &str) -> Result<String, BackendError> {
    let mut without_resources = spec.clone();
    for container in &mut without_resources.containers {
        container.resources = None;
    }
    let json = serde_json::to_string(&without_resources)
        .map_err(|e| BackendError::Io(format!("encoding a pod spec: {e}")))?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(json.as_bytes());
    hasher.update(settings.as_bytes());
    Ok(format!("{:08x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_dns_labels_that_stay_distinct() {
        assert_eq!(dns_label("ctr-1", 63), "ctr-1");
        let (a, b) = (dns_label("CTR_1", 63), dns_label("ctr.1", 63));
        assert_ne!(a, b);
        for label in [
            &a,
            &b,
            &dns_label(&"x".repeat(100), 20),
            &dns_label("__", 63),
        ] {
            assert!(label.len() <= 63, "{label}");
            assert!(
                (label.chars()).all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{label}"
            );
            assert!(!label.starts_with('-') && !label.ends_with('-'), "{label}");
        }
        assert!(dns_label(&"x".repeat(100), 20).len() <= 20);
        // At most 40 + 1 + 20 characters: room for a pod's generated suffixes.
        assert_eq!(pod_name("ctr", "data_executor-0").len(), "ctr-".len() + 20);
        assert!(pod_name(&"j".repeat(80), "trainer-1000").len() <= 61);
    }

    #[test]
    fn resources_are_requested_and_limited_alike() {
        let r = resources(1.5, 2 << 30).expect("resources");
        assert_eq!(r.requests, r.limits);
        let amounts = r.requests.expect("requests");
        assert_eq!(amounts["cpu"].0, "1500m");
        assert_eq!(amounts["memory"].0, (2u64 << 30).to_string());
        assert!(resources(0.0, 0).is_none());
    }
}
