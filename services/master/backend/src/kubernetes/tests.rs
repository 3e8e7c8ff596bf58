//! Reconciliation on observed states: crash loops, OOMKilled, eviction, node loss, scale
//! up and down, a master restart adopting its pods, changed specs and resizes.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodCondition,
    PodStatus,
};
use primus_config::KubernetesBackendSettings;

use super::reconcile::{Action, Limits, ObservedPod, Phase, Tracked, Wanted, reconcile};
use super::render::{self, JobOwner, RenderContext};
use crate::{BackendEvent, ExecutorRole, ExecutorSettings, ExecutorSpec};

const LIMITS: Limits = Limits {
    max_restarts: 2,
    adoption: Duration::from_secs(120),
};
/// Long after the backend started: the adoption window is over.
const LATER: Duration = Duration::from_secs(600);

fn spec(memory_bytes: u64) -> ExecutorSpec {
    ExecutorSpec {
        job: "ctr".into(),
        role: ExecutorRole::Ps,
        index: 0,
        settings: ExecutorSettings::Ps(Box::default()),
        cpu: 2.0,
        memory_bytes,
    }
}

fn context(settings: &KubernetesBackendSettings) -> RenderContext<'_> {
    RenderContext {
        settings,
        shard: "0-1".into(),
        master_addr: "10.0.0.1:7071".into(),
    }
}

fn owner() -> JobOwner {
    JobOwner {
        name: render::owner_name("ctr"),
        uid: "0b4a1f8e-0000-4000-8000-000000000001".into(),
    }
}

fn wanted(memory_bytes: u64) -> Wanted {
    let settings = KubernetesBackendSettings::default();
    let context = context(&settings);
    let spec = spec(memory_bytes);
    let pod = render::executor_pod(&context, &spec, &owner()).expect("pod");
    let digest =
        pod.metadata.annotations.as_ref().expect("annotations")[render::ANNOTATION_SPEC].clone();
    Wanted {
        job: spec.job.clone(),
        id: spec.id(),
        settings: render::executor_settings(&context, &spec, &owner()).expect("settings"),
        pod,
        digest,
        cpu: spec.cpu,
        memory_bytes,
        port: settings.grpc_port,
    }
}

/// The wanted pod as the API server would report it: `uid`, with `status`.
fn observed(wanted: &Wanted, uid: &str, status: PodStatus) -> ObservedPod {
    let mut pod = wanted.pod.clone();
    pod.metadata.uid = Some(uid.into());
    pod.status = Some(status);
    ObservedPod::of(&pod).expect("an executor's pod")
}

/// The wanted pod running at `ip`.
fn running(wanted: &Wanted, uid: &str, ip: &str) -> ObservedPod {
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some(ip.into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "executor".into(),
            restart_count: 0,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    };
    observed(wanted, uid, status)
}

fn terminated(reason: &str, exit_code: i32) -> Option<ContainerState> {
    Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(reason.into()),
            exit_code,
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    })
}

/// The wanted pod after its container restarted `restarts` times, the last run ending
/// with `reason` and `exit_code`.
fn restarted(
    wanted: &Wanted,
    uid: &str,
    restarts: i32,
    reason: &str,
    exit_code: i32,
) -> ObservedPod {
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.0.5".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "executor".into(),
            restart_count: restarts,
            last_state: terminated(reason, exit_code),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    };
    observed(wanted, uid, status)
}

/// An executor whose pod `u1` was observed running at 10.1.0.5.
fn started() -> (Wanted, Tracked) {
    let wanted = wanted(1 << 30);
    let mut tracked = Tracked::default();
    let pod = running(&wanted, "u1", "10.1.0.5");
    reconcile(Some(&wanted), Some(&pod), &mut tracked, LIMITS, LATER);
    (wanted, tracked)
}

fn events(actions: &[Action]) -> Vec<&BackendEvent> {
    (actions.iter())
        .filter_map(|a| match a {
            Action::Report { event, .. } => Some(event),
            _ => None,
        })
        .collect()
}

#[test]
fn kubernetes_scale_up_creates_a_pod_and_a_running_one_needs_nothing() {
    let wanted = wanted(1 << 30);
    let mut tracked = Tracked::default();
    let actions = reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER);
    assert_eq!(actions, vec![Action::Create]);
    let pod = running(&wanted, "u1", "10.1.0.5");
    let actions = reconcile(Some(&wanted), Some(&pod), &mut tracked, LIMITS, LATER);
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(tracked.ip, Some("10.1.0.5".parse::<IpAddr>().expect("ip")));
}

