//! One job's sync (Monolith §2.2.3): touched rows from every training PS shard to every
//! serving replica on each delta notice and every sparse interval; the dense network as a
//! new ONNX model on the dense interval.
//!
//! Per replica and training shard the sync knows the version the replica holds (from the
//! replica's own answers), so a replica that restarted empty is brought back with a full
//! copy (ExportDelta since 0) and then deltas, and one that missed a delta gets it again.
//! Replicas keep the newest version of each row, so re-sent rows are harmless and a training
//! shard that restarts from an older checkpoint does not take serving backwards. A shard
//! awaiting its restore refuses to export, so a replica's version of it never passes the
//! rows the restore brings back with their checkpoint's versions.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use primus_model::{ModelLayout, ParamSet, ParamTensor, Tower};
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{
    ApplyDeltaRequest, DeltaNotice, ExportDeltaRequest, ExportDeltaResponse, LoadDenseRequest,
    ReplicaStateRequest,
};
use primus_ps_client::PsClient;
use primus_telemetry::propagation::TraceInterceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// What to keep in sync, from the Job and its Dataset.
#[derive(Debug, Clone)]
pub struct SyncTarget {
    pub job: String,
    pub layout: ModelLayout,
    /// The tower serving predicts with (MTRM's adapt tower when the job trains on streams).
    pub tower: Tower,
    pub sparse_interval: Duration,
    pub dense_interval: Duration,
}

/// The job's processes: training PS shards in shard order, serving replicas.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// `(id, host:port)` of each training PS shard, in shard order.
    pub shards: Vec<(String, String)>,
    /// `(id, host:port)` of each serving replica.
    pub replicas: Vec<(String, String)>,
}

/// Counters since the last [`JobSync::take_report`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncReport {
    pub cycles: u64,
    /// Rows and evictions exported by the training shards.
    pub delta_rows: u64,
    /// Bytes of delta payload sent to replicas (keys, versions, rows), all replicas.
    pub delta_bytes: u64,
    /// Milliseconds from a delta notice to every replica holding that version, one per notice.
    pub freshness_ms: Vec<f64>,
    pub dense_loads: u64,
    pub failures: u64,
    /// Milliseconds since the dense model the stalest replica serves was exported (dense
    /// freshness); None until every replica serves one.
    pub dense_age_ms: Option<f64>,
}

struct ReplicaLink {
    id: String,
    addr: String,
    client: ServingServiceClient<Traced>,
    /// Per training shard id: every change up to this version is held (the replica's own
    /// answer at the start of this cycle). `None`: it did not answer; skipped this cycle.
    applied: Option<HashMap<String, u64>>,
    dense_version: u64,
}

struct ShardLink {
    id: String,
    addr: String,
    client: ParameterServerClient<Traced>,
}

/// A channel whose calls carry the current span's trace context: the ExportDelta and
/// ApplyDelta request spans on the PS side are children of the sync cycle's span.
type Traced = InterceptedService<Channel, TraceInterceptor>;

/// Pushes one sparse cycle links to at most.
const MAX_LINKED_PUSHES: usize = 128;

pub struct JobSync {
    target: SyncTarget,
    shards: Vec<ShardLink>,
    replicas: Vec<ReplicaLink>,
    dense_client: Option<PsClient>,
    /// The latest exported dense model, re-sent to replicas that lack it.
    dense_model: Option<(u64, Vec<u8>)>,
    last_dense: Option<Instant>,
    /// Per shard: notices not yet held by every replica, oldest first.
    pending: HashMap<String, VecDeque<(u64, Instant)>>,
    /// `traceparent`s of the pushes the notices since the last cycle named.
    pushes: Vec<String>,
    report: SyncReport,
}

fn lazy_channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(30))
        .connect_lazy())
}

impl JobSync {
    pub fn new(target: SyncTarget) -> Self {
        Self {
            target,
            shards: Vec::new(),
            replicas: Vec::new(),
            dense_client: None,
            dense_model: None,
            last_dense: None,
            pending: HashMap::new(),
            pushes: Vec::new(),
            report: SyncReport::default(),
        }
    }

    pub fn target(&self) -> &SyncTarget {
        &self.target
    }

    /// Follows the job's processes; links to unchanged addresses are kept.
    pub fn set_topology(&mut self, topology: &Topology) -> anyhow::Result<()> {
        let same_shards = self.shards.len() == topology.shards.len()
            && self
                .shards
                .iter()
                .zip(&topology.shards)
                .all(|(s, (id, addr))| &s.id == id && &s.addr == addr);
        if !same_shards {
            self.shards = topology
                .shards
                .iter()
                .map(|(id, addr)| {
                    Ok(ShardLink {
                        id: id.clone(),
                        addr: addr.clone(),
                        client: ParameterServerClient::with_interceptor(
                            lazy_channel(addr)?,
                            TraceInterceptor,
                        )
                        .max_decoding_message_size(usize::MAX),
                    })
                })
                .collect::<anyhow::Result<_>>()?;
            self.dense_client = None;
        }
        let mut kept: Vec<ReplicaLink> = Vec::new();
        for (id, addr) in &topology.replicas {
            let existing = self
                .replicas
                .iter()
                .position(|r| &r.id == id && &r.addr == addr);
            kept.push(match existing {
                Some(i) => self.replicas.swap_remove(i),
                None => ReplicaLink {
                    id: id.clone(),
                    addr: addr.clone(),
                    client: ServingServiceClient::with_interceptor(
                        lazy_channel(addr)?,
                        TraceInterceptor,
                    )
                    .max_encoding_message_size(usize::MAX),
                    applied: None,
                    dense_version: 0,
                },
            });
        }
        self.replicas = kept;
        Ok(())
    }

