//! The discrete-event loop: submissions, the optimizer's rounds and Job completions in
//! time order. Between two events every running Job trains at its true throughput; a
//! completion is the moment its remaining samples run out. What a policy decides (which
//! allocation, when) comes from `primus-resource-model`, the code the master runs.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use primus_resource_model::autoscale::{self, Measurements, Step};
use primus_resource_model::plans::{self, PlanSpace};
use primus_resource_model::warm_start::{self, ConfigRecord, RoleCounts};
use primus_resource_model::{Allocation, Terms};

use crate::policy::{Policy, Settings};
use crate::random::Random;
use crate::report::Outcome;
use crate::trace::{Request, Trace};
use crate::truth::{Faults, Truth};

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
/// Seconds after which a process short of memory is killed.
const OOM_SECONDS: f64 = 300.0;
/// Head room the master's memory policy gives a process it raises, as a share of what the
/// process needs (`scaling.memory.safety_margin`'s default).
const MEMORY_SAFETY_MARGIN: f64 = 0.1;
/// The simulated Jobs' `scaling.max_trainers` and `scaling.max_ps`.
const MAX_TRAINERS: u32 = 32;
const MAX_PS: u32 = 16;
/// Iteration times kept per allocation (the newest).
const KEPT_TIMES: usize = 30;

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
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
struct Run {
    request: Request,
    progress: f64,
    checkpointed: f64,
    last_checkpoint: f64,
    paused_until: f64,
    oom_at: Option<f64>,
    faults: Faults,
    faults_handled: Faults,
    measurements: Measurements,
    /// Allocation changes, and explorations among them.
    steps: u32,
    explorations: u32,
    /// The allocation it needs, as planned before any scale-up into spare cores: what
    /// the config DB keeps for warm starts.
    needed: Allocation,
}

