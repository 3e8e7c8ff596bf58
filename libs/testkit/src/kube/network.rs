//! The cluster's network: each node a network namespace, the first joined to the host by a
//! veth pair, the second to the first by another; routes so that the host, both nodes and
//! every pod reach each other's addresses, pod ranges and Service addresses.
//!
//! ```text
//!  host 10.200.0.1 ── veth ── node1 10.200.0.2 ── veth ── node2 10.200.0.3
//!                             pods 10.244.0.0/24          pods 10.244.1.0/24
//!  host routes: 10.200.0.3, 10.244.0.0/16, 10.96.0.0/16 (Services, through node1's
//!  kube-proxy) via 10.200.0.2
//! ```
//!
//! The addresses are fixed: the watchdog's machine-wide lock keeps one cluster at a time.

use crate::host::sh;
use crate::process::Error;

/// The host's address on the cluster network: pods reach servers the test starts here.
pub const HOST_IP: &str = "10.200.0.1";
pub(crate) const NODE_SUBNET_BITS: u8 = 24;
pub(crate) const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub(crate) const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The API server's Service address (first of the Service range) and the cluster DNS.
pub(crate) const API_SERVICE_IP: &str = "10.96.0.1";
pub(crate) const DNS_IP: &str = "10.96.0.10";

/// The node of `index` (0-based): its name and address.
pub(crate) fn node_ip(index: usize) -> String {
    format!("10.200.0.{}", index + 2)
}

/// The namespace names of a cluster whose id is `id`.
pub(crate) fn netns_name(id: &str, node: &str) -> String {
    format!("primus-{id}-{node}")
}

/// Makes the first node's namespace, joined to the host by `host_if`.
pub(crate) fn first_node(netns: &str, host_if: &str) -> Result<(), Error> {
    let ip = node_ip(0);
    sh(&format!(
        "ip netns add {netns}
         ip link add {host_if} type veth peer name eth0 netns {netns}
         ip addr add {HOST_IP}/{NODE_SUBNET_BITS} dev {host_if}
         ip link set {host_if} up
         ip -n {netns} addr add {ip}/{NODE_SUBNET_BITS} dev eth0
         ip -n {netns} link set lo up
         ip -n {netns} link set eth0 up
         ip -n {netns} route add default via {HOST_IP} dev eth0
         ip route replace {CLUSTER_CIDR} via {ip} dev {host_if}
         ip route replace {SERVICE_CIDR} via {ip} dev {host_if}"
    ))?;
    node_sysctls(netns)
}

/// Makes the namespace of a further node (`index` >= 1), joined to the first node's. The
/// host's address lies in the node subnet but only the first node's link reaches it: a
/// route says so (else the node asks for it on its own link and gets no answer).
pub(crate) fn further_node(
    first: &str,
    netns: &str,
    index: usize,
    host_if: &str,
) -> Result<(), Error> {
    let (first_ip, ip) = (node_ip(0), node_ip(index));
    let link = format!("v-node{}", index + 1);
    sh(&format!(
        "ip netns add {netns}
         ip -n {first} link add {link} type veth peer name eth0 netns {netns}
         ip -n {first} link set {link} up
         ip -n {first} route replace {ip}/32 dev {link}
         ip -n {netns} addr add {ip}/{NODE_SUBNET_BITS} dev eth0
         ip -n {netns} link set lo up
         ip -n {netns} link set eth0 up
         ip -n {netns} route add default via {first_ip} dev eth0
         ip -n {netns} route add {HOST_IP}/32 via {first_ip} dev eth0
         ip route replace {ip}/32 via {first_ip} dev {host_if}"
    ))?;
    node_sysctls(netns)
}

/// Routes `pod_cidr` of node `index` from every other node's namespace.
pub(crate) fn route_pods(namespaces: &[String], index: usize, pod_cidr: &str) -> Result<(), Error> {
    let ip = node_ip(index);
    for (other, netns) in namespaces.iter().enumerate() {
        if other == index {
            continue;
        }
        // Node 1 reaches the others over their own links; the others go through node 1.
        let via = if other == 0 {
            format!("via {ip} dev v-node{}", index + 1)
        } else if index == 0 {
            format!("via {ip} dev eth0")
        } else {
            format!("via {} dev eth0", node_ip(0))
        };
        sh(&format!("ip -n {netns} route replace {pod_cidr} {via}"))?;
    }
    Ok(())
}

fn node_sysctls(netns: &str) -> Result<(), Error> {
    sh(&format!(
        "nsenter --net=/run/netns/{netns} sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1"
    ))
    .map(|_| ())
}
