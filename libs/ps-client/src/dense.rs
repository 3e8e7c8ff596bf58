//! What a trainer needs to keep its own copy of the dense parameters exact: the version
//! each shard's dense store reached with a push, and the tensors with their optimizer state
//! and the optimizer that applies pushes, read at one version per shard.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::try_join_all;
use primus_proto::v1::PullDenseRequest;

use crate::{PsClient, PsClientError, Shards};

/// What [`PsClient::push_dense`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DensePushed {
    /// The version each shard (by address) reached with this push.
    pub versions: BTreeMap<String, u64>,
    /// Some part was refused for moved tensors and pushed again elsewhere.
    pub moved: bool,
    /// Some shard had applied this minibatch already and left it out.
    pub repeated: bool,
}

/// Dense tensors with their optimizer state, per shard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DenseState {
    /// Per shard (by address): its version and its tensors in the PS's dense snapshot form
    /// (`primus_embedding::DenseStore::encode`).
    pub shards: BTreeMap<String, (u64, Vec<u8>)>,
    /// The optimizer the shards apply pushes with, in the Job spec's JSON form (the same
    /// on every shard).
    pub optimizer_json: String,
}

impl PsClient {
    /// The named tensors (every tensor when empty) with their optimizer state, each shard's
    /// at one version.
    pub async fn pull_dense_state(&self, names: &[String]) -> Result<DenseState, PsClientError> {
        self.repeatable(|shards| pull_dense_state_on(shards, names))
            .await
    }
}

async fn pull_dense_state_on(
    shards: Arc<Shards>,
    names: &[String],
) -> Result<DenseState, PsClientError> {
    let groups = shards.by_dense_shard(names.iter().map(|n| (n.clone(), n.clone())));
    let calls = (groups.into_iter().enumerate())
        .filter(|(_, group)| names.is_empty() || !group.is_empty())
        .map(|(shard, names)| {
            let mut client = shards.clients[shard].clone();
            async move {
                let request = PullDenseRequest {
                    names,
                    with_state: true,
                };
                let response = client
                    .pull_dense(request)
                    .await
                    .map_err(|status| PsClientError::Call { shard, status })?;
                Ok::<_, PsClientError>((shard, response.into_inner()))
            }
        });
    let mut state = DenseState::default();
    for (shard, answer) in try_join_all(calls).await? {
        if !state.shards.is_empty() && answer.optimizer_json != state.optimizer_json {
            let status = tonic::Status::failed_precondition(format!(
                "dense optimizer {} differs from another shard's {}",
                answer.optimizer_json, state.optimizer_json
            ));
            return Err(PsClientError::Call { shard, status });
        }
        state.optimizer_json = answer.optimizer_json;
        let part = (answer.version, answer.state);
        state.shards.insert(shards.addrs[shard].clone(), part);
    }
    Ok(state)
}
