/// Every error names the object or URL it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A URL no store can be opened for.
    #[error("invalid storage URL {url:?}: {message}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// No object there.
    #[error("{url}: not found")]
    NotFound {
        /// The object.
        url: String,
    },
    /// The store refused the credentials.
    #[error("{url}: access denied (check the storage credentials): {message}")]
    Denied {
        /// The object.
        url: String,
        /// What it said.
        message: String,
    },
    /// The store failed otherwise.
    #[error("{url}: {message}")]
    Store {
        /// The object.
        url: String,
        /// What it said.
        message: String,
    },
    /// The object is not a Parquet file this build reads.
    #[error("{url}: not a readable Parquet file: {message}")]
    Parquet {
        /// The object.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A column asked for is not in the file.
    #[error("{url}: no column `{column}` (columns: {available})")]
    MissingColumn {
        /// The file.
        url: String,
        /// The column.
        column: String,
        /// The columns there are.
        available: String,
    },
    /// Row groups beyond the file's.
    #[error("{url}: row groups {start}..{end} requested, the file has {available}")]
    RowGroupRange {
        /// The file.
        url: String,
        /// First row group asked for.
        start: usize,
        /// Row group after the last asked for.
        end: usize,
        /// Row groups in the file.
        available: usize,
    },
}

impl StorageError {
    /// Whether the store could not be reached or failed on its side, so that the same call
    /// may succeed later; a missing object, refused credentials or an unreadable file do
    /// not change by waiting.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Store { .. })
    }

    pub(crate) fn from_store(url: String, error: object_store::Error) -> Self {
        match error {
            object_store::Error::NotFound { .. } => Self::NotFound { url },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Self::Denied {
                url,
                message: error.to_string(),
            },
            other => {
                let message = without_java_stack(&other.to_string());
                // The HDFS client reports the namenode's refusal (a Java exception's name)
                // and a failed Kerberos login (GSSAPI) as generic errors.
                if message.contains("AccessControlException") || message.contains("GSSAPI error") {
                    Self::Denied { url, message }
                } else {
                    Self::Store { url, message }
                }
            }
        }
    }
}

/// The namenode's exceptions arrive with their Java stack trace; the first line says it all.
fn without_java_stack(message: &str) -> String {
    message
        .split_once("\n\tat ")
        .map_or(message, |(head, _)| head)
        .trim_end()
        .to_owned()
}
