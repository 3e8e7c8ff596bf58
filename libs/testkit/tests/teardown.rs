//! A cluster or a Docker engine whose test process is killed (SIGKILL, no destructor runs)
//! leaves nothing behind: its watchdog stops every process and container, unmounts, deletes
//! the network namespaces and host routes, removes the cgroups and folders. Each test runs
//! itself again as the process to kill.

#![expect(
    clippy::print_stdout,
    reason = "the child process tells its parent where its fixture is on stdout"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use primus_testkit::DockerEngine;
use primus_testkit::kube::KubeCluster;

const CHILD: &str = "PRIMUS_TESTKIT_TEARDOWN_CHILD";

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "the test runs itself as the child it kills, told so by a variable"
)]
fn a_killed_test_process_leaves_no_trace_of_its_cluster() {
    if std::env::var_os(CHILD).is_some_and(|c| c == "kube") {
        let cluster = KubeCluster::start().expect("cluster");
        // A pod on each node: containers, their network namespaces, volume mounts.
        let pods = cluster.dir().join("pods.yaml");
        let manifest: String = cluster
            .node_names()
            .iter()
            .map(|node| {
                format!(
                    "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: on-{node}}}\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: c, image: {}, imagePullPolicy: Never}}\n",
                    primus_testkit::images::PAUSE_IMAGE
                )
            })
            .collect();
        std::fs::write(&pods, manifest).expect("pods.yaml");
        let path = pods.display().to_string();
        cluster.kubectl_run(&["apply", "-f", &path]).expect("apply");
        cluster
            .kubectl_run(&[
                "wait",
                "--for=condition=Ready",
                "pod",
                "--all",
                "--timeout=60s",
            ])
            .expect("pods ready");
        println!("UP {}", cluster.dir().display());
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let (mut child, dir) = child(
        "kube",
        "a_killed_test_process_leaves_no_trace_of_its_cluster",
    );
    let pid = child.id();
    assert!(Path::new(&dir).join("parts/node2").is_dir(), "{dir}");
    let netns_prefix = format!("primus-k{pid}-");
    assert!(
        netns(&netns_prefix).len() == 2,
        "{:?}",
        netns(&netns_prefix)
    );
    assert!(!processes(&dir).is_empty());
    assert_eq!(netns("cni-").len(), 2, "a pod namespace per node");

    kill_and_wait_for_teardown(&mut child, &dir);
    assert_eq!(processes(&dir), Vec::<String>::new(), "processes left");
    assert_eq!(
        netns(&netns_prefix),
        Vec::<String>::new(),
        "namespaces left"
    );
    let cni: Vec<String> = netns("cni-");
    assert_eq!(cni, Vec::<String>::new(), "pod namespaces left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&dir), "mounts left under {dir}");
    let cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .expect("memory cgroups")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&netns_prefix))
        .collect();
    assert_eq!(cgroups, Vec::<String>::new(), "cgroups left");
    let routes = String::from_utf8(
        Command::new("ip")
            .arg("route")
            .output()
            .expect("ip route")
            .stdout,
    )
    .expect("utf-8");
    assert!(
        !routes.contains("10.244.0.0/16"),
        "host routes left:\n{routes}"
    );
    for path in ["/var/lib/kubelet", "/var/log/containers", "/var/lib/cni"] {
        assert!(!Path::new(path).exists(), "{path} left");
    }
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "the test runs itself as the child it kills, told so by a variable"
)]
fn a_killed_test_process_leaves_no_trace_of_its_docker_engine() {
    if std::env::var_os(CHILD).is_some_and(|c| c == "docker") {
        let engine = DockerEngine::start().expect("dockerd");
        let (tag, archive) = primus_testkit::images::debian_image().expect("an image");
        engine.load(&archive).expect("docker load");
        engine
            .docker_run(&[
                "run",
                "-d",
                "--name",
                "sleeper",
                "-p",
                "8080:8080",
                &tag,
                "sleep",
                "600",
            ])
            .expect("docker run");
        println!("UP {}", engine.dir().display());
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let (mut child, dir) = child(
        "docker",
        "a_killed_test_process_leaves_no_trace_of_its_docker_engine",
    );
    let netns_name = format!("primus-d{}", child.id());
    assert_eq!(netns(&netns_name), std::slice::from_ref(&netns_name));
    assert!(!processes(&dir).is_empty());
    kill_and_wait_for_teardown(&mut child, &dir);
    assert_eq!(processes(&dir), Vec::<String>::new(), "processes left");
    assert_eq!(netns(&netns_name), Vec::<String>::new(), "namespaces left");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&dir), "mounts left under {dir}");
    let sleepers: Vec<String> = processes("sleep 600");
    assert_eq!(
        sleepers,
        Vec::<String>::new(),
        "the container is still running"
    );
}

/// Runs this test binary again as the child of kind `kind`, running only `test`, and
/// returns once it printed the folder of its fixture.
fn child(kind: &str, test: &str) -> (std::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture"])
        .env(CHILD, kind)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the test binary again");
    let stdout = child.stdout.take().expect("stdout");
    let dir = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("UP ").map(str::to_owned))
        .expect("the child's fixture came up");
    (child, dir)
}

/// SIGKILLs `child` and waits for its fixture's folder to go (its watchdog's teardown).
fn kill_and_wait_for_teardown(child: &mut std::process::Child, dir: &str) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Path::new(dir).exists() {
        assert!(Instant::now() < deadline, "{dir} still there after 120 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Network namespaces whose names start with `prefix`.
fn netns(prefix: &str) -> Vec<String> {
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Processes whose command line contains `text`.
fn processes(text: &str) -> Vec<String> {
    processes_where(|cmdline| cmdline.contains(text))
}

/// Processes whose command line passes `matches`.
fn processes_where(matches: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let state = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let zombie = state
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z'));
        if !zombie && matches(&cmdline) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}
