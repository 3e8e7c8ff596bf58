//! The hot set (HypeReca 2FP) against in-process tables and a real NATS server: one
//! trainer with a hot set ends with bitwise the rows of the all-PS path; two trainers in
//! lockstep keep bitwise identical replicas, which equal the tables' rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use primus_batch::{FeaturePipeline, Minibatch};
use primus_bus::Bus;
use primus_config::NatsSettings;
use primus_datagen::criteo::{Criteo, CriteoOptions, feature_schema};
use primus_model::{Model, ModelLayout};
use primus_proto::v1::SourceKind;
use primus_spec::job::{DenseSpec, ModelKind, ModelSpec, OptimizerSpec, TableSpec};
use primus_spec::job::{HotExchange, HotSetSpec};
use primus_testkit::NatsServer;
use primus_trainer::device::EmbeddingDevice;
use primus_trainer::feed::{Feed, Incoming};
use primus_trainer::hot::{HotSync, RingEndpoint, TrainerDirectory};
use primus_trainer::meter::{Report, Reporter};
use primus_trainer::store::{LocalStore, ParameterStore};
use primus_trainer::train::{Trainer, TrainerTotals};

const TABLE: &str = "categorical";

fn layout() -> (ModelLayout, OptimizerSpec) {
    let schema = feature_schema(TABLE);
    let spec = ModelSpec {
        kind: ModelKind::Dlrm,
        tables: vec![TableSpec::new(TABLE, 8, OptimizerSpec::adagrad(0.05))],
        dense: DenseSpec {
            bottom: vec![16, 8],
            top: vec![16, 1],
            optimizer: OptimizerSpec::adagrad(0.01),
            graph: None,
        },
    };
    let layout = ModelLayout::new(&spec, &schema).expect("layout");
    (layout, spec.dense.optimizer)
}

fn batches(seed: u64, count: usize) -> Vec<Minibatch> {
    let pipeline = FeaturePipeline::new(&feature_schema(TABLE));
    let mut generator = Criteo::new(CriteoOptions {
        seed,
        cardinality_scale: 0.0005,
        ..CriteoOptions::default()
    })
    .expect("generator");
    (0..count)
        .map(|_| {
            let generated = generator.generate(256, 0).expect("rows");
            pipeline.minibatch(&generated.batch).expect("minibatch")
        })
        .collect()
}

fn incoming(batch: Minibatch) -> Incoming {
    Incoming::new(batch, SourceKind::Batch, "generated", &Default::default())
}

fn settings(rows: u64) -> HotSetSpec {
    HotSetSpec {
        enabled: true,
        warmup_batches: 5,
        rows: Some(rows),
        sync_timeout_ms: 20_000,
        ..HotSetSpec::default()
    }
}

/// 200 rows and a sync timeout short enough for the tests that wait one out.
fn quick_timeout() -> HotSetSpec {
    HotSetSpec {
        sync_timeout_ms: 1_500,
        ..settings(200)
    }
}

/// trainer-0's part in a hot set it trains alone.
async fn join_alone(spec: HotSetSpec, bus: &Bus, layout: &ModelLayout) -> HotSync {
    let directory = fixed(&["trainer-0"]);
    HotSync::join(
        spec,
        bus,
        "job",
        "trainer-0",
        layout,
        directory,
        EmbeddingDevice::Cpu,
        Some(ring_endpoint().await),
    )
    .await
    .expect("join")
}

/// A HotExchange service on loopback, serving until the test's runtime ends.
async fn ring_endpoint() -> RingEndpoint {
    let bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let (endpoint, _server) = RingEndpoint::serve(bind).await.expect("ring endpoint");
    endpoint
}

fn fixed(members: &[&str]) -> TrainerDirectory {
    let members: Vec<String> = members.iter().map(|m| m.to_string()).collect();
    Arc::new(move || {
        let members = members.clone();
        Box::pin(async move { Ok(members) })
    })
}

async fn bus(nats: &NatsServer) -> Bus {
    Bus::connect(&NatsSettings {
        url: nats.url(),
        ..NatsSettings::default()
    })
    .await
    .expect("nats")
}

fn store(layout: &ModelLayout, dense: &OptimizerSpec) -> Arc<LocalStore> {
    Arc::new(LocalStore::new(&layout.ps_tables(), dense, 0).expect("store"))
}

