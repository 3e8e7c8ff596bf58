//! A real two-node Kubernetes on this machine ([`KubeCluster`]): etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and CoreDNS, and two nodes, each a kubelet with
//! its own containerd and kube-proxy in its own network namespace, running real containers
//! with runc. Certificates are made on the spot; images are docker-archive tars imported
//! into both nodes' containerd.
//!
//! The binaries come from `scripts/install-cluster-tools.sh` (`$CLUSTER_TOOLS_DIR/bin`),
//! containerd, runc and the CNI plugins from Debian. A watchdog (`host.rs`) holds the
//! machine-wide lock for the cluster's life and removes everything it made (processes,
//! containers, mounts, network namespaces, cgroups, host routes, host folders) when the
//! cluster is dropped or the test process ends in any way.

mod config;
mod kueue;
mod network;
mod node;
mod pki;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::host::{Daemon, Watchdog, in_netns, run, wait_for};
use crate::images;
use crate::process::Error;
use node::{Node, NodeTools, write};
use pki::{Client, Pki};

pub use kueue::Kueue;
pub use network::HOST_IP;

const NODES: usize = 2;
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const TEARDOWN: &str = include_str!("../teardown.sh");

/// The cluster's programs.
struct Tools {
    etcd: PathBuf,
    apiserver: PathBuf,
    controller_manager: PathBuf,
    scheduler: PathBuf,
    coredns: PathBuf,
    kubectl: PathBuf,
    node: NodeTools,
}

impl Tools {
    fn find() -> Result<Self, Error> {
        Ok(Self {
            etcd: images::cluster_tool("etcd")?,
            apiserver: images::cluster_tool("kube-apiserver")?,
            controller_manager: images::cluster_tool("kube-controller-manager")?,
            scheduler: images::cluster_tool("kube-scheduler")?,
            coredns: images::cluster_tool("coredns")?,
            kubectl: images::cluster_tool("kubectl")?,
            node: NodeTools {
                kubelet: images::cluster_tool("kubelet")?,
                kube_proxy: images::cluster_tool("kube-proxy")?,
                containerd: images::system_tool("containerd")?,
                ctr: images::system_tool("ctr")?,
            },
        })
    }
}

/// The daemons of the control plane (in the first node's namespace, as on a control-plane
/// node); the API server's command is kept so that it can be stopped and started again.
struct ControlPlane {
    daemons: Vec<Daemon>,
    apiserver: Option<Daemon>,
    apiserver_command: Vec<String>,
}

