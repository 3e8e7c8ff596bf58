/// What went wrong turning rows into a minibatch, or bytes back into one.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A column the schema names is not in the rows.
    #[error("column `{column}` is missing (available: {available})")]
    MissingColumn {
        /// The column.
        column: String,
        /// The columns there are.
        available: String,
    },
    /// A column's type does not fit its feature.
    #[error("column `{column}` has type {found}; expected {expected}")]
    ColumnType {
        /// The column.
        column: String,
        /// Its type.
        found: String,
        /// The types that fit.
        expected: &'static str,
    },
    /// A value the feature cannot take.
    #[error("column `{column}` row {row}: {message}")]
    BadValue {
        /// The column.
        column: String,
        /// The row.
        row: usize,
        /// What is wrong.
        message: String,
    },
    /// The RecD dedup groups are inconsistent.
    #[error("dedup groups: {0}")]
    Groups(String),
    /// The minibatch's bytes are not a minibatch.
    #[error("minibatch encoding: {0}")]
    Encoding(String),
}

impl From<arrow_schema::ArrowError> for BatchError {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Self::Encoding(e.to_string())
    }
}
