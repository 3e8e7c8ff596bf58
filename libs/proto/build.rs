//! Compiles proto/primus/v1/*.proto and proto/onnx/onnx.proto with protox (pure Rust; no protoc on the machine).
use std::path::PathBuf;

const FILES: &[&str] = &[
    "primus/v1/common.proto",
    "primus/v1/api.proto",
    "primus/v1/master.proto",
    "primus/v1/data.proto",
    "primus/v1/ps.proto",
    "primus/v1/serving.proto",
    "primus/v1/hot.proto",
    "onnx/onnx.proto",
];

/// The `bytes` fields a training step moves megabytes of: decoded as `bytes::Bytes`, a
/// slice of the received message instead of a copy of it.
const SHARED_BYTES: &[&str] = &[
    ".primus.v1.LookupRequest.keys",
    ".primus.v1.LookupResponse.rows",
    ".primus.v1.PushRequest.keys",
    ".primus.v1.PushRequest.grads",
    ".primus.v1.DenseTensor.values",
    ".primus.v1.Minibatch.arrow_ipc",
];

#[expect(
    clippy::disallowed_methods,
    reason = "a build script learns its folders from cargo's variables"
)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    for file in FILES {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let descriptors = protox::compile(FILES, [&root])?;
    // The servers' gRPC reflection describes the API from these.
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("file_descriptor_set.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    let mut config = tonic_prost_build::configure();
    for field in SHARED_BYTES {
        config = config.bytes(field);
    }
    config.compile_fds(descriptors)?;
    Ok(())
}
