//! The ring exchange of a round's hot-row gradients over direct gRPC streams, one from
//! each trainer to the next, kept open across rounds (HypeReca §4). A
//! round's participants, in member order, form a ring; the hot rows are sharded among them
//! by key (each participant owns the rows whose key hashes to its place). In n-1
//! reduce-scatter steps every participant passes one shard's partial sum to the next, which
//! adds its own gradients of that shard; after them each holds the full sum of the shard
//! it owns. In n-1 all-gather steps the full sums go around once more. Each participant
//! sends about 2(n-1)/n of a share per round, every link carries the same load at every
//! step (no contention), and since each shard's sum is computed once and then copied, every
//! member applies bitwise the same sum. The owner of a shard pushes it to the PS.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context;
use primus_proto::v1::hot_exchange_client::HotExchangeClient;
use primus_proto::v1::hot_exchange_server::{HotExchange, HotExchangeServer};
use primus_proto::v1::{HotPass, HotPassAck};

use primus_spec::job::TableSpec;
use prost::Message;
use tokio::sync::Notify;

use super::share::{parse_rows, share_rows};
use super::{Rows, Share};

/// (generation, round, step) of a pass.
type PassKey = (u64, u64, u32);

/// Passes that reached this trainer's HotExchange service, until its rounds take them.
#[derive(Default)]
pub struct RingInbox {
    passes: Mutex<HashMap<PassKey, HotPass>>,
    arrived: Notify,
    received_bytes: AtomicU64,
}

impl RingInbox {
    /// The gRPC service that files passes here, refusing a pass of more than
    /// `max_pass_bytes` (RESOURCE_EXHAUSTED).
    pub fn service(self: &Arc<Self>, max_pass_bytes: usize) -> HotExchangeServer<RingService> {
        HotExchangeServer::new(RingService {
            inbox: self.clone(),
        })
        .max_decoding_message_size(max_pass_bytes)
    }

    /// The largest pass a hot set of at most `max_rows` rows of tables `specs` can make:
    /// every row of the widest table, with its key, and room for the pass's own fields.
    pub fn max_pass_bytes(max_rows: u64, specs: &[TableSpec]) -> usize {
        let widest = specs.iter().map(|s| s.dim as usize).max().unwrap_or(0);
        let rows = usize::try_from(max_rows).unwrap_or(usize::MAX);
        rows.saturating_mul(8 + 4 * widest).saturating_add(1 << 20)
    }

    /// Waits for the pass of `key` until `deadline`.
    async fn take(&self, key: PassKey, deadline: Instant) -> Option<HotPass> {
        loop {
            let arrived = self.arrived.notified();
            if let Some(pass) = self.lock().remove(&key) {
                return Some(pass);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, arrived).await.is_err() {
                return self.lock().remove(&key);
            }
        }
    }

