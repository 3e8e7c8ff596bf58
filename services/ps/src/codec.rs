//! Keys and rows on the wire: packed little-endian u64 and f32.

use tonic::Status;

pub fn encode_keys(keys: &[u64]) -> Vec<u8> {
    keys.iter().flat_map(|k| k.to_le_bytes()).collect()
}

pub fn decode_keys(bytes: &[u8]) -> Result<Vec<u64>, Status> {
    if !bytes.len().is_multiple_of(8) {
        return Err(Status::invalid_argument(format!(
            "keys: {} bytes is not a whole number of 8-byte keys",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

pub fn encode_f32(values: &[f32], out: &mut Vec<u8>) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

pub fn decode_f32(field: &str, bytes: &[u8]) -> Result<Vec<f32>, Status> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Status::invalid_argument(format!(
            "{field}: {} bytes is not a whole number of 4-byte floats",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
