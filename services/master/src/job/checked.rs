//! A Job checked before anything of it starts: its spec parsed, its Dataset loaded, its
//! model fitted to the Dataset's schema, its mode against what the Dataset holds, and every
//! Parquet prefix it reads holding something. Each refusal is the Job's final condition.

use std::collections::HashMap;

use primus_model::ModelLayout;
use primus_proto::v1::Resource;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::JobSpec;

use super::Outcome;
use super::executors::JobParts;
use crate::context::Context;
use crate::resources::{DatasetError, Resources};
use primus_data_tasks::plan::{Catalog, ListingCache, StreamPlan};
use primus_data_tasks::planning;

/// A Job checked against its Dataset, before anything starts.
pub(super) struct CheckedJob {
    pub(super) spec: JobSpec,
    pub(super) dataset: DatasetSpec,
    pub(super) layout: ModelLayout,
    /// The batch side of the Dataset's streams.
    pub(super) plans: Vec<StreamPlan>,
    /// The mode reads Parquet sources, and stream sources.
    pub(super) reads_batch: bool,
    pub(super) reads_streams: bool,
}

impl CheckedJob {
    /// Parses the spec, loads the Dataset and checks that the model fits its schema, that
    /// the mode finds something to read and that every Parquet prefix holds something.
    pub(super) async fn check<B, C: Catalog>(
        context: &Context<B, C>,
        resource: &Resource,
    ) -> Result<Self, Outcome> {
        let spec: JobSpec = serde_json::from_str(&resource.spec_json)
            .map_err(|e| Outcome::failed("InvalidSpec", format!("spec: {e}")))?;
        let dataset = load_dataset(&context.resources, &spec.dataset).await?;
        let layout = ModelLayout::new(&spec.model, &dataset.schema)
            .map_err(|e| Outcome::failed("ModelMismatch", e.to_string()))?;
        let (reads_batch, reads_streams) = planning::reads(spec.mode);
        planning::check_mode(spec.mode, &dataset)
            .map_err(|message| Outcome::failed("ModeMismatch", message))?;
        if reads_batch {
            check_sources(&context.cache, &dataset).await?;
        }
        let plans = planning::stream_plans(&dataset)
            .map_err(|e| Outcome::failed("InvalidDataset", e.to_string()))?;
        Ok(Self {
            spec,
            dataset,
            layout,
            plans,
            reads_batch,
            reads_streams,
        })
    }

    pub(super) fn parts<'a>(
        &'a self,
        name: &'a str,
        memory_given: &'a HashMap<String, u64>,
    ) -> JobParts<'a> {
        JobParts {
            name,
            spec: &self.spec,
            dataset: &self.dataset,
            layout: &self.layout,
            memory_given,
        }
    }
}

async fn load_dataset(resources: &Resources, name: &str) -> Result<DatasetSpec, Outcome> {
    let spec_json = match resources.dataset(name).await {
        Ok(spec_json) => spec_json,
        Err(DatasetError::Missing) => {
            return Err(Outcome::failed(
                "DatasetMissing",
                format!("spec.dataset: Dataset {name:?} does not exist"),
            ));
        }
        Err(DatasetError::Unreadable(message)) => {
            return Err(Outcome::failed("DatasetUnreadable", message));
        }
    };
    serde_json::from_str(&spec_json)
        .map_err(|e| Outcome::failed("InvalidDataset", format!("Dataset {name:?}: {e}")))
}

/// Every Parquet source's prefix must hold something.
async fn check_sources<C: Catalog>(
    cache: &ListingCache<C>,
    dataset: &DatasetSpec,
) -> Result<(), Outcome> {
    for source in dataset.streams.iter().flat_map(|s| &s.sources) {
        let Some(parquet) = &source.parquet else {
            continue;
        };
        match cache.catalog().exists(&parquet.uri).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Outcome::failed(
                    "DataSourceMissing",
                    format!(
                        "source `{}`: nothing under prefix {}",
                        source.name, parquet.uri
                    ),
                ));
            }
            Err(e) => {
                return Err(Outcome::failed(
                    "DataSourceUnreadable",
                    format!("source `{}`: {e}", source.name),
                ));
            }
        }
    }
    Ok(())
}
