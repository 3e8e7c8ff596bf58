//! One node of the cluster: a network namespace with containerd, a kubelet and kube-proxy,
//! its state in a folder of its own (`<cluster>/parts/<node>`), so that it can be lost at
//! once (everything killed, as a machine that loses power) and join again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config;
use super::network;
use crate::host::{Daemon, in_netns, run, sh, wait_for};
use crate::process::Error;

/// The programs a node runs.
pub(crate) struct NodeTools {
    pub(crate) kubelet: PathBuf,
    pub(crate) kube_proxy: PathBuf,
    pub(crate) containerd: PathBuf,
    pub(crate) ctr: PathBuf,
}

pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) index: usize,
    pub(crate) dir: PathBuf,
    pub(crate) netns: String,
    cgroup_root: String,
    daemons: Vec<Daemon>,
}

impl Node {
    pub(crate) fn new(cluster_dir: &Path, id: &str, index: usize) -> Self {
        let name = format!("node{}", index + 1);
        Self {
            dir: cluster_dir.join("parts").join(&name),
            netns: network::netns_name(id, &name),
            cgroup_root: format!("/primus-{id}-{name}"),
            name,
            index,
            daemons: Vec::new(),
        }
    }

    /// The kubelet's cgroup root (`/primus-<id>-<node>`).
    pub(crate) fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    pub(crate) fn ip(&self) -> String {
        network::node_ip(self.index)
    }

    /// The socket of the node's containerd.
    pub(crate) fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    /// Writes the node's folder: what the teardown removes, the configuration files.
    pub(crate) fn prepare(&self, pki_dir: &Path) -> Result<(), Error> {
        let d = &self.dir;
        for sub in [
            "cni/net.d",
            "cni/ipam",
            "kubelet",
            "device-plugins",
            "container-logs",
            "pod-logs",
        ] {
            let path = d.join(sub);
            std::fs::create_dir_all(&path)
                .map_err(Error::io(format!("create {}", path.display())))?;
        }
        write(&d.join("netns"), &format!("{}\n", self.netns))?;
        write(&d.join("cgroups"), &format!("{}\n", self.cgroup_root))?;
        write(&d.join("containerd.toml"), &config::containerd(d))?;
        write(
            &d.join("kubelet.yaml"),
            &config::kubelet(d, pki_dir, &self.ip(), &self.cgroup_root),
        )?;
        let proxy_kubeconfig = pki_dir.join("kube-proxy.kubeconfig");
        write(
            &d.join("kube-proxy.yaml"),
            &config::kube_proxy(&proxy_kubeconfig, &self.name),
        )?;
        Ok(())
    }

