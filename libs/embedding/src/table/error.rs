//! What a table refuses, and the checks every caller's input goes through first, so a
//! refused call changes nothing.

use primus_gpu::GpuError;

/// Why a table refused a call; nothing changed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EmbeddingError {
    /// A table needs at least one float per row.
    #[error("table {table}: dim must be > 0")]
    ZeroDim {
        /// The table.
        table: String,
    },
    /// The shard count is not a power of two in range.
    #[error("table {table}: shard count {shards} must be a power of two between 1 and 4096")]
    Shards {
        /// The table.
        table: String,
        /// The shard count asked for.
        shards: usize,
    },
    /// Values that are not a whole row per key.
    #[error("{what} has {got} floats; {keys} keys of dim {dim} need {want}")]
    Width {
        /// What the values are (`gradients`, `rows`).
        what: &'static str,
        /// Floats given.
        got: usize,
        /// Keys given.
        keys: usize,
        /// Floats per key.
        dim: usize,
        /// Floats needed.
        want: usize,
    },
    /// A gradient value is NaN or infinite.
    #[error("gradient for key {key} (position {position}) is not finite")]
    NonFinite {
        /// The key.
        key: u64,
        /// Its position in the call.
        position: usize,
    },
    /// A hot-row replica was asked for a key it does not hold.
    #[error("table {table}: key {key} is not among the replicated hot rows")]
    NotHot {
        /// The table.
        table: String,
        /// The key.
        key: u64,
    },
    /// Rows on a device need an optimizer with a device kernel.
    #[error(
        "table {table}: optimizer {optimizer} has no device kernel; a table whose rows live on a device needs adagrad or adam"
    )]
    NoKernel {
        /// The table.
        table: String,
        /// Its optimizer.
        optimizer: &'static str,
    },
    /// The device holding the rows failed.
    #[error("table {table}: device: {reason}")]
    Device {
        /// The table.
        table: String,
        /// What the device said.
        reason: String,
    },
}

pub(crate) fn device_error(table: &str, error: GpuError) -> EmbeddingError {
    EmbeddingError::Device {
        table: table.to_owned(),
        reason: error.to_string(),
    }
}

/// `dim` finite gradient floats for each of `keys`.
pub(crate) fn check_gradients(
    keys: &[u64],
    grads: &[f32],
    dim: usize,
) -> Result<(), EmbeddingError> {
    check_width("gradients", keys.len(), grads.len(), dim)?;
    match first_non_finite(grads) {
        Some(bad) => Err(EmbeddingError::NonFinite {
            key: keys[bad / dim],
            position: bad / dim,
        }),
        None => Ok(()),
    }
}

/// Where the first NaN or infinity of `values` is. Every push checks all its floats, so the
/// common answer (none) is found in one pass that vectorizes, without a branch per float.
pub(crate) fn first_non_finite(values: &[f32]) -> Option<usize> {
    if values.iter().fold(true, |finite, v| finite & v.is_finite()) {
        return None;
    }
    values.iter().position(|v| !v.is_finite())
}

/// `got` floats must be `per_key` for each of `keys` keys.
pub(crate) fn check_width(
    what: &'static str,
    keys: usize,
    got: usize,
    per_key: usize,
) -> Result<(), EmbeddingError> {
    let want = keys * per_key;
    if got == want {
        Ok(())
    } else {
        Err(EmbeddingError::Width {
            what,
            got,
            keys,
            dim: per_key,
            want,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::first_non_finite;

    #[test]
    fn the_first_nan_or_infinity_is_found() {
        assert_eq!(first_non_finite(&[]), None);
        assert_eq!(
            first_non_finite(&[0.0, -1.5, f32::MAX, f32::MIN_POSITIVE]),
            None
        );
        let mut values = vec![0.25f32; 100];
        values[70] = f32::NEG_INFINITY;
        values[41] = f32::NAN;
        assert_eq!(first_non_finite(&values), Some(41));
        values[3] = f32::INFINITY;
        assert_eq!(first_non_finite(&values), Some(3));
    }
}