/// A running cluster. See the module documentation.
pub struct KubeCluster {
    id: String,
    dir: PathBuf,
    pki: Pki,
    tools: Tools,
    host_if: String,
    control: Mutex<ControlPlane>,
    nodes: Mutex<Vec<Node>>,
    /// Every image imported so far, imported again into a node that joins again.
    images: Mutex<Vec<PathBuf>>,
    watchdog: Mutex<Watchdog>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KubeCluster {
    /// The one cluster of this test process, started on first use.
    pub fn shared() -> Result<&'static KubeCluster, Error> {
        static SHARED: OnceLock<Result<KubeCluster, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| KubeCluster::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|detail| Error::FailedEarlier {
                what: "the Kubernetes cluster (shared)".into(),
                detail: detail.clone(),
            })
    }

    /// Starts a cluster; waits for another test process's cluster to be torn down first.
    pub fn start() -> Result<Self, Error> {
        let started = Instant::now();
        let tools = Tools::find()?;
        let pause = images::pause_image()?;
        let id = format!("k{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("primus-kube-{}", std::process::id()));
        if dir.exists() {
            return Err(Error::Unsupported {
                what: "the Kubernetes cluster".into(),
                detail: format!("{} exists: one cluster per test process", dir.display()),
            });
        }
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
        let watchdog = Watchdog::start("kubernetes", &dir, TEARDOWN)?;
        crate::host::remove_stale("primus-kube-", &dir);
        let host_if = format!("p{id}");
        let nodes: Vec<Node> = (0..NODES).map(|i| Node::new(&dir, &id, i)).collect();
        write(
            &dir.join("netns"),
            &nodes
                .iter()
                .map(|n| format!("{}\n", n.netns))
                .collect::<String>(),
        )?;
        // Written by the kubelets and containerd's CNI whatever they are told.
        write(
            &dir.join("host-paths"),
            "/var/lib/kubelet\n/var/log/containers\n/var/lib/cni\n",
        )?;
        let pki = make_pki(&dir, &nodes)?;
        let cluster = Self {
            id,
            pki,
            tools,
            host_if,
            control: Mutex::new(ControlPlane {
                daemons: Vec::new(),
                apiserver: None,
                apiserver_command: Vec::new(),
            }),
            nodes: Mutex::new(nodes),
            images: Mutex::new(vec![pause]),
            watchdog: Mutex::new(watchdog),
            dir,
        };
        cluster.bring_up().map_err(|e| cluster.with_logs(e))?;
        eprintln!(
            "[testkit] Kubernetes cluster up in {:.1}s ({} nodes, kubeconfig {})",
            started.elapsed().as_secs_f64(),
            NODES,
            cluster.kubeconfig().display()
        );
        Ok(cluster)
    }

    /// The administrator's kubeconfig (user `admin` in `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.pki.kubeconfig_path("admin")
    }

    /// `kubectl` with the administrator's kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.tools.kubectl);
        command.arg("--kubeconfig").arg(self.kubeconfig());
        command
    }

    /// Runs `kubectl ARGS` to completion and returns its output; a failure carries stderr.
    pub fn kubectl_run(&self, args: &[&str]) -> Result<String, Error> {
        let kubeconfig = self.kubeconfig().display().to_string();
        let mut all = vec!["--kubeconfig", &kubeconfig];
        all.extend_from_slice(args);
        run(&self.tools.kubectl.display().to_string(), &all)
    }

    /// The cluster's folder: logs under `logs/` and `parts/<node>/logs/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The nodes' names.
    pub fn node_names(&self) -> Vec<String> {
        lock(&self.nodes).iter().map(|n| n.name.clone()).collect()
    }

    /// Imports a docker-archive tar into every node that runs (and into nodes that join
    /// again later).
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        let mut imported = lock(&self.images);
        if imported.iter().any(|known| known == archive) {
            return Ok(());
        }
        for node in lock(&self.nodes).iter() {
            node.import(&self.tools.node, archive)?;
        }
        imported.push(archive.to_path_buf());
        Ok(())
    }

    /// Node `name` is lost at once: its kubelet, containerd, kube-proxy and every container
    /// on it are killed, its network namespace is removed. The API server notices after
    /// the node monitor's grace period (10 s) and evicts its pods 10 s later.
    pub fn lose_node(&self, name: &str) -> Result<(), Error> {
        let teardown = self.dir.join("teardown.sh");
        let mut nodes = lock(&self.nodes);
        let node = (nodes.iter_mut())
            .find(|n| n.name == name)
            .ok_or_else(|| unknown_node(name))?;
        node.lose(&teardown)
    }

    /// Node `name`, lost before, joins again: a new namespace, containerd with every
    /// image, its kubelet and kube-proxy; returns once it is Ready.
    pub fn rejoin_node(&self, name: &str) -> Result<(), Error> {
        let images = lock(&self.images).clone();
        let mut nodes = lock(&self.nodes);
        let first = nodes[0].netns.clone();
        let node = (nodes.iter_mut())
            .find(|n| n.name == name)
            .ok_or_else(|| unknown_node(name))?;
        if node.index == 0 {
            return Err(Error::Unsupported {
                what: format!("rejoin {name}"),
                detail: "the first node carries the control plane and is never lost".into(),
            });
        }
        network::further_node(&first, &node.netns, node.index, &self.host_if)?;
        node.start_containerd(&self.tools.node, &images)?;
        node.start_agents(&self.tools.node, self.pki.dir())?;
        let pod_cidr = self.pod_cidr(name)?;
        node.write_cni(&pod_cidr)?;
        let namespaces: Vec<String> = nodes.iter().map(|n| n.netns.clone()).collect();
        let index = (nodes.iter().position(|n| n.name == name)).unwrap_or_default();
        network::route_pods(&namespaces, index, &pod_cidr)?;
        drop(nodes);
        self.wait_node_ready(name)
    }

    /// What a failed test needs to see of `namespace`: its pods with their nodes and
    /// addresses, its latest events, and the end of each pod's log.
    pub fn diagnostics(&self, namespace: &str) -> String {
        let mut out = String::new();
        let show = |args: &[&str]| {
            self.kubectl_run(args)
                .unwrap_or_else(|e| format!("(kubectl {}: {e})\n", args.join(" ")))
        };
        out.push_str(&show(&["-n", namespace, "get", "pods", "-o", "wide"]));
        let nodes = show(&["describe", "nodes"]);
        let mut allocated = false;
        for line in nodes.lines() {
            if line.starts_with("Name:") || line.starts_with("Allocated resources:") {
                allocated = line.starts_with("Allocated");
                out.push_str(line);
                out.push('\n');
            } else if allocated && (line.contains("cpu") || line.contains("memory")) {
                out.push_str(line);
                out.push('\n');
            }
        }
        let events = show(&["-n", namespace, "get", "events", "--sort-by=.lastTimestamp"]);
        let lines: Vec<&str> = events.lines().collect();
        out.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
        let pods = show(&["-n", namespace, "get", "pods", "-o", "name"]);
        for pod in pods.lines() {
            out.push_str(&format!("\n--- {pod}\n"));
            out.push_str(&show(&[
                "-n",
                namespace,
                "logs",
                "--all-containers",
                "--tail=20",
                pod,
            ]));
        }
        out
    }

    /// The cgroup folder of container `container_id` (as its status names it, without the
    /// `containerd://`) in cgroup v1 hierarchy `hierarchy` (`memory`, `cpu`, ...).
    pub fn container_cgroup(&self, hierarchy: &str, container_id: &str) -> Option<PathBuf> {
        if container_id.is_empty() {
            return None;
        }
        let mut pending: Vec<PathBuf> = (lock(&self.nodes).iter())
            .map(|node| {
                Path::new("/sys/fs/cgroup")
                    .join(hierarchy)
                    .join(node.cgroup_root().trim_start_matches('/'))
            })
            .collect();
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                if entry.file_name().to_string_lossy().ends_with(container_id) {
                    return Some(path);
                }
                pending.push(path);
            }
        }
        None
    }

    /// Stops the API server (SIGTERM); [`KubeCluster::start_api_server`] brings it back.
    pub fn stop_api_server(&self) {
        if let Some(apiserver) = lock(&self.control).apiserver.take() {
            apiserver.stop(Duration::from_secs(10));
        }
    }

    /// Starts the API server again after [`KubeCluster::stop_api_server`] and waits until
    /// it is ready.
    pub fn start_api_server(&self) -> Result<(), Error> {
        let mut control = lock(&self.control);
        if control.apiserver.is_some() {
            return Ok(());
        }
        let mut apiserver = Daemon::spawn(
            "03-kube-apiserver",
            &control.apiserver_command,
            &self.dir,
            &[],
        )?;
        self.wait_api_ready(&mut apiserver)?;
        control.apiserver = Some(apiserver);
        Ok(())
    }

    /// Waits until every node is Ready with a heartbeat later than `since` (RFC 3339, UTC,
    /// as Kubernetes writes times): its kubelet reported since. After an API server outage
    /// longer than the node monitor's grace, the node lifecycle controller marks every node
    /// NotReady (and takes their pods out of their Services) until their kubelets report
    /// again, which took them up to 50 s here.
    pub fn wait_nodes_reported_since(&self, since: &str) -> Result<(), Error> {
        let template = r#"{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}{"\n"}{end}"#;
        wait_for("every node reporting", READY_TIMEOUT, None, || {
            let listed =
                (self.kubectl_run(&["get", "nodes", "-o", &format!("jsonpath={template}")]))
                    .map_err(|e| e.to_string())?;
            let behind: Vec<&str> = (listed.lines())
                .filter(
                    |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                        [_, "True", heartbeat] => heartbeat <= since,
                        _ => true,
                    },
                )
                .collect();
            if listed.trim().is_empty() {
                Err("no nodes listed".into())
            } else if behind.is_empty() {
                Ok(())
            } else {
                Err(format!("not Ready since {since}: {behind:?}"))
            }
        })
    }

    /// Stops the cluster now and removes everything it made.
    pub fn stop(self) {
        drop(self);
    }

    fn bring_up(&self) -> Result<(), Error> {
        let images = lock(&self.images).clone();
        let mut nodes = lock(&self.nodes);
        network::first_node(&nodes[0].netns, &self.host_if)?;
        for node in nodes.iter().skip(1) {
            network::further_node(&nodes[0].netns, &node.netns, node.index, &self.host_if)?;
        }
        self.start_control_plane(&nodes[0].netns)?;
        for node in nodes.iter_mut() {
            node.prepare(self.pki.dir())?;
            node.start_containerd(&self.tools.node, &images)?;
            node.start_agents(&self.tools.node, self.pki.dir())?;
        }
        let namespaces: Vec<String> = nodes.iter().map(|n| n.netns.clone()).collect();
        for (index, node) in nodes.iter().enumerate() {
            let pod_cidr = self.pod_cidr(&node.name)?;
            node.write_cni(&pod_cidr)?;
            network::route_pods(&namespaces, index, &pod_cidr)?;
        }
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        drop(nodes);
        for name in &names {
            self.wait_node_ready(name)?;
        }
        self.apply(config::storage_class())?;
        self.apply(&local_volumes(&self.dir, &names)?)?;
        wait_for("the default service account", READY_TIMEOUT, None, || {
            self.kubectl_run(&["get", "serviceaccount", "default"])
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    fn start_control_plane(&self, netns: &str) -> Result<(), Error> {
        let (d, pki) = (
            self.dir.display().to_string(),
            self.pki.dir().display().to_string(),
        );
        let ip = network::node_ip(0);
        let mut control = lock(&self.control);
        let mut etcd = in_netns(netns);
        etcd.extend([
            self.tools.etcd.display().to_string(),
            "--name=primus-testkit".into(),
            format!("--data-dir={d}/etcd"),
            "--listen-client-urls=http://127.0.0.1:2379".into(),
            "--advertise-client-urls=http://127.0.0.1:2379".into(),
            "--listen-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
            "--initial-cluster=primus-testkit=http://127.0.0.1:2380".into(),
            "--listen-metrics-urls=http://127.0.0.1:2381".into(),
            "--quota-backend-bytes=1073741824".into(),
            "--unsafe-no-fsync".into(),
        ]);
        control
            .daemons
            .push(Daemon::spawn("01-etcd", &etcd, &self.dir, &[])?);

        let mut apiserver = in_netns(netns);
        let toleration = config::EVICTION_TOLERATION_SECONDS;
        apiserver.extend([
            self.tools.apiserver.display().to_string(),
            format!("--advertise-address={ip}"),
            "--bind-address=0.0.0.0".into(),
            "--secure-port=6443".into(),
            "--etcd-servers=http://127.0.0.1:2379".into(),
            format!("--service-cluster-ip-range={}", network::SERVICE_CIDR),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={pki}/sa.pub"),
            format!("--service-account-signing-key-file={pki}/sa.key"),
            format!("--tls-cert-file={pki}/apiserver.crt"),
            format!("--tls-private-key-file={pki}/apiserver.key"),
            format!("--client-ca-file={pki}/ca.crt"),
            format!("--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt"),
            format!("--kubelet-client-key={pki}/apiserver-kubelet-client.key"),
            // Else `kubectl logs` and `exec` look the node's name up in DNS and time out.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            format!("--default-not-ready-toleration-seconds={toleration}"),
            format!("--default-unreachable-toleration-seconds={toleration}"),
        ]);
        let mut daemon = Daemon::spawn("03-kube-apiserver", &apiserver, &self.dir, &[])?;
        self.wait_api_ready(&mut daemon)?;
        control.apiserver = Some(daemon);
        control.apiserver_command = apiserver;

        let kubeconfig = |file: &str| self.pki.kubeconfig_path(file).display().to_string();
        let mut kcm = in_netns(netns);
        let kcm_config = kubeconfig("kube-controller-manager");
        kcm.extend([
            self.tools.controller_manager.display().to_string(),
            format!("--kubeconfig={kcm_config}"),
            format!("--authentication-kubeconfig={kcm_config}"),
            format!("--authorization-kubeconfig={kcm_config}"),
            "--bind-address=127.0.0.1".into(),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={pki}/sa.key"),
            format!("--root-ca-file={pki}/ca.crt"),
            format!("--cluster-signing-cert-file={pki}/ca.crt"),
            format!("--cluster-signing-key-file={pki}/ca.key"),
            // The nodes' pod ranges come from here and must match their CNI ranges.
            "--allocate-node-cidrs=true".into(),
            format!("--cluster-cidr={}", network::CLUSTER_CIDR),
            "--node-cidr-mask-size=24".into(),
            format!("--service-cluster-ip-range={}", network::SERVICE_CIDR),
            "--controllers=*,-cloud-node-lifecycle".into(),
            format!("--node-monitor-grace-period={}", config::NODE_MONITOR_GRACE),
            format!("--node-monitor-period={}", config::NODE_MONITOR_PERIOD),
        ]);
        control.daemons.push(Daemon::spawn(
            "04-kube-controller-manager",
            &kcm,
            &self.dir,
            &[],
        )?);
        let mut scheduler = in_netns(netns);
        let scheduler_config = kubeconfig("kube-scheduler");
        scheduler.extend([
            self.tools.scheduler.display().to_string(),
            format!("--kubeconfig={scheduler_config}"),
            format!("--authentication-kubeconfig={scheduler_config}"),
            format!("--authorization-kubeconfig={scheduler_config}"),
            "--bind-address=127.0.0.1".into(),
            "--leader-elect=false".into(),
        ]);
        control.daemons.push(Daemon::spawn(
            "05-kube-scheduler",
            &scheduler,
            &self.dir,
            &[],
        )?);

        self.apply(&config::dns_objects(&ip))?;
        let corefile = self.dir.join("Corefile");
        write(
            &corefile,
            &config::corefile(&ip, &self.pki.kubeconfig_path("coredns")),
        )?;
        let mut coredns = in_netns(netns);
        coredns.extend([
            self.tools.coredns.display().to_string(),
            "-conf".into(),
            corefile.display().to_string(),
        ]);
        let mut daemon = Daemon::spawn("06-coredns", &coredns, &self.dir, &[])?;
        let ready = in_netns(netns);
        wait_for("CoreDNS", READY_TIMEOUT, Some(&mut daemon), || {
            let mut curl: Vec<&str> = ready.iter().skip(1).map(String::as_str).collect();
            curl.extend([
                "curl",
                "-sf",
                "-o",
                "/dev/null",
                "http://127.0.0.1:8181/ready",
            ]);
            run(&ready[0], &curl).map(|_| ()).map_err(|e| e.to_string())
        })?;
        control.daemons.push(daemon);
        Ok(())
    }

    fn wait_api_ready(&self, apiserver: &mut Daemon) -> Result<(), Error> {
        wait_for("kube-apiserver", READY_TIMEOUT, Some(apiserver), || {
            self.kubectl_run(&["get", "--raw", "/readyz"])
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// The pod range the controller-manager gave node `name`.
    fn pod_cidr(&self, name: &str) -> Result<String, Error> {
        let mut cidr = String::new();
        wait_for(
            &format!("the pod range of {name}"),
            READY_TIMEOUT,
            None,
            || {
                cidr = self
                    .kubectl_run(&["get", "node", name, "-o", "jsonpath={.spec.podCIDR}"])
                    .map_err(|e| e.to_string())?;
                if cidr.trim().is_empty() {
                    Err(format!("{name} has no pod range yet"))
                } else {
                    Ok(())
                }
            },
        )?;
        Ok(cidr.trim().to_owned())
    }

    fn wait_node_ready(&self, name: &str) -> Result<(), Error> {
        wait_for(&format!("node {name}"), READY_TIMEOUT, None, || {
            if let Some(exited) = lock(&self.nodes).iter_mut().find_map(Node::exited) {
                return Err(exited);
            }
            let ready = self
                .kubectl_run(&[
                    "get",
                    "node",
                    name,
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
                ])
                .map_err(|e| e.to_string())?;
            if ready.trim() == "True" {
                Ok(())
            } else {
                Err(format!("{name} Ready={}", ready.trim()))
            }
        })
    }

    fn apply(&self, manifest: &str) -> Result<(), Error> {
        let file = self.dir.join(format!("apply-{}.yaml", manifest.len()));
        write(&file, manifest)?;
        self.kubectl_run(&["apply", "--server-side", "-f", &file.display().to_string()])
            .map(|_| ())
    }

    /// `error` with the ends of the cluster's logs, for a start that failed.
    fn with_logs(&self, error: Error) -> Error {
        let mut logs = String::new();
        for path in log_files(&self.dir) {
            let tail = crate::host::log_tail(&path, 8);
            if !tail.is_empty() {
                logs.push_str(&format!("\n--- {}\n{tail}", path.display()));
            }
        }
        Error::Exited {
            what: format!("the Kubernetes cluster {}", self.id),
            status: error.to_string(),
            log: logs,
        }
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        lock(&self.watchdog).tear_down();
    }
}

fn unknown_node(name: &str) -> Error {
    Error::Unsupported {
        what: format!("node {name}"),
        detail: "no such node in this cluster".into(),
    }
}

fn make_pki(dir: &Path, nodes: &[Node]) -> Result<Pki, Error> {
    let api = network::node_ip(0);
    let names: Vec<String> = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        network::API_SERVICE_IP,
        &api,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut clients = vec![
        Client::new("admin", "admin", Some("system:masters")),
        Client::new(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
        ),
        Client::new(
            "kube-controller-manager",
            "system:kube-controller-manager",
            None,
        ),
        Client::new("kube-scheduler", "system:kube-scheduler", None),
        Client::new("kube-proxy", "system:kube-proxy", None),
        Client::new("coredns", "coredns", None),
    ];
    for node in nodes {
        clients.push(Client::new(
            &format!("kubelet-{}", node.name),
            &format!("system:node:{}", node.name),
            Some("system:nodes"),
        ));
    }
    Pki::make(
        &dir.join("pki"),
        &format!("https://{api}:6443"),
        &names,
        &clients,
    )
}

/// Local PersistentVolumes, eight per node, in folders of the cluster's: the default
/// StorageClass's claims bind to them on the node their pod is scheduled to.
fn local_volumes(dir: &Path, nodes: &[String]) -> Result<String, Error> {
    let mut manifest = String::new();
    for node in nodes {
        for index in 0..8 {
            let path = dir.join("volumes").join(node).join(index.to_string());
            std::fs::create_dir_all(&path)
                .map_err(Error::io(format!("create {}", path.display())))?;
            manifest.push_str(&format!(
                "---\napiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: testkit-{node}-{index}}}\nspec:\n  capacity: {{storage: 20Gi}}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: testkit-host-path\n  local: {{path: {path}}}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{node}]}}]\n",
                path = path.display()
            ));
        }
    }
    Ok(manifest)
}

/// Every `*.log` under `dir`.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("volumes") && !path.ends_with("containerd") {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
