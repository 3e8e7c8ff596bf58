//! The deployment paths of Primus-rs run for real, as a user runs them: `k8s/` applied with
//! kustomize to the testkit's two-node Kubernetes cluster ([`KubeDeployment`]), and
//! `deploy/docker-compose.yaml` started by Docker Compose on the testkit's Docker engine.
//! No registry can be reached here: the images are the testkit's (NATS, Redis, MinIO,
//! Jaeger from this machine's builds) and the Primus image from deploy/Dockerfile; a
//! kustomize overlay maps the manifests' image names to them, as an air-gapped cluster's
//! operator would.

#![warn(missing_docs)]

pub mod compose;
pub mod example;
pub mod faults;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use primus_api_client::{ApiClient, ClientSettings};
use primus_spec::Kind;
use primus_spec::status::{Phase, Status};
use primus_testkit::images;
use primus_testkit::kube::KubeCluster;

const DEV: &str = "k8s/overlays/dev";
const OPERATOR_OVERLAY: &str = "k8s/overlays/operator";

/// The namespace of k8s/.
pub const NAMESPACE: &str = "primus";
/// The API token of k8s/overlays/dev.
pub const DEV_TOKEN: &str = "primus-dev-token";

/// An overlay of k8s/ applied to the shared cluster, every service ready.
pub struct KubeDeployment {
    /// The cluster.
    pub cluster: &'static KubeCluster,
    api: String,
    /// Its master takes Jobs from PrimusJobs (k8s/overlays/operator), not the API server.
    operator: bool,
}

