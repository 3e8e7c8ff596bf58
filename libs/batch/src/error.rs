/// What went wrong turning rows into a minibatch, or bytes back into one.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("column `{column}` is missing (available: {available})")]
    MissingColumn { column: String, available: String },
    #[error("column `{column}` has type {found}; expected {expected}")]
    ColumnType {
        column: String,
        found: String,
        expected: &'static str,
    },
    #[error("column `{column}` row {row}: {message}")]
    BadValue {
        column: String,
        row: usize,
        message: String,
    },
    #[error("dedup groups: {0}")]
    Groups(String),
    #[error("minibatch encoding: {0}")]
    Encoding(String),
}

impl From<arrow::error::ArrowError> for BatchError {
    fn from(e: arrow::error::ArrowError) -> Self {
        Self::Encoding(e.to_string())
    }
}