async fn trainer(
    layout: &ModelLayout,
    store: Arc<LocalStore>,
    hot: Option<HotSync>,
) -> Trainer<LocalStore> {
    let trainer = Trainer::start(
        Model::new(layout.clone()).expect("a model of the layout"),
        store,
        0,
        1,
        10_000,
    )
    .await
    .expect("start");
    match hot {
        Some(hot) => trainer.with_hot_set(hot),
        None => trainer,
    }
}

/// Weights then optimizer state of every key, sorted by key.
async fn rows(store: &LocalStore, keys: &[u64]) -> Vec<(u64, Vec<f32>)> {
    let stored = store.read_rows(TABLE, keys).await.expect("read rows");
    let mut rows: Vec<(u64, Vec<f32>)> = stored.rows().map(|(k, v)| (k, v.to_vec())).collect();
    rows.sort_by_key(|r| r.0);
    rows
}

/// Checks that `trainer`'s hot rows equal `store`'s rows of those keys (weights and
/// optimizer state, bitwise) and returns them.
async fn assert_replica_on(
    trainer: &Trainer<LocalStore>,
    store: &LocalStore,
) -> Vec<(u64, Vec<f32>)> {
    let replica = replica_rows(trainer);
    let keys: Vec<u64> = replica.iter().map(|r| r.0).collect();
    assert_eq!(
        replica,
        rows(store, &keys).await,
        "the PS rows of hot keys are not the replicas'"
    );
    replica
}

fn replica_rows(trainer: &Trainer<LocalStore>) -> Vec<(u64, Vec<f32>)> {
    let replica = trainer
        .hot_set()
        .and_then(|h| h.replica(0))
        .expect("an installed hot set");
    let mut rows: Vec<(u64, Vec<f32>)> = replica
        .keys()
        .map(|k| (k, replica.values(k).expect("read").expect("row")))
        .collect();
    rows.sort_by_key(|r| r.0);
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trainer_with_a_hot_set_ends_with_the_rows_of_the_all_ps_path() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = bus(&nats).await;
    let (layout, dense) = layout();
    let (all_ps_store, hot_store) = (store(&layout, &dense), store(&layout, &dense));
    let mut all_ps = trainer(&layout, all_ps_store.clone(), None).await;
    let hot = join_alone(settings(150), &bus, &layout).await;
    let mut with_hot = trainer(&layout, hot_store.clone(), Some(hot)).await;

    let mut seen = std::collections::BTreeSet::new();
    for batch in batches(3, 30) {
        for trainer in [&mut all_ps, &mut with_hot] {
            let prepared = trainer
                .prepare(incoming(batch.clone()))
                .await
                .expect("prepare");
            seen.extend(prepared.keys().tables[0].iter().copied());
            trainer.step(prepared).await.expect("step");
        }
    }
    with_hot.settle().await.expect("the last round's push");
    let status = with_hot.hot_set().expect("hot set").status();
    assert_eq!((status.members, status.rows), (1, 150), "{status:?}");
    assert_eq!(
        status.rounds, 25,
        "a round after every step from the 6th on"
    );
    let report = with_hot.meter.report();
    let hot_share = report.hot_share.expect("a hot share");
    assert!(
        hot_share > 0.2,
        "the 150 hottest rows served {hot_share:.3} of accesses"
    );

    // Every row, hot or not, is bitwise the all-PS path's, and so are the replicas.
    let seen: Vec<u64> = seen.into_iter().collect();
    let expected = rows(&all_ps_store, &seen).await;
    assert_eq!(expected.len(), seen.len());
    assert_eq!(rows(&hot_store, &seen).await, expected);
    assert_replica_on(&with_hot, &all_ps_store).await;
    assert_eq!(all_ps.params(), with_hot.params());
}

#[derive(Default)]
struct Quiet;