    /// Drops passes of rounds up to (`generation`, `round`): late or left over.
    fn forget_through(&self, generation: u64, round: u64) {
        self.lock()
            .retain(|(g, r, _), _| (*g, *r) > (generation, round));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PassKey, HotPass>> {
        self.passes.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The HotExchange service of one trainer.
pub struct RingService {
    inbox: Arc<RingInbox>,
}

#[tonic::async_trait]
impl HotExchange for RingService {
    async fn passes(
        &self,
        request: tonic::Request<tonic::Streaming<HotPass>>,
    ) -> Result<tonic::Response<HotPassAck>, tonic::Status> {
        let mut passes = request.into_inner();
        while let Some(pass) = passes.message().await? {
            (self.inbox.received_bytes).fetch_add(pass.encoded_len() as u64, Ordering::Relaxed);
            let key = (pass.generation, pass.round, pass.step);
            self.inbox.lock().insert(key, pass);
            self.inbox.arrived.notify_waiters();
        }
        Ok(tonic::Response::new(HotPassAck {}))
    }
}

/// This trainer's open stream of passes to one other trainer.
struct Outbox {
    passes: tokio::sync::mpsc::Sender<HotPass>,
    stream: tokio::task::JoinHandle<Result<(), tonic::Status>>,
}

impl Outbox {
    async fn open(addr: &str) -> anyhow::Result<Self> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .with_context(|| format!("the address {addr:?}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let mut client = HotExchangeClient::new(channel).max_encoding_message_size(usize::MAX);
        let (passes, queued) = tokio::sync::mpsc::channel(OUTBOX_PASSES);
        let stream = tokio::spawn(async move {
            let queued = tokio_stream::wrappers::ReceiverStream::new(queued);
            client.passes(queued).await.map(|_| ())
        });
        Ok(Self { passes, stream })
    }
}

/// Passes queued on a stream before a send waits: a ring round makes 2(n-1).
const OUTBOX_PASSES: usize = 64;

/// Where a trainer takes part in ring exchanges: its inbox, served at `addr`.
#[derive(Clone)]
pub struct RingEndpoint {
    pub inbox: Arc<RingInbox>,
    pub addr: String,
}

impl RingEndpoint {
    /// An inbox served on its own gRPC server at `bind` (port 0: any), until the task is
    /// aborted; for tests and benchmarks (a trainer serves the inbox beside its health).
    pub async fn serve(bind: SocketAddr) -> anyhow::Result<(Self, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding the hot-set exchange to {bind}"))?;
        let addr = listener.local_addr()?.to_string();
        let inbox = Arc::new(RingInbox::default());
        let service = inbox.service(usize::MAX);
        // Passes are small and answered at once: no Nagle delay on either side.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |stream| stream.and_then(|s| s.set_nodelay(true).map(|()| s)),
        );
        let server = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the hot-set exchange server stopped");
            }
        });
        Ok((Self { inbox, addr }, server))
    }
}

/// A round's participant: its trainer id and exchange address.
pub(super) struct Participant {
    pub id: String,
    pub addr: String,
}

/// What a ring round gives one participant.
pub(super) struct RingSum {
    /// Every participant's gradients summed: the same bits on each.
    pub summed: Share,
    /// The shard of `summed` this participant owns, which it pushes to the PS.
    pub owned: Share,
}

/// One trainer's side of the ring exchanges.
pub(super) struct Ring {
    endpoint: RingEndpoint,
    outboxes: HashMap<String, Outbox>,
    sent_bytes: u64,
}

impl Ring {
    pub(super) fn new(endpoint: RingEndpoint) -> Self {
        Self {
            endpoint,
            outboxes: HashMap::new(),
            sent_bytes: 0,
        }
    }

    pub(super) fn addr(&self) -> &str {
        &self.endpoint.addr
    }

    /// Bytes of gradients this trainer sent and received on the ring so far.
    pub(super) fn bytes(&self) -> (u64, u64) {
        let received = self.endpoint.inbox.received_bytes.load(Ordering::Relaxed);
        (self.sent_bytes, received)
    }

