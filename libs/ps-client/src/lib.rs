//! Client of a job's PS shards: routes each key to a shard by jump consistent hash, sends
//! each shard its unique keys in parallel, and reassembles rows in request order.

#![warn(missing_docs)]

use std::collections::HashMap;
use std::future::Future;

use futures::future::try_join_all;
pub use primus_embedding::DenseValues;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{
    DenseTensor, InitDenseRequest, LookupRequest, PullDenseRequest, PushDenseRequest, PushRequest,
    ReadRowsRequest,
};
use primus_telemetry::propagation::TraceInterceptor;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use primus_proto::packed::{decode_f32, decode_keys, encode_f32, encode_keys};

/// Lamping & Veach's jump consistent hash: the shard of `key` among `shards`; growing the
/// shard count moves only the keys the new shards take.
pub fn jump_consistent_hash(key: u64, shards: u32) -> u32 {
    let mut key = key;
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(shards) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// Why a call to the PS shards failed.
#[derive(Debug, thiserror::Error)]
pub enum PsClientError {
    /// No shard to call.
    #[error("no PS shard addresses")]
    NoShards,
    /// A shard cannot be reached.
    #[error("PS shard {addr}: {message}")]
    Connect {
        /// Its address.
        addr: String,
        /// Why.
        message: String,
    },
    /// A shard answered with an error.
    #[error("PS shard {shard}: {status}")]
    Call {
        /// The shard.
        shard: usize,
        /// What it said.
        status: Status,
    },
    /// Gradients that are not a whole row per key.
    #[error("{got} gradient floats for {keys} keys is not a whole row per key")]
    GradientWidth {
        /// Floats given.
        got: usize,
        /// Keys given.
        keys: usize,
    },
    /// A shard lacked a dense tensor it holds.
    #[error("PS shard {shard} did not return dense tensor {name:?}")]
    MissingDense {
        /// The shard.
        shard: usize,
        /// The tensor.
        name: String,
    },
}

fn dense_to_proto(tensor: &DenseValues) -> DenseTensor {
    let mut values = Vec::with_capacity(tensor.values.len() * 4);
    encode_f32(&tensor.values, &mut values);
    DenseTensor {
        name: tensor.name.clone(),
        shape: tensor.shape.clone(),
        values,
    }
}

fn dense_from_proto(shard: usize, tensor: DenseTensor) -> Result<DenseValues, PsClientError> {
    let values =
        decode_f32(&format!("dense tensor {:?}", tensor.name), &tensor.values).map_err(|e| {
            PsClientError::Call {
                shard,
                status: e.into(),
            }
        })?;
    Ok(DenseValues {
        name: tensor.name,
        shape: tensor.shape,
        values,
    })
}

/// Stored rows with their optimizer state, as `ReadRows` returns them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredRows {
    /// Weights per row.
    pub dim: usize,
    /// Floats per row in `values`: `dim` weights, then the optimizer's state.
    pub stride: usize,
    /// The asked keys that have a row (each once).
    pub keys: Vec<u64>,
    /// Every row's floats, end to end.
    pub values: Vec<f32>,
}

impl StoredRows {
    /// Each key with its weights then optimizer state.
    pub fn rows(&self) -> impl Iterator<Item = (u64, &[f32])> {
        self.keys
            .iter()
            .copied()
            .zip(self.values.chunks_exact(self.stride.max(1)))
    }
}

type ShardClient = ParameterServerClient<InterceptedService<Channel, TraceInterceptor>>;

/// A client of a Job's PS shards (cheap to clone).
#[derive(Clone)]
pub struct PsClient {
    /// Every call carries the caller's trace context (the PS request span continues it).
    shards: Vec<ShardClient>,
}

/// The keys one shard gets: unique keys and where each came from in the request.
struct Route {
    keys: Vec<u64>,
    /// For each request position routed here: index into `keys`.
    positions: Vec<(usize, usize)>,
}

