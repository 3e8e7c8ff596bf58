//! Generated code for the Primus wire protocol (`proto/primus/v1`).
//!
//! Owns nothing but the generated messages, clients and servers; the `.proto` files at the
//! repository root are the source of truth.

/// `primus.v1`: every service's messages, clients (`*_client`) and servers (`*_server`).
pub mod v1 {
    #![allow(clippy::all, clippy::unwrap_used, missing_docs)]
    tonic::include_proto!("primus.v1");
}
