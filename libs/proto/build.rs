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
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
