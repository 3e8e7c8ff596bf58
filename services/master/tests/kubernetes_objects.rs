//! Every object the Kubernetes backend creates for each example Job, rendered by its own
//! code from the executors the master gives the Job, passes `kubernetes-validate --strict`.

use std::path::PathBuf;
use std::process::Command;

use primus_backend::kubernetes::render::{self, JobOwner, RenderContext};
use primus_config::{KubernetesBackendSettings, MasterSettings};
use primus_spec::Resource;

/// The oldest Kubernetes the backend's types model (`k8s-openapi`'s `v1_33`).
const KUBERNETES_VERSION: &str = "1.33.0";

/// The files of example Jobs: `examples/` and the Kubernetes example's.
fn example_files() -> Vec<PathBuf> {
    let root = primus_testkit::repo_root();
    let mut files: Vec<PathBuf> = (std::fs::read_dir(root.join("examples")).expect("examples/"))
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.push(root.join("k8s/example/ctr-k8s.yaml"));
    files
}

/// Every object the backend creates for every example Job, as YAML documents.
fn rendered_examples(settings: &MasterSettings) -> (Vec<String>, usize) {
    let context = RenderContext {
        settings: &settings.kubernetes,
        shard: "0-1".into(),
        master_addr: "master-0.master.primus.svc:7071".into(),
    };
    let mut documents = Vec::new();
    let mut jobs = 0;
    for path in example_files() {
        let text = std::fs::read_to_string(&path).expect("example");
        let resources =
            primus_spec::parse_documents(&path.display().to_string(), &text).expect("parses");
        let datasets: Vec<_> = (resources.iter())
            .filter_map(|r| match r {
                Resource::Dataset(d) => Some(d),
                _ => None,
            })
            .collect();
        for resource in &resources {
            let Resource::Job(job) = resource else {
                continue;
            };
            let name = &job.metadata.name;
            let dataset = (datasets.iter())
                .find(|d| d.metadata.name == job.spec.dataset)
                .unwrap_or_else(|| panic!("{}: no Dataset {}", path.display(), job.spec.dataset));
            let owner = render::job_owner(&context, name);
            let owned_by = JobOwner {
                name: owner.metadata.name.clone().expect("name"),
                // The API server gives the uid; any well-formed one validates alike.
                uid: "6f1c2a9e-3b7d-4c1e-9a2b-0d8e5f4a7c31".into(),
            };
            documents.push(serde_yaml_ng::to_string(&owner).expect("yaml"));
            let executors = primus_master::job_executors(settings, name, &job.spec, &dataset.spec)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!executors.is_empty(), "{}", path.display());
            for spec in &executors {
                let config =
                    render::executor_settings(&context, spec, &owned_by).expect("settings");
                let pod = render::executor_pod(&context, spec, &owned_by).expect("pod");
                documents.push(serde_yaml_ng::to_string(&config).expect("yaml"));
                documents.push(serde_yaml_ng::to_string(&pod).expect("yaml"));
            }
            jobs += 1;
        }
    }
    (documents, jobs)
}

#[test]
fn kubernetes_objects_of_every_example_job_pass_strict_validation() {
    let settings = MasterSettings {
        kubernetes: KubernetesBackendSettings {
            namespace: Some("primus".into()),
            service_account: Some("executor".into()),
            node_selector: [("kubernetes.io/os".to_owned(), "linux".to_owned())].into(),
            // Pods of a gang: the PodGroup annotation and the gang scheduler's name.
            pod_group: true,
            scheduler_name: Some("volcano".into()),
            ..KubernetesBackendSettings::default()
        },
        ..MasterSettings::default()
    };
    let (documents, jobs) = rendered_examples(&settings);
    assert!(jobs >= 8, "example Jobs rendered: {jobs}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, documents.join("---\n")).expect("write");
    let output = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubernetes-validate did not run ({e}): scripts/install-deps.sh installs it, \
                 scripts/env.sh puts it on PATH"
            )
        });
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let valid = report.matches("INFO").count();
    assert_eq!(valid, documents.len(), "{report}");
    eprintln!(
        "kubernetes-validate --strict ({KUBERNETES_VERSION}): {valid} objects of {jobs} example Jobs valid"
    );
}
