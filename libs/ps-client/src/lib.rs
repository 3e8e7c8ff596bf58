//! Client of a job's PS shards: routes each key to a shard by jump consistent hash
//! ([`layout`]), sends each shard its unique keys in parallel, and reassembles rows in
//! request order. When a shard answers that its keys moved (the Job is being resharded), the
//! client asks its [`ShardSource`] for the new shard list and retries what was refused, so
//! every gradient is applied exactly once. [`reshard`] moves a Job's parameters from one
//! shard list to another.

#![warn(missing_docs)]

mod dense;
pub mod layout;
pub mod reshard;
mod shard_calls;
mod tables;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

pub use dense::{DensePushed, DenseState};
use futures::future::{BoxFuture, try_join_all};
pub use layout::{Layout, jump_consistent_hash};
use primus_batch::hash::KeyMap;
pub use primus_embedding::DenseValues;
use primus_proto::v1::DenseTensor;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_telemetry::propagation::TraceInterceptor;
pub use tables::{TableGrads, TableKeys, TableRows};
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use primus_proto::packed::{decode_f32, encode_f32, encode_keys};
use shard_calls::{
    Gradients, init_dense_on, lookup_on, pull_dense_on, push_dense_on, push_on, read_rows_on,
};

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
    /// A shard kept refusing moved keys and no new shard list came.
    #[error("PS shard {shard} refused moved parameters for {waited:?} and no new shard list came")]
    MovedTooLong {
        /// The refusing shard.
        shard: usize,
        /// How long the client waited.
        waited: Duration,
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

impl PsClientError {
    /// Whether a shard refused the call because the parameters it touches moved.
    pub fn is_moved(&self) -> bool {
        matches!(self, Self::Call { status, .. } if is_moved(status))
    }

    /// Whether a shard could not be reached (a shard that left refuses connections).
    fn is_unreachable(&self) -> bool {
        matches!(self, Self::Call { status, .. } if is_unreachable(status))
    }
}

/// The metadata key of a shard's refusal of moved parameters.
pub const MOVED_METADATA: &str = "primus-ps-moved";

/// Whether `status` is a shard's refusal of parameters that moved to another shard.
pub fn is_moved(status: &Status) -> bool {
    status.code() == tonic::Code::Aborted && status.metadata().get(MOVED_METADATA).is_some()
}

/// Whether a call failed because its shard could not be reached (down, restarting, or
/// gone after a resharding), refused it unprocessed while going away, or died under it
/// (its connection reset): the shard's part of a push is held and sent again. A shard
/// that died mid-call lost that call's update with everything since its checkpoint, so
/// the resend applies it at most once, on the restored rows.
pub(crate) fn is_unreachable(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable
        || refused_by_go_away(status)
        || connection_broke(status)
}

/// A call whose connection the shard's end reset or closed (the process died, or it shut
/// down before the call was sent: hyper cancels what it had not sent yet).
fn connection_broke(status: &Status) -> bool {
    use std::io::ErrorKind;
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(hyper) = error.downcast_ref::<hyper::Error>()
            && hyper.is_canceled()
        {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            );
        }
        source = error.source();
    }
    false
}

/// A call on a connection the shard closed with HTTP/2 GOAWAY (it shuts down) after the
/// last stream it processes: this one was never processed.
fn refused_by_go_away(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_remote();
        }
        source = error.source();
    }
    false
}

