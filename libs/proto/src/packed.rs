//! Keys and rows in proto `bytes` fields: packed little-endian u64 keys and f32 values.

/// A packed field whose length is not a whole number of its items.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {len} bytes is not a whole number of {width}-byte {items}")]
pub struct PackedError {
    /// The field.
    pub field: String,
    /// Its length in bytes.
    pub len: usize,
    width: usize,
    items: &'static str,
}

/// A malformed packed field in a request is the caller's mistake.
impl From<PackedError> for tonic::Status {
    fn from(error: PackedError) -> Self {
        tonic::Status::invalid_argument(error.to_string())
    }
}

/// `keys` as little-endian bytes.
pub fn encode_keys(keys: &[u64]) -> Vec<u8> {
    #[cfg(target_endian = "little")]
    return bytemuck::cast_slice(keys).to_vec();
    #[cfg(not(target_endian = "little"))]
    return keys.iter().flat_map(|k| k.to_le_bytes()).collect();
}

/// Appends `values` as little-endian bytes to `out`.
pub fn encode_f32(values: &[f32], out: &mut Vec<u8>) {
    // One copy, without zeroing the space first: dense pushes are megabytes a step.
    #[cfg(target_endian = "little")]
    out.extend_from_slice(bytemuck::cast_slice(values));
    #[cfg(not(target_endian = "little"))]
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
}

/// `field`'s keys.
pub fn decode_keys(field: &str, bytes: &[u8]) -> Result<Vec<u64>, PackedError> {
    check(field, bytes, 8, "keys")?;
    // Collected from an exact-size iterator: one allocation, filled once (not zeroed first).
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// `field`'s floats.
pub fn decode_f32(field: &str, bytes: &[u8]) -> Result<Vec<f32>, PackedError> {
    check(field, bytes, 4, "floats")?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn check(field: &str, bytes: &[u8], width: usize, items: &'static str) -> Result<(), PackedError> {
    if bytes.len().is_multiple_of(width) {
        Ok(())
    } else {
        Err(PackedError {
            field: field.to_owned(),
            len: bytes.len(),
            width,
            items,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_ragged_fields_are_named() {
        let keys = [0, 7, u64::MAX];
        assert_eq!(decode_keys("keys", &encode_keys(&keys)), Ok(keys.to_vec()));
        let mut bytes = Vec::new();
        encode_f32(&[1.5, -0.0, f32::MAX], &mut bytes);
        assert_eq!(decode_f32("rows", &bytes), Ok(vec![1.5, -0.0, f32::MAX]));
        let mut appended = vec![9];
        encode_f32(&[1.0], &mut appended);
        assert_eq!(appended, [9, 0, 0, 0x80, 0x3f], "appended, little-endian");
        let error = decode_keys("keys", &[0; 9]).expect_err("ragged");
        assert_eq!(
            error.to_string(),
            "keys: 9 bytes is not a whole number of 8-byte keys"
        );
        let error = decode_f32("grads", &[0; 6]).expect_err("ragged");
        assert_eq!(
            error.to_string(),
            "grads: 6 bytes is not a whole number of 4-byte floats"
        );
    }
}
