//! LoadCheckpoint: a replica takes a checkpoint's rows and dense network from the training
//! PS shards' snapshots, so it serves a Job's final model after its training PS is gone
//! (or an earlier Job's model). Every file is read and verified before anything changes.

use primus_embedding::{DeltaRows, DenseStore, ShardSnapshot};
use primus_model::{ParamSet, ParamTensor, Tower};
use primus_proto::v1::{LoadCheckpointRequest, LoadCheckpointResponse, ServedTower};
use tonic::Status;

use super::Replica;
use crate::snapshots::{Chain, load_chain};

impl Replica {
    /// Reads every manifest's chain, then writes the rows newer than held and serves the
    /// checkpoint's dense network.
    pub(super) async fn load_checkpoint(
        &self,
        request: LoadCheckpointRequest,
    ) -> Result<LoadCheckpointResponse, Status> {
        if request.manifest_uris.is_empty() {
            return Err(Status::invalid_argument(
                "manifest_uris: at least one (a snapshot per training PS shard) is needed",
            ));
        }
        let tower = match request.tower() {
            ServedTower::Adapt => Tower::Adapt,
            ServedTower::Memory => Tower::Memory,
        };
        let mut chains = Vec::with_capacity(request.manifest_uris.len());
        for uri in &request.manifest_uris {
            let dim_of = |name: &str| self.tables.get(name).map(|t| t.dim());
            chains.push(load_chain(dim_of, &self.storage, uri).await?);
        }
        let dense_version = self.next_dense_version();
        let onnx = self.dense_onnx(&chains, tower, dense_version)?;
        let version = chains.iter().map(|c| c.version).max().unwrap_or(0);
        let mut rows = 0;
        for (name, shard) in chains.iter().flat_map(|c| &c.shards) {
            rows += self.write_snapshot(name, shard)?;
        }
        let dense_version = self.install_dense(dense_version, onnx).await?;
        tracing::info!(
            rows,
            version,
            dense_version,
            manifests = request.manifest_uris.len(),
            "checkpoint loaded"
        );
        Ok(LoadCheckpointResponse {
            rows,
            version,
            dense_version,
        })
    }

    /// The dense tensors of every shard's snapshot, as the ONNX model serving runs.
    fn dense_onnx(&self, chains: &[Chain], tower: Tower, version: u64) -> Result<Vec<u8>, Status> {
        let spec = self
            .serving
            .model
            .as_ref()
            .unwrap_or_else(|| unreachable!("Replica::new requires serving.model"));
        let store = DenseStore::new(&spec.dense.optimizer);
        for chain in chains {
            store
                .merge_where(&chain.dense, |_| true)
                .map_err(|e| Status::failed_precondition(format!("dense.bin: {e}")))?;
        }
        let mut params = ParamSet::init(&self.layout, 0);
        let (pulled, _) = store.pull(&params.names()).map_err(|e| {
            Status::failed_precondition(format!("the checkpoint's dense network: {e}"))
        })?;
        params
            .assign(pulled.into_iter().map(ParamTensor::from).collect())
            .map_err(|e| {
                Status::failed_precondition(format!("the checkpoint's dense network: {e}"))
            })?;
        primus_model::onnx::export(&self.layout, &params, tower, version)
            .map_err(|e| Status::internal(format!("exporting the dense network: {e}")))
    }

    /// One snapshot file's rows (weights only) and evictions, by their versions.
    fn write_snapshot(&self, table: &str, shard: &ShardSnapshot) -> Result<u64, Status> {
        let table = self.table(table)?;
        let (dim, stride) = (shard.dim as usize, shard.stride as usize);
        let weights: Vec<f32> = shard
            .values
            .chunks_exact(stride)
            .flat_map(|row| &row[..dim])
            .copied()
            .collect();
        let versions: Vec<u64> = shard.meta.iter().map(|m| m.version).collect();
        let evicted_versions = vec![shard.version; shard.evicted.len()];
        let outcome = table
            .apply(DeltaRows {
                keys: &shard.keys,
                versions: &versions,
                weights: &weights,
                evicted: &shard.evicted,
                evicted_versions: &evicted_versions,
            })
            .map_err(|e| Status::data_loss(format!("table {:?}: {e}", table.name())))?;
        if let Some(newest) = versions.iter().max() {
            self.newest_row
                .fetch_max(*newest, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(outcome.written)
    }

    /// Dense versions are unix microseconds, as serving-sync's: a later load always wins.
    fn next_dense_version(&self) -> u64 {
        primus_spec::time::unix_us().max(self.dense.version() + 1)
    }
}
