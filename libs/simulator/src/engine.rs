//! The discrete-event loop: submissions, the master's status ticks and Job completions in
//! time order. Between two events every running Job trains at its true throughput; a
//! completion is the moment its remaining samples run out. Under the Primus and
//! DLRover-RM policies every decision (which allocation, when, how much memory) is the
//! master's own policies' ([`crate::master`]); this loop carries them out.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use primus_job_policy::memory::after_out_of_memory;
use primus_job_policy::{Action, Capacity, ClusterPlans, ExecutorRole, Market};
use primus_resource_model::Allocation;
use primus_resource_model::warm_start::{self, ConfigRecord, RoleCounts};
use primus_spec::job::JobSpec;
use tokio::time::Instant;

use crate::master::{GIB, Managed, Observed, bytes, endpoint, ids};
use crate::policy::{Policy, Settings};
use crate::random::Random;
use crate::report::Outcome;
use crate::trace::{Request, Trace};
use crate::truth::Faults;

/// Seconds a restarted Job (stop, start, restore) trains nothing.
const RESTART_SECONDS: f64 = 300.0;
/// Seconds between a static Job's checkpoints.
const CHECKPOINT_SECONDS: f64 = 1_800.0;
/// Seconds a process failure costs a Job that recovers in place.
const RECOVER_SECONDS: f64 = 60.0;
/// Seconds an allocation change that starts processes costs (measured executor starts).
const START_SECONDS: f64 = 60.0;
/// Seconds a change that only resizes processes costs.
const RESIZE_SECONDS: f64 = 10.0;
/// A Job whose processes fail this often in all is given up.
const MOST_FAILURES: u32 = 3;

/// What the scheduler can do next.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Arrival(usize),
    Round,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Timed(f64, u64, Event);

impl Eq for Timed {}

impl Ord for Timed {
    fn cmp(&self, other: &Self) -> Ordering {
        // A min-heap on time, then on insertion order.
        (other.0.total_cmp(&self.0)).then(other.1.cmp(&self.1))
    }
}

impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Where a Job is.
enum Phase {
    /// Submitted (again, after a failure: not before `from`), waiting for resources.
    Queued {
        from: f64,
    },
    Running(Box<Run>),
    Done {
        at: f64,
    },
    Failed,
}

/// A running Job.
struct Run {
    /// Processes, cores, and each role's memory.
    request: Request,
    progress: f64,
    checkpointed: f64,
    last_checkpoint: f64,
    paused_until: f64,
    faults: Faults,
    /// The master's part (None under static allocation).
    managed: Option<Box<Managed>>,
}

impl Run {
    /// Cores and memory the Job holds.
    fn held(&self) -> (f64, f64) {
        let memory = match &self.managed {
            Some(managed) => managed.held_gib(&self.request),
            None => self.request.memory_gib(),
        };
        (self.request.cores(), memory)
    }
}

struct JobState {
    phase: Phase,
    request: Request,
    failures: u32,
    random: Random,
}

/// One policy over one trace.
pub(crate) struct Simulation<'t> {
    trace: &'t Trace,
    policy: Policy,
    settings: Settings,
    /// The spec every simulated Job's starts from.
    template: JobSpec,
    /// The master's ledger of its `policy: auto` Jobs' holdings and plans.
    ledger: ClusterPlans,
    /// Simulated time 0 as the policies' clock.
    epoch: Instant,
    jobs: Vec<JobState>,
    queue: VecDeque<usize>,
    events: BinaryHeap<Timed>,
    sequence: u64,
    now: f64,
    config_db: Vec<ConfigRecord>,
    usage: Usage,
    scaling_actions: u64,
    /// Completed Jobs one of whose PS shards reached its memory and refused new keys.
    refused_keys: usize,
}

/// Core- and GiB-seconds the running Jobs held and used while submissions came.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Usage {
    pub(crate) busy_core_seconds: f64,
    pub(crate) held_core_seconds: f64,
    pub(crate) used_gib_seconds: f64,
    pub(crate) held_gib_seconds: f64,
}