impl Reporter for Quiet {
    async fn report(&self, _: &Report) {}
    async fn aligned(&self, _: u64, _: &TrainerTotals) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_trainers_in_lockstep_keep_bitwise_identical_hot_rows_equal_to_the_ps() {
    lockstep(HotExchange::Ring).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_trainers_exchanging_over_nats_keep_bitwise_identical_hot_rows_equal_to_the_ps() {
    lockstep(HotExchange::Nats).await;
}

/// Two trainers with a hot set of 200 rows whose gradients travel by `exchange`: their
/// replicas end bitwise equal, and equal to the PS's rows.
async fn lockstep(exchange: HotExchange) {
    let nats = NatsServer::start().expect("nats-server");
    let spec = HotSetSpec {
        exchange,
        ..settings(200)
    };
    let (mut a, mut b, shared) = pair(&nats, spec).await;
    // A last checkpoint barrier: past it both have run the same rounds.
    let feeds = [ending_at_a_barrier(11, 24), ending_at_a_barrier(12, 24)];
    train_both([&mut a, &mut b], feeds, [&Quiet, &Quiet]).await;

    for trainer in [&a, &b] {
        let status = trainer.hot_set().expect("hot set").status();
        // A round after each of minibatches 6 to 24, and idle ones when a trainer's next
        // minibatch was not looked up yet while the other's share came.
        assert_eq!((status.members, status.rows), (2, 200), "{status:?}");
        assert!(status.rounds >= 19, "{status:?}");
        let traffic = status.exchange;
        assert!(
            traffic.sent_bytes > 0 && traffic.received_bytes > 0,
            "{exchange:?}: {status:?}"
        );
    }
    let replica_a = assert_replica_on(&a, &shared).await;
    assert_eq!(replica_a, replica_rows(&b), "the replicas diverged");
}

type FeedStream = futures::stream::BoxStream<'static, anyhow::Result<Feed>>;

/// Trains trainer-0 and trainer-1 at once, each on its feed; both must succeed.
async fn train_both<R: Reporter>(
    [a, b]: [&mut Trainer<LocalStore>; 2],
    [feed_a, feed_b]: [FeedStream; 2],
    [reporter_a, reporter_b]: [&R; 2],
) {
    let interval = Duration::from_secs(60);
    let (ra, rb) = tokio::join!(
        a.train(feed_a, interval, reporter_a),
        b.train(feed_b, interval, reporter_b)
    );
    ra.expect("trainer-0");
    rb.expect("trainer-1");
}

/// `count` minibatches, then checkpoint 9's barrier.
fn ending_at_a_barrier(seed: u64, count: usize) -> FeedStream {
    feed(seed, count)
        .chain(futures::stream::iter([Ok(Feed::Barrier(9))]))
        .boxed()
}

fn feed(seed: u64, count: usize) -> FeedStream {
    let items: Vec<anyhow::Result<Feed>> = batches(seed, count)
        .into_iter()
        .map(|b| Ok(Feed::batch(incoming(b))))
        .collect();
    futures::stream::iter(items).boxed()
}

async fn pair(
    nats: &NatsServer,
    settings: HotSetSpec,
) -> (Trainer<LocalStore>, Trainer<LocalStore>, Arc<LocalStore>) {
    let bus = bus(nats).await;
    let (layout, dense) = layout();
    let shared = store(&layout, &dense);
    let members = ["trainer-0", "trainer-1"];
    let mut trainers = Vec::new();
    for id in members {
        let hot = HotSync::join(
            settings.clone(),
            &bus,
            "job",
            id,
            &layout,
            fixed(&members),
            EmbeddingDevice::Cpu,
            Some(ring_endpoint().await),
        )
        .await
        .expect("join");
        trainers.push(trainer(&layout, shared.clone(), Some(hot)).await);
    }
    let b = trainers.pop().expect("trainer-1");
    let a = trainers.pop().expect("trainer-0");
    (a, b, shared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_data_ends_leaves_and_the_other_goes_on_alone() {
    let nats = NatsServer::start().expect("nats-server");
    let (mut a, mut b, shared) = pair(&nats, settings(200)).await;
    train_both(
        [&mut a, &mut b],
        [feed(21, 10), feed(22, 20)],
        [&Quiet, &Quiet],
    )
    .await;
    let status = b.hot_set().expect("hot set").status();
    assert_eq!((status.members, status.rows), (1, 200), "{status:?}");
    assert!(status.rounds >= 15, "{status:?}");
    assert_replica_on(&b, &shared).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_member_ends_the_group_and_the_other_trains_through_the_ps() {
    let nats = NatsServer::start().expect("nats-server");
    let (mut a, mut b, _) = pair(&nats, quick_timeout()).await;
    let steps_a = Steps::default();
    let done = {
        let hung = a.train(feed(31, 20), Duration::ZERO, &steps_a);
        let other = b.train(feed(32, 20), Duration::from_secs(60), &Quiet);
        tokio::pin!(hung, other);
        // Then nothing polls trainer-0 any more, as if its process hung.
        until_trainer_0_stepped(hung, other.as_mut(), &steps_a, 8).await;
        other.await
    };
    done.expect("trainer-1");
    assert_eq!(b.meter.steps, 20, "trainer-1 trained every minibatch");
    let status = b.hot_set().expect("hot set").status();
    assert_eq!(status.rows, 0, "no hot set is left: {status:?}");
}

/// A trainer that was not in the group when the leader chose again at a checkpoint (one
/// restarted, say) installs the new plan at once and waits in its first round for the
/// leader. The leader passed the barrier and gets no minibatch until the newcomer is at it
/// too (the data executors pause for the checkpoint): it answers from where it idles,
/// installs the plan, and tells the newcomer at the barrier that it passed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_idle_past_a_barrier_installs_the_plan_a_newcomer_waits_in() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = bus(&nats).await;
    let (layout, dense) = layout();
    let shared = store(&layout, &dense);
    let spec = HotSetSpec {
        sync_timeout_ms: 5_000,
        ..settings(200)
    };
    let mut trainers = Vec::new();
    for (id, directory) in [
        ("trainer-0", listed_alone_first()),
        ("trainer-1", fixed(&["trainer-0", "trainer-1"])),
    ] {
        let hot = HotSync::join(
            spec.clone(),
            &bus,
            "job",
            id,
            &layout,
            directory,
            EmbeddingDevice::Cpu,
            Some(ring_endpoint().await),
        )
        .await
        .expect("join");
        trainers.push(trainer(&layout, shared.clone(), Some(hot)).await);
    }
    let (mut b, mut a) = (
        trainers.pop().expect("trainer-1"),
        trainers.pop().expect("trainer-0"),
    );
    // trainer-0's data resumes once trainer-1 is at checkpoint 9's barrier too.
    let at_barrier = Arc::new(Releases::default());
    let paused = {
        let at_barrier = at_barrier.clone();
        futures::stream::once(async move { at_barrier.0.notified().await })
            .filter_map(|_| async { None })
    };
    let feed_a = ending_at_a_barrier(41, 8).chain(paused).chain(feed(43, 4));
    let feed_b = ending_at_a_barrier(42, 8).chain(feed(44, 4));
    let interval = Duration::from_secs(60);
    let both = async {
        tokio::join!(
            a.train(feed_a.boxed(), interval, &Quiet),
            b.train(feed_b.boxed(), interval, &*at_barrier)
        )
    };
    let (ra, rb) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("both trainers end (waiting on each other otherwise)");
    ra.expect("trainer-0");
    rb.expect("trainer-1");
    for trainer in [&a, &b] {
        assert_eq!(trainer.meter.steps, 12);
        let status = trainer.hot_set().expect("hot set").status();
        assert_eq!(
            (status.generation, status.rows),
            (2, 200),
            "trainer-0 alone, then both: {status:?}"
        );
    }
}

/// trainer-0's directory: only itself the first time it is asked, both trainers after.
fn listed_alone_first() -> TrainerDirectory {
    let asked = Arc::new(AtomicU64::new(0));
    Arc::new(move || {
        let first = asked.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(async move {
            let listed: &[&str] = match first {
                true => &["trainer-0"],
                false => &["trainer-0", "trainer-1"],
            };
            Ok(listed.iter().map(|id| id.to_string()).collect())
        })
    })
}

/// Wakes a waiter once its trainer aligned at a checkpoint barrier.
#[derive(Default)]
struct Releases(tokio::sync::Notify);

impl Reporter for Releases {
    async fn report(&self, _: &Report) {}
    async fn aligned(&self, _: u64, _: &TrainerTotals) {
        self.0.notify_one();
    }
}

/// Polls both trainings until trainer-0 (`hung`, counted by `reports`) did `steps` steps;
/// neither may end before.
async fn until_trainer_0_stepped<A: Future, B: Future>(
    mut hung: std::pin::Pin<&mut A>,
    mut other: std::pin::Pin<&mut B>,
    reports: &Steps,
    steps: u64,
) {
    while reports.0.load(Ordering::SeqCst) < steps {
        tokio::select! {
            _ = &mut hung => panic!("trainer-0 ended"),
            _ = &mut other => panic!("trainer-1 ended before trainer-0 stopped"),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
}

/// Counts a trainer's reports (one per step with a zero interval).
#[derive(Default)]
struct Steps(AtomicU64);

impl Reporter for Steps {
    async fn report(&self, _: &Report) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    async fn aligned(&self, _: u64, _: &TrainerTotals) {}
}

/// Without a fixed size the leader measures syncing a row against serving an access from
/// the PS and replicates what the latency model says pays (in process, a local apply
/// costs far less than a table lookup and push, so some rows always do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_model_chooses_how_many_rows_to_replicate() {
    let nats = NatsServer::start().expect("nats-server");
    let bus = bus(&nats).await;
    let (layout, dense) = layout();
    let chosen = HotSetSpec {
        rows: None,
        max_rows: 400,
        ..settings(0)
    };
    let hot = join_alone(chosen, &bus, &layout).await;
    let mut trainer = trainer(&layout, store(&layout, &dense), Some(hot)).await;
    trainer
        .train(feed(41, 8), Duration::from_secs(60), &Quiet)
        .await
        .expect("train");
    let status = trainer.hot_set().expect("hot set").status();
    assert!(
        (1..=400).contains(&status.rows),
        "the model chose {status:?}"
    );
    assert!(status.expected_coverage > 0.0, "{status:?}");
}

/// Records the checkpoints each trainer reported aligned.
#[derive(Default)]
struct Aligned(std::sync::Mutex<Vec<(u64, u64)>>);

impl Reporter for Aligned {
    async fn report(&self, _: &Report) {}
    async fn aligned(&self, checkpoint_id: u64, totals: &TrainerTotals) {
        (self.0.lock().expect("aligned")).push((checkpoint_id, totals.steps));
    }
}

/// Members reach a checkpoint barrier after different numbers of minibatches: the first
/// keeps taking part in (empty) rounds until the other arrives, neither stalls, the group
/// survives, and when both report the checkpoint aligned the PS holds every hot-row update
/// trained before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_reaching_a_barrier_at_different_steps_wait_for_each_other_in_rounds() {
    let nats = NatsServer::start().expect("nats-server");
    let (mut a, mut b, shared) = pair(&nats, settings(200)).await;
    // Checkpoint 7 after 9 and 14 minibatches, checkpoint 9 at the end.
    let with_barrier = |seed: u64, at: usize| {
        let mut items: Vec<anyhow::Result<Feed>> = batches(seed, at + 10)
            .into_iter()
            .map(|b| Ok(Feed::batch(incoming(b))))
            .collect();
        items.insert(at, Ok(Feed::Barrier(7)));
        items.push(Ok(Feed::Barrier(9)));
        futures::stream::iter(items).boxed()
    };
    let (aligned_a, aligned_b) = (Aligned::default(), Aligned::default());
    let started = std::time::Instant::now();
    let feeds = [with_barrier(51, 9), with_barrier(52, 14)];
    train_both([&mut a, &mut b], feeds, [&aligned_a, &aligned_b]).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "no member waited out the sync timeout ({:?})",
        started.elapsed()
    );
    assert_eq!(
        aligned_a.0.into_inner().expect("aligned"),
        vec![(7, 9), (9, 19)]
    );
    assert_eq!(
        aligned_b.0.into_inner().expect("aligned"),
        vec![(7, 14), (9, 24)]
    );
    for trainer in [&a, &b] {
        let status = trainer.hot_set().expect("hot set").status();
        assert_eq!((status.members, status.rows), (2, 200), "{status:?}");
    }
    let replica = assert_replica_on(&a, &shared).await;
    assert_eq!(replica, replica_rows(&b), "the replicas diverged");
}

/// `batch` with every categorical id moved by `offset`: traffic on other keys.
fn shifted(batch: &arrow_array::RecordBatch, offset: i64) -> arrow_array::RecordBatch {
    use arrow_array::{Array, ArrayRef, Int64Array};
    let columns: Vec<ArrayRef> = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(
            |(field, column)| match column.as_any().downcast_ref::<Int64Array>() {
                Some(ids) if field.name().starts_with('c') => {
                    let moved: Int64Array = ids.iter().map(|id| id.map(|id| id + offset)).collect();
                    Arc::new(moved) as ArrayRef
                }
                _ => column.clone(),
            },
        )
        .collect();
    arrow_array::RecordBatch::try_new(batch.schema(), columns).expect("shifted batch")
}

/// When traffic moves to other keys, the leader sees the hot rows' share of accesses fall
/// at the next checkpoint and chooses again (each time it moves); the new rows come from
/// the PS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drifted_hot_set_is_chosen_again_at_a_checkpoint() {
    const OFFSET: i64 = 1 << 40;
    let nats = NatsServer::start().expect("nats-server");
    let bus = bus(&nats).await;
    let (layout, dense) = layout();
    let shared = store(&layout, &dense);
    let hot = join_alone(settings(100), &bus, &layout).await;
    let mut trainer = trainer(&layout, shared.clone(), Some(hot)).await;
    let pipeline = FeaturePipeline::new(&feature_schema(TABLE));
    let mut generator = Criteo::new(CriteoOptions {
        seed: 61,
        cardinality_scale: 0.0005,
        ..CriteoOptions::default()
    })
    .expect("generator");
    let mut minibatch = |offset: i64| {
        let generated = generator.generate(256, 0).expect("rows");
        let batch = shifted(&generated.batch, offset);
        Ok(Feed::batch(incoming(
            pipeline.minibatch(&batch).expect("minibatch"),
        )))
    };
    let mut items: Vec<anyhow::Result<Feed>> = (0..8).map(|_| minibatch(0)).collect();
    items.push(Ok(Feed::Barrier(1)));
    items.extend((0..8).map(|_| minibatch(OFFSET)));
    items.push(Ok(Feed::Barrier(2)));
    items.extend((0..8).map(|_| minibatch(2 * OFFSET)));
    items.push(Ok(Feed::Barrier(3)));
    items.extend((0..4).map(|_| minibatch(2 * OFFSET)));
    trainer
        .train(
            futures::stream::iter(items).boxed(),
            Duration::from_secs(60),
            &Quiet,
        )
        .await
        .expect("train");
    let status = trainer.hot_set().expect("hot set").status();
    // Chosen at the start, again after the first move, and again after the second.
    assert_eq!((status.generation, status.rows), (3, 100), "{status:?}");
    let replica = replica_rows(&trainer);
    let hashed_before = batches(61, 1)[0].to_kjt().expect("kjt");
    let old_keys: std::collections::HashSet<u64> = hashed_before
        .features
        .iter()
        .flat_map(|f| f.values.iter().copied())
        .collect();
    assert!(
        replica.iter().all(|(key, _)| !old_keys.contains(key)),
        "the new hot set holds the moved traffic's keys"
    );
    assert_replica_on(&trainer, &shared).await;
}

/// A member whose stream goes quiet answers the others' rounds with nothing to add, so
/// they keep training instead of waiting out the sync timeout and ending the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_data_answers_rounds_so_the_group_survives_a_quiet_stream() {
    let nats = NatsServer::start().expect("nats-server");
    let (mut a, mut b, shared) = pair(&nats, quick_timeout()).await;
    let pause = futures::stream::once(tokio::time::sleep(Duration::from_secs(3)))
        .filter_map(|_| async { None::<anyhow::Result<Feed>> });
    let quiet = feed(71, 8).chain(pause).chain(feed(72, 8)).boxed();
    train_both([&mut a, &mut b], [feed(73, 16), quiet], [&Quiet, &Quiet]).await;
    assert_eq!((a.meter.steps, b.meter.steps), (16, 16));
    let (status_a, status_b) = (
        a.hot_set().expect("hot set").status(),
        b.hot_set().expect("hot set").status(),
    );
    assert_eq!(
        (status_a.generation, status_a.rows),
        (1, 200),
        "{status_a:?}"
    );
    // trainer-0 finished during the pause and left; trainer-1 went on alone.
    assert_eq!(
        (status_b.generation, status_b.rows, status_b.members),
        (1, 200, 1),
        "{status_b:?}"
    );
    assert_replica_on(&b, &shared).await;
}
