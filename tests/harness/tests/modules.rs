//! The shape of the crates inside: the top-level modules of each crate (a file or folder
//! under `src/`) import one another without a circle, so each can be read after the ones
//! it names. A module's imports are the `crate::<module>` paths its files mention.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The top-level module a file of `src` belongs to (`lib`, `main` for the roots).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src");
    let first = relative.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_owned()
}

/// The `crate::<name>` paths in `text`, outside comments.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (at, _) in code.match_indices("crate::") {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `primus_crate::`, not this crate
            }
            let name: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

/// Each top-level module of the crate at `src` and the others it imports.
fn module_imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(src, file);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("a source file");
        let named: Vec<String> = (crate_paths(&text).into_iter())
            .filter(|name| *name != module && modules.contains(name))
            .collect();
        imports.entry(module).or_default().extend(named);
    }
    imports
}

/// A circle among `imports`, as the modules on it, if there is one.
fn circle(imports: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        module: &'a str,
        imports: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| *m == module) {
            let mut found: Vec<String> = path[start..].iter().map(|m| m.to_string()).collect();
            found.push(module.to_owned());
            return Some(found);
        }
        if !done.insert(module) {
            return None;
        }
        path.push(module);
        for next in imports.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, imports, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    imports
        .keys()
        .find_map(|module| visit(module, imports, &mut Vec::new(), &mut done))
}

#[test]
fn the_master_and_the_trainer_import_their_modules_without_a_circle() {
    let root = primus_testkit::repo_root();
    for crate_dir in [
        "services/master",
        "services/master/backend",
        "services/master/data-tasks",
        "services/trainer",
        "libs/job-policy",
    ] {
        let imports = module_imports(&root.join(crate_dir).join("src"));
        assert!(
            imports.len() >= 2,
            "{crate_dir}: modules found: {imports:?}"
        );
        if let Some(found) = circle(&imports) {
            panic!(
                "{crate_dir}: modules import each other: {}",
                found.join(" -> ")
            );
        }
    }
}

#[test]
fn a_circle_is_found_and_named() {
    let imports: BTreeMap<String, BTreeSet<String>> = [
        ("feed", vec![]),
        ("prefetch", vec!["feed", "train"]),
        ("train", vec!["feed", "prefetch"]),
    ]
    .into_iter()
    .map(|(m, to)| (m.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circle(&imports),
        Some(vec!["prefetch".into(), "train".into(), "prefetch".into()])
    );
    assert_eq!(
        crate_paths("use crate::feed::Feed; // crate::train\nuse primus_crate::x;"),
        BTreeSet::from(["feed".to_owned()])
    );
}

/// The policies of a Job's status tick: each decides on a snapshot alone.
const POLICIES: [&str; 4] = ["autoscale", "memory", "optimizer", "stragglers"];

/// What a policy's code outside its tests would need to reach outside the process: the Job's
/// run (and through it the backend and the queue), a backend, the task queue, a gRPC
/// client, or anything awaited.
const OUTSIDE: [&str; 6] = [
    "JobRun",
    "ResourceBackend",
    "TaskQueue",
    "_client",
    ".await",
    "tokio::spawn",
];

/// `text` before its `#[cfg(test)]` module, without comments.
fn code_outside_tests(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    (code.lines())
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the policies' crate may not depend on: a backend, the task queue, Redis, NATS.
const NOT_DEPENDED_ON: [&str; 5] = [
    "primus-backend",
    "primus-data-tasks",
    "redis",
    "async-nats",
    "primus-bus",
];

#[test]
fn the_policies_of_a_jobs_status_tick_decide_without_reaching_outside_the_process() {
    let crate_dir = primus_testkit::repo_root().join("libs/job-policy");
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("its manifest");
    for dependency in NOT_DEPENDED_ON {
        assert!(
            !manifest.lines().any(|l| l.starts_with(dependency)),
            "primus-job-policy depends on {dependency}: its policies decide on a Snapshot alone"
        );
    }
    let src = crate_dir.join("src");
    for policy in POLICIES {
        let file = src.join(format!("{policy}.rs"));
        let text = std::fs::read_to_string(&file).expect("a policy's file");
        let code = code_outside_tests(&text);
        assert!(code.contains("fn decide"), "{policy}.rs decides nothing");
        for token in OUTSIDE {
            assert!(
                !code.contains(token),
                "{policy}.rs mentions `{token}`: a policy decides on a Snapshot and returns Actions; the master's job/actions.rs carries them out"
            );
        }
    }
    assert_eq!(
        code_outside_tests("fn a() {} // x.await\n#[cfg(test)]\nmod t { y.await }"),
        "fn a() {} "
    );
}