impl<'t> Simulation<'t> {
    pub(crate) fn new(
        trace: &'t Trace,
        policy: Policy,
        settings: Settings,
        template: JobSpec,
        seed: u64,
    ) -> Self {
        let jobs = (trace.jobs.iter().enumerate())
            .map(|(i, job)| JobState {
                phase: Phase::Queued { from: job.arrival },
                request: job.user,
                failures: 0,
                random: Random::stream(seed ^ 0x5eed, i as u64),
            })
            .collect();
        let mut simulation = Self {
            trace,
            policy,
            settings,
            template,
            ledger: ClusterPlans::default(),
            epoch: Instant::now(),
            jobs,
            queue: VecDeque::new(),
            events: BinaryHeap::new(),
            sequence: 0,
            now: 0.0,
            config_db: Vec::new(),
            usage: Usage::default(),
            scaling_actions: 0,
            refused_keys: 0,
        };
        for (i, job) in trace.jobs.iter().enumerate() {
            simulation.schedule(job.arrival, Event::Arrival(i));
        }
        simulation.schedule(0.0, Event::Round);
        simulation
    }

    fn schedule(&mut self, at: f64, event: Event) {
        self.sequence += 1;
        self.events.push(Timed(at, self.sequence, event));
    }

    /// The last submission plus half a day: what is not done by then counts as not
    /// completed.
    pub(crate) fn horizon(&self) -> f64 {
        self.trace.jobs.last().map_or(0.0, |j| j.arrival) + 12.0 * 3_600.0
    }

    /// Runs to the horizon, telling `progress` the share of it simulated.
    pub(crate) fn run(mut self, progress: &mut dyn FnMut(f64)) -> Outcome {
        let horizon = self.horizon();
        let mut reported = 0.0;
        while let Some(&Timed(at, _, event)) = self.events.peek() {
            let (completion, job) = self.next_completion();
            if completion <= at && completion <= horizon {
                self.advance(completion);
                self.complete(job);
                continue;
            }
            if at > horizon {
                break;
            }
            self.events.pop();
            self.advance(at);
            match event {
                Event::Arrival(i) => {
                    self.arrive(i);
                    self.start_queued();
                }
                Event::Round => {
                    self.round();
                    self.start_queued();
                    let pending = self
                        .jobs
                        .iter()
                        .any(|j| !matches!(j.phase, Phase::Done { .. } | Phase::Failed));
                    if pending {
                        self.schedule(at + self.settings.interval_seconds, Event::Round);
                    }
                }
            }
            if self.now / horizon - reported >= 0.01 {
                reported = self.now / horizon;
                progress(reported.min(1.0));
            }
        }
        progress(1.0);
        Outcome::of(
            self.policy,
            self.trace,
            &self.finished(),
            self.usage,
            self.scaling_actions,
            self.refused_keys,
        )
    }

    /// Each Job's completion time (None: not completed).
    fn finished(&self) -> Vec<Option<f64>> {
        self.jobs
            .iter()
            .map(|j| match j.phase {
                Phase::Done { at } => Some(at),
                _ => None,
            })
            .collect()
    }

    fn run_of(&self, i: usize) -> Option<&Run> {
        match &self.jobs[i].phase {
            Phase::Running(run) => Some(run),
            _ => None,
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|&i| self.run_of(i).is_some())
            .collect()
    }

    fn throughput(&self, i: usize, run: &Run) -> f64 {
        let job = &self.trace.jobs[i];
        job.truth
            .throughput(&job.shape, &run.request.allocation, run.faults)
    }

    /// The earliest completion among running Jobs, and whose.
    fn next_completion(&self) -> (f64, usize) {
        let mut best = (f64::INFINITY, 0);
        for i in self.running() {
            let Some(run) = self.run_of(i) else { continue };
            let rate = self.throughput(i, run);
            if rate <= 0.0 {
                continue;
            }
            let left = (self.trace.jobs[i].samples - run.progress).max(0.0);
            let at = run.paused_until.max(self.now) + left / rate;
            if at < best.0 {
                best = (at, i);
            }
        }
        best
    }

    /// Trains every running Job up to `to`, and counts the cores and memory they use
    /// while submissions still come.
    fn advance(&mut self, to: f64) {
        let from = self.now;
        let last_arrival = self.trace.jobs.last().map_or(0.0, |j| j.arrival);
        let counted = (to.min(last_arrival) - from).max(0.0);
        for i in self.running() {
            let job = &self.trace.jobs[i];
            let rate = self.run_of(i).map_or(0.0, |run| self.throughput(i, run));
            let Phase::Running(run) = &mut self.jobs[i].phase else {
                continue;
            };
            let training = (to - run.paused_until.max(from)).max(0.0);
            run.progress = (run.progress + rate * training).min(job.samples);
            let allocation = run.request.allocation;
            let (held_cores, held_gib) = run.held();
            let fill = table_fill(run.progress, job.samples, job.truth.table_fill);
            let usage = &mut self.usage;
            usage.held_core_seconds += held_cores * counted;
            usage.held_gib_seconds += held_gib * counted;
            usage.used_gib_seconds += job.truth.used_gib(&allocation, fill).min(held_gib) * counted;
            if rate > 0.0 {
                let training = (to.min(last_arrival) - run.paused_until.max(from)).max(0.0);
                usage.busy_core_seconds +=
                    job.truth.busy_cores(&job.shape, &allocation, run.faults) * training;
            }
        }
        self.now = to;
    }

