//! Generated code for the Primus wire protocol (`proto/primus/v1`) and for the subset of the
//! ONNX model format the model export writes (`proto/onnx`).
//!
//! Owns nothing but the generated messages, clients and servers; the `.proto` files at the
//! repository root are the source of truth.

/// `primus.v1`: every service's messages, clients (`*_client`) and servers (`*_server`).
pub mod v1 {
    #![allow(clippy::all, clippy::unwrap_used, missing_docs)]
    tonic::include_proto!("primus.v1");
}

/// `onnx`: the ONNX model messages the dense-network export builds (see proto/onnx/onnx.proto).
pub mod onnx {
    #![allow(clippy::all, clippy::unwrap_used, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