#[test]
fn kubernetes_scale_down_deletes_the_pod_of_a_released_executor() {
    let pod = running(&wanted(1 << 30), "u1", "10.1.0.5");
    let mut tracked = Tracked::default();
    let actions = reconcile(None, Some(&pod), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: pod.name.clone(),
            force: false
        }]
    );
    let mut going = pod.clone();
    going.deleting = true;
    assert!(reconcile(None, Some(&going), &mut tracked, LIMITS, LATER).is_empty());
}

#[test]
fn kubernetes_crash_loop_restarts_with_the_log_then_gives_up() {
    let (wanted, mut tracked) = started();
    let crashed = restarted(&wanted, "u1", 1, "Error", 1);
    let actions = reconcile(Some(&wanted), Some(&crashed), &mut tracked, LIMITS, LATER);
    match &actions[..] {
        [
            Action::Report {
                event:
                    BackendEvent::Restarting {
                        id,
                        status,
                        restart: 1,
                        ..
                    },
                log_of: Some(pod),
            },
        ] => {
            assert_eq!(id, "ps-0");
            assert_eq!(pod, &crashed.name);
            assert!(status.contains("exit code 1"), "{status}");
        }
        other => panic!("{other:?}"),
    }
    // Seen already: nothing new.
    assert!(reconcile(Some(&wanted), Some(&crashed), &mut tracked, LIMITS, LATER).is_empty());
    // Two more crashes (the kubelet's CrashLoopBackOff in between): past max_restarts.
    let looping = restarted(&wanted, "u1", 3, "Error", 2);
    let actions = reconcile(Some(&wanted), Some(&looping), &mut tracked, LIMITS, LATER);
    assert!(actions.contains(&Action::Delete {
        name: looping.name.clone(),
        force: false
    }));
    assert!(
        matches!(events(&actions)[..], [BackendEvent::GaveUp { status, .. }] if status.contains("crashed 3 times")),
        "{actions:?}"
    );
    // Given up: once the pod is gone, no new one.
    assert!(reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER).is_empty());
}

#[test]
fn kubernetes_oom_killed_asks_for_more_memory_and_restarts() {
    let (wanted, mut tracked) = started();
    let killed = restarted(&wanted, "u1", 1, "OOMKilled", 137);
    let actions = reconcile(Some(&wanted), Some(&killed), &mut tracked, LIMITS, LATER);
    match events(&actions)[..] {
        [
            BackendEvent::OutOfMemory {
                id, memory_bytes, ..
            },
            BackendEvent::Restarting { status, .. },
        ] => {
            assert_eq!((id.as_str(), *memory_bytes), ("ps-0", 1 << 30));
            assert!(status.contains("OOMKilled"), "{status}");
        }
        _ => panic!("{actions:?}"),
    }
}

#[test]
fn kubernetes_eviction_replaces_the_pod_and_reports_the_restart_at_its_new_address() {
    let (wanted, mut tracked) = started();
    let mut evicted = running(&wanted, "u1", "10.1.0.5");
    evicted.phase = Phase::Failed;
    evicted.reason = Some("Evicted".into());
    let actions = reconcile(Some(&wanted), Some(&evicted), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: evicted.name.clone(),
            force: false
        }]
    );
    // Gone: a new pod; its restart is reported once it has an address, after the move.
    assert_eq!(
        reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER),
        vec![Action::Create]
    );
    let mut pending = running(&wanted, "u2", "10.1.0.9");
    pending.ip = None;
    pending.phase = Phase::Pending;
    assert!(reconcile(Some(&wanted), Some(&pending), &mut tracked, LIMITS, LATER).is_empty());
    let replacement = running(&wanted, "u2", "10.1.0.9");
    let actions = reconcile(
        Some(&wanted),
        Some(&replacement),
        &mut tracked,
        LIMITS,
        LATER,
    );
    match events(&actions)[..] {
        [
            BackendEvent::Moved { grpc_addr, .. },
            BackendEvent::Restarting {
                status, restart: 1, ..
            },
        ] => {
            assert_eq!(grpc_addr.to_string(), "10.1.0.9:7080");
            assert!(status.contains("Evicted"), "{status}");
        }
        _ => panic!("{actions:?}"),
    }
}

