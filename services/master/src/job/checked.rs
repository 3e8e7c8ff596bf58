//! A Job checked before anything of it starts: its spec parsed, its Dataset loaded, its
//! model fitted to the Dataset's schema, its mode against what the Dataset holds, and every
//! Parquet prefix it reads holding something. Each refusal is the Job's final condition; a
//! store out of reach is waited out first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use primus_model::ModelLayout;
use primus_proto::v1::Resource;
use primus_spec::dataset::DatasetSpec;
use primus_spec::job::JobSpec;

use super::Outcome;
use super::executors::JobParts;
use super::status::JobStatus;
use crate::context::Context;
use crate::resources::{DatasetError, Resources};
use primus_data_tasks::plan::{Catalog, ListingCache, StreamPlan};
use primus_data_tasks::planning::{self, SourceError};

/// The condition a Job whose source's store is out of reach shows while it waits.
const DATA_SOURCES: &str = "DataSources";

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
        writer: &mut JobStatus,
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
            let outage_timeout =
                Duration::from_secs(context.settings.master.planner.store_outage_timeout_s);
            check_sources(&context.cache, &dataset, outage_timeout, writer).await?;
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

/// Every Parquet source's prefix must hold something. A store out of reach is tried again
/// for up to `master.planner.store_outage_timeout_s`, the Job's `DataSources` condition
/// saying so meanwhile.
async fn check_sources<C: Catalog>(
    cache: &ListingCache<C>,
    dataset: &DatasetSpec,
    outage_timeout: Duration,
    writer: &mut JobStatus,
) -> Result<(), Outcome> {
    let started = Instant::now();
    loop {
        let error = match planning::check_sources(cache.catalog().as_ref(), dataset).await {
            Ok(()) => break,
            Err(error) => error,
        };
        let waited = started.elapsed();
        if !error.is_transient() {
            let reason = match error {
                SourceError::Missing { .. } => "DataSourceMissing",
                SourceError::Unreadable { .. } => "DataSourceUnreadable",
            };
            return Err(Outcome::failed(reason, error.to_string()));
        }
        if waited >= outage_timeout {
            return Err(Outcome::failed(
                "DataSourceUnreadable",
                format!(
                    "{error} (the store was out of reach for {} s, master.planner.store_outage_timeout_s)",
                    waited.as_secs()
                ),
            ));
        }
        tracing::warn!(%error, "the Job waits for its source's store");
        let message = format!(
            "{error}; tried again for up to {} s",
            outage_timeout.as_secs()
        );
        writer.condition(DATA_SOURCES, false, "StoreOutOfReach", message);
        writer.write().await;
        tokio::time::sleep(planning::OUTAGE_RETRY).await;
    }
    let waited = writer
        .status
        .conditions
        .iter()
        .any(|c| c.kind == DATA_SOURCES);
    if waited {
        let message = "every Parquet source holds data".to_owned();
        writer.condition(DATA_SOURCES, true, "Readable", message);
    }
    Ok(())
}