    /// Sums `share` with every other participant's around the ring of `participants`
    /// (member order; `me` among them) for round `round` of `generation`. `Err` names the
    /// participant that did not pass its part before `deadline` or could not be reached.
    pub(super) async fn all_reduce(
        &mut self,
        me: &str,
        participants: &[Participant],
        (generation, round): (u64, u64),
        share: &Share,
        specs: &[TableSpec],
        deadline: Instant,
    ) -> Result<RingSum, Vec<String>> {
        let n = participants.len();
        let Some(at) = participants.iter().position(|p| p.id == me) else {
            return Err(vec![me.to_owned()]);
        };
        let (left, right) = (&participants[(at + n - 1) % n], &participants[(at + 1) % n]);
        let mut shards = shard(share, n);
        let inbox = self.endpoint.inbox.clone();
        let passes = 2 * (n - 1);
        for step in 0..passes {
            // Reduce-scatter: pass the partial sum of shard at-step-1, take at-step-2's.
            // All-gather: pass the full sum of shard at-(step-n+1), take the one before.
            let (send, take) = if step < n - 1 {
                ((at + 2 * n - step - 1) % n, (at + 2 * n - step - 2) % n)
            } else {
                let t = step - (n - 1);
                ((at + 2 * n - t) % n, (at + 2 * n - t - 1) % n)
            };
            let pass = HotPass {
                trainer_id: me.to_owned(),
                generation,
                round,
                step: step as u32,
                rows: share_rows(&shards[send]),
            };
            let key = (generation, round, step as u32);
            let (sent, taken) =
                tokio::join!(self.send(&right.addr, pass), inbox.take(key, deadline));
            if let Err(e) = sent {
                tracing::warn!(member = %right.id, error = %e, "passing hot-set gradients");
                return Err(vec![right.id.clone()]);
            }
            let Some(taken) = taken else {
                return Err(vec![left.id.clone()]);
            };
            let rows = parse_rows(&taken.rows, specs).map_err(|e| {
                tracing::warn!(member = %left.id, error = %e, "a malformed hot-set pass");
                vec![left.id.clone()]
            })?;
            let taken = if step < n - 1 {
                add_sorted(&rows, &shards[take])
            } else {
                rows
            };
            shards[take] = taken;
        }
        inbox.forget_through(generation, round);
        let owned = shards[at].clone();
        let summed = concat(specs.len(), &shards);
        Ok(RingSum { summed, owned })
    }

    /// Queues `pass` on the stream to `addr`, opening it (again, once it broke) first.
    async fn send(&mut self, addr: &str, pass: HotPass) -> anyhow::Result<()> {
        let bytes = pass.encoded_len() as u64;
        if self
            .outboxes
            .get(addr)
            .is_none_or(|o| o.stream.is_finished())
        {
            self.outboxes
                .insert(addr.to_owned(), Outbox::open(addr).await?);
        }
        let Some(outbox) = self.outboxes.get(addr) else {
            unreachable!("opened above")
        };
        if outbox.passes.send(pass).await.is_err() {
            self.outboxes.remove(addr);
            anyhow::bail!("{addr}: the stream of passes ended");
        }
        self.sent_bytes += bytes;
        Ok(())
    }
}

/// The participant (0..n) that owns `key` of layout table `table`: the sharded index.
fn owner(table: usize, key: u64, n: usize) -> usize {
    let mixed = primus_batch::hash::mix64(key ^ primus_batch::hash::mix64(table as u64 + 1));
    (mixed % n as u64) as usize
}

/// `share` split into `n` shards by owner, each table's rows sorted by key, so partial
/// sums merge without hashing.
fn shard(share: &Share, n: usize) -> Vec<Share> {
    let mut shards = vec![Share::empty(share.tables.len()); n];
    for (t, (keys, grads)) in share.tables.iter().enumerate() {
        if keys.is_empty() {
            continue;
        }
        let dim = grads.len() / keys.len();
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by_key(|&i| keys[i]);
        for i in order {
            let rows = &mut shards[owner(t, keys[i], n)].tables[t];
            rows.0.push(keys[i]);
            rows.1.extend_from_slice(&grads[i * dim..(i + 1) * dim]);
        }
    }
    shards
}

/// `received + own`, per table, each sorted by key (so the sum is too); a key in both is
/// summed in that order, the same on whichever member computes it.
fn add_sorted(received: &Share, own: &Share) -> Share {
    let tables = received.tables.iter().zip(&own.tables);
    Share {
        tables: tables.map(|(a, b)| add_rows(a, b)).collect(),
    }
}

