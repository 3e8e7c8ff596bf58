//! The serving role (Monolith §2.2.3): replicas of the job's tables without optimizer state,
//! fed by serving-sync's deltas (ApplyDelta), and the dense network as an ONNX model
//! (LoadDense). Predict turns raw features into keys and dense values with the training
//! feature pipeline, pools the rows and runs the model; it is served over gRPC and as
//! `POST /v1/predict` (JSON) on the same port, behind the same bearer tokens when
//! `serving.token_file` is set.

mod checkpoint;
mod dense;
mod features;
mod http;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use primus_batch::FeaturePipeline;
use primus_embedding::{DeltaRows, ReplicaTable};
use primus_model::ModelLayout;
use primus_model::pooling::{BatchKeys, CpuKernels};
use primus_proto::v1::serving_service_server::{ServingService, ServingServiceServer};
use primus_proto::v1::{
    ApplyDeltaRequest, ApplyDeltaResponse, DumpRowsRequest, DumpRowsResponse, HeadPredictions,
    LoadCheckpointRequest, LoadCheckpointResponse, LoadDenseRequest, LoadDenseResponse,
    PredictRequest, PredictResponse, ReplicaStateRequest, ReplicaStateResponse, SourceVersion,
    TableDelta,
};
use primus_service::{BearerTokens, Node, Services, Shutdown};
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub use dense::{DenseError, DenseInputs, DenseModel, DensePredictions};
pub use features::{SampleError, record_batch};
use primus_config::{PsSettings, ServingSettings, StorageSettings};
use primus_proto::packed::{decode_f32, decode_keys, encode_f32, encode_keys};

/// The span of one Predict (gRPC or HTTP): its samples, and what the answer used (filled
/// in by [`Replica::answer`]).
fn predict_span(samples: usize) -> tracing::Span {
    tracing::info_span!(
        "serving.predict",
        primus.samples = samples,
        primus.sparse_version = tracing::field::Empty,
        primus.dense_version = tracing::field::Empty,
        primus.applied = tracing::field::Empty,
    )
}

/// Runs the serving role until `shutdown`.
pub async fn run(settings: PsSettings, shutdown: Shutdown) -> anyhow::Result<()> {
    let replica = Arc::new(Replica::new(&settings)?);
    let mut node = Node::bind(crate::SERVICE, &settings.server).await?;
    let bus = node.connect_nats(&settings.nats).await?;
    let server = ServingServiceServer::new(ServingApi {
        replica: replica.clone(),
    })
    .max_decoding_message_size(settings.ps.max_request_bytes)
    .max_encoding_message_size(usize::MAX);
    let http = http::routes(replica, settings.ps.max_request_bytes);
    node.serve(Services::new().grpc(server).http(http), shutdown)
        .await?;
    bus.drain().await?;
    Ok(())
}

/// What one serving replica holds.
pub struct Replica {
    job: String,
    tables: HashMap<String, ReplicaTable>,
    layout: ModelLayout,
    pipeline: FeaturePipeline,
    serving: ServingSettings,
    library: PathBuf,
    dense: Arc<dense::DenseSlot>,
    /// Per training shard: every change up to this version is applied.
    applied: Mutex<HashMap<String, u64>>,
    newest_row: AtomicU64,
    /// Where checkpoints are read from (LoadCheckpoint).
    storage: StorageSettings,
    /// Predict's bearer tokens (`serving.token_file`); None: Predict is open.
    tokens: Option<BearerTokens>,
}

