//! The resource backend conformance test, against the local backend and against the
//! testkit's two-node cluster (real kubelets and containers, the Primus image built from
//! deploy/Dockerfile).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use primus_backend::kubernetes::KubernetesBackend;
use primus_backend::kubernetes::render;
use primus_backend::local::LocalBackend;
use primus_backend::{
    BackendError, BackendEvent, Executor, ExecutorRole, ExecutorSettings, ExecutorSpec,
    ResourceBackend,
};
use primus_config::{KubernetesBackendSettings, LocalBackendSettings, PsSettings};
use primus_harness::binary;
use primus_harness::image::{PRIMUS_IMAGE, primus_image};
use primus_testkit::kube::{HOST_IP, KubeCluster};
use primus_testkit::service::{ServingStatus, wait_for_health};
use primus_testkit::{NatsServer, restartable_port};

/// What the conformance test needs of a backend besides the trait: whether an executor
/// it started is ready (serving gRPC health).
trait Probe {
    async fn ready(&self, executor: &Executor) -> bool;

    /// What to show when an executor did not become ready or stop in time.
    fn diagnostics(&self) -> String;

    /// The memory limit the executor runs under, where the backend sets one it can read
    /// back (the local backend's is a figure the master enforces itself).
    async fn memory_limit(&self, executor: &Executor) -> Option<Result<u64, String>>;
}

/// The local backend's executors are reached directly.
struct Direct;

impl Probe for Direct {
    async fn ready(&self, executor: &Executor) -> bool {
        let addr = executor.grpc_addr.to_string();
        wait_for_health(&addr, ServingStatus::Serving, Duration::from_millis(500))
            .await
            .is_ok()
    }

    async fn memory_limit(&self, _executor: &Executor) -> Option<Result<u64, String>> {
        None
    }

    fn diagnostics(&self) -> String {
        String::new()
    }
}

/// A cluster's pods may not be reachable from the test: the kubelet's gRPC probe says.
struct PodReady {
    pods: kube::Api<Pod>,
    cluster: &'static KubeCluster,
}

impl Probe for PodReady {
    async fn ready(&self, executor: &Executor) -> bool {
        let name = render::pod_name(&executor.job, &executor.id);
        let Ok(Some(pod)) = self.pods.get_opt(&name).await else {
            return false;
        };
        (pod.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter())
        .any(|c| c.type_ == "Ready" && c.status == "True")
    }

    fn diagnostics(&self) -> String {
        self.cluster.diagnostics("default")
    }

    /// The limit the pod's status reports, once the kernel's cgroup of its container says
    /// the same.
    async fn memory_limit(&self, executor: &Executor) -> Option<Result<u64, String>> {
        let name = render::pod_name(&executor.job, &executor.id);
        let pod = match self.pods.get(&name).await {
            Ok(pod) => pod,
            Err(e) => return Some(Err(format!("pod {name}: {e}"))),
        };
        let status = (pod.status.and_then(|s| s.container_statuses))
            .unwrap_or_default()
            .into_iter()
            .next();
        let Some(status) = status else {
            return Some(Err(format!("pod {name} has no container status")));
        };
        let reported = (status.resources.and_then(|r| r.limits))
            .and_then(|limits| limits.get("memory").map(|q| q.0.clone()));
        let container = (status.container_id.unwrap_or_default())
            .rsplit("://")
            .next()
            .unwrap_or_default()
            .to_owned();
        let cgroup = self.cluster.container_cgroup("memory", &container);
        let limit = cgroup.and_then(|dir| {
            std::fs::read_to_string(dir.join("memory.limit_in_bytes"))
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
        });
        Some(match (reported, limit) {
            (Some(reported), Some(limit)) if bytes(&reported) == Some(limit) => Ok(limit),
            other => Err(format!("pod status limit and cgroup limit: {other:?}")),
        })
    }
}

