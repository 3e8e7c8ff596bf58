//! k8s/crds installed on a real API server: every example's Dataset and Job applied as
//! custom resources with kubectl, their printer columns and short names, the status
//! subresource, and malformed Jobs refused by the API server naming the field.

use std::sync::OnceLock;

use primus_kube_resources::convert::{custom_resource, resource};
use primus_testkit::kube::KubeCluster;
use serde_json::{Value, json};

/// The shared cluster with k8s/crds installed, once.
pub(super) fn cluster() -> &'static KubeCluster {
    static INSTALLED: OnceLock<&'static KubeCluster> = OnceLock::new();
    INSTALLED.get_or_init(install)
}

fn install() -> &'static KubeCluster {
    let cluster = KubeCluster::shared().expect("the test cluster");
    let crds = primus_testkit::repo_root().join("k8s/crds");
    kubectl(cluster, &["apply", "-k", &crds.display().to_string()]);
    kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "crd/primusjobs.primus.dev",
            "crd/primusdatasets.primus.dev",
            "crd/primusmetrics.primus.dev",
            "--timeout=60s",
        ],
    );
    cluster
}

pub(super) fn kubectl(cluster: &KubeCluster, args: &[&str]) -> String {
    (cluster.kubectl_run(args)).unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
}

/// `primus --kubernetes ARGS` in `namespace`: its output, or its exit code and stderr.
pub(super) fn primus(
    cluster: &KubeCluster,
    namespace: &str,
    args: &[&str],
) -> Result<String, String> {
    let output = std::process::Command::new(primus_harness::binary("primus"))
        .args(["--kubernetes", "--kubeconfig"])
        .arg(cluster.kubeconfig())
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .expect("run primus");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(format!("{}: {stdout}{stderr}", output.status))
    }
}

/// A namespace of its own for each test (they run at once).
pub(super) fn namespace(cluster: &KubeCluster, name: &'static str) -> &'static str {
    kubectl(cluster, &["create", "namespace", name]);
    name
}

/// `kubectl patch --type=merge` of object `name` of `resource` in `namespace`.
pub(super) fn merge_patch(
    cluster: &KubeCluster,
    namespace: &str,
    resource: &str,
    name: &str,
    patch: &str,
) {
    let args = [
        "patch",
        resource,
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        patch,
    ];
    kubectl(cluster, &args);
}

/// Whether `object`'s status holds condition `kind` as true.
pub(super) fn has_condition(object: &Value, kind: &str) -> bool {
    (object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten())
    .any(|c| c["type"] == kind && c["status"] == true)
}

/// `kubectl apply -f` of `objects` in one file, with `flags`; the error is kubectl's.
pub(super) fn apply(
    cluster: &KubeCluster,
    namespace: &str,
    objects: &[Value],
    flags: &[&str],
) -> Result<String, String> {
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    let documents: Vec<String> = objects.iter().map(Value::to_string).collect();
    std::fs::write(file.path(), documents.join("\n---\n")).expect("write the objects");
    let path = file.path().display().to_string();
    let mut args = vec!["apply", "-n", namespace, "-f", &path];
    args.extend_from_slice(flags);
    cluster.kubectl_run(&args).map_err(|e| e.to_string())
}

pub(super) fn get_json(cluster: &KubeCluster, namespace: &str, kind: &str, name: &str) -> Value {
    let text = kubectl(cluster, &["get", kind, name, "-n", namespace, "-o", "json"]);
    serde_json::from_str(&text).expect("kubectl's JSON")
}

/// Every resource of every example file, as its custom resource.
fn examples() -> Vec<Value> {
    let folder = primus_testkit::repo_root().join("examples");
    let mut objects = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("examples/") {
        let path = entry.expect("an example").path();
        let text = std::fs::read_to_string(&path).expect("read an example");
        let resources = primus_spec::parse_documents(&path.display().to_string(), &text)
            .unwrap_or_else(|e| panic!("{e}"));
        for resource in resources {
            objects.push(custom_resource(&resource, None).expect("its custom resource"));
        }
    }
    objects
}

/// examples/criteo-like.yaml's Job as a custom resource named `name`.
fn example_job(name: &str) -> Value {
    let mut job = examples()
        .into_iter()
        .find(|o| o["metadata"]["name"] == "ctr-demo")
        .expect("examples/criteo-like.yaml's Job");
    job["metadata"]["name"] = json!(name);
    job
}

#[test]
fn every_example_applies_as_custom_resources_with_columns_and_short_names() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-examples");
    let objects = examples();
    let applied = apply(cluster, namespace, &objects, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(applied.lines().count(), objects.len(), "{applied}");

    let jobs = kubectl(cluster, &["get", "pjob", "-n", namespace]);
    let header: Vec<&str> = jobs
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PHASE",
            "PROGRESS",
            "SAMPLES",
            "SAMPLES/S",
            "AUC",
            "AGE"
        ],
        "{jobs}"
    );
    let job_count = objects.iter().filter(|o| o["kind"] == "PrimusJob").count();
    assert!(job_count >= 4, "{job_count} example Jobs");
    assert_eq!(jobs.lines().count(), job_count + 1, "{jobs}");
    // Examples of one Dataset each hold it (MovieLens's two): one resource per name.
    let dataset_names: std::collections::BTreeSet<&str> = (objects.iter())
        .filter(|o| o["kind"] == "PrimusDataset")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    let datasets = kubectl(cluster, &["get", "pds", "-n", namespace, "-o", "name"]);
    assert_eq!(datasets.lines().count(), dataset_names.len(), "{datasets}");

    // What is stored reads back as the resource applied.
    for object in &objects {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let stored = get_json(cluster, namespace, kind, name);
        assert_eq!(
            resource(&stored).expect("a valid resource"),
            resource(object).expect("a valid resource"),
            "{kind} {name}"
        );
    }
}