impl PsClient {
    /// Connects to every shard (`host:port`, in the job topology's shard order).
    pub async fn connect(addrs: &[String]) -> Result<Self, PsClientError> {
        if addrs.is_empty() {
            return Err(PsClientError::NoShards);
        }
        let mut shards = Vec::with_capacity(addrs.len());
        for addr in addrs {
            let failed = |message: String| PsClientError::Connect {
                addr: addr.clone(),
                message,
            };
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| failed(e.to_string()))?
                .connect()
                .await
                .map_err(|e| failed(primus_telemetry::error_chain(&e)))?;
            shards.push(
                ParameterServerClient::with_interceptor(channel, TraceInterceptor)
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20),
            );
        }
        Ok(Self { shards })
    }

    fn route(&self, keys: &[u64]) -> Vec<Route> {
        let n = self.shards.len() as u32;
        let mut routes: Vec<Route> = (0..n)
            .map(|_| Route {
                keys: Vec::new(),
                positions: Vec::new(),
            })
            .collect();
        let mut seen: HashMap<u64, (usize, usize)> = HashMap::with_capacity(keys.len());
        for (position, key) in keys.iter().enumerate() {
            let (shard, index) = *seen.entry(*key).or_insert_with(|| {
                let shard = jump_consistent_hash(*key, n) as usize;
                routes[shard].keys.push(*key);
                (shard, routes[shard].keys.len() - 1)
            });
            routes[shard].positions.push((position, index));
        }
        routes
    }

    /// Calls every shard that `routes` gives keys, at once, with its client and its keys
    /// packed; a failed call names its shard.
    async fn per_shard<T, F, Fut>(
        &self,
        routes: &[Route],
        call: F,
    ) -> Result<Vec<(usize, T)>, PsClientError>
    where
        F: Fn(ShardClient, Vec<u8>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let calls = routes
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.keys.is_empty())
            .map(|(shard, route)| {
                let answer = call(self.shards[shard].clone(), encode_keys(&route.keys));
                async move {
                    answer
                        .await
                        .map(|answer| (shard, answer))
                        .map_err(|status| PsClientError::Call { shard, status })
                }
            });
        try_join_all(calls).await
    }

    /// Rows of `keys` in request order (`dim` floats each), and `dim`.
    pub async fn lookup(
        &self,
        table: &str,
        keys: &[u64],
    ) -> Result<(Vec<f32>, usize), PsClientError> {
        let routes = self.route(keys);
        let answers = self
            .per_shard(&routes, |mut client, keys| async move {
                let request = LookupRequest {
                    table: table.to_owned(),
                    keys,
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

    /// The stored rows of `keys` with their optimizer state, from every shard at once.
    /// Keys without a row are left out.
    pub async fn read_rows(&self, table: &str, keys: &[u64]) -> Result<StoredRows, PsClientError> {
        let routes = self.route(keys);
        let answers = self
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

    /// Pushes `grads` (`dim` floats per key, in key order); duplicate keys have their
    /// gradients applied one after another, as one table would. Returns (applied, dropped).
    pub async fn push(
        &self,
        table: &str,
        keys: &[u64],
        grads: &[f32],
    ) -> Result<(u64, u64), PsClientError> {
        if keys.is_empty() {
            return Ok((0, 0));
        }
        if !grads.len().is_multiple_of(keys.len()) {
            return Err(PsClientError::GradientWidth {
                got: grads.len(),
                keys: keys.len(),
            });
        }
        let dim = grads.len() / keys.len();
        let n = self.shards.len() as u32;
        let mut per_shard: Vec<(Vec<u64>, Vec<u8>)> =
            vec![(Vec::new(), Vec::new()); self.shards.len()];
        for (position, key) in keys.iter().enumerate() {
            let shard = jump_consistent_hash(*key, n) as usize;
            per_shard[shard].0.push(*key);
            encode_f32(
                &grads[position * dim..(position + 1) * dim],
                &mut per_shard[shard].1,
            );
        }
        let calls = per_shard
            .into_iter()
            .enumerate()
            .filter(|(_, (k, _))| !k.is_empty())
            .map(|(shard, (shard_keys, shard_grads))| {
                let mut client = self.shards[shard].clone();
                let request = PushRequest {
                    table: table.to_owned(),
                    keys: encode_keys(&shard_keys),
                    grads: shard_grads,
                };
                async move {
                    let response = client
                        .push(request)
                        .await
                        .map_err(|status| PsClientError::Call { shard, status })?
                        .into_inner();
                    Ok::<_, PsClientError>((response.applied, response.dropped))
                }
            });
        let outcomes = try_join_all(calls).await?;
        Ok(outcomes
            .into_iter()
            .fold((0, 0), |(a, d), (x, y)| (a + x, d + y)))
    }

    /// The shard holding dense tensor `name` (spread by a hash of the name).
    fn dense_shard(&self, name: &str) -> usize {
        let key = primus_batch::hash::hash_bytes(name.as_bytes());
        jump_consistent_hash(key, self.shards.len() as u32) as usize
    }

    /// Groups `items` by the shard of their dense tensor name.
    fn by_dense_shard<T>(&self, items: impl IntoIterator<Item = (String, T)>) -> Vec<Vec<T>> {
        let mut groups: Vec<Vec<T>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for (name, item) in items {
            groups[self.dense_shard(&name)].push(item);
        }
        groups
    }

    /// Offers initial values; tensors that exist keep theirs (the first trainer wins).
    /// Returns the names this call created.
    pub async fn init_dense(&self, tensors: &[DenseValues]) -> Result<Vec<String>, PsClientError> {
        let groups =
            self.by_dense_shard(tensors.iter().map(|t| (t.name.clone(), dense_to_proto(t))));
        let calls = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(shard, tensors)| {
                let mut client = self.shards[shard].clone();
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

    /// Current values of `names`, in that order.
    pub async fn pull_dense(&self, names: &[String]) -> Result<Vec<DenseValues>, PsClientError> {
        let groups = self.by_dense_shard(names.iter().map(|n| (n.clone(), n.clone())));
        let calls = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(shard, names)| {
                let mut client = self.shards[shard].clone();
                async move {
                    let response = client
                        .pull_dense(PullDenseRequest { names })
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
                        shard: self.dense_shard(name),
                        name: name.clone(),
                    })
            })
            .collect()
    }

    /// Applies gradients with each shard's dense optimizer.
    pub async fn push_dense(&self, grads: &[DenseValues]) -> Result<(), PsClientError> {
        let groups = self.by_dense_shard(grads.iter().map(|g| (g.name.clone(), dense_to_proto(g))));
        let calls = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .map(|(shard, grads)| {
                let mut client = self.shards[shard].clone();
                async move {
                    client
                        .push_dense(PushDenseRequest { grads })
                        .await
                        .map_err(|status| PsClientError::Call { shard, status })?;
                    Ok::<_, PsClientError>(())
                }
            });
        try_join_all(calls).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_hash_spreads_keys_and_moves_few_on_growth() {
        let keys: Vec<u64> = (0..10_000u64)
            .map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let mut counts = [0usize; 4];
        for k in &keys {
            counts[jump_consistent_hash(*k, 4) as usize] += 1;
        }
        assert!(
            counts.iter().all(|c| (2_200..2_800).contains(c)),
            "{counts:?}"
        );
        let moved = keys
            .iter()
            .filter(|k| jump_consistent_hash(**k, 4) != jump_consistent_hash(**k, 5))
            .count();
        // Growing 4 -> 5 shards moves about a fifth of the keys, all to the new shard.
        assert!((1_700..2_300).contains(&moved), "{moved}");
        assert!(keys.iter().all(|k| {
            let (before, after) = (jump_consistent_hash(*k, 4), jump_consistent_hash(*k, 5));
            before == after || after == 4
        }));
    }
}