#[test]
fn kubernetes_node_loss_deletes_the_pod_at_once() {
    let (wanted, mut tracked) = started();
    let mut lost = running(&wanted, "u1", "10.1.0.5");
    lost.phase = Phase::Unknown;
    let actions = reconcile(Some(&wanted), Some(&lost), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: lost.name.clone(),
            force: true
        }]
    );
    // A pod the taint manager marks for deletion (its node unreachable) is lost too.
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.0.7".into()),
        conditions: Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByTaintManager".into()),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    };
    let mut tainted = observed(&wanted, "u2", status);
    // It is deleted already (the taint manager's eviction), but its node never confirms.
    tainted.deleting = true;
    let actions = reconcile(Some(&wanted), Some(&tainted), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: tainted.name.clone(),
            force: true
        }]
    );
    assert_eq!(tracked.restarts, 2);
    // Seen again before it is gone: deleted again, not counted again.
    let again = reconcile(Some(&wanted), Some(&tainted), &mut tracked, LIMITS, LATER);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(tracked.restarts, 2);
    assert_eq!(
        reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER),
        vec![Action::Create]
    );
    assert_eq!(tracked.restarts, 2);
}

#[test]
fn kubernetes_a_pod_deleted_by_someone_else_is_replaced_as_a_restart() {
    let (wanted, mut tracked) = started();
    // `kubectl delete pod`: Terminating for its grace period, then gone.
    let mut terminating = running(&wanted, "u1", "10.1.0.5");
    terminating.deleting = true;
    assert!(
        reconcile(
            Some(&wanted),
            Some(&terminating),
            &mut tracked,
            LIMITS,
            LATER
        )
        .is_empty()
    );
    assert_eq!(
        reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER),
        vec![Action::Create]
    );
    // Not yet observed again: created again, the restart counted once.
    assert_eq!(
        reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER),
        vec![Action::Create]
    );
    let replacement = running(&wanted, "u2", "10.1.0.9");
    let actions = reconcile(
        Some(&wanted),
        Some(&replacement),
        &mut tracked,
        LIMITS,
        LATER,
    );
    match events(&actions)[..] {
        [
            BackendEvent::Moved { grpc_addr, .. },
            BackendEvent::Restarting {
                status, restart: 1, ..
            },
        ] => {
            assert_eq!(grpc_addr.to_string(), "10.1.0.9:7080");
            assert!(status.contains("deleted"), "{status}");
        }
        _ => panic!("{actions:?}"),
    }
}

#[test]
fn kubernetes_master_restart_adopts_running_pods_without_events() {
    let wanted = wanted(1 << 30);
    // Restarted four times under the previous master: old news.
    let pod = restarted(&wanted, "u1", 4, "Error", 1);
    let mut tracked = Tracked::default();
    // Before the Job is driven again the pod is left alone...
    assert!(
        reconcile(
            None,
            Some(&pod),
            &mut tracked,
            LIMITS,
            Duration::from_secs(5)
        )
        .is_empty()
    );
    // ...and once it is, adopted as it runs.
    let actions = reconcile(
        Some(&wanted),
        Some(&pod),
        &mut tracked,
        LIMITS,
        Duration::from_secs(6),
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert_eq!(tracked.restarts, 0);
    // A pod of a changed spec (another settings file) is replaced instead.
    let mut other = pod.clone();
    other.digest = Some("0000beef".into());
    let actions = reconcile(
        Some(&wanted),
        Some(&other),
        &mut Tracked::default(),
        LIMITS,
        LATER,
    );
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: other.name.clone(),
            force: false
        }]
    );
}

#[test]
fn kubernetes_new_resources_resize_the_running_pod() {
    let before = wanted(1 << 30);
    let pod = running(&before, "u1", "10.1.0.5");
    let mut tracked = Tracked::default();
    assert!(reconcile(Some(&before), Some(&pod), &mut tracked, LIMITS, LATER).is_empty());
    let after = wanted(3 << 29);
    assert_eq!(
        before.digest, after.digest,
        "resources are not part of the digest"
    );
    let actions = reconcile(Some(&after), Some(&pod), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Resize {
            name: pod.name.clone()
        }]
    );
}

