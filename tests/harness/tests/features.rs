//! One build of each dependency for every feature set the scripts build: the quickstart's
//! services without their optional features, the workspace with them (what
//! `scripts/test.sh` lints and tests) and the workspace with the model's `cuda` feature
//! resolve every third-party crate they share with the same features (`cargo tree`), so
//! that none of the three rebuilds what another built. A dependency whose features differ
//! is named with what to add to `libs/unified-features/Cargo.toml`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each package of the selection (`name vX.Y.Z`, with its source for workspace members)
/// and the features it resolves for the host target.
type Resolved = BTreeMap<String, BTreeSet<String>>;

/// `cargo tree` over `selection`, as packages and their features.
#[expect(
    clippy::disallowed_methods,
    reason = "the cargo that runs the test resolves the builds"
)]
fn resolve(selection: &[String], edges: &str) -> Resolved {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = host_target();
    let output = Command::new(cargo)
        .current_dir(primus_testkit::repo_root())
        .args([
            "tree", "--locked", "--prefix", "none", "--format", "{p}|{f}",
        ])
        .args(["--edges", edges, "--target", &host])
        .args(selection)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo tree {selection:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut resolved = Resolved::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((package, features)) = line.split_once('|') else {
            continue;
        };
        let features = features.split(',').filter(|f| !f.is_empty());
        (resolved.entry(package.to_owned()).or_default()).extend(features.map(str::to_owned));
    }
    resolved
}

/// The host's target triple (`rustc -vV`).
#[expect(
    clippy::disallowed_methods,
    reason = "the rustc that builds the test names its host"
)]
fn host_target() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(rustc).arg("-vV").output().expect("rustc runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let host = text.lines().find_map(|l| l.strip_prefix("host: "));
    host.expect("rustc -vV names its host").to_owned()
}

/// The quickstart's packages: `SERVICE_PACKAGES` in scripts/env.sh.
fn service_packages() -> Vec<String> {
    let env = std::fs::read_to_string(primus_testkit::repo_root().join("scripts/env.sh"))
        .expect("scripts/env.sh");
    let list = env
        .split_once("SERVICE_PACKAGES=(")
        .expect("SERVICE_PACKAGES in env.sh");
    let list = list.1.split_once(')').expect("the list's end").0;
    list.split_whitespace().map(str::to_owned).collect()
}

/// The third-party packages both resolve whose features differ, with the features of the
/// larger build.
fn differences(with: &Resolved, without: &Resolved) -> Vec<String> {
    let third_party = |package: &&String| !package.contains('(');
    (without.keys().filter(third_party))
        .filter_map(|package| {
            let (wanted, got) = (with.get(package)?, &without[package]);
            (wanted != got).then(|| {
                let missing: Vec<_> = wanted.symmetric_difference(got).collect();
                format!("{package}: {missing:?} (resolved as {wanted:?} by the larger build)")
            })
        })
        .collect()
}

fn workspace(features: &[&str]) -> Vec<String> {
    let mut selection = vec!["--workspace".to_owned()];
    selection.extend(features.iter().map(|f| format!("--features={f}")));
    selection
}

#[test]
fn the_quickstarts_build_shares_every_dependency_with_the_workspaces() {
    let with = resolve(&workspace(&[]), "normal,build,dev");
    let mut quickstart = vec!["--no-default-features".to_owned()];
    quickstart.extend(service_packages().iter().map(|p| format!("--package={p}")));
    let without = resolve(&quickstart, "normal,build");
    assert!(
        without.keys().any(|p| p.starts_with("tokio ")),
        "the quickstart's selection resolves its dependencies: {without:?}"
    );
    let differ = differences(&with, &without);
    assert!(
        differ.is_empty(),
        "the quickstart's build resolves these dependencies with other features than the \
         workspace's, so one of them builds them again; add the features to \
         libs/unified-features/Cargo.toml:\n{}",
        differ.join("\n")
    );
}

#[test]
fn the_models_cuda_tests_share_every_dependency_with_the_workspaces() {
    let without = resolve(&workspace(&[]), "normal,build,dev");
    let with = resolve(&workspace(&["primus-model/cuda"]), "normal,build,dev");
    assert!(
        with.keys().any(|p| p.starts_with("burn-cuda ")),
        "the cuda selection resolves burn's CUDA backend: {with:?}"
    );
    let differ = differences(&with, &without);
    assert!(
        differ.is_empty(),
        "the workspace with primus-model/cuda resolves these dependencies with other \
         features than without it, so its tests build them again; add the features to \
         libs/unified-features/Cargo.toml:\n{}",
        differ.join("\n")
    );
}