impl KubeDeployment {
    /// The deployment of this test process, made on first use: the images imported into
    /// both nodes, `kubectl apply -k` of an overlay over k8s/overlays/dev that names them,
    /// and every workload rolled out.
    pub fn shared() -> &'static KubeDeployment {
        static SHARED: OnceLock<KubeDeployment> = OnceLock::new();
        SHARED.get_or_init(|| Self::deploy(DEV))
    }

    /// [`KubeDeployment::shared`] of k8s/overlays/operator (the master as the operator of
    /// PrimusJobs). Both deploy to the namespace `primus`: a test process uses one.
    pub fn operator() -> &'static KubeDeployment {
        static OPERATOR: OnceLock<KubeDeployment> = OnceLock::new();
        OPERATOR.get_or_init(|| Self::deploy(OPERATOR_OVERLAY))
    }

    fn deploy(overlay: &str) -> KubeDeployment {
        Self::apply(overlay).unwrap_or_else(|e| panic!("{overlay}: {e}"))
    }

    fn apply(overlay: &str) -> Result<Self, String> {
        let started = Instant::now();
        let cluster = KubeCluster::shared().map_err(|e| e.to_string())?;
        let mut overrides = String::new();
        let upstream = [
            ("nats", images::nats_image()),
            ("redis", images::redis_image()),
            ("minio/minio", images::minio_image()),
            ("jaegertracing/jaeger", images::jaeger_image()),
        ];
        for (name, image) in upstream {
            let (tag, archive) = image.map_err(|e| e.to_string())?;
            cluster.import_image(&archive).map_err(|e| e.to_string())?;
            let (new_name, new_tag) = tag.rsplit_once(':').unwrap_or((&tag, "latest"));
            overrides.push_str(&format!(
                "  - {{name: {name}, newName: {new_name}, newTag: \"{new_tag}\"}}\n"
            ));
        }
        let primus = primus_harness::image::primus_image().map_err(|e| e.to_string())?;
        cluster.import_image(&primus).map_err(|e| e.to_string())?;

        let applied = overlay;
        let overlay = cluster.dir().join("overlay");
        std::fs::create_dir_all(&overlay).map_err(|e| e.to_string())?;
        // Kustomize takes a base by a relative path only.
        let base = primus_testkit::repo_root().join(applied);
        let up = "../".repeat(overlay.components().count().saturating_sub(1));
        let base = format!("{up}{}", base.display().to_string().trim_start_matches('/'));
        // The services stay on the first node, as an operator keeps stateful services on
        // nodes of their own: the node-loss test loses the second node, and with it only
        // Job pods.
        let kustomization = format!(
            "# {applied} with the images this machine built.\n\
             apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{base}]\nimages:\n{overrides}patches:\n{}{}",
            on_first_node("StatefulSet"),
            on_first_node("Deployment")
        );
        std::fs::write(overlay.join("kustomization.yaml"), kustomization)
            .map_err(|e| e.to_string())?;
        let overlay = overlay.display().to_string();
        cluster
            .kubectl_run(&["apply", "-k", &overlay])
            .map_err(|e| e.to_string())?;
        let workloads = [
            "statefulset/nats",
            "statefulset/redis",
            "statefulset/minio",
            "deployment/jaeger",
            "deployment/api-server",
            "statefulset/master",
            "deployment/serving-sync",
        ];
        for workload in workloads {
            cluster
                .kubectl_run(&[
                    "-n",
                    NAMESPACE,
                    "rollout",
                    "status",
                    workload,
                    "--timeout=300s",
                ])
                .map_err(|e| format!("{workload}: {e}\n{}", cluster.diagnostics(NAMESPACE)))?;
        }
        cluster
            .kubectl_run(&[
                "-n",
                NAMESPACE,
                "wait",
                "--for=condition=complete",
                "job/minio-bucket",
                "--timeout=300s",
            ])
            .map_err(|e| format!("the bucket: {e}\n{}", cluster.diagnostics(NAMESPACE)))?;
        let api = format!("http://{}:7070", service_ip(cluster, "api-server")?);
        eprintln!(
            "[cluster] {applied} applied and rolled out in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let operator = applied == OPERATOR_OVERLAY;
        Ok(Self {
            cluster,
            api,
            operator,
        })
    }

    /// A client of the deployment's API server (through its Service address).
    pub async fn client(&self) -> ApiClient {
        let settings = ClientSettings {
            server: self.api.clone(),
            token: DEV_TOKEN.into(),
            ca_file: None,
        };
        ApiClient::connect_patiently(&settings, 60)
            .await
            .expect("the API server's Service")
    }

    /// Job `job`'s status; asked again while the API server is away (60 s at most).
    pub async fn status(&self, job: &str) -> Status {
        if self.operator {
            return self.custom_status(job);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let answer = match tokio::time::timeout(Duration::from_secs(5), self.client()).await {
                Ok(client) => client.get(Kind::Job, job).await.map_err(|e| e.to_string()),
                Err(_) => Err("no API client within 5 s".into()),
            };
            match answer {
                Ok(resource) => {
                    return serde_json::from_str(&resource.status_json).unwrap_or_default();
                }
                Err(e) => assert!(Instant::now() < deadline, "{job}: status: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// PrimusJob `job`'s status, as kubectl reads it (asked again for 60 s at most).
    fn custom_status(&self, job: &str) -> Status {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let read = self.cluster.kubectl_run(&[
                "-n",
                NAMESPACE,
                "get",
                "primusjob",
                job,
                "-o",
                "jsonpath={.status}",
            ]);
            match read {
                Ok(text) => return serde_json::from_str(&text).unwrap_or_default(),
                Err(e) => assert!(Instant::now() < deadline, "{job}: status: {e}"),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits up to `timeout` for Job `job` to reach `phase`, calling `each` with every
    /// status seen; fails with the cluster's diagnostics when it ends otherwise.
    pub async fn wait_for_phase(
        &self,
        job: &str,
        phase: Phase,
        timeout: Duration,
        mut each: impl FnMut(&Status),
    ) -> Status {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status(job).await;
            each(&status);
            if status.phase == phase {
                return status;
            }
            assert!(
                !status.phase.is_terminal() && Instant::now() < deadline,
                "{job} is {:?}, not {phase:?}: {status:#?}\n{}",
                status.phase,
                self.cluster.diagnostics(NAMESPACE)
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The pods of Job `job` now: (executor id, node, pod IP).
    pub fn job_pods(&self, job: &str) -> Vec<JobPod> {
        let template = "{range .items[*]}{.metadata.annotations.primus\\.dev/executor-id} \
                        {.spec.nodeName} {.metadata.uid} {.metadata.name} \
                        {.status.conditions[?(@.type==\"Ready\")].status}- {.status.podIP}\
                        {\"\\n\"}{end}";
        self.job_pods_listed(job, template)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                Some(JobPod {
                    executor: parts.next()?.to_owned(),
                    node: parts.next()?.to_owned(),
                    uid: parts.next()?.to_owned(),
                    name: parts.next()?.to_owned(),
                    ready: parts.next()? == "True-",
                    ip: parts.next().unwrap_or_default().to_owned(),
                })
            })
            .collect()
    }

    /// The pods of Job `job`, one line each as the kubectl jsonpath `template` writes them.
    pub fn job_pods_listed(&self, job: &str, template: &str) -> Result<String, String> {
        (self.cluster.kubectl_run(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            &format!("primus.dev/job={job}"),
            "-o",
            &format!("jsonpath={template}"),
        ]))
        .map_err(|e| e.to_string())
    }

    /// Every object of Job `job` left in the namespace (pods, Secrets, ConfigMaps).
    pub fn job_objects(&self, job: &str) -> Vec<String> {
        self.cluster
            .kubectl_run(&[
                "-n",
                NAMESPACE,
                "get",
                "pods,secrets,configmaps",
                "-l",
                &format!("primus.dev/job={job}"),
                "-o",
                "name",
            ])
            .unwrap_or_else(|e| e.to_string())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Deletes every Job a test that failed before left running: two nodes of two CPUs
    /// hold one Job, and the next test's pods would find no room.
    pub async fn delete_left_jobs(&self) {
        if self.operator {
            let left = (self.cluster)
                .kubectl_run(&["-n", NAMESPACE, "get", "primusjobs", "-o", "name"])
                .unwrap_or_default();
            for job in left
                .lines()
                .filter_map(|l| l.rsplit_once('/'))
                .map(|(_, n)| n)
            {
                eprintln!("[cluster] deleting PrimusJob {job} left by an earlier test");
                self.delete_job(job).await;
            }
            return;
        }
        let listed = (self.client().await)
            .list(Kind::Job, std::collections::HashMap::new())
            .await
            .expect("list Jobs");
        for job in listed.resources {
            eprintln!(
                "[cluster] deleting Job {} left by an earlier test",
                job.name
            );
            self.delete_job(&job.name).await;
        }
    }

    /// Deletes Job `job` through the API server and waits until no object of it is left
    /// (2 minutes at most; then fails with what is left and the master's log).
    pub async fn delete_job(&self, job: &str) {
        if self.operator {
            (self.cluster)
                .kubectl_run(&["-n", NAMESPACE, "delete", "primusjob", job, "--wait=true"])
                .expect("kubectl delete primusjob");
        } else {
            (self.client().await)
                .delete(Kind::Job, job, 0)
                .await
                .expect("delete the Job");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.job_objects(job).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{job}: objects left: {:?}\n{}\n{}\nmaster-0 (previous container): {}\nmaster-0: {}",
                self.job_objects(job),
                self.cluster
                    .kubectl_run(&[
                        "-n",
                        NAMESPACE,
                        "get",
                        "pods",
                        "-l",
                        &format!("primus.dev/job={job}"),
                        "-o",
                        "custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,DELETING:.metadata.deletionTimestamp"
                    ])
                    .unwrap_or_default(),
                self.cluster
                    .kubectl_run(&[
                        "-n",
                        NAMESPACE,
                        "get",
                        "configmaps,secrets",
                        "-l",
                        &format!("primus.dev/job={job}"),
                        "-o",
                        "yaml"
                    ])
                    .unwrap_or_default(),
                self.cluster
                    .kubectl_run(&["-n", NAMESPACE, "logs", "master-0", "--previous", "--tail=30"])
                    .unwrap_or_default(),
                self.cluster
                    .kubectl_run(&["-n", NAMESPACE, "logs", "master-0", "--tail=40"])
                    .unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// The example this deployment's master runs: `k8s/example`, or for the operator
    /// `k8s/example-operator` (the same Job as custom resources).
    pub fn example_applied(&self) -> PathBuf {
        let example = if self.operator {
            "k8s/example-operator"
        } else {
            "k8s/example"
        };
        primus_testkit::repo_root().join(example)
    }

    /// `k8s/example`, as the repository has it.
    pub fn example_dir() -> PathBuf {
        primus_testkit::repo_root().join("k8s/example")
    }
}

/// A kustomize patch placing every workload of `kind` on the first node.
fn on_first_node(kind: &str) -> String {
    format!(
        "  - target: {{kind: {kind}}}\n    patch: |-\n      - op: add\n        \
         path: /spec/template/spec/nodeSelector\n        \
         value: {{kubernetes.io/hostname: node1}}\n"
    )
}

/// One pod of a Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPod {
    /// The executor it runs (`ps-0`, `trainer-0`, ...).
    pub executor: String,
    /// The node it runs on.
    pub node: String,
    /// The pod's uid (a replacement has another).
    pub uid: String,
    /// Its address (empty while it has none).
    pub ip: String,
    /// The pod's name.
    pub name: String,
    /// Whether it is Ready.
    pub ready: bool,
}

/// The address of Service `name` of k8s/ (the host reaches Services through the first
/// node's kube-proxy).
pub fn service_ip(cluster: &KubeCluster, name: &str) -> Result<String, String> {
    cluster
        .kubectl_run(&[
            "-n",
            NAMESPACE,
            "get",
            "service",
            name,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .map(|ip| ip.trim().to_owned())
        .map_err(|e| e.to_string())
}