    fn arrive(&mut self, i: usize) {
        if self.policy == Policy::DlroverRm
            && let Some(start) = warm_start::warm_start(
                &self.config_db,
                &self.trace.jobs[i].features,
                primus_job_policy::WARM_START_NEIGHBOURS,
                primus_job_policy::WARM_START_SMOOTHING,
            )
        {
            let user = self.trace.jobs[i].user;
            let a = start.allocation;
            let allocation = Allocation {
                trainers: a.trainers.max(1),
                ps: a.ps.max(1),
                trainer_cpu: a.trainer_cpu.max(1.0).round(),
                ps_cpu: a.ps_cpu.max(1.0).round(),
            };
            // Memory is not in the config DB: each process gets the user's.
            self.jobs[i].request = Request { allocation, ..user };
        }
        self.queue.push_back(i);
    }

    fn free(&self) -> (f64, f64) {
        let (mut cpu, mut memory) = (self.trace.cluster.cpu, self.trace.cluster.memory_gib);
        for i in self.running() {
            if let Some(run) = self.run_of(i) {
                let (cores, gib) = run.held();
                cpu -= cores;
                memory -= gib;
            }
        }
        (cpu, memory)
    }

    /// Starts queued Jobs in order of submission, each that fits.
    fn start_queued(&mut self) {
        let (mut cpu, mut memory) = self.free();
        let mut waiting = VecDeque::new();
        while let Some(i) = self.queue.pop_front() {
            let request = self.jobs[i].request;
            let from = match self.jobs[i].phase {
                Phase::Queued { from } => from,
                _ => continue,
            };
            if from > self.now || request.cores() > cpu || request.memory_gib() > memory {
                waiting.push_back(i);
                continue;
            }
            cpu -= request.cores();
            memory -= request.memory_gib();
            self.start(i, request);
        }
        self.queue = waiting;
    }

    fn start(&mut self, i: usize, request: Request) {
        let managed = self.policy.scales().then(|| {
            let shape = self.trace.jobs[i].shape;
            let started = self.clock(self.now);
            Box::new(Managed::new(
                &self.template,
                &request,
                self.policy,
                shape,
                started,
            ))
        });
        self.jobs[i].phase = Phase::Running(Box::new(Run {
            request,
            progress: 0.0,
            checkpointed: 0.0,
            last_checkpoint: self.now,
            paused_until: self.now,
            faults: Faults::default(),
            managed,
        }));
    }

    /// Simulated second `at` on the policies' clock.
    fn clock(&self, at: f64) -> Instant {
        self.epoch + Duration::from_secs_f64(at.max(0.0))
    }

    fn complete(&mut self, i: usize) {
        let job = &self.trace.jobs[i];
        if let Some(run) = self.run_of(i) {
            self.refused_keys += usize::from(run.managed.as_ref().is_some_and(|m| m.refused_keys));
        }
        if let (Policy::DlroverRm, Some(run)) = (self.policy, self.run_of(i)) {
            // As the master records a succeeded Job: its allocation at the end.
            let a = run.request.allocation;
            self.config_db.push(ConfigRecord {
                job: job.name.clone(),
                features: job.features.clone(),
                allocation: RoleCounts {
                    data_executors: 1,
                    trainers: a.trainers,
                    ps: a.ps,
                    data_executor_cpu: 1.0,
                    trainer_cpu: a.trainer_cpu,
                    ps_cpu: a.ps_cpu,
                },
                samples_per_second: job.truth.throughput(&job.shape, &a, Faults::default()),
            });
        }
        self.ledger.leave(&job.name);
        self.jobs[i].phase = Phase::Done { at: self.now };
        self.start_queued();
    }

    /// The master's status tick: faults, failures and memory first, then every running
    /// Job's policies decide and their actions are carried out.
    fn round(&mut self) {
        for i in self.running() {
            self.check_faults(i);
        }
        if !self.policy.scales() {
            return;
        }
        // The queue does not change while the running Jobs tick.
        let capacity = self.capacity();
        for i in self.running() {
            self.tick(i, &capacity);
        }
    }

