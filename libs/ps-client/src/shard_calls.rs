//! One call to one PS shard per function: lookups, row reads, sparse and dense pushes and
//! dense pulls, each answering in the shard's own terms (rows in its key order, what it
//! refused because the keys moved) for [`crate::PsClient`] to route and reassemble.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::{join_all, try_join_all};
use primus_proto::packed::{decode_f32, decode_keys, encode_f32, encode_keys};
use primus_proto::v1::{
    InitDenseRequest, LookupRequest, PullDenseRequest, PushDenseRequest, PushRequest,
    ReadRowsRequest,
};
use tonic::Status;

use crate::{
    DensePushed, DenseValues, PsClientError, Shards, StoredRows, dense_from_proto, dense_to_proto,
    is_moved, is_unreachable, layout,
};

pub(crate) async fn lookup_on(
    shards: Arc<Shards>,
    table: &str,
    keys: &[u64],
) -> Result<(Vec<f32>, usize), PsClientError> {
    let routes = shards.route(keys);
    let answers = shards
        .per_shard(&routes, |mut client, keys| async move {
            let request = LookupRequest {
                table: table.to_owned(),
                keys: keys.into(),
            };
            let response = client.lookup(request).await?.into_inner();
            let rows = decode_f32("rows", &response.rows)?;
            Ok((response.dim as usize, rows))
        })
        .await?;
    let dim = answers.first().map_or(0, |(_, (dim, _))| *dim);
    let mut out = vec![0.0f32; keys.len() * dim];
    for (shard, (_, rows)) in answers {
        for &(position, index) in &routes[shard].positions {
            out[position * dim..(position + 1) * dim]
                .copy_from_slice(&rows[index * dim..(index + 1) * dim]);
        }
    }
    Ok((out, dim))
}

pub(crate) async fn read_rows_on(
    shards: Arc<Shards>,
    table: &str,
    keys: &[u64],
) -> Result<StoredRows, PsClientError> {
    let routes = shards.route(keys);
    let answers = shards
        .per_shard(&routes, |mut client, keys| async move {
            let request = ReadRowsRequest {
                table: table.to_owned(),
                keys,
            };
            let response = client.read_rows(request).await?.into_inner();
            let keys = decode_keys("keys", &response.keys)?;
            let values = decode_f32("values", &response.values)?;
            let stride = response.stride as usize;
            if values.len() != keys.len() * stride {
                return Err(Status::internal(format!(
                    "{} floats for {} rows of {stride}",
                    values.len(),
                    keys.len()
                )));
            }
            Ok(StoredRows {
                dim: response.dim as usize,
                stride,
                keys,
                values,
            })
        })
        .await?;
    let mut all = StoredRows::default();
    for (_, answer) in answers {
        (all.dim, all.stride) = (answer.dim, answer.stride);
        all.keys.extend(answer.keys);
        all.values.extend(answer.values);
    }
    Ok(all)
}

/// Keys and their gradients (`dim` floats per key).
pub(crate) type Gradients = (Vec<u64>, Vec<f32>);

/// What one push over a shard list did, and the part refused for moved keys (with the first
/// refusal) that must go again.
pub(crate) struct PushOutcome {
    pub(crate) applied: u64,
    pub(crate) dropped: u64,
    pub(crate) refused: Option<(PsClientError, Gradients)>,
}

pub(crate) async fn push_on(
    shards: &Shards,
    table: &str,
    keys: &[u64],
    grads: &[f32],
    dim: usize,
) -> PushOutcome {
    let n = shards.count();
    let mut per_shard: Vec<(Vec<u64>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); n as usize];
    for (position, key) in keys.iter().enumerate() {
        let shard = layout::key_shard(*key, n) as usize;
        per_shard[shard].0.push(*key);
        per_shard[shard]
            .1
            .extend_from_slice(&grads[position * dim..(position + 1) * dim]);
    }
    let calls = per_shard
        .into_iter()
        .enumerate()
        .filter(|(_, (k, _))| !k.is_empty())
        .map(|(shard, (shard_keys, shard_grads))| {
            let mut client = shards.clients[shard].clone();
            let mut packed = Vec::with_capacity(shard_grads.len() * 4);
            encode_f32(&shard_grads, &mut packed);
            let request = PushRequest {
                table: table.to_owned(),
                keys: encode_keys(&shard_keys).into(),
                grads: packed.into(),
            };
            async move {
                let answer = client.push(request).await.map(tonic::Response::into_inner);
                (shard, answer, (shard_keys, shard_grads))
            }
        });
    let mut outcome = PushOutcome {
        applied: 0,
        dropped: 0,
        refused: None,
    };
    let mut failed = None;
    for (shard, answer, part) in join_all(calls).await {
        match answer {
            Ok(response) => {
                outcome.applied += response.applied;
                outcome.dropped += response.dropped + response.refused;
            }
            Err(status) if is_moved(&status) || is_unreachable(&status) => {
                let (_, (left_keys, left_grads)) = outcome.refused.get_or_insert_with(|| {
                    (PsClientError::Call { shard, status }, Default::default())
                });
                left_keys.extend(part.0);
                left_grads.extend(part.1);
            }
            Err(status) => failed = failed.or(Some(PsClientError::Call { shard, status })),
        }
    }
    if let Some(error) = failed {
        // Not a move: the caller fails as a whole.
        outcome.refused = Some((error, Default::default()));
    }
    outcome
}

