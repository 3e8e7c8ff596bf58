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
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