impl Replica {
    pub fn new(settings: &PsSettings) -> anyhow::Result<Self> {
        let serving = &settings.serving;
        let (Some(model), Some(schema)) = (&serving.model, &serving.schema) else {
            anyhow::bail!("serving.model and serving.schema: the serving role needs both");
        };
        let layout =
            ModelLayout::new(model, schema).map_err(|e| anyhow::anyhow!("serving: {e}"))?;
        #[expect(
            clippy::disallowed_methods,
            reason = "ORT_DYLIB_PATH is ONNX Runtime's own variable for its library, the fallback of serving.onnxruntime_library"
        )]
        let library = match &serving.onnxruntime_library {
            Some(path) => path.clone(),
            None => std::env::var_os("ORT_DYLIB_PATH").map(PathBuf::from).ok_or_else(|| {
                anyhow::anyhow!(
                    "serving.onnxruntime_library: not set, and ORT_DYLIB_PATH is not set either \
                     (scripts/install-deps.sh puts libonnxruntime.so under .tools/ort)"
                )
            })?,
        };
        let tokens = serving
            .token_file
            .as_deref()
            .map(|path| BearerTokens::load(path, "serving.token_file"))
            .transpose()?;
        if !library.is_file() {
            anyhow::bail!(
                "serving.onnxruntime_library: {} is not a file",
                library.display()
            );
        }
        let tables = layout
            .ps_tables()
            .iter()
            .map(|spec| {
                let table = ReplicaTable::new(spec, settings.ps.seed, settings.ps.shards_per_table);
                (spec.name.clone(), table)
            })
            .collect();
        Ok(Self {
            job: serving.job.clone(),
            tables,
            pipeline: FeaturePipeline::new(schema),
            layout,
            serving: serving.clone(),
            library,
            dense: Arc::default(),
            applied: Mutex::default(),
            newest_row: AtomicU64::new(0),
            storage: settings.storage.clone(),
            tokens,
        })
    }

    /// Loads `onnx` as dense `version` unless one as new is served; the version served after.
    async fn install_dense(&self, version: u64, onnx: Vec<u8>) -> Result<u64, Status> {
        if version <= self.dense.version() {
            return Ok(self.dense.version());
        }
        let (library, sessions) = (self.library.clone(), self.serving.sessions);
        let model = tokio::task::spawn_blocking(move || {
            DenseModel::load(&library, version, &onnx, sessions)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| match e {
            DenseError::Library { .. } => Status::failed_precondition(e.to_string()),
            _ => Status::invalid_argument(format!("onnx_model: {e}")),
        })?;
        let version = self.dense.install(model);
        tracing::info!(version, "dense model loaded");
        Ok(version)
    }

    /// `<shard>=<version>` of every training shard whose changes up to that version this
    /// replica holds, in shard order.
    fn applied_versions(&self) -> String {
        let applied = self.applied.lock().unwrap_or_else(PoisonError::into_inner);
        let mut versions: Vec<String> = (applied.iter())
            .map(|(shard, version)| format!("{shard}={version}"))
            .collect();
        versions.sort_unstable();
        versions.join(" ")
    }

    /// Whether a Predict with this `authorization` header value (None: no header) may run:
    /// any listed token may, whatever scope and labels its line gives.
    fn authorize(&self, header: Option<&str>) -> Result<(), Status> {
        match &self.tokens {
            Some(tokens) => tokens.check_header(header).map(drop),
            None => Ok(()),
        }
    }

    /// A Predict, as gRPC and HTTP both answer it: the request checked, then scored on a
    /// blocking thread.
    async fn answer(self: &Arc<Self>, request: PredictRequest) -> Result<PredictResponse, Status> {
        if !request.job.is_empty() && request.job != self.job {
            return Err(Status::not_found(format!(
                "job: this replica serves {:?}, not {:?}",
                self.job, request.job
            )));
        }
        if request.samples.is_empty() {
            return Err(Status::invalid_argument("samples: at least one is needed"));
        }
        if request.samples.len() > self.serving.max_samples {
            return Err(Status::invalid_argument(format!(
                "samples: {} is over the limit of {} per request (serving.max_samples)",
                request.samples.len(),
                self.serving.max_samples
            )));
        }
        let sparse_version = self.newest_row.load(Ordering::Acquire);
        let dense_version = self.dense.version();
        // What this answer used: every training shard's changes up to its version here.
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record("primus.sparse_version", sparse_version);
            span.record("primus.dense_version", dense_version);
            span.record("primus.applied", self.applied_versions());
        }
        let replica = self.clone();
        let predicted = tokio::task::spawn_blocking(move || replica.predict(&request.samples))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        Ok(PredictResponse {
            probabilities: predicted.probabilities,
            sparse_version,
            dense_version,
            heads: (predicted.heads.into_iter())
                .map(|(name, values)| HeadPredictions { name, values })
                .collect(),
        })
    }

    fn table(&self, name: &str) -> Result<&ReplicaTable, Status> {
        self.tables.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.tables.keys().map(String::as_str).collect();
            known.sort_unstable();
            Status::invalid_argument(format!(
                "tables: {name:?} is not held by this replica (tables: {})",
                known.join(", ")
            ))
        })
    }

    /// Checks every table of a delta before any is applied (a bad delta changes nothing).
    fn decode_delta(&self, tables: &[TableDelta]) -> Result<Vec<DecodedDelta<'_>>, Status> {
        tables
            .iter()
            .map(|t| {
                let table = self.table(&t.table)?;
                let what = |field: &str| format!("tables[{:?}].{field}", t.table);
                if t.dim as usize != table.dim() {
                    return Err(Status::invalid_argument(format!(
                        "{}: {} given, the table's dim is {}",
                        what("dim"),
                        t.dim,
                        table.dim()
                    )));
                }
                let delta = DecodedDelta {
                    table,
                    keys: decode_keys(&what("keys"), &t.keys)?,
                    versions: decode_keys(&what("versions"), &t.versions)?,
                    weights: decode_f32(&what("rows"), &t.rows)?,
                    evicted: decode_keys(&what("evicted_keys"), &t.evicted_keys)?,
                    evicted_versions: decode_keys(&what("evicted_versions"), &t.evicted_versions)?,
                };
                let rows_fit = delta.weights.len() == delta.keys.len() * table.dim();
                let versions_fit = delta.versions.len() == delta.keys.len()
                    && delta.evicted_versions.len() == delta.evicted.len();
                if !rows_fit || !versions_fit {
                    return Err(Status::invalid_argument(format!(
                        "tables[{:?}]: {} keys, {} versions, {} floats of rows (dim {}), \
                         {} evicted keys with {} versions do not fit together",
                        t.table,
                        delta.keys.len(),
                        delta.versions.len(),
                        delta.weights.len(),
                        table.dim(),
                        delta.evicted.len(),
                        delta.evicted_versions.len()
                    )));
                }
                if let Some(bad) = delta.weights.iter().position(|w| !w.is_finite()) {
                    return Err(Status::invalid_argument(format!(
                        "{}: row of key {} holds a non-finite value",
                        what("rows"),
                        delta.keys[bad / table.dim()]
                    )));
                }
                Ok(delta)
            })
            .collect()
    }

    /// Keys, pooling and the dense model for `samples` (blocking).
    fn predict(&self, samples: &[primus_proto::v1::Sample]) -> Result<DensePredictions, Status> {
        let invalid = |e: &dyn std::fmt::Display| Status::invalid_argument(e.to_string());
        let batch = record_batch(self.pipeline_schema(), samples).map_err(|e| invalid(&e))?;
        let minibatch = self.pipeline.minibatch(&batch).map_err(|e| invalid(&e))?;
        let kjt = minibatch.to_kjt().map_err(|e| invalid(&e))?;
        let keys = BatchKeys::collect(&self.layout, &kjt).map_err(|e| invalid(&e))?;
        let mut rows = Vec::with_capacity(self.layout.tables.len());
        let mut wide = Vec::new();
        for (slot, unique) in self.layout.tables.iter().zip(&keys.tables) {
            rows.push(self.lookup(&slot.name, unique)?);
            if let Some(name) = &slot.wide {
                wide.push(self.lookup(name, unique)?);
            }
        }
        let wide_width = if self.layout.has_wide() {
            self.layout.features.len()
        } else {
            0
        };
        // The rows were looked up here for these keys: a pooling error is ours, not the caller's.
        let internal = |e: primus_model::ModelError| Status::internal(e.to_string());
        let inputs = DenseInputs {
            rows: samples.len(),
            dense: minibatch.dense.values,
            dense_width: self.layout.dense_inputs,
            embedded: keys
                .pool(&CpuKernels, &self.layout, &rows)
                .map_err(internal)?,
            embedded_width: self.layout.embedding_width,
            wide: if wide_width > 0 {
                keys.pool_wide(&CpuKernels, &wide).map_err(internal)?
            } else {
                Vec::new()
            },
            wide_width,
        };
        let model = self
            .dense
            .get()
            .map_err(|e| Status::unavailable(e.to_string()))?;
        model
            .predict(inputs)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn pipeline_schema(&self) -> &primus_spec::dataset::FeatureSchema {
        // Checked in `new`: the serving role does not start without a schema.
        self.serving
            .schema
            .as_ref()
            .unwrap_or_else(|| unreachable!("Replica::new requires serving.schema"))
    }

    fn lookup(&self, table: &str, keys: &[u64]) -> Result<Vec<f32>, Status> {
        let table = self.table(table)?;
        let mut out = vec![0.0; keys.len() * table.dim()];
        table
            .lookup(keys, &mut out)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(out)
    }
}