pub(crate) async fn init_dense_on(
    shards: Arc<Shards>,
    tensors: &[DenseValues],
) -> Result<Vec<String>, PsClientError> {
    let groups = shards.by_dense_shard(tensors.iter().map(|t| (t.name.clone(), dense_to_proto(t))));
    let calls = groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(shard, tensors)| {
            let mut client = shards.clients[shard].clone();
            async move {
                let response = client
                    .init_dense(InitDenseRequest { tensors })
                    .await
                    .map_err(|status| PsClientError::Call { shard, status })?;
                Ok::<_, PsClientError>(response.into_inner().created)
            }
        });
    Ok(try_join_all(calls).await?.into_iter().flatten().collect())
}

pub(crate) async fn pull_dense_on(
    shards: Arc<Shards>,
    names: &[String],
) -> Result<Vec<DenseValues>, PsClientError> {
    let groups = shards.by_dense_shard(names.iter().map(|n| (n.clone(), n.clone())));
    let calls = groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(shard, names)| {
            let mut client = shards.clients[shard].clone();
            async move {
                let response = client
                    .pull_dense(PullDenseRequest {
                        names,
                        with_state: false,
                    })
                    .await
                    .map_err(|status| PsClientError::Call { shard, status })?;
                response
                    .into_inner()
                    .tensors
                    .into_iter()
                    .map(|t| dense_from_proto(shard, t))
                    .collect::<Result<Vec<_>, _>>()
            }
        });
    let mut pulled: HashMap<String, DenseValues> = try_join_all(calls)
        .await?
        .into_iter()
        .flatten()
        .map(|t| (t.name.clone(), t))
        .collect();
    names
        .iter()
        .map(|name| {
            pulled
                .remove(name)
                .ok_or_else(|| PsClientError::MissingDense {
                    shard: layout::dense_shard(name, shards.count()) as usize,
                    name: name.clone(),
                })
        })
        .collect()
}

/// Pushes dense gradients over `shards`; `None` when every part was applied, else the first
/// error and the gradients to push again (none unless the error is a move).
pub(crate) async fn push_dense_on(
    shards: &Shards,
    grads: Vec<DenseValues>,
    minibatch: u64,
    pushed: &mut DensePushed,
) -> Option<(PsClientError, Vec<DenseValues>)> {
    let groups = shards.by_dense_shard(grads.into_iter().map(|g| (g.name.clone(), g)));
    let calls = groups
        .into_iter()
        .enumerate()
        .filter(|(_, g)| !g.is_empty())
        .map(|(shard, part)| {
            let mut client = shards.clients[shard].clone();
            let grads = part.iter().map(dense_to_proto).collect();
            async move {
                let request = PushDenseRequest { grads, minibatch };
                let answer = client.push_dense(request).await;
                (shard, answer, part)
            }
        });
    let mut refused: Option<(PsClientError, Vec<DenseValues>)> = None;
    let mut failed = None;
    for (shard, answer, part) in join_all(calls).await {
        match answer {
            Ok(response) => {
                let response = response.into_inner();
                pushed.repeated |= response.repeated;
                (pushed.versions).insert(shards.addrs[shard].clone(), response.version);
            }
            Err(status) if is_moved(&status) || is_unreachable(&status) => {
                refused
                    .get_or_insert_with(|| (PsClientError::Call { shard, status }, Vec::new()))
                    .1
                    .extend(part);
            }
            Err(status) => failed = failed.or(Some(PsClientError::Call { shard, status })),
        }
    }
    match failed {
        Some(error) => Some((error, Vec::new())),
        None => refused,
    }
}