    /// Process failures, checkpoints, out-of-memory kills, and the trace's stragglers and
    /// hot PS shards (which the master handles neither of: its straggler policy is for data
    /// executors, which are not simulated).
    fn check_faults(&mut self, i: usize) {
        let job = &self.trace.jobs[i];
        let (now, interval, policy) = (self.now, self.settings.interval_seconds, self.policy);
        let state = &mut self.jobs[i];
        let Phase::Running(run) = &mut state.phase else {
            return;
        };
        let fill = table_fill(run.progress, job.samples, job.truth.table_fill);
        let a = run.request.allocation;
        if run.managed.is_none()
            && (run.request.ps_gib < job.truth.ps_gib_at(a.ps, fill)
                || run.request.trainer_gib < job.truth.trainer_gib)
        {
            // Killed for its memory: the user submits it again with half as much more.
            state.failures += 1;
            state.request = Request {
                ps_gib: run.request.ps_gib * 1.5,
                trainer_gib: run.request.trainer_gib * 1.5,
                ..run.request
            };
            state.phase = match state.failures >= MOST_FAILURES {
                true => Phase::Failed,
                false => Phase::Queued {
                    from: now + 2.0 * RESTART_SECONDS,
                },
            };
            if matches!(state.phase, Phase::Queued { .. }) {
                self.queue.push_back(i);
            }
            return;
        }
        let processes = f64::from(a.trainers + a.ps);
        let failed = state
            .random
            .chance(1.0 - (-job.failure_rate * processes * interval / 3_600.0).exp());
        if policy == Policy::Static {
            if now - run.last_checkpoint >= CHECKPOINT_SECONDS {
                (run.checkpointed, run.last_checkpoint) = (run.progress, now);
            }
            if failed {
                state.failures += 1;
                run.progress = run.checkpointed;
                run.paused_until = now + RESTART_SECONDS;
                if state.failures >= MOST_FAILURES {
                    state.phase = Phase::Failed;
                    return;
                }
            }
        } else if failed {
            run.paused_until = run.paused_until.max(now) + RECOVER_SECONDS;
        }
        let done = run.progress / job.samples;
        run.faults.straggler = job.straggler_at.is_some_and(|at| done >= at);
        run.faults.hot_ps = job.hot_ps_at.is_some_and(|at| done >= at);
    }

    /// One status tick of Job `i`'s master: a trainer over its memory is killed and
    /// answered as the master answers it; the Job's snapshot goes to its policies, and
    /// what they decide is carried out.
    fn tick(&mut self, i: usize, capacity: &Capacity) {
        let job = &self.trace.jobs[i];
        let now = self.clock(self.now);
        let interval = self.settings.interval_seconds;
        let noise = (job.truth.noise * self.jobs[i].random.normal()).exp();
        let Phase::Running(run) = &mut self.jobs[i].phase else {
            return;
        };
        let request = run.request;
        let Some(managed) = run.managed.as_mut() else {
            return;
        };
        let a = request.allocation;
        let mut actions = Vec::new();
        for id in ids(ExecutorRole::Trainer, a.trainers) {
            let allotted = managed.allotted_gib(&request, ExecutorRole::Trainer, &id);
            if allotted < job.truth.trainer_gib {
                let trainer = endpoint(ExecutorRole::Trainer, &id);
                let given = &managed.memory_given;
                actions.push(after_out_of_memory(
                    &managed.spec,
                    given,
                    &trainer,
                    bytes(allotted),
                ));
                run.paused_until = run.paused_until.max(self.now) + RECOVER_SECONDS;
            }
        }
        let training = run.paused_until <= self.now;
        let rate = job.truth.throughput(&job.shape, &a, run.faults) * noise;
        let horizon = managed.spec.scaling.memory.horizon_seconds as f64 / interval;
        let seen = Observed {
            now,
            allocation: a,
            trainer_gib: job.truth.trainer_gib,
            ps_gib: job.truth.ps_gib_at(
                a.ps,
                table_fill(run.progress, job.samples, job.truth.table_fill),
            ),
            trainer_busy_cores: job.truth.busy_cores(&job.shape, &a, run.faults)
                / f64::from(a.trainers + a.ps).max(1.0),
            samples_trained: run.progress,
            samples: job.samples,
            samples_per_second: if training { rate } else { 0.0 },
            horizon_samples: horizon.ceil().clamp(1.0, f64::from(u32::MAX)) as u32,
        };
        let snapshot = managed.observe(&request, &seen);
        managed.policies.record(&snapshot);
        let market = Market {
            job: &job.name,
            cluster: &self.ledger,
            capacity,
        };
        actions.extend(managed.policies.decide(&snapshot, &market));
        for action in actions {
            self.act(i, action);
        }
    }

