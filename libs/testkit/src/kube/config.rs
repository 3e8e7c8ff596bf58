//! The configuration files of the cluster's components, and the settings that had to be
//! what they are on a machine without systemd, with cgroup v1, two kubelets on one kernel
//! and each node in a network namespace.

use std::path::Path;

use super::network::{CLUSTER_CIDR, DNS_IP};

/// How fast a lost node is noticed and its pods evicted: Kubernetes' defaults take about
/// 50 s and 350 s; tests of a node loss should not wait that long. The grace leaves room
/// for a kubelet starved of CPU by two cores training flat out: at 10 s such a node was
/// once marked unreachable and a pod evicted from it.
pub(crate) const NODE_LEASE_SECONDS: u32 = 10;
pub(crate) const NODE_STATUS_FREQUENCY: &str = "4s";
pub(crate) const NODE_MONITOR_GRACE: &str = "20s";
pub(crate) const NODE_MONITOR_PERIOD: &str = "2s";
pub(crate) const EVICTION_TOLERATION_SECONDS: u32 = 10;

/// containerd of one node: all its state under the node's folder, never the host's
/// /run/containerd (dockerd's containerd may run there), and runc's state beside it.
pub(crate) fn containerd(node_dir: &Path) -> String {
    let d = node_dir.display();
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd/containerd.sock"
[ttrpc]
  address = "{d}/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # The sandbox asks for a negative oom_score_adj, which needs CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/net.d"
"#,
        pause = crate::images::PAUSE_IMAGE,
    )
}

/// The kubelet of one node.
pub(crate) fn kubelet(node_dir: &Path, pki_dir: &Path, node_ip: &str, cgroup_root: &str) -> String {
    let d = node_dir.display();
    let pki = pki_dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
# One cgroup root per kubelet: two kubelets on one kernel must not share /kubepods.
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{d}/containerd/containerd.sock
podLogsDir: {d}/pod-logs
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {pki}/ca.crt}}
authorization: {{mode: Webhook}}
clusterDomain: cluster.local
clusterDNS: [{DNS_IP}]
resolvConf: /etc/resolv.conf
address: {node_ip}
readOnlyPort: 0
serializeImagePulls: false
# The machine's disk is shared with everything else the tests write.
evictionHard: {{memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}}
imageGCHighThresholdPercent: 100
nodeLeaseDurationSeconds: {NODE_LEASE_SECONDS}
nodeStatusUpdateFrequency: {NODE_STATUS_FREQUENCY}
"#
    )
}

/// kube-proxy of one node.
pub(crate) fn kube_proxy(kubeconfig: &Path, node: &str) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
mode: iptables
clusterCIDR: {CLUSTER_CIDR}
hostnameOverride: {node}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Setting nf_conntrack_max needs a capability the machine does not give.
conntrack: {{maxPerCore: 0}}
"#,
        kubeconfig = kubeconfig.display(),
    )
}

/// The bridge CNI network of one node over its pod range. No masquerading: servers see the
/// client pod's own address.
pub(crate) fn cni(node_dir: &Path, pod_cidr: &str) -> String {
    let d = node_dir.display();
    format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "primus-testkit",
  "plugins": [
    {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{pod_cidr}"}}]],
              "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{d}/cni/ipam"}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
  ]
}}
"#
    )
}

/// CoreDNS, a host process on `node_ip` in the first node's namespace, answering for the
/// cluster's names only (nothing outside can be reached).
pub(crate) fn corefile(node_ip: &str, kubeconfig: &Path) -> String {
    format!(
        r#".:53 {{
    bind {node_ip}
    errors
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} primus-testkit
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loadbalance
}}
"#,
        kubeconfig = kubeconfig.display(),
    )
}

/// What CoreDNS may read (its client certificate's user is `coredns`), and the kube-dns
/// Service on the cluster DNS address whose one endpoint is CoreDNS on the node.
pub(crate) fn dns_objects(node_ip: &str) -> String {
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {DNS_IP}
  ports:
  - {{name: dns, port: 53, protocol: UDP, targetPort: 53}}
  - {{name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels: {{kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: primus-testkit}}
addressType: IPv4
ports:
- {{name: dns, port: 53, protocol: UDP}}
- {{name: dns-tcp, port: 53, protocol: TCP}}
endpoints:
- addresses: ["{node_ip}"]
  conditions: {{ready: true}}
"#
    )
}

/// A default StorageClass whose volumes are host folders on the node that first uses
/// them (the `local-path` way, done by the cluster's own static provisioner): StatefulSets
/// of k8s/ claim their volumes from it.
pub(crate) fn storage_class() -> &'static str {
    r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: testkit-host-path
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
"#
}