struct DecodedDelta<'a> {
    table: &'a ReplicaTable,
    keys: Vec<u64>,
    versions: Vec<u64>,
    weights: Vec<f32>,
    evicted: Vec<u64>,
    evicted_versions: Vec<u64>,
}

/// The ServingService RPCs over one [`Replica`].
struct ServingApi {
    replica: Arc<Replica>,
}

#[tonic::async_trait]
impl ServingService for ServingApi {
    async fn apply_delta(
        &self,
        request: Request<ApplyDeltaRequest>,
    ) -> Result<Response<ApplyDeltaResponse>, Status> {
        let request = request.into_inner();
        if request.source_shard.is_empty() {
            return Err(Status::invalid_argument("source_shard: must not be empty"));
        }
        let deltas = self.replica.decode_delta(&request.tables)?;
        let mut response = ApplyDeltaResponse::default();
        for delta in &deltas {
            let outcome = delta
                .table
                .apply(DeltaRows {
                    keys: &delta.keys,
                    versions: &delta.versions,
                    weights: &delta.weights,
                    evicted: &delta.evicted,
                    evicted_versions: &delta.evicted_versions,
                })
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            response.written += outcome.written;
            response.stale += outcome.stale;
            if let Some(newest) = delta.versions.iter().max() {
                self.replica.newest_row.fetch_max(*newest, Ordering::AcqRel);
            }
        }
        let mut applied = self
            .replica
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let held = applied.entry(request.source_shard).or_insert(0);
        // Only a delta that starts within what is held closes the gap up to its version.
        if request.since_version <= *held {
            *held = (*held).max(request.version);
        }
        response.applied_version = *held;
        Ok(Response::new(response))
    }