#[test]
fn kubernetes_new_resources_replace_a_pod_whose_container_is_not_running() {
    let before = wanted(1 << 30);
    let (_, mut tracked) = started();
    // OOM-killed and waiting to start again: it would start within the pod's old limits.
    let mut waiting = running(&before, "u1", "10.1.0.5");
    waiting.running = false;
    let after = wanted(3 << 29);
    let actions = reconcile(Some(&after), Some(&waiting), &mut tracked, LIMITS, LATER);
    assert_eq!(
        actions,
        vec![Action::Delete {
            name: waiting.name.clone(),
            force: false
        }]
    );
    assert_eq!(
        reconcile(Some(&after), None, &mut tracked, LIMITS, LATER),
        vec![Action::Create]
    );
    let replacement = running(&after, "u2", "10.1.0.9");
    let actions = reconcile(
        Some(&after),
        Some(&replacement),
        &mut tracked,
        LIMITS,
        LATER,
    );
    assert!(
        events(&actions).iter().any(
            |e| matches!(e, BackendEvent::Restarting { status, .. } if status.contains("resized"))
        ),
        "{actions:?}"
    );
}

#[test]
fn kubernetes_a_finished_trainer_completes_and_gets_no_new_pod() {
    let wanted = wanted(1 << 30);
    let status = PodStatus {
        phase: Some("Succeeded".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "executor".into(),
            state: terminated("Completed", 0),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    };
    let done = observed(&wanted, "u1", status);
    let mut tracked = Tracked::default();
    let actions = reconcile(Some(&wanted), Some(&done), &mut tracked, LIMITS, LATER);
    assert!(
        matches!(events(&actions)[..], [BackendEvent::Completed { .. }]),
        "{actions:?}"
    );
    assert!(reconcile(Some(&wanted), Some(&done), &mut tracked, LIMITS, LATER).is_empty());
    assert!(reconcile(Some(&wanted), None, &mut tracked, LIMITS, LATER).is_empty());
}

#[test]
fn kubernetes_pods_carry_identity_owner_probes_and_resources() {
    let wanted = wanted(1 << 30);
    let meta = &wanted.pod.metadata;
    let labels = meta.labels.as_ref().expect("labels");
    assert_eq!(labels[render::LABEL_JOB], "ctr");
    assert_eq!(labels[render::LABEL_ROLE], "ps");
    assert_eq!(labels[render::LABEL_EXECUTOR], "ps-0");
    assert_eq!(labels[render::LABEL_SHARD], "0-1");
    let owners = meta.owner_references.as_ref().expect("owner");
    assert_eq!(owners[0].uid, owner().uid);
    assert_eq!(owners[0].controller, Some(true));
    let spec = wanted.pod.spec.as_ref().expect("spec");
    let container = &spec.containers[0];
    assert_eq!(
        container.args.as_deref(),
        Some(
            &[
                "ps".to_owned(),
                "--config".into(),
                "/etc/primus/executor/settings.toml".into()
            ][..]
        )
    );
    let probe = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.grpc.as_ref());
    assert_eq!(probe.map(|g| g.port), Some(7080));
    let env = container.env.as_ref().expect("env");
    let value = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value("PRIMUS_EXECUTOR_ID").as_deref(), Some("ps-0"));
    assert_eq!(
        value("PRIMUS_MASTER_ADDR").as_deref(),
        Some("10.0.0.1:7071")
    );
    let settings = &wanted.settings.string_data.as_ref().expect("data")["settings.toml"];
    assert!(settings.contains("0.0.0.0:7080"), "{settings}");
    let observed = running(&wanted, "u1", "10.1.0.5");
    assert_eq!(
        (observed.cpu_millis, observed.memory_bytes),
        (2000, 1 << 30)
    );
    assert_eq!(spec.restart_policy.as_deref(), Some("OnFailure"));
    assert_eq!(spec.automount_service_account_token, Some(false));
}

#[test]
fn kubernetes_quantities_read_as_the_api_and_metrics_server_write_them() {
    use super::reconcile::cpu_millis;
    let memory_bytes = |q: &str| primus_spec::job::parse_memory(q).ok();
    assert_eq!(cpu_millis("500m"), Some(500));
    assert_eq!(cpu_millis("2"), Some(2000));
    assert_eq!(cpu_millis("1.5"), Some(1500));
    assert_eq!(cpu_millis("250000000n"), Some(250));
    assert_eq!(cpu_millis("1500u"), Some(2));
    assert_eq!(cpu_millis("lots"), None);
    assert_eq!(memory_bytes("512Mi"), Some(512 << 20));
    assert_eq!(memory_bytes("2Gi"), Some(2 << 30));
    assert_eq!(memory_bytes("1G"), Some(1_000_000_000));
    assert_eq!(memory_bytes("12345Ki"), Some(12345 << 10));
    assert_eq!(memory_bytes("1073741824"), Some(1 << 30));
    assert_eq!(memory_bytes("1k"), Some(1_000));
    assert_eq!(memory_bytes("1.5Gi"), None, "not a whole number of units");
}