    /// Starts containerd and imports `images` (docker-archive tars) into it.
    pub(crate) fn start_containerd(
        &mut self,
        tools: &NodeTools,
        images: &[PathBuf],
    ) -> Result<(), Error> {
        let mut command = in_netns(&self.netns);
        command.push(tools.containerd.display().to_string());
        command.extend([
            "--config".into(),
            self.dir.join("containerd.toml").display().to_string(),
        ]);
        let mut containerd = Daemon::spawn("10-containerd", &command, &self.dir, &[])?;
        let socket = self.containerd_socket();
        let ctr = tools.ctr.display().to_string();
        wait_for(
            &format!("containerd of {}", self.name),
            Duration::from_secs(30),
            Some(&mut containerd),
            || {
                run(&ctr, &["-a", &socket.display().to_string(), "version"])
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )?;
        self.daemons.push(containerd);
        for image in images {
            self.import(tools, image)?;
        }
        Ok(())
    }

    /// Imports one docker-archive tar into the node's containerd (the kubelet's namespace).
    pub(crate) fn import(&self, tools: &NodeTools, image: &Path) -> Result<(), Error> {
        run(
            &tools.ctr.display().to_string(),
            &[
                "-a",
                &self.containerd_socket().display().to_string(),
                "-n",
                "k8s.io",
                "images",
                "import",
                &image.display().to_string(),
            ],
        )
        .map(|_| ())
    }

    /// Starts the kubelet (in a mount namespace of its own, see below) and kube-proxy.
    pub(crate) fn start_agents(&mut self, tools: &NodeTools, pki_dir: &Path) -> Result<(), Error> {
        self.make_cgroup_root()?;
        let d = self.dir.display().to_string();
        // The kubelet's device-plugin folder is fixed at /var/lib/kubelet/device-plugins, and
        // a second kubelet deletes the first one's socket there: each kubelet runs in its own
        // mount namespace with its own folder bound over it (and its own /var/log/containers).
        // Its root folder is first made a shared mount, so the volumes it mounts for pods
        // still reach the host's mount namespace, where containerd looks for them.
        sh(&format!(
            "mkdir -p /var/lib/kubelet/device-plugins /var/log/containers
             mountpoint -q {d}/kubelet || mount --bind {d}/kubelet {d}/kubelet
             mount --make-rshared {d}/kubelet"
        ))?;
        let mut kubelet = vec![
            "unshare".into(),
            "-m".into(),
            "--propagation".into(),
            "unchanged".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "mount --bind {d}/device-plugins /var/lib/kubelet/device-plugins && \
                 mount --bind {d}/container-logs /var/log/containers && exec \"$@\""
            ),
            "kubelet".into(),
        ];
        kubelet.extend(in_netns(&self.netns));
        kubelet.extend([
            tools.kubelet.display().to_string(),
            format!("--config={d}/kubelet.yaml"),
            format!(
                "--kubeconfig={}",
                pki_dir
                    .join(format!("kubelet-{}.kubeconfig", self.name))
                    .display()
            ),
            format!("--root-dir={d}/kubelet"),
            format!("--cert-dir={d}/kubelet/pki"),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip()),
            "--v=1".into(),
        ]);
        self.daemons
            .push(Daemon::spawn("20-kubelet", &kubelet, &self.dir, &[])?);
        let mut proxy = in_netns(&self.netns);
        proxy.extend([
            tools.kube_proxy.display().to_string(),
            format!("--config={d}/kube-proxy.yaml"),
        ]);
        self.daemons
            .push(Daemon::spawn("30-kube-proxy", &proxy, &self.dir, &[])?);
        Ok(())
    }

    /// Writes the node's CNI network over its pod range (containerd picks it up by itself).
    pub(crate) fn write_cni(&self, pod_cidr: &str) -> Result<(), Error> {
        write(
            &self.dir.join("cni/net.d/10-primus-testkit.conflist"),
            &config::cni(&self.dir, pod_cidr),
        )
    }

    /// Which of its daemons exited, with the end of its log.
    pub(crate) fn exited(&mut self) -> Option<String> {
        self.daemons.iter_mut().find_map(|daemon| {
            let status = daemon.exit_status()?;
            Some(format!(
                "{} of {} exited ({status}):\n{}",
                daemon.name(),
                self.name,
                crate::host::log_tail(daemon.log(), 20)
            ))
        })
    }

    /// The node dies at once: its daemons and containers killed, its mounts, pod
    /// namespaces, own namespace and cgroups removed (the teardown script with SIGKILL).
    pub(crate) fn lose(&mut self, teardown: &Path) -> Result<(), Error> {
        let output = std::process::Command::new("sh")
            .arg(teardown)
            .arg(&self.dir)
            .arg("keep")
            .env("SIGNAL", "KILL")
            .output()
            .map_err(Error::io(format!("run {}", teardown.display())))?;
        for daemon in self.daemons.drain(..) {
            daemon.kill();
        }
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::Command {
                command: format!("{} {}", teardown.display(), self.dir.display()),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            })
        }
    }

    /// The kubelet's cgroup root in every hierarchy (it refuses a missing one); cpuset
    /// needs its CPUs and memory nodes copied from the root.
    fn make_cgroup_root(&self) -> Result<(), Error> {
        let root = self.cgroup_root.trim_start_matches('/');
        sh(&format!(
            "for h in /sys/fs/cgroup/*/; do mkdir -p \"${{h}}{root}\"; done
             c=/sys/fs/cgroup/cpuset/{root}
             if [ -d \"$c\" ]; then
               cat /sys/fs/cgroup/cpuset/cpuset.cpus > \"$c/cpuset.cpus\"
               cat /sys/fs/cgroup/cpuset/cpuset.mems > \"$c/cpuset.mems\"
             fi"
        ))
        .map(|_| ())
    }
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(Error::io(format!("write {}", path.display())))
}