    async fn load_dense(
        &self,
        request: Request<LoadDenseRequest>,
    ) -> Result<Response<LoadDenseResponse>, Status> {
        let request = request.into_inner();
        if request.version == 0 {
            return Err(Status::invalid_argument("version: must be > 0"));
        }
        let version = self
            .replica
            .install_dense(request.version, request.onnx_model)
            .await?;
        Ok(Response::new(LoadDenseResponse { version }))
    }

    async fn load_checkpoint(
        &self,
        request: Request<LoadCheckpointRequest>,
    ) -> Result<Response<LoadCheckpointResponse>, Status> {
        let answer = self.replica.load_checkpoint(request.into_inner()).await?;
        Ok(Response::new(answer))
    }

    async fn predict(
        &self,
        request: Request<PredictRequest>,
    ) -> Result<Response<PredictResponse>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap_or(""));
        self.replica.authorize(header)?;
        let request = request.into_inner();
        let span = predict_span(request.samples.len());
        let answer = self.replica.answer(request).instrument(span).await?;
        Ok(Response::new(answer))
    }

    async fn replica_state(
        &self,
        _request: Request<ReplicaStateRequest>,
    ) -> Result<Response<ReplicaStateResponse>, Status> {
        let applied = self
            .replica
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut sources: Vec<SourceVersion> = applied
            .iter()
            .map(|(source, version)| SourceVersion {
                source_shard: source.clone(),
                applied_version: *version,
            })
            .collect();
        sources.sort_by(|a, b| a.source_shard.cmp(&b.source_shard));
        Ok(Response::new(ReplicaStateResponse {
            job: self.replica.job.clone(),
            sources,
            dense_version: self.replica.dense.version(),
            rows: self.replica.tables.values().map(|t| t.len() as u64).sum(),
        }))
    }

    async fn dump_rows(
        &self,
        _request: Request<DumpRowsRequest>,
    ) -> Result<Response<DumpRowsResponse>, Status> {
        let mut names: Vec<&String> = self.replica.tables.keys().collect();
        names.sort_unstable();
        let tables = names
            .into_iter()
            .map(|name| {
                let table = &self.replica.tables[name];
                let (keys, versions, weights) = table.rows();
                let mut rows = Vec::with_capacity(weights.len() * 4);
                encode_f32(&weights, &mut rows);
                TableDelta {
                    table: name.clone(),
                    dim: table.dim() as u32,
                    keys: encode_keys(&keys),
                    rows,
                    evicted_keys: Vec::new(),
                    versions: encode_keys(&versions),
                    evicted_versions: Vec::new(),
                    update_counts: Vec::new(),
                }
            })
            .collect();
        Ok(Response::new(DumpRowsResponse { tables }))
    }
}