impl Run {
    /// Cores and memory the Job holds.
    fn held(&self) -> (f64, f64) {
        (self.request.cores(), self.request.memory_gib())
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
    jobs: Vec<JobState>,
    queue: VecDeque<usize>,
    events: BinaryHeap<Timed>,
    sequence: u64,
    now: f64,
    config_db: Vec<ConfigRecord>,
    usage: Usage,
    scaling_actions: u64,
    seed: u64,
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
    pub(crate) fn new(trace: &'t Trace, policy: Policy, settings: Settings, seed: u64) -> Self {
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
            jobs,
            queue: VecDeque::new(),
            events: BinaryHeap::new(),
            sequence: 0,
            now: 0.0,
            config_db: Vec::new(),
            usage: Usage::default(),
            scaling_actions: 0,
            seed,
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
        if run.oom_at.is_some_and(|at| at <= self.now) {
            return 0.0;
        }
        job.truth
            .throughput(&job.shape, &run.request.allocation, run.faults)
    }

    /// The earliest completion among running Jobs, and whose.
    fn next_completion(&self) -> (f64, usize) {
        let mut best = (f64::INFINITY, 0);
        for i in self.running() {
            let Some(run) = self.run_of(i) else { continue };
            let rate = self.throughput(i, run);
            if rate <= 0.0 || run.oom_at.is_some() {
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
            let usage = &mut self.usage;
            usage.held_core_seconds += held_cores * counted;
            usage.held_gib_seconds += held_gib * counted;
            usage.used_gib_seconds += job.truth.used_gib(&allocation).min(held_gib) * counted;
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
            && let Some(start) =
                warm_start::warm_start(&self.config_db, &self.trace.jobs[i].features, 5, 0.5)
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
        if self.policy.scales() {
            // The master's memory policy gives a process what it needs before it runs out.
            let job = &self.trace.jobs[i];
            self.jobs[i].request = raised_to_need(self.jobs[i].request, &job.truth);
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
        let job = &self.trace.jobs[i];
        let short = request.ps_gib < job.truth.ps_gib(request.allocation.ps)
            || request.trainer_gib < job.truth.trainer_gib;
        // Only a static allocation starts short (the scaling policies raised it on arrival).
        let oom_at = short.then_some(self.now + OOM_SECONDS);
        self.jobs[i].phase = Phase::Running(Box::new(Run {
            request,
            progress: 0.0,
            checkpointed: 0.0,
            last_checkpoint: self.now,
            paused_until: self.now,
            oom_at,
            faults: Faults::default(),
            faults_handled: Faults::default(),
            measurements: Measurements::new(self.trace.jobs[i].shape, KEPT_TIMES),
            steps: 0,
            explorations: 0,
            needed: request.allocation,
        }));
    }

    fn complete(&mut self, i: usize) {
        let job = &self.trace.jobs[i];
        if let (Policy::DlroverRm, Some(run)) = (self.policy, self.run_of(i)) {
            let a = run.needed;
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
        self.jobs[i].phase = Phase::Done { at: self.now };
        self.start_queued();
    }

    /// The optimizer's round: faults and failures first, then profiles and plans.
    fn round(&mut self) {
        for i in self.running() {
            self.check_faults(i);
        }
        if !self.policy.scales() {
            return;
        }
        let mut planned = Vec::new();
        for i in self.running() {
            if let Some(candidates) = self.profile_and_plan(i) {
                planned.push(candidates);
            }
        }
        self.select(planned);
    }

    /// Out-of-memory kills, process failures, checkpoints, and stragglers and hot shards
    /// (DLRover-RM handles the ones it saw in its last round).
    fn check_faults(&mut self, i: usize) {
        let job = &self.trace.jobs[i];
        let (now, interval, policy) = (self.now, self.settings.interval_seconds, self.policy);
        let state = &mut self.jobs[i];
        let Phase::Running(run) = &mut state.phase else {
            return;
        };
        if run.oom_at.is_some_and(|at| at <= now) {
            state.failures += 1;
            let retry = Request {
                ps_gib: run.request.ps_gib * 1.5,
                trainer_gib: run.request.trainer_gib * 1.5,
                ..run.request
            };
            state.request = retry;
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
        let a = run.request.allocation;
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
        if policy == Policy::DlroverRm {
            // Seen last round: the straggler's data shards go to the others, the hot
            // shard's rows move (seamless migration).
            if run.faults.straggler {
                (run.faults.straggler, run.faults_handled.straggler) = (false, true);
                run.paused_until = run.paused_until.max(now) + 30.0;
            }
            if run.faults.hot_ps {
                (run.faults.hot_ps, run.faults_handled.hot_ps) = (false, true);
                run.paused_until = run.paused_until.max(now) + RECOVER_SECONDS;
            }
        }
        run.faults.straggler =
            !run.faults_handled.straggler && job.straggler_at.is_some_and(|at| done >= at);
        run.faults.hot_ps =
            !run.faults_handled.hot_ps && job.hot_ps_at.is_some_and(|at| done >= at);
    }

    /// Records the Job's iteration time and takes its step ([`autoscale::step`]):
    /// explorations and right-sizing at once, scale-ups returned for the selection.
    fn profile_and_plan(&mut self, i: usize) -> Option<Planned> {
        let trace = self.trace;
        let job = &trace.jobs[i];
        let (policy, now, seed) = (self.policy, self.now, self.seed);
        let free_cores = self.unclaimed_cores();
        let state = &mut self.jobs[i];
        let Phase::Running(run) = &mut state.phase else {
            return None;
        };
        if run.paused_until > now || run.oom_at.is_some() {
            return None;
        }
        let a = run.request.allocation;
        let noise = (job.truth.noise * state.random.normal()).exp();
        let samples = f64::from(a.trainers) * job.shape.batch;
        let observed = samples / job.truth.throughput(&job.shape, &a, run.faults);
        run.measurements.add(a, observed * noise);
        let terms = match policy {
            Policy::Primus => Terms::Compute,
            _ => Terms::All,
        };
        let model = run.measurements.fit(terms);
        let job_state = autoscale::JobState {
            current: a,
            model: model.as_ref(),
            measurements: &run.measurements,
            space: PlanSpace::counts_only(&a, MAX_TRAINERS, MAX_PS, START_SECONDS),
            remaining_samples: Some(job.samples - run.progress),
            free_cores,
            steps: run.steps,
            explorations: run.explorations,
            seed: seed ^ ((i as u64) << 20) ^ now as u64,
        };
        match autoscale::step(&job_state) {
            Step::Stay => None,
            Step::Explore(next) => {
                run.explorations += 1;
                self.resize(i, next);
                None
            }
            Step::RightSize(smaller) => {
                run.needed = smaller.allocation;
                self.resize(i, smaller.allocation);
                None
            }
            Step::Offer(plans) => Some(Planned { job: i, plans }),
        }
    }

    /// Cores neither a running Job nor a queued one needs.
    fn unclaimed_cores(&self) -> f64 {
        let queued: f64 = (self.queue.iter())
            .map(|&i| self.jobs[i].request.cores())
            .sum();
        (self.free().0 - queued).max(0.0)
    }

    /// Eqs. 11-14 over the Jobs' scale-up plans, within the cores that neither a running
    /// Job nor a queued one needs.
    fn select(&mut self, planned: Vec<Planned>) {
        let (_, mut memory) = self.free();
        let jobs: Vec<plans::JobPlans> = planned.iter().map(|p| p.plans.clone()).collect();
        let chosen = plans::select(&jobs, self.unclaimed_cores(), self.settings.rho);
        for (planned, choice) in planned.iter().zip(chosen) {
            let Some(k) = choice else { continue };
            let allocation = planned.plans.plans[k].allocation;
            let Some(run) = self.run_of(planned.job) else {
                continue;
            };
            let added = self.request_for(planned.job, run, allocation).memory_gib()
                - run.request.memory_gib();
            if added > memory {
                continue;
            }
            memory -= added;
            self.resize(planned.job, allocation);
        }
    }

    /// The request of `run` under `allocation`: each process keeps its memory, raised to
    /// what it needs (with the master's safety margin) where that is more.
    fn request_for(&self, i: usize, run: &Run, allocation: Allocation) -> Request {
        let truth = &self.trace.jobs[i].truth;
        let request = Request {
            allocation,
            ..run.request
        };
        raised_to_need(request, truth)
    }

    /// Moves Job `i` to `allocation`, pausing it while processes start or resize. A
    /// change that would leave a PS shard short of memory is not made.
    fn resize(&mut self, i: usize, allocation: Allocation) {
        let now = self.now;
        let truth = self.trace.jobs[i].truth;
        let Some(run) = self.run_of(i) else { return };
        let request = self.request_for(i, run, allocation);
        if request.ps_gib < truth.ps_gib(allocation.ps) {
            return;
        }
        let Phase::Running(run) = &mut self.jobs[i].phase else {
            return;
        };
        let old = run.request.allocation;
        let starts = allocation.trainers > old.trainers || allocation.ps > old.ps;
        let pause = if starts {
            START_SECONDS
        } else {
            RESIZE_SECONDS
        };
        run.paused_until = run.paused_until.max(now) + pause;
        run.request = request;
        run.steps += 1;
        self.scaling_actions += 1;
    }
}

/// `request` with each process's memory raised to what it needs, plus the master's safety
/// margin, where that is more.
fn raised_to_need(request: Request, truth: &Truth) -> Request {
    let raised = |held: f64, need: f64| match held < need {
        true => need * (1.0 + MEMORY_SAFETY_MARGIN),
        false => held,
    };
    Request {
        ps_gib: raised(request.ps_gib, truth.ps_gib(request.allocation.ps)),
        trainer_gib: raised(request.trainer_gib, truth.trainer_gib),
        ..request
    }
}

/// One Job's candidate plans for the cluster-level selection.
struct Planned {
    job: usize,
    plans: plans::JobPlans,
}
