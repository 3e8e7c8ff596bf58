//! Keys and rows on the wire (`primus_proto::packed`), with a malformed field answered
//! as `INVALID_ARGUMENT`.

use primus_proto::packed;
pub use primus_proto::packed::{encode_f32, encode_keys};
use tonic::Status;

pub fn decode_keys(bytes: &[u8]) -> Result<Vec<u64>, Status> {
    packed::decode_keys("keys", bytes).map_err(|e| Status::invalid_argument(e.to_string()))
}

pub fn decode_f32(field: &str, bytes: &[u8]) -> Result<Vec<f32>, Status> {
    packed::decode_f32(field, bytes).map_err(|e| Status::invalid_argument(e.to_string()))
}