#[test]
fn the_status_subresource_fills_the_columns_and_only_it_changes_status() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-status");
    let name = "status-columns";
    apply(cluster, namespace, &[example_job(name)], &[]).unwrap_or_else(|e| panic!("{e}"));
    let status = json!({"status": {
        "phase": "Running",
        "observed_generation": 1,
        "progress": {"samples": 1200, "steps": 3, "fraction": 0.25,
                     "samples_per_second": 4096.5, "auc": 0.75},
    }});
    let patch = |body: &Value, subresource: &[&str]| {
        let body = body.to_string();
        let mut args = vec![
            "patch",
            "primusjob",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
        ];
        args.push(&body);
        args.extend_from_slice(subresource);
        cluster.kubectl_run(&args).map_err(|e| e.to_string())
    };
    patch(&status, &["--subresource=status"]).expect("patch the status");
    let row = kubectl(
        cluster,
        &["get", "pjob", name, "-n", namespace, "--no-headers"],
    );
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..6],
        [name, "Running", "0.25", "1200", "4096.5", "0.75"],
        "{row}"
    );

    // A status written through the Job itself is ignored, as a spec through status is.
    let through_job = json!({"status": {"phase": "Succeeded"}, "spec": {"dataset": "other"}});
    patch(&through_job, &[]).expect("patch the Job");
    let through_status = json!({"spec": {"dataset": "third"}});
    patch(&through_status, &["--subresource=status"]).expect("patch the status");
    let stored = get_json(cluster, namespace, "primusjob", name);
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(stored["spec"]["dataset"], "other");
    assert_eq!(
        stored["metadata"]["generation"], 2,
        "one spec change, one generation"
    );

    // A status that is not one is refused, naming the field.
    let refused = patch(
        &json!({"status": {"phase": "Sleeping"}}),
        &["--subresource=status"],
    );
    let message = refused.expect_err("an unknown phase is refused");
    assert!(message.contains("status.phase"), "{message}");
}

/// What makes a Job malformed.
type Breakage = fn(&mut Value);