fn add_rows((a_keys, a_grads): &Rows, (b_keys, b_grads): &Rows) -> Rows {
    let dim = match (a_keys.len(), b_keys.len()) {
        (0, 0) => return Rows::default(),
        (0, _) => return (b_keys.clone(), b_grads.clone()),
        (_, 0) => return (a_keys.clone(), a_grads.clone()),
        (n, _) => a_grads.len() / n,
    };
    let mut keys = Vec::with_capacity(a_keys.len() + b_keys.len());
    let mut grads = Vec::with_capacity(a_grads.len() + b_grads.len());
    let (mut i, mut j) = (0, 0);
    while i < a_keys.len() || j < b_keys.len() {
        let a = a_keys.get(i).copied().unwrap_or(u64::MAX);
        let b = b_keys.get(j).copied().unwrap_or(u64::MAX);
        let (take_a, take_b) = match (i < a_keys.len(), j < b_keys.len()) {
            (true, true) => (a <= b, b <= a),
            (in_a, _) => (in_a, !in_a),
        };
        let row_a = take_a.then(|| &a_grads[i * dim..(i + 1) * dim]);
        let row_b = take_b.then(|| &b_grads[j * dim..(j + 1) * dim]);
        match (row_a, row_b) {
            (Some(x), Some(y)) => {
                keys.push(a);
                grads.extend(x.iter().zip(y).map(|(x, y)| x + y));
            }
            (Some(x), None) => {
                keys.push(a);
                grads.extend_from_slice(x);
            }
            (None, Some(y)) => {
                keys.push(b);
                grads.extend_from_slice(y);
            }
            (None, None) => unreachable!("one side has a row left"),
        }
        i += usize::from(take_a);
        j += usize::from(take_b);
    }
    (keys, grads)
}