/// A memory quantity the API server reports (`384Mi`, or plain bytes) in bytes.
fn bytes(quantity: &str) -> Option<u64> {
    let (digits, unit) = quantity.split_at(
        quantity
            .find(|c: char| !c.is_ascii_digit())?
            .min(quantity.len()),
    );
    let scale = match unit {
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok().map(|n| n * scale)
}

async fn eventually(probe: &impl Probe, executor: &Executor, ready: bool, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while probe.ready(executor).await != ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} not {} within {within:?}\n{}",
            executor.id,
            if ready { "ready" } else { "stopped" },
            probe.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ps_shard(job: &str, index: u32, nats_url: &str) -> ExecutorSpec {
    let mut settings = PsSettings::default();
    settings.nats.url = nats_url.into();
    ExecutorSpec {
        job: job.into(),
        role: ExecutorRole::Ps,
        index,
        settings: ExecutorSettings::Ps(Box::new(settings)),
        cpu: 0.25,
        memory_bytes: 256 << 20,
    }
}

/// The trait's promises: started executors become ready at the address given; scaling up
/// adds one, scaling down stops exactly that one; a resize is reported; releasing an
/// unknown executor names it; releasing the Job stops the rest.
async fn conformance<B: ResourceBackend>(
    backend: &B,
    probe: &impl Probe,
    nats_url: &str,
    within: Duration,
) {
    let job = format!("conformance-{}", std::process::id());
    let mut events = backend.events();
    let first = backend
        .request(ps_shard(&job, 0, nats_url))
        .await
        .expect("ps-0 starts");
    assert_eq!((first.id.as_str(), first.role), ("ps-0", ExecutorRole::Ps));
    eventually(probe, &first, true, within).await;
    let second = backend
        .request(ps_shard(&job, 1, nats_url))
        .await
        .expect("ps-1 starts");
    eventually(probe, &second, true, within).await;
    backend
        .resize(&job, "ps-0", 0.5, 384 << 20)
        .await
        .expect("resize");
    let resized = tokio::time::timeout(within, async {
        loop {
            match events.recv().await {
                Ok(BackendEvent::Resized {
                    id, memory_bytes, ..
                }) if id == "ps-0" => {
                    return memory_bytes;
                }
                Ok(BackendEvent::GaveUp { id, status, .. }) => panic!("{id} gave up: {status}"),
                Ok(_) => {}
                Err(e) => panic!("backend events: {e}"),
            }
        }
    })
    .await
    .expect("a Resized event");
    assert_eq!(resized, 384 << 20);
    // The backend reports the resize once the API server took it; the kubelet applies it
    // to the container after.
    let deadline = tokio::time::Instant::now() + within;
    while let Some(limit) = probe.memory_limit(&first).await {
        if limit == Ok(384 << 20) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "resize of ps-0 to 384 MiB, pod status and cgroup: {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    backend.release(&job, "ps-1").await.expect("release ps-1");
    eventually(probe, &second, false, within).await;
    let unknown = backend.release(&job, "ps-1").await;
    assert!(
        matches!(unknown, Err(BackendError::Unknown { ref id, .. }) if id == "ps-1"),
        "{unknown:?}"
    );
    eventually(probe, &first, true, within).await;
    backend.release_job(&job).await;
    eventually(probe, &first, false, within).await;
}

/// The Primus image imported into `cluster`, and a NATS server its pods reach.
fn on_the_cluster(cluster: &KubeCluster) -> NatsServer {
    let image = primus_image().expect("the Primus image");
    cluster
        .import_image(&image)
        .expect("the image in the cluster");
    let host_ip = HOST_IP.parse().expect("an IP");
    NatsServer::start_on(host_ip, restartable_port().expect("a port"), None)
        .expect("nats-server on the cluster network")
}

/// The backend's settings for `cluster`: the imported image, the `default` namespace.
fn backend_settings(cluster: &KubeCluster) -> KubernetesBackendSettings {
    KubernetesBackendSettings {
        kubeconfig: Some(cluster.kubeconfig()),
        namespace: Some("default".into()),
        image: PRIMUS_IMAGE.into(),
        image_pull_policy: "Never".into(),
        stop_grace_ms: 5_000,
        ..KubernetesBackendSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_backend_conformance() {
    let nats = NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("tempdir");
    let local = LocalBackend::new(
        LocalBackendSettings {
            binaries: [("ps".to_owned(), binary("primus-ps"))].into(),
            work_dir: dir.path().join("work"),
            ..LocalBackendSettings::default()
        },
        "127.0.0.1:1".into(),
    );
    conformance(&local, &Direct, &nats.url(), Duration::from_secs(60)).await;
    local.shutdown().await;
    eprintln!("resource backend conformance: local backend PASSED");

    let cluster = KubeCluster::shared().expect("the test cluster");
    let nats = on_the_cluster(cluster);
    let settings = backend_settings(cluster);
    let backend = KubernetesBackend::connect(settings, (0, 1), "127.0.0.1:1".into())
        .await
        .expect("the test cluster's API server");
    let probe = PodReady {
        pods: backend.pods(),
        cluster,
    };
    conformance(&backend, &probe, &nats.url(), Duration::from_secs(120)).await;
    objects_of_a_job_deleted_meanwhile_go_at_once(cluster, &nats.url()).await;
    eprintln!(
        "resource backend conformance: kubernetes backend PASSED on the test cluster \
         ({} nodes, real containers, in-place resize seen in the pod status and its cgroup)",
        cluster.node_names().len()
    );
}

/// A master that finds a Job absent from its listing (deleted while no master followed
/// it) deletes the pod, settings Secret and owner its executor left at once, without
/// waiting for the adoption window or the garbage collector; a listed Job's pod stays.
async fn objects_of_a_job_deleted_meanwhile_go_at_once(cluster: &KubeCluster, nats_url: &str) {
    let connect =
        || KubernetesBackend::connect(backend_settings(cluster), (0, 1), "127.0.0.1:1".into());
    let (deleted, listed) = (
        format!("deleted-{}", std::process::id()),
        format!("listed-{}", std::process::id()),
    );
    let previous = connect().await.expect("the test cluster's API server");
    for job in [&deleted, &listed] {
        (previous.request(ps_shard(job, 0, nats_url)))
            .await
            .unwrap_or_else(|e| panic!("{job}'s ps-0 starts: {e}"));
    }
    // The master stops; the pods outlive it.
    drop(previous);
    let next = connect().await.expect("the test cluster's API server");
    next.release_jobs_not_listed(std::slice::from_ref(&listed))
        .await;
    let exists = |kind: &str, name: &str| {
        let args = [
            "get",
            kind,
            name,
            "-n",
            "default",
            "--ignore-not-found",
            "-o",
            "name",
        ];
        let found = cluster.kubectl_run(&args).expect("kubectl get");
        !found.trim().is_empty()
    };
    let pods = next.pods();
    assert!(
        deleting(&pods, &deleted).await,
        "the deleted Job's pod is not being deleted"
    );
    let secret = render::pod_name(&deleted, "ps-0");
    assert!(
        !exists("secret", &secret),
        "the deleted Job's settings Secret is left"
    );
    let owner = render::owner_name(&deleted);
    assert!(
        !exists("configmap", &owner),
        "the deleted Job's owner is left"
    );
    assert!(
        !deleting(&pods, &listed).await,
        "the listed Job's pod is being deleted"
    );
    next.release_job(&listed).await;
    assert!(
        deleting(&pods, &listed).await,
        "the released Job's pod is not being deleted"
    );
}

/// Whether `job`'s ps-0 pod is gone or being deleted.
async fn deleting(pods: &kube::Api<Pod>, job: &str) -> bool {
    let name = render::pod_name(job, "ps-0");
    let pod = pods.get_opt(&name).await.expect("get the pod");
    pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

/// Gangs on the test cluster (under `operator::`, so `cargo test --workspace operator` runs
/// it). Volcano is not served here: its PodGroup CRD is installed alone, no scheduler acts
/// on it, and the test reads what the backend writes.
mod operator {
    use super::*;
    use primus_backend::Gang;
    use serde_json::Value;

    /// Volcano's PodGroup API as its CRD serves it, with the schema left open.
    const POD_GROUP_CRD: &str = r#"{
      "apiVersion": "apiextensions.k8s.io/v1",
      "kind": "CustomResourceDefinition",
      "metadata": {"name": "podgroups.scheduling.volcano.sh"},
      "spec": {
        "group": "scheduling.volcano.sh",
        "scope": "Namespaced",
        "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup", "shortNames": ["pg"]},
        "versions": [{
          "name": "v1beta1", "served": true, "storage": true,
          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
          "subresources": {"status": {}}
        }]
      }
    }"#;

    fn pod_group(cluster: &KubeCluster, name: &str) -> Option<Value> {
        let args = [
            "get",
            "podgroup",
            name,
            "-n",
            "default",
            "-o",
            "json",
            "--ignore-not-found",
        ];
        let found = cluster.kubectl_run(&args).expect("kubectl get podgroup");
        (!found.trim().is_empty()).then(|| serde_json::from_str(&found).expect("a PodGroup"))
    }

    /// With `kubernetes.pod_group`, a Job's executors form one PodGroup: all of them its
    /// minimum members, their requests its minimum resources, owned by the Job's owner (so
    /// it goes with the Job), and every pod names it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_jobs_executors_form_one_pod_group_that_goes_with_the_job() {
        let cluster = KubeCluster::shared().expect("the test cluster");
        let dir = tempfile::tempdir().expect("tempdir");
        let crd = dir.path().join("podgroups.json");
        std::fs::write(&crd, POD_GROUP_CRD).expect("the CRD file");
        let crd = crd.display().to_string();
        cluster
            .kubectl_run(&["apply", "--server-side", "-f", &crd])
            .expect("the PodGroup CRD applied");
        let established = "condition=established";
        let crd_name = "crd/podgroups.scheduling.volcano.sh";
        (cluster.kubectl_run(&["wait", "--for", established, crd_name, "--timeout=60s"]))
            .expect("the PodGroup CRD served");
        let nats = on_the_cluster(cluster);
        let settings = KubernetesBackendSettings {
            pod_group: true,
            ..backend_settings(cluster)
        };
        let backend = KubernetesBackend::connect(settings, (0, 1), "127.0.0.1:1".into())
            .await
            .expect("the test cluster's API server");
        assert!(backend.schedules_gangs());
        let job = format!("gang-{}", std::process::id());
        let gang = Gang {
            members: 2,
            cpu: 0.5,
            memory_bytes: 512 << 20,
        };
        backend
            .form_gang(&job, &gang)
            .await
            .expect("the PodGroup applied");
        let (first, second) = tokio::join!(
            backend.request(ps_shard(&job, 0, &nats.url())),
            backend.request(ps_shard(&job, 1, &nats.url())),
        );
        let executors = [first.expect("ps-0 starts"), second.expect("ps-1 starts")];
        let name = render::owner_name(&job);
        let group = pod_group(cluster, &name).expect("the Job's PodGroup");
        assert_eq!(group["spec"]["minMember"], 2, "{group:#}");
        assert_eq!(group["spec"]["minResources"]["cpu"], "500m", "{group:#}");
        assert_eq!(
            group["spec"]["minResources"]["memory"], "536870912",
            "{group:#}"
        );
        let owner = &group["metadata"]["ownerReferences"][0];
        assert_eq!(
            (owner["kind"].as_str(), owner["name"].as_str()),
            (Some("ConfigMap"), Some(name.as_str()))
        );
        for executor in &executors {
            let pod = (backend
                .pods()
                .get(&render::pod_name(&job, &executor.id))
                .await)
                .expect("the executor's pod");
            let annotations = pod.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get(render::ANNOTATION_POD_GROUP),
                Some(&name),
                "{} names its PodGroup",
                executor.id
            );
        }
        backend.release_job(&job).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while pod_group(cluster, &name).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the PodGroup outlived its Job by 60 s"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
