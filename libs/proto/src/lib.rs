//! Generated code for the Primus wire protocol (`proto/primus/v1`) and for the subset of the
//! ONNX model format the model export writes (`proto/onnx`).
//!
//! Owns the generated messages, clients and servers (the `.proto` files at the repository
//! root are the source of truth) and [`role_endpoints`], the one ordering of a topology's
//! endpoints every client of a job's shards relies on, and [`packed`], the encoding of
//! keys and rows in `bytes` fields, and [`MAX_FRAME_SIZE`], the HTTP/2 frames peers may send.

#![warn(missing_docs)]

pub mod packed;

/// `primus.v1`: every service's messages, clients (`*_client`) and servers (`*_server`).
pub mod v1 {
    #![allow(clippy::all, clippy::unwrap_used, missing_docs)]
    // The comments come from the .proto files, written for their readers (`<job>` in a
    // subject is not HTML there).
    #![allow(
        rustdoc::invalid_html_tags,
        rustdoc::broken_intra_doc_links,
        rustdoc::bare_urls
    )]
    tonic::include_proto!("primus.v1");
}

/// Every compiled `.proto` file as an encoded `FileDescriptorSet`, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// The largest HTTP/2 frame a service or a trainer's client lets its peer send: a training
/// step's megabyte messages (dense pushes, minibatches) cross in a few frames instead of
/// one per 16 KiB, HTTP/2's default.
pub const MAX_FRAME_SIZE: u32 = 1 << 20;

/// The response header of `DatasetService.StreamMinibatches` naming the data executor (its
/// id in the Job's topology): what a trainer reports to `TaskService.ReportReceived` if the
/// stream breaks.
pub const EXECUTOR_ID_HEADER: &str = "primus-executor-id";

/// `onnx`: the ONNX model messages the dense-network export builds (see proto/onnx/onnx.proto).
pub mod onnx {
    #![allow(clippy::all, clippy::unwrap_used, missing_docs)]
    // The comments come from the .proto files, written for their readers (`<job>` in a
    // subject is not HTML there).
    #![allow(
        rustdoc::invalid_html_tags,
        rustdoc::broken_intra_doc_links,
        rustdoc::bare_urls
    )]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// `role`'s endpoints ordered by executor index (`ps-2` before `ps-10`): the shard order a
/// job's PS clients route keys by.
pub fn role_endpoints(endpoints: &[v1::Endpoint], role: v1::Role) -> Vec<v1::Endpoint> {
    let mut matching: Vec<v1::Endpoint> = endpoints
        .iter()
        .filter(|e| e.role == role as i32)
        .cloned()
        .collect();
    matching.sort_by_key(|e| {
        e.id.rsplit('-')
            .next()
            .and_then(|i| i.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    matching
}

/// gRPC addresses of [`role_endpoints`], in that order.
pub fn role_addrs(endpoints: &[v1::Endpoint], role: v1::Role) -> Vec<String> {
    role_endpoints(endpoints, role)
        .into_iter()
        .map(|e| e.grpc_addr)
        .collect()
}