    /// Remembers when a shard announced a version (freshness is measured from here).
    pub fn note(&mut self, notice: &DeltaNotice) {
        self.pending
            .entry(notice.shard.clone())
            .or_default()
            .push_back((notice.version, Instant::now()));
        let room = MAX_LINKED_PUSHES.saturating_sub(self.pushes.len());
        self.pushes.extend(notice.pushes.iter().take(room).cloned());
    }

    /// The pushes named since the last call: what the next cycle moves.
    pub fn take_pushes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pushes)
    }

    /// Counters since the last call, and the dense model's age now.
    pub fn take_report(&mut self) -> SyncReport {
        let mut report = std::mem::take(&mut self.report);
        report.dense_age_ms = self.dense_age_ms();
        report
    }

    /// Dense versions are export times in microseconds: the stalest replica's is its age.
    fn dense_age_ms(&self) -> Option<f64> {
        let stalest = self.replicas.iter().map(|r| r.dense_version).min()?;
        let now = primus_spec::time::unix_us();
        (stalest > 0).then(|| now.saturating_sub(stalest) as f64 / 1000.0)
    }

    /// Per replica id, the version held of each shard (`None` while unknown).
    pub fn replica_versions(&self) -> Vec<(String, Option<HashMap<String, u64>>)> {
        self.replicas
            .iter()
            .map(|r| (r.id.clone(), r.applied.clone()))
            .collect()
    }

    /// One sparse cycle: learn unknown replicas' state, then per shard export what the
    /// replicas lack and apply it. Failures are logged and retried next cycle.
    pub async fn sync_sparse(&mut self) {
        self.report.cycles += 1;
        self.refresh_replica_state().await;
        for shard_index in 0..self.shards.len() {
            let shard_id = self.shards[shard_index].id.clone();
            let mut wanted: Vec<u64> = self
                .replicas
                .iter()
                .filter_map(|r| r.applied.as_ref())
                .map(|a| a.get(&shard_id).copied().unwrap_or(0))
                .collect();
            wanted.sort_unstable();
            wanted.dedup();
            for since in wanted {
                let Some(delta) = self.export(shard_index, since).await else {
                    continue;
                };
                if delta.version < since {
                    // The shard's clock went backwards across a restart: start it over
                    // (replicas keep whichever copy of a row is newer).
                    tracing::warn!(job = %self.target.job, shard = %shard_id, since, version = delta.version,
                        "training shard is behind what replicas hold; sending it whole next");
                    self.reset_shard(&shard_id);
                    continue;
                }
                self.apply(&shard_id, since, delta).await;
            }
        }
        self.settle_notices();
        self.send_missing_dense().await;
    }

    async fn refresh_replica_state(&mut self) {
        // Asked every cycle (one small call per replica): a replica that restarted empty
        // is noticed even while no rows change, and gets a full copy and the dense model.
        for replica in &mut self.replicas {
            match replica.client.replica_state(ReplicaStateRequest {}).await {
                Ok(state) => {
                    let state = state.into_inner();
                    replica.applied = Some(
                        state
                            .sources
                            .into_iter()
                            .map(|s| (s.source_shard, s.applied_version))
                            .collect(),
                    );
                    replica.dense_version = state.dense_version;
                }
                Err(status) => {
                    self.report.failures += 1;
                    replica.applied = None;
                    tracing::debug!(replica = %replica.id, error = %status.message(), "replica not answering");
                }
            }
        }
    }

    async fn export(&mut self, shard_index: usize, since: u64) -> Option<ExportDeltaResponse> {
        let shard = &mut self.shards[shard_index];
        match shard
            .client
            .export_delta(ExportDeltaRequest {
                since_version: since,
                update_counts: false,
            })
            .await
        {
            Ok(response) => Some(response.into_inner()),
            // A shard awaiting its restore refuses until its rows are back: expected
            // while a Job recovers, so not worth a warning each cycle.
            Err(status) if status.code() == tonic::Code::Unavailable => {
                self.report.failures += 1;
                tracing::debug!(job = %self.target.job, shard = %shard.id, error = %status.message(), "training shard not exporting yet");
                None
            }
            Err(status) => {
                self.report.failures += 1;
                tracing::warn!(job = %self.target.job, shard = %shard.id, error = %status.message(), "ExportDelta failed");
                None
            }
        }
    }

    fn reset_shard(&mut self, shard_id: &str) {
        for replica in &mut self.replicas {
            if let Some(applied) = replica.applied.as_mut() {
                applied.insert(shard_id.to_owned(), 0);
            }
        }
    }

    /// Applies `delta` to every replica that holds exactly `since` of the shard.
    async fn apply(&mut self, shard_id: &str, since: u64, delta: ExportDeltaResponse) {
        let rows: u64 = delta
            .tables
            .iter()
            .map(|t| ((t.keys.len() + t.evicted_keys.len()) / 8) as u64)
            .sum();
        let bytes: u64 = delta
            .tables
            .iter()
            .map(|t| {
                (t.keys.len() + t.rows.len() + t.versions.len())
                    + t.evicted_keys.len()
                    + t.evicted_versions.len()
            })
            .sum::<usize>() as u64;
        self.report.delta_rows += rows;
        let request = ApplyDeltaRequest {
            source_shard: shard_id.to_owned(),
            version: delta.version,
            tables: delta.tables,
            since_version: since,
        };
        for replica in &mut self.replicas {
            let Some(applied) = replica.applied.as_mut() else {
                continue;
            };
            if applied.get(shard_id).copied().unwrap_or(0) != since {
                continue;
            }
            // An empty delta only moves the version; skip the call when nothing changed.
            if rows == 0 && since == request.version {
                continue;
            }
            match replica.client.apply_delta(request.clone()).await {
                Ok(response) => {
                    let held = response.into_inner().applied_version;
                    applied.insert(shard_id.to_owned(), held);
                    self.report.delta_bytes += bytes;
                }
                Err(status) => {
                    self.report.failures += 1;
                    tracing::warn!(replica = %replica.id, error = %status.message(), "ApplyDelta failed; asking its state next cycle");
                    replica.applied = None;
                }
            }
        }
    }

    /// Notices whose version every replica now holds become freshness samples.
    fn settle_notices(&mut self) {
        let now = Instant::now();
        for (shard, pending) in &mut self.pending {
            let held = self
                .replicas
                .iter()
                .map(|r| {
                    r.applied
                        .as_ref()
                        .and_then(|a| a.get(shard).copied())
                        .unwrap_or(0)
                })
                .min();
            let Some(held) = held else {
                pending.clear();
                continue;
            };
            while pending.front().is_some_and(|(version, _)| *version <= held) {
                if let Some((_, seen)) = pending.pop_front() {
                    self.report
                        .freshness_ms
                        .push(now.duration_since(seen).as_secs_f64() * 1e3);
                }
            }
        }
    }

    /// Whether the dense interval has passed since the last export (or none was made).
    pub fn dense_due(&self) -> bool {
        self.last_dense
            .is_none_or(|at| at.elapsed() >= self.target.dense_interval)
    }

    /// Pulls the dense parameters, exports them as ONNX and loads them on every replica.
    pub async fn sync_dense(&mut self) -> anyhow::Result<u64> {
        self.last_dense = Some(Instant::now());
        let addrs: Vec<String> = self.shards.iter().map(|s| s.addr.clone()).collect();
        if addrs.is_empty() {
            anyhow::bail!("the job has no training PS shard yet");
        }
        if self.dense_client.is_none() {
            self.dense_client = Some(PsClient::connect(&addrs).await?);
        }
        let Some(client) = &self.dense_client else {
            unreachable!("connected above")
        };
        let mut params = ParamSet::init(&self.target.layout, 0);
        let pulled = client.pull_dense(&params.names()).await?;
        params.assign(pulled.into_iter().map(ParamTensor::from).collect())?;
        let version = self.next_dense_version();
        let model =
            primus_model::onnx::export(&self.target.layout, &params, self.target.tower, version)?;
        self.dense_model = Some((version, model));
        self.send_missing_dense().await;
        Ok(version)
    }

    /// Versions of dense models are the export time in microseconds, always increasing, so
    /// a replica never swaps an older model in (also across restarts of this service).
    fn next_dense_version(&self) -> u64 {
        let now = primus_spec::time::unix_us();
        let last = self.dense_model.as_ref().map_or(0, |(v, _)| *v);
        now.max(last + 1)
    }

    async fn send_missing_dense(&mut self) {
        let Some((version, model)) = &self.dense_model else {
            return;
        };
        for replica in &mut self.replicas {
            if replica.applied.is_none() || replica.dense_version >= *version {
                continue;
            }
            let request = LoadDenseRequest {
                version: *version,
                onnx_model: model.clone(),
            };
            match replica.client.load_dense(request).await {
                Ok(response) => {
                    replica.dense_version = response.into_inner().version;
                    self.report.dense_loads += 1;
                }
                Err(status) => {
                    self.report.failures += 1;
                    tracing::warn!(replica = %replica.id, error = %status.message(), "LoadDense failed");
                    replica.applied = None;
                }
            }
        }
    }
}
