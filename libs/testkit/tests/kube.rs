//! The testkit's cluster is a real one: pods run on both nodes and reach each other across
//! them by pod address, by Service name (the cluster DNS) and by Service address (kube-proxy);
//! the host reaches a Service too; a container past its memory limit is OOM-killed by the
//! kernel.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use primus_testkit::images::{debian_image, redis_image};
use primus_testkit::kube::KubeCluster;

const WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: redis}
spec:
  replicas: 2
  selector: {matchLabels: {app: redis}}
  template:
    metadata: {labels: {app: redis}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
         labelSelector: {matchLabels: {app: redis}}}
      containers:
      - {name: redis, image: "@REDIS@", imagePullPolicy: Never, ports: [{containerPort: 6379}]}
---
apiVersion: v1
kind: Service
metadata: {name: redis}
spec:
  selector: {app: redis}
  ports: [{port: 6379, targetPort: 6379}]
---
apiVersion: v1
kind: Pod
metadata: {name: client-node1}
spec:
  nodeName: node1
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: "@REDIS@", imagePullPolicy: Never, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: client-node2}
spec:
  nodeName: node2
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: "@REDIS@", imagePullPolicy: Never, command: [sleep, infinity]}
---
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: "@DEBIAN@"
    imagePullPolicy: Never
    command: [perl, -e, "my $x = 'a' x (256 * 1024 * 1024); sleep 5"]
    resources:
      limits: {memory: 64Mi, cpu: 200m}
"#;

#[test]
fn pods_reach_each_other_across_nodes_by_address_name_and_service_and_the_kernel_enforces_limits() {
    let cluster = KubeCluster::shared().expect("the cluster");
    let (redis, redis_archive) = redis_image().expect("redis image");
    let (debian, debian_archive) = debian_image().expect("debian image");
    cluster.import_image(&redis_archive).expect("import");
    cluster.import_image(&debian_archive).expect("import");
    let manifest = WORKLOADS
        .replace("@REDIS@", &redis)
        .replace("@DEBIAN@", &debian);
    let file = cluster.dir().join("workloads.yaml");
    std::fs::write(&file, manifest).expect("write");
    cluster
        .kubectl_run(&["apply", "-f", &file.display().to_string()])
        .expect("apply");
    cluster
        .kubectl_run(&["rollout", "status", "deployment/redis", "--timeout=120s"])
        .expect("redis on both nodes");
    cluster
        .kubectl_run(&[
            "wait",
            "--for=condition=Ready",
            "pod/client-node1",
            "pod/client-node2",
            "--timeout=120s",
        ])
        .expect("clients");
    let servers = cluster
        .kubectl_run(&[
            "get",
            "pods",
            "-l",
            "app=redis",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
        ])
        .expect("redis pods");
    let servers: Vec<(&str, &str)> = servers.lines().filter_map(|l| l.split_once(' ')).collect();
    let mut nodes: Vec<&str> = servers.iter().map(|(node, _)| *node).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, ["node1", "node2"], "one replica per node");

    for client in ["client-node1", "client-node2"] {
        for (node, ip) in &servers {
            assert_eq!(
                ping_from(cluster, client, ip),
                "PONG",
                "{client} -> pod on {node} ({ip})"
            );
        }
        for name in ["redis", "redis.default.svc.cluster.local"] {
            assert_eq!(
                service_ping_from(cluster, client, name),
                "PONG",
                "{client} -> Service {name}"
            );
        }
    }
    let service = cluster
        .kubectl_run(&[
            "get",
            "service",
            "redis",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .expect("the Service's address");
    assert_eq!(
        ping(service.trim()).expect("the host reaches the Service"),
        "+PONG\r\n"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reason = cluster
            .kubectl_run(&[
                "get",
                "pod",
                "hog",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.terminated.reason}",
            ])
            .expect("hog");
        if reason.trim() == "OOMKilled" {
            break;
        }
        assert!(Instant::now() < deadline, "hog not OOM-killed: {reason:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `redis-cli -h host ping` inside pod `client`.
fn ping_from(cluster: &KubeCluster, client: &str, host: &str) -> String {
    cluster
        .kubectl_run(&["exec", client, "--", "redis-cli", "-h", host, "ping"])
        .unwrap_or_else(|e| e.to_string())
        .trim()
        .to_owned()
}

/// [`ping_from`] through a Service: kube-proxy programs a Service's rules after its
/// endpoints became ready (until then the Service refuses connections), so the answer
/// may take a moment; the last one after 30 s.
fn service_ping_from(cluster: &KubeCluster, client: &str, service: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = ping_from(cluster, client, service);
        if answer == "PONG" || Instant::now() >= deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn ping(ip: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect((ip, 6379))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