fn dense_to_proto(tensor: &DenseValues) -> DenseTensor {
    let mut values = Vec::with_capacity(tensor.values.len() * 4);
    encode_f32(&tensor.values, &mut values);
    DenseTensor {
        name: tensor.name.clone(),
        shape: tensor.shape.clone(),
        values: values.into(),
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

/// Where the Job's PS shards are now, in shard order: a client asks when a shard says the
/// parameters it was asked for moved.
pub type ShardSource =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Vec<String>, String>> + Send + Sync>;

/// How often a refused client asks its source for a new shard list, and how long it waits
/// before it tries the refused call again with the list it has.
const MOVE_POLL: Duration = Duration::from_millis(10);
const MOVE_RETRY: Duration = Duration::from_millis(250);
/// A refused call gives up after this long (a resharding that never finished, a shard
/// that does not come back).
const MOVE_GIVE_UP: Duration = Duration::from_secs(300);

/// The shards a client routes over, in shard order.
struct Shards {
    addrs: Vec<String>,
    clients: Vec<ShardClient>,
}

impl Shards {
    async fn connect(addrs: &[String]) -> Result<Self, PsClientError> {
        if addrs.is_empty() {
            return Err(PsClientError::NoShards);
        }
        let mut clients = Vec::with_capacity(addrs.len());
        for addr in addrs {
            clients.push(connect_shard(addr).await?);
        }
        Ok(Self {
            addrs: addrs.to_vec(),
            clients,
        })
    }

    fn count(&self) -> u32 {
        self.clients.len() as u32
    }

    fn route(&self, keys: &[u64]) -> Vec<Route> {
        let n = self.count();
        let mut routes: Vec<Route> = (0..n)
            .map(|_| Route {
                keys: Vec::new(),
                positions: Vec::new(),
            })
            .collect();
        let mut seen: KeyMap<(usize, usize)> =
            KeyMap::with_capacity_and_hasher(keys.len(), Default::default());
        for (position, key) in keys.iter().enumerate() {
            let (shard, index) = *seen.entry(*key).or_insert_with(|| {
                let shard = layout::key_shard(*key, n) as usize;
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
                let answer = call(self.clients[shard].clone(), encode_keys(&route.keys));
                async move {
                    answer
                        .await
                        .map(|answer| (shard, answer))
                        .map_err(|status| PsClientError::Call { shard, status })
                }
            });
        try_join_all(calls).await
    }

    /// Groups `items` by the shard of their dense tensor name.
    fn by_dense_shard<T>(&self, items: impl IntoIterator<Item = (String, T)>) -> Vec<Vec<T>> {
        let mut groups: Vec<Vec<T>> = (0..self.clients.len()).map(|_| Vec::new()).collect();
        for (name, item) in items {
            groups[layout::dense_shard(&name, self.count()) as usize].push(item);
        }
        groups
    }
}

async fn connect_shard(addr: &str) -> Result<ShardClient, PsClientError> {
    let failed = |message: String| PsClientError::Connect {
        addr: addr.to_owned(),
        message,
    };
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| failed(e.to_string()))?
        .max_frame_size(primus_proto::MAX_FRAME_SIZE)
        .connect()
        .await
        .map_err(|e| failed(primus_telemetry::error_chain(&e)))?;
    Ok(
        ParameterServerClient::with_interceptor(channel, TraceInterceptor)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20),
    )
}

/// A client of a Job's PS shards (cheap to clone; clones share the shard list).
#[derive(Clone)]
pub struct PsClient {
    /// Every call carries the caller's trace context (the PS request span continues it).
    shards: Arc<RwLock<Arc<Shards>>>,
    source: Option<ShardSource>,
    /// How long each call that met moved parameters waited before it was answered.
    move_waits: Arc<Mutex<Vec<Duration>>>,
}

/// The keys one shard gets: unique keys and where each came from in the request.
struct Route {
    keys: Vec<u64>,
    /// For each request position routed here: index into `keys`.
    positions: Vec<(usize, usize)>,
}

/// A call that met moved parameters: when, and how long it may still wait.
#[derive(Default)]
struct Refusals {
    first: Option<Instant>,
}

impl PsClient {
    /// Connects to every shard (`host:port`, in the job topology's shard order).
    pub async fn connect(addrs: &[String]) -> Result<Self, PsClientError> {
        Ok(Self {
            shards: Arc::new(RwLock::new(Arc::new(Shards::connect(addrs).await?))),
            source: None,
            move_waits: Arc::default(),
        })
    }

    /// Follows resharding: when a shard refuses moved parameters, asks `source` for the
    /// shard list and retries what was refused. Without a source a refusal is an error.
    pub fn following(mut self, source: ShardSource) -> Self {
        self.source = Some(source);
        self
    }

    /// The shard addresses this client routes over now.
    pub fn addrs(&self) -> Vec<String> {
        self.current().addrs.clone()
    }

    /// How long each call that met moved parameters waited, oldest first (drained).
    pub fn take_move_waits(&self) -> Vec<Duration> {
        std::mem::take(
            &mut *self
                .move_waits
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    fn current(&self) -> Arc<Shards> {
        self.shards
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// After `refused` on `seen`: waits for a new shard list (or a while, to try again),
    /// or gives up after [`MOVE_GIVE_UP`] or without a source. A shard that cannot be
    /// reached is tried again: at its new address if the list changed (it left in a
    /// resharding, or was replaced), else at the same one (it is restarting).
    async fn follow_move(
        &self,
        seen: &Arc<Shards>,
        refused: PsClientError,
        refusals: &mut Refusals,
    ) -> Result<(), PsClientError> {
        let gone = !refused.is_moved() && refused.is_unreachable();
        let (Some(source), true) = (&self.source, refused.is_moved() || gone) else {
            return Err(refused);
        };
        let first = *refusals.first.get_or_insert_with(Instant::now);
        if first.elapsed() > MOVE_GIVE_UP {
            let shard = match refused {
                PsClientError::Call { shard, .. } => shard,
                _ => 0,
            };
            return Err(PsClientError::MovedTooLong {
                shard,
                waited: first.elapsed(),
            });
        }
        if !Arc::ptr_eq(&self.current(), seen) {
            return Ok(());
        }
        let retry_at = Instant::now() + MOVE_RETRY;
        while Instant::now() < retry_at {
            tokio::time::sleep(MOVE_POLL).await;
            let addrs = match source().await {
                Ok(addrs) if !addrs.is_empty() && addrs != seen.addrs => addrs,
                // Down, and not because it left (restarting, or its replacement not
                // listed yet): tried again at the same address.
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "asking for the PS shard list");
                    continue;
                }
            };
            let shards = Arc::new(Shards::connect(&addrs).await?);
            let mut current = self.shards.write().unwrap_or_else(PoisonError::into_inner);
            if Arc::ptr_eq(&current, seen) {
                tracing::info!(shards = ?addrs, "PS shards changed");
                *current = shards;
            }
            return Ok(());
        }
        Ok(())
    }

    fn answered(&self, refusals: &Refusals) {
        if let Some(first) = refusals.first {
            self.move_waits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(first.elapsed());
        }
    }

    /// Runs `call` (which must be safe to repeat whole) until no shard refuses it for
    /// moved parameters.
    async fn repeatable<T, F, Fut>(&self, call: F) -> Result<T, PsClientError>
    where
        F: Fn(Arc<Shards>) -> Fut,
        Fut: Future<Output = Result<T, PsClientError>>,
    {
        let mut refusals = Refusals::default();
        loop {
            let shards = self.current();
            match call(shards.clone()).await {
                Ok(answer) => {
                    self.answered(&refusals);
                    return Ok(answer);
                }
                Err(e) => self.follow_move(&shards, e, &mut refusals).await?,
            }
        }
    }

    /// Rows of `keys` in request order (`dim` floats each), and `dim`.
    pub async fn lookup(
        &self,
        table: &str,
        keys: &[u64],
    ) -> Result<(Vec<f32>, usize), PsClientError> {
        self.repeatable(|shards| lookup_on(shards, table, keys))
            .await
    }

    /// The stored rows of `keys` with their optimizer state, from every shard at once.
    /// Keys without a row are left out.
    pub async fn read_rows(&self, table: &str, keys: &[u64]) -> Result<StoredRows, PsClientError> {
        self.repeatable(|shards| read_rows_on(shards, table, keys))
            .await
    }

    /// Pushes `grads` (`dim` floats per key, in key order); duplicate keys have their
    /// gradients applied one after another, as one table would. Returns (applied, dropped):
    /// dropped gradients are those of keys not admitted yet or refused a row by a shard at
    /// its memory limit.
    /// A shard's part that is refused because its keys moved is pushed again to their new
    /// shards, and only that part: every gradient is applied once.
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
        let (mut applied, mut dropped) = (0, 0);
        let mut refusals = Refusals::default();
        let mut pending: Option<Gradients> = None;
        loop {
            let shards = self.current();
            let (keys, grads) = pending
                .as_ref()
                .map_or((keys, grads), |(k, g)| (k.as_slice(), g.as_slice()));
            let outcome = push_on(&shards, table, keys, grads, dim).await;
            applied += outcome.applied;
            dropped += outcome.dropped;
            match outcome.refused {
                None => {
                    self.answered(&refusals);
                    return Ok((applied, dropped));
                }
                Some((error, left)) => {
                    self.follow_move(&shards, error, &mut refusals).await?;
                    pending = Some(left);
                }
            }
        }
    }

    /// Offers initial values; tensors that exist keep theirs (the first trainer wins).
    /// Returns the names this call created.
    pub async fn init_dense(&self, tensors: &[DenseValues]) -> Result<Vec<String>, PsClientError> {
        self.repeatable(|shards| init_dense_on(shards, tensors))
            .await
    }

    /// Current values of `names`, in that order.
    pub async fn pull_dense(&self, names: &[String]) -> Result<Vec<DenseValues>, PsClientError> {
        self.repeatable(|shards| pull_dense_on(shards, names)).await
    }

    /// Applies gradients with each shard's dense optimizer; a shard's part refused because
    /// its tensors moved is pushed again to their new shards, and only that part. Returns
    /// the version each shard's dense store reached. A nonzero `minibatch` identity is
    /// applied once per shard (see `PushDenseRequest`).
    pub async fn push_dense(
        &self,
        grads: Vec<DenseValues>,
        minibatch: u64,
    ) -> Result<DensePushed, PsClientError> {
        let mut refusals = Refusals::default();
        let mut pending = grads;
        let mut pushed = DensePushed::default();
        loop {
            let shards = self.current();
            match push_dense_on(&shards, pending, minibatch, &mut pushed).await {
                None => {
                    self.answered(&refusals);
                    return Ok(pushed);
                }
                Some((error, left)) => {
                    self.follow_move(&shards, error, &mut refusals).await?;
                    pushed.moved = true;
                    pending = left;
                }
            }
        }
    }
}