#[test]
fn a_malformed_job_is_refused_by_the_api_server_naming_the_field() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-malformed");
    let cases: [(&str, Breakage, &str); 5] = [
        (
            "a string for a count",
            |job| job["spec"]["topology"]["ps"]["replicas"] = json!("two"),
            "spec.topology.ps.replicas",
        ),
        (
            "an unknown field",
            |job| job["spec"]["modle"] = json!({}),
            "spec.modle",
        ),
        (
            "a required field missing",
            |job| {
                job["spec"]
                    .as_object_mut()
                    .map(|spec| spec.remove("dataset"));
            },
            "spec.dataset",
        ),
        (
            "a mode that is not one",
            |job| job["spec"]["mode"] = json!("sometimes"),
            "spec.mode",
        ),
        (
            "a negative size",
            |job| job["spec"]["training"]["batch_size"] = json!(-4),
            "spec.training.batch_size",
        ),
    ];
    for (case, break_it, field) in cases {
        let mut job = example_job("malformed");
        break_it(&mut job);
        // kubectl checks against the schema the API server publishes; the API server
        // itself refuses too (strict field validation: unknown fields are not pruned).
        let by_kubectl = apply(cluster, namespace, std::slice::from_ref(&job), &[]);
        let by_kubectl = by_kubectl.expect_err(case);
        let leaf = field.rsplit('.').next().unwrap_or(field);
        assert!(
            by_kubectl.contains(leaf),
            "{case}: kubectl names {leaf}: {by_kubectl}"
        );
        let by_server = apply(cluster, namespace, &[job], &["--validate=strict"]);
        let by_server = by_server.expect_err(case);
        assert!(
            by_server.contains(field),
            "{case}: the API server names {field}: {by_server}"
        );
        eprintln!("{case}: {}", by_server.lines().last().unwrap_or_default());
    }
    let left = cluster.kubectl_run(&["get", "pjob", "malformed", "-n", namespace]);
    assert!(left.is_err(), "nothing malformed was stored: {left:?}");
}

#[test]
fn the_cli_applies_gets_describes_and_deletes_custom_resources() {
    let cluster = cluster();
    let namespace = namespace(cluster, "operator-cli");
    let example = primus_testkit::repo_root().join("examples/criteo-like.yaml");
    let example = example.display().to_string();
    let applied =
        primus(cluster, namespace, &["apply", "-f", &example]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        applied.lines().collect::<Vec<_>>(),
        [
            format!("dataset/criteo-like created (namespace {namespace})"),
            format!("job/ctr-demo created (namespace {namespace})"),
        ],
        "{applied}"
    );
    let again =
        primus(cluster, namespace, &["apply", "-f", &example]).unwrap_or_else(|e| panic!("{e}"));
    assert!(again.lines().all(|l| l.contains(" unchanged ")), "{again}");

    let listed = primus(cluster, namespace, &["get", "jobs"]).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listed.lines().any(|l| l.starts_with("ctr-demo ")),
        "{listed}"
    );
    let by_kubectl = kubectl(cluster, &["get", "pjob", "-n", namespace, "-o", "name"]);
    assert_eq!(by_kubectl.trim(), "primusjob.primus.dev/ctr-demo");
    let described = primus(cluster, namespace, &["describe", "dataset", "criteo-like"]);
    assert!(
        described
            .unwrap_or_else(|e| panic!("{e}"))
            .contains("criteo-like")
    );

    let deleted = primus(cluster, namespace, &["delete", "job", "ctr-demo"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        deleted.trim(),
        format!("job/ctr-demo deleted (namespace {namespace})")
    );
    let missing = primus(cluster, namespace, &["get", "job", "ctr-demo"]).expect_err("deleted");
    assert!(
        missing.starts_with("exit status: 1") && missing.contains("not found"),
        "{missing}"
    );
    let watch = primus(cluster, namespace, &["watch", "job", "ctr-demo"]).expect_err("no watch");
    assert!(
        watch.starts_with("exit status: 2") && watch.contains("kubectl get primusjobs -w"),
        "{watch}"
    );
}
