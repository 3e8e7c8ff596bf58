//! The workspace's shape, read from `cargo metadata`: a service crate is deployed on its
//! own, so no service and no library depends on a service crate (tests, benchmarks and
//! the CLI may use one as a dev-dependency, to run it in-process); and a service's own
//! crates (`services/<service>/<part>/`) are used by that service alone.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// The workspace's packages, each with its folder (relative to the workspace root) and
/// the names of its normal and build dependencies.
#[expect(
    clippy::disallowed_methods,
    reason = "the cargo that runs the test lists the workspace"
)]
fn packages() -> Vec<(String, String, BTreeSet<String>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(primus_testkit::repo_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let root = metadata["workspace_root"].as_str().expect("workspace_root");
    let packages = metadata["packages"].as_array().expect("packages");
    packages
        .iter()
        .map(|package| {
            let name = package["name"].as_str().expect("name").to_owned();
            let manifest = package["manifest_path"].as_str().expect("manifest_path");
            let folder = manifest
                .strip_prefix(root)
                .unwrap_or(manifest)
                .trim_start_matches('/')
                .trim_end_matches("Cargo.toml")
                .to_owned();
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].as_str() != Some("dev"))
                .map(|d| d["name"].as_str().expect("dependency name").to_owned())
                .collect();
            (name, folder, dependencies)
        })
        .collect()
}

/// The service a package in `folder` belongs to, and whether it is the service's own
/// crate (`services/<service>/`) rather than one of its parts.
fn service_of(folder: &str) -> Option<(&str, bool)> {
    let rest = folder.strip_prefix("services/")?;
    let (service, part) = rest.split_once('/')?;
    Some((service, part.is_empty()))
}

#[test]
fn no_service_or_library_depends_on_a_service_crate() {
    let packages = packages();
    let services: BTreeSet<&str> = packages
        .iter()
        .filter(|(_, folder, _)| service_of(folder).is_some_and(|(_, own)| own))
        .map(|(name, _, _)| name.as_str())
        .collect();
    assert!(
        services.contains("primus-master") && services.contains("primus-trainer"),
        "the services were found: {services:?}"
    );
    let offenders: Vec<String> = packages
        .iter()
        .filter(|(_, folder, _)| folder.starts_with("services/") || folder.starts_with("libs/"))
        .flat_map(|(name, _, dependencies)| {
            dependencies
                .iter()
                .filter(|d| services.contains(d.as_str()))
                .map(move |d| format!("{name} -> {d}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "service crates used as dependencies (move the shared part into libs/): {offenders:?}"
    );
}

#[test]
fn a_services_own_crates_serve_that_service_alone() {
    let packages = packages();
    let part_of: BTreeMap<&str, &str> = (packages.iter())
        .filter_map(|(name, folder, _)| match service_of(folder)? {
            (service, false) => Some((name.as_str(), service)),
            (_, true) => None,
        })
        .collect();
    assert!(
        part_of.get("primus-backend") == Some(&"master"),
        "the master's own crates were found: {part_of:?}"
    );
    let part_of = &part_of;
    let offenders: Vec<String> = (packages.iter())
        .flat_map(|(name, folder, dependencies)| {
            let service = service_of(folder).map(|(service, _)| service);
            (dependencies.iter())
                .filter(move |d| {
                    part_of
                        .get(d.as_str())
                        .is_some_and(|of| Some(*of) != service)
                })
                .map(move |d| format!("{name} -> {d}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "a service's own crates used beyond it (move the shared part into libs/): {offenders:?}"
    );
}
