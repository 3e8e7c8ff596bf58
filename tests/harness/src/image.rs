//! The Primus image of this build: deploy/Dockerfile's `prebuilt` target over the
//! workspace's binaries (stripped) and the ONNX Runtime library the tests use, built on the
//! testkit's Docker engine from the testkit's Debian base, and saved as a docker-archive
//! tar that clusters import. Built again only when an input changed.

use std::path::{Path, PathBuf};

use primus_testkit::images::{self, base_layer, debian_image};
use primus_testkit::{DockerEngine, Error};

use crate::sandbox::binary;

/// The image's name, as `k8s/overlays/dev` and `deploy/docker-compose.yaml` name it.
pub const PRIMUS_IMAGE: &str = "primus-rs:dev";

/// The binaries the image holds.
pub const PRIMUS_BINARIES: [&str; 7] = [
    "primus",
    "primus-api-server",
    "primus-master",
    "primus-data-executor",
    "primus-trainer",
    "primus-ps",
    "primus-serving-sync",
];

/// The image's docker-archive tar (building it on [`DockerEngine::shared`] when stale).
pub fn primus_image() -> Result<PathBuf, Error> {
    let root = primus_testkit::repo_root();
    let dockerfile = root.join("deploy/Dockerfile");
    let entrypoint = root.join("deploy/entrypoint.sh");
    let onnxruntime = onnxruntime_library()?;
    let base = base_layer()?;
    let binaries: Vec<PathBuf> = PRIMUS_BINARIES.iter().map(|b| binary(b)).collect();
    let mut inputs: Vec<&Path> = vec![&dockerfile, &entrypoint, &onnxruntime, &base];
    inputs.extend(binaries.iter().map(PathBuf::as_path));
    images::cached("primus-rs", PRIMUS_IMAGE, &inputs, |archive| {
        let engine = DockerEngine::shared()?;
        let (base_tag, base_archive) = debian_image()?;
        engine.load(&base_archive)?;
        let context = tempfile::tempdir().map_err(Error::io("a build context"))?;
        let bin = context.path().join("bin");
        let lib = context.path().join("lib");
        for folder in [&bin, &lib] {
            std::fs::create_dir_all(folder).map_err(Error::io(folder.display().to_string()))?;
        }
        for path in &binaries {
            let name = path.file_name().unwrap_or_default();
            let out = bin.join(name).display().to_string();
            primus_testkit::run(
                "strip",
                &["--strip-debug", "-o", &out, &path.display().to_string()],
            )?;
        }
        let library = onnxruntime.file_name().unwrap_or_default();
        std::fs::copy(&onnxruntime, lib.join(library)).map_err(Error::io("libonnxruntime"))?;
        std::fs::copy(&entrypoint, context.path().join("entrypoint.sh"))
            .map_err(Error::io("entrypoint.sh"))?;
        let base_arg = format!("BASE={base_tag}");
        let output = engine
            .docker()
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "--quiet", "--file"])
            .arg(&dockerfile)
            .args([
                "--target",
                "prebuilt",
                "--build-arg",
                &base_arg,
                "--tag",
                PRIMUS_IMAGE,
            ])
            .arg(context.path())
            .output()
            .map_err(Error::io("docker build"))?;
        if !output.status.success() {
            return Err(Error::Command {
                command: format!("docker build -f {} --target prebuilt", dockerfile.display()),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        engine.docker_run(&[
            "save",
            "--output",
            &archive.display().to_string(),
            PRIMUS_IMAGE,
        ])?;
        Ok(())
    })
}

/// The ONNX Runtime library scripts/install-deps.sh installed (what `ORT_DYLIB_PATH` names).
fn onnxruntime_library() -> Result<PathBuf, Error> {
    let capi = primus_testkit::repo_root().join(".tools/ort/onnxruntime/capi");
    std::fs::read_dir(&capi)
        .ok()
        .and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| {
                (p.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("libonnxruntime.so."))
            })
        })
        .ok_or_else(|| Error::MissingBinary {
            binary: "libonnxruntime.so.*".into(),
            tools: capi.display().to_string(),
            install: "./scripts/install-deps.sh".into(),
        })
}