/// The shards' rows one after the other, per table.
fn concat(tables: usize, shards: &[Share]) -> Share {
    let mut all = Share::empty(tables);
    for shard in shards {
        for ((keys, grads), (shard_keys, shard_grads)) in all.tables.iter_mut().zip(&shard.tables) {
            keys.extend_from_slice(shard_keys);
            grads.extend_from_slice(shard_grads);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use primus_spec::job::OptimizerSpec;

    use super::*;
    use crate::hot::share::tests::share;

    /// Four trainers over real gRPC: each gets the sum of all four shares, bit for bit the
    /// same, every shard owned once, each sending 2(n-1)/n of its share.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_members_sum_their_shares_around_the_ring() {
        let specs = vec![TableSpec::new("t", 2, OptimizerSpec::adagrad(0.1))];
        let mut endpoints = Vec::new();
        for _ in 0..4 {
            let bind = SocketAddr::from(([127, 0, 0, 1], 0));
            endpoints.push(RingEndpoint::serve(bind).await.expect("serve"));
        }
        let participants: Vec<Participant> = (endpoints.iter().enumerate())
            .map(|(i, (e, _))| Participant {
                id: format!("trainer-{i}"),
                addr: e.addr.clone(),
            })
            .collect();
        let shares: Vec<Share> = (0..4u64)
            .map(|m| {
                // Hot rows are the ones every member touches in a step; one member skips some.
                let rows: Vec<(u64, f32)> = (0..400u64)
                    .filter(|k| m != 3 || k % 5 != 0)
                    .map(|k| (k, (k * (m + 1)) as f32 * 0.001))
                    .collect();
                share(&rows)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let runs = (endpoints.iter().enumerate()).map(|(m, (endpoint, _))| {
            let (participants, share, specs) = (&participants, &shares[m], &specs);
            let mut ring = Ring::new(endpoint.clone());
            async move {
                let me = format!("trainer-{m}");
                let sum = (ring.all_reduce(&me, participants, (1, 5), share, specs, deadline))
                    .await
                    .expect("all-reduce");
                (sum, ring.bytes())
            }
        });
        let results = futures::future::join_all(runs).await;
        let first = &results[0].0.summed;
        let mut expected: HashMap<u64, [f64; 2]> = HashMap::new();
        for s in &shares {
            for (key, g) in s.tables[0].0.iter().zip(s.tables[0].1.chunks_exact(2)) {
                let sum = expected.entry(*key).or_default();
                sum[0] += f64::from(g[0]);
                sum[1] += f64::from(g[1]);
            }
        }
        assert_eq!(first.tables[0].0.len(), expected.len());
        for (key, g) in first.tables[0]
            .0
            .iter()
            .zip(first.tables[0].1.chunks_exact(2))
        {
            let want = expected[key];
            assert!((f64::from(g[0]) - want[0]).abs() < 1e-5, "key {key}");
            assert!((f64::from(g[1]) - want[1]).abs() < 1e-5, "key {key}");
        }
        let mut owned_keys = 0;
        let share_bytes = share_rows(&shares[0])
            .iter()
            .map(|r| r.encoded_len())
            .sum::<usize>() as f64;
        for (sum, (sent, received)) in &results {
            assert_eq!(&sum.summed, first, "bitwise the same sum everywhere");
            owned_keys += sum.owned.tables[0].0.len();
            // 2(n-1)/n = 1.5 shares, and the passes' own fields.
            let ratio = *sent as f64 / share_bytes;
            assert!((1.45..1.6).contains(&ratio), "sent {ratio:.2} shares");
            assert!(*received > 0);
        }
        assert_eq!(owned_keys, expected.len(), "each row owned once");
        for (_, server) in endpoints {
            server.abort();
        }
    }

    #[test]
    fn a_pass_may_hold_every_hot_row_of_the_widest_table() {
        let specs = [
            TableSpec::new("narrow", 4, OptimizerSpec::adagrad(0.1)),
            TableSpec::new("wide", 16, OptimizerSpec::adagrad(0.1)),
        ];
        let limit = RingInbox::max_pass_bytes(100_000, &specs);
        assert_eq!(limit, 100_000 * (8 + 64) + (1 << 20));
        let rows: Vec<(u64, f32)> = (0..1000).map(|k| (k, 0.5)).collect();
        let pass = HotPass {
            rows: share_rows(&share(&rows)),
            ..HotPass::default()
        };
        assert!(pass.encoded_len() <= RingInbox::max_pass_bytes(1000, &specs));
    }

    #[test]
    fn sorted_rows_add_by_key() {
        let a = (vec![1, 3, 9], vec![1.0, 1.0, 3.0, 3.0, 9.0, 9.0]);
        let b = (vec![2, 3], vec![2.0, 2.0, 0.5, 0.5]);
        let sum = add_rows(&a, &b);
        assert_eq!(sum.0, vec![1, 2, 3, 9]);
        assert_eq!(sum.1, vec![1.0, 1.0, 2.0, 2.0, 3.5, 3.5, 9.0, 9.0]);
        assert_eq!(add_rows(&a, &Rows::default()), a);
        assert_eq!(add_rows(&Rows::default(), &b), b);
    }

    /// A participant that never passes its part: the round fails naming it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_neighbour_is_named() {
        let specs = vec![TableSpec::new("t", 2, OptimizerSpec::adagrad(0.1))];
        let bind = SocketAddr::from(([127, 0, 0, 1], 0));
        let (mine, server) = RingEndpoint::serve(bind).await.expect("serve");
        let (other, other_server) = RingEndpoint::serve(bind).await.expect("serve");
        let participants = [
            Participant {
                id: "a".into(),
                addr: mine.addr.clone(),
            },
            Participant {
                id: "b".into(),
                addr: other.addr.clone(),
            },
        ];
        let deadline = Instant::now() + Duration::from_millis(300);
        let mut ring = Ring::new(mine);
        let silent = ring
            .all_reduce(
                "a",
                &participants,
                (1, 1),
                &share(&[(1, 1.0)]),
                &specs,
                deadline,
            )
            .await
            .err();
        assert_eq!(silent, Some(vec!["b".to_owned()]));
        server.abort();
        other_server.abort();
    }
}