    /// What the master divides among its `policy: auto` Jobs: the cluster, less what the
    /// queued Jobs ask for (so that scale-ups do not hold back Jobs waiting to start).
    fn capacity(&self) -> Capacity {
        let (cores, memory) = (self.queue.iter())
            .map(|&i| self.jobs[i].request)
            .fold((0.0, 0.0), |(c, m), r| (c + r.cores(), m + r.memory_gib()));
        let cluster = &self.trace.cluster;
        Capacity {
            cpu: Some((cluster.cpu - cores).max(0.0)),
            memory_bytes: Some(bytes(cluster.memory_gib - memory)),
            rho: self.settings.rho,
        }
    }

    /// Carries out one of the master's actions on Job `i`.
    fn act(&mut self, i: usize, action: Action) {
        match action {
            Action::Move { target, .. } => self.resize(i, target),
            Action::AddPsShard => self.add_ps_shard(i),
            Action::RaiseShardMemory { id, bytes, .. } => {
                if !self.give_memory(i, &id, bytes) {
                    self.add_ps_shard(i);
                }
            }
            // Where the cluster has no room the master records a `MemoryShort` event (or
            // the killed trainer restarts as it was): nothing changes.
            Action::Resize { id, bytes, .. } => {
                self.give_memory(i, &id, bytes);
            }
            // The simulated Jobs have no data executors: the autoscaler and the straggler
            // policy, which act on them alone, decide nothing; events and conditions change
            // nothing.
            Action::AddExecutor { .. }
            | Action::RemoveExecutor { .. }
            | Action::MarkStragglers(_)
            | Action::TakeBack { .. }
            | Action::Event { .. }
            | Action::Condition { .. } => {}
        }
    }

    /// Gives executor `id` of Job `i` `bytes` of memory where the cluster has it.
    fn give_memory(&mut self, i: usize, id: &str, bytes: u64) -> bool {
        let (_, free) = self.free();
        let Phase::Running(run) = &mut self.jobs[i].phase else {
            return false;
        };
        let request = run.request;
        let Some(managed) = run.managed.as_mut() else {
            return false;
        };
        let role = match id.starts_with(ExecutorRole::Ps.as_str()) {
            true => ExecutorRole::Ps,
            false => ExecutorRole::Trainer,
        };
        let added = bytes as f64 / GIB - managed.allotted_gib(&request, role, id);
        if added > free {
            return false;
        }
        managed.memory_given.insert(id.to_owned(), bytes);
        self.scaling_actions += 1;
        true
    }

    /// One more PS shard by a live resharding, within `scaling.max_ps`.
    fn add_ps_shard(&mut self, i: usize) {
        let Some(run) = self.run_of(i) else { return };
        let a = run.request.allocation;
        let most = run.managed.as_ref().map_or(0, |m| m.spec.scaling.max_ps);
        if a.ps < most {
            self.resize(i, Allocation { ps: a.ps + 1, ..a });
        }
    }

    /// Moves Job `i` to `allocation` where the cluster has the cores and memory, pausing
    /// it while processes start or stop; new processes get their role's memory.
    fn resize(&mut self, i: usize, allocation: Allocation) {
        let (now, epoch_now) = (self.now, self.clock(self.now));
        let (free_cores, free_memory) = self.free();
        let Phase::Running(run) = &mut self.jobs[i].phase else {
            return;
        };
        let old = run.request;
        let request = Request { allocation, ..old };
        let (cores, memory) = run.held();
        let Some(managed) = run.managed.as_mut() else {
            return;
        };
        let added_memory = managed.held_gib(&request) - memory;
        if request.cores() - cores > free_cores || added_memory > free_memory {
            return;
        }
        managed.keep_memory_of(&allocation);
        let starts =
            allocation.trainers > old.allocation.trainers || allocation.ps > old.allocation.ps;
        let pause = if starts {
            START_SECONDS
        } else {
            RESIZE_SECONDS
        };
        if starts {
            managed.started_in(START_SECONDS);
        }
        managed
            .policies
            .optimizer
            .moved(epoch_now + Duration::from_secs_f64(pause));
        run.paused_until = run.paused_until.max(now) + pause;
        run.request = request;
        self.scaling_actions += 1;
    }
}

/// The share of a Job's keys in its tables after `progress` of its `samples`: they grow
/// until `fill_share` of the samples is trained.
fn table_fill(progress: f64, samples: f64, fill_share: f64) -> f64 {
    (progress / (samples * fill_share).max(1.0)).clamp(0.0, 1.0)
}
