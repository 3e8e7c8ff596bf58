/// Every error names the object or URL it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("invalid storage URL {url:?}: {message}")]
    InvalidUrl { url: String, message: String },
    #[error("{url}: not found")]
    NotFound { url: String },
    #[error("{url}: access denied (check the storage credentials): {message}")]
    Denied { url: String, message: String },
    #[error("{url}: {message}")]
    Store { url: String, message: String },
    #[error("{url}: not a readable Parquet file: {message}")]
    Parquet { url: String, message: String },
    #[error("{url}: no column `{column}` (columns: {available})")]
    MissingColumn {
        url: String,
        column: String,
        available: String,
    },
    #[error("{url}: row groups {start}..{end} requested, the file has {available}")]
    RowGroupRange {
        url: String,
        start: usize,
        end: usize,
        available: usize,
    },
}

impl StorageError {
    pub(crate) fn from_store(url: String, error: object_store::Error) -> Self {
        match error {
            object_store::Error::NotFound { .. } => Self::NotFound { url },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Self::Denied {
                url,
                message: error.to_string(),
            },
            other => Self::Store {
                url,
                message: other.to_string(),
            },
        }
    }
}
