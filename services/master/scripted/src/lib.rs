//! `primus-scripted`: a resource backend that runs no process. Each executor the master
//! requests is a listener on loopback whose calls one in-process gRPC server answers from a
//! [`Script`], plus a task that plays its role against the real master: a data executor
//! registers with the task service, takes tasks, reports progress and finishes them, and
//! publishes heartbeats and its buffer fill on NATS; a trainer publishes metrics reports
//! and exits 0 once the Job's data is exhausted. A test changes the script while the Job
//! runs, crashes or kills executors ([`ScriptedBackend::crash`],
//! [`ScriptedBackend::give_up`], [`ScriptedBackend::out_of_memory`]) and reads what the
//! master asked of the backend ([`ScriptedBackend::calls`]).
//!
//! The master, NATS, Redis and the API server are the real ones; only the executors are
//! scripted. What the scripted ones do not play (minibatches, lookups and pushes,
//! checkpoints' snapshots and restores, resharding) they answer UNIMPLEMENTED, so a Job
//! that needs it fails loudly: those paths belong to the real-process suites.

mod answers;
mod roles;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use primus_backend::{
    BackendError, BackendEvent, Executor, ExecutorRole, ExecutorSpec, ExecutorUsage, Gang,
    ResourceBackend,
};
use primus_bus::Bus;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio::task::AbortHandle;

/// How the scripted executors behave; [`ScriptedBackend::script`] changes it while they run.
#[derive(Debug, Clone)]
pub struct Script {
    /// How often each executor reports (heartbeat, metrics, task progress).
    pub report_interval: Duration,
    /// Samples per second each trainer reports, unless `trainer_rates` names it.
    pub trainer_samples_per_second: f64,
    pub trainer_rates: HashMap<String, f64>,
    /// The buffer fill (0..=1) data executors report.
    pub buffer_fill: f64,
    /// Rows a data executor serves of its task per report, unless `served_rates` names it.
    pub rows_per_report: u64,
    pub served_rates: HashMap<String, u64>,
    /// The rows of each task: a data executor finishes it once it served them.
    pub rows_per_task: u64,
    /// CPU cores and resident bytes each role uses, unless `usage_of` names the executor.
    pub usage: HashMap<ExecutorRole, (f64, u64)>,
    pub usage_of: HashMap<String, (f64, u64)>,
    /// What PS shards answer about the bytes their tables hold.
    pub ps_table_bytes: u64,
    /// Resizes are refused (the pool cannot give more).
    pub refuse_resizes: bool,
    /// A Job's executors are placed as one gang (`ResourceBackend::schedules_gangs`).
    pub gangs: bool,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            report_interval: Duration::from_millis(100),
            trainer_samples_per_second: 1_000.0,
            trainer_rates: HashMap::new(),
            buffer_fill: 0.5,
            rows_per_report: 100,
            served_rates: HashMap::new(),
            rows_per_task: 200,
            usage: HashMap::new(),
            usage_of: HashMap::new(),
            ps_table_bytes: 0,
            refuse_resizes: false,
            gangs: false,
        }
    }
}

impl Script {
    fn usage_of(&self, role: ExecutorRole, id: &str) -> (f64, u64) {
        (self.usage_of.get(id).or_else(|| self.usage.get(&role)))
            .copied()
            .unwrap_or((0.1, 64 << 20))
    }

    fn trainer_rate(&self, id: &str) -> f64 {
        (self.trainer_rates.get(id).copied()).unwrap_or(self.trainer_samples_per_second)
    }

    fn rows_per_report(&self, id: &str) -> u64 {
        (self.served_rates.get(id).copied()).unwrap_or(self.rows_per_report)
    }
}

/// What the master asked of the backend, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    Requested {
        job: String,
        id: String,
        cpu: f64,
        memory_bytes: u64,
    },
    Released {
        job: String,
        id: String,
    },
    Killed {
        job: String,
        id: String,
    },
    Resized {
        job: String,
        id: String,
        cpu: f64,
        memory_bytes: u64,
    },
    FormedGang {
        job: String,
        gang: Gang,
    },
    /// A PS shard was opened for training (its `Open` answered).
    Opened {
        job: String,
        id: String,
    },
}

/// The backend; clones share its executors.
#[derive(Clone)]
pub struct ScriptedBackend {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    events: broadcast::Sender<BackendEvent>,
    pub(crate) bus: Bus,
    /// `http://host:port` of the master's task service.
    pub(crate) master: String,
    /// Connections accepted on any executor's listener, for the one gRPC server.
    incoming: mpsc::Sender<std::io::Result<TcpStream>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) script: Script,
    pub(crate) executors: HashMap<Key, Running>,
    pub(crate) by_addr: HashMap<SocketAddr, Key>,
    calls: Vec<Call>,
    /// Jobs whose data the task service said is exhausted.
    pub(crate) exhausted: HashSet<String>,
    restarts: HashMap<Key, u32>,
}

/// (job, executor id).
pub(crate) type Key = (String, String);

/// One scripted executor.
pub(crate) struct Running {
    pub(crate) role: ExecutorRole,
    addr: SocketAddr,
    pub(crate) memory_bytes: u64,
    /// The task it holds and the rows of it served.
    pub(crate) held: Option<(String, u64)>,
    /// Its listener and its role's task.
    tasks: Vec<AbortHandle>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ScriptedBackend {
    /// Scripted executors that reach the master's task service at `master_addr` and
    /// publish on `bus`. Starts the gRPC server that answers for all of them.
    pub fn new(bus: Bus, master_addr: SocketAddr, script: Script) -> Self {
        let (incoming, accepted) = mpsc::channel(1024);
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                script,
                ..State::default()
            }),
            events,
            bus,
            master: format!("http://{master_addr}"),
            incoming,
        });
        tokio::spawn(answers::serve(shared.clone(), accepted));
        Self { shared }
    }

    /// Changes the script; executors read it at their next report.
    pub fn script(&self, change: impl FnOnce(&mut Script)) {
        change(&mut self.shared.lock().script);
    }

    /// What the master asked so far.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The ids of `job`'s executors running now, sorted.
    pub fn running(&self, job: &str) -> Vec<String> {
        let state = self.shared.lock();
        let mut ids: Vec<String> = (state.executors.keys())
            .filter(|(j, _)| j == job)
            .map(|(_, id)| id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// `id` crashed and restarts in place (same address), as a supervised process does.
    pub fn crash(&self, job: &str, id: &str) {
        let restart = {
            let mut state = self.shared.lock();
            let count = state.restarts.entry(key(job, id)).or_default();
            *count += 1;
            *count
        };
        self.shared.send(BackendEvent::Restarting {
            job: job.into(),
            id: id.into(),
            status: "signal: 9 (SIGKILL)".into(),
            restart,
        });
    }

    /// `id` crashed more often than allowed: it stays down.
    pub fn give_up(&self, job: &str, id: &str) {
        let mut state = self.shared.lock();
        if let Some(running) = state.executors.remove(&key(job, id)) {
            state.by_addr.remove(&running.addr);
        }
        drop(state);
        self.shared.send(BackendEvent::GaveUp {
            job: job.into(),
            id: id.into(),
            status: "exit status: 101".into(),
        });
    }

    /// `id` was killed for using more than its memory (and restarts in place).
    pub fn out_of_memory(&self, job: &str, id: &str) {
        let memory = (self.shared.lock().executors.get(&key(job, id))).map(|r| r.memory_bytes);
        if let Some(memory_bytes) = memory {
            self.shared.send(BackendEvent::OutOfMemory {
                job: job.into(),
                id: id.into(),
                memory_bytes,
            });
        }
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn send(&self, event: BackendEvent) {
        // No receiver: the master is not following events yet, nothing to tell.
        let _ = self.events.send(event);
    }

    pub(crate) fn record(&self, call: Call) {
        self.lock().calls.push(call);
    }

    /// Stops `(job, id)`; an error naming it when it does not run.
    fn stop(&self, job: &str, id: &str, call: Call) -> Result<(), BackendError> {
        self.record(call);
        let mut state = self.lock();
        match state.executors.remove(&key(job, id)) {
            Some(running) => {
                state.by_addr.remove(&running.addr);
                Ok(())
            }
            None => Err(BackendError::Unknown {
                job: job.into(),
                id: id.into(),
            }),
        }
    }
}

fn key(job: &str, id: &str) -> Key {
    (job.to_owned(), id.to_owned())
}

impl ResourceBackend for ScriptedBackend {
    async fn request(&self, spec: ExecutorSpec) -> Result<Executor, BackendError> {
        let id = spec.id();
        let start_failed = |e: std::io::Error| BackendError::Start {
            id: id.clone(),
            binary: "scripted executor".into(),
            message: e.to_string(),
        };
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(start_failed)?;
        let addr = listener.local_addr().map_err(start_failed)?;
        self.shared.record(Call::Requested {
            job: spec.job.clone(),
            id: id.clone(),
            cpu: spec.cpu,
            memory_bytes: spec.memory_bytes,
        });
        let executor = Executor {
            job: spec.job.clone(),
            id: id.clone(),
            role: spec.role,
            grpc_addr: addr,
        };
        let accepting = tokio::spawn(accept(listener, self.shared.incoming.clone()));
        let mut tasks = vec![accepting.abort_handle()];
        if let Some(role) = roles::play(self.shared.clone(), &executor) {
            tasks.push(role.abort_handle());
        }
        let running = Running {
            role: spec.role,
            addr,
            memory_bytes: spec.memory_bytes,
            held: None,
            tasks,
        };
        let mut state = self.shared.lock();
        state.by_addr.insert(addr, key(&spec.job, &id));
        state.executors.insert(key(&spec.job, &id), running);
        Ok(executor)
    }

    async fn release(&self, job: &str, id: &str) -> Result<(), BackendError> {
        let call = Call::Released {
            job: job.into(),
            id: id.into(),
        };
        self.shared.stop(job, id, call)
    }

    async fn kill(&self, job: &str, id: &str) -> Result<(), BackendError> {
        let call = Call::Killed {
            job: job.into(),
            id: id.into(),
        };
        self.shared.stop(job, id, call)
    }

    async fn release_job(&self, job: &str) {
        for id in self.running(job) {
            let call = Call::Released {
                job: job.into(),
                id: id.clone(),
            };
            // Gone meanwhile (it gave up): nothing to stop.
            let _ = self.shared.stop(job, &id, call);
        }
    }

    async fn resize(
        &self,
        job: &str,
        id: &str,
        cpu: f64,
        memory_bytes: u64,
    ) -> Result<(), BackendError> {
        {
            let mut state = self.shared.lock();
            if state.script.refuse_resizes {
                return Err(BackendError::Capacity {
                    id: id.into(),
                    message: "the script refuses resizes".into(),
                });
            }
            let Some(running) = state.executors.get_mut(&key(job, id)) else {
                return Err(BackendError::Unknown {
                    job: job.into(),
                    id: id.into(),
                });
            };
            running.memory_bytes = memory_bytes;
            state.calls.push(Call::Resized {
                job: job.into(),
                id: id.into(),
                cpu,
                memory_bytes,
            });
        }
        self.shared.send(BackendEvent::Resized {
            job: job.into(),
            id: id.into(),
            cpu,
            memory_bytes,
        });
        Ok(())
    }

    fn schedules_gangs(&self) -> bool {
        self.shared.lock().script.gangs
    }

    async fn form_gang(&self, job: &str, gang: &Gang) -> Result<(), BackendError> {
        self.shared.record(Call::FormedGang {
            job: job.into(),
            gang: gang.clone(),
        });
        Ok(())
    }

    fn events(&self) -> broadcast::Receiver<BackendEvent> {
        self.shared.events.subscribe()
    }

    async fn usage(&self, job: &str) -> Vec<ExecutorUsage> {
        let state = self.shared.lock();
        (state.executors.iter())
            .filter(|((j, _), _)| j == job)
            .map(|((_, id), running)| {
                let (cpu_cores, memory_bytes) = state.script.usage_of(running.role, id);
                ExecutorUsage {
                    id: id.clone(),
                    cpu_cores,
                    memory_bytes,
                }
            })
            .collect()
    }
}

/// Hands every connection `listener` accepts to the one gRPC server.
async fn accept(listener: TcpListener, incoming: mpsc::Sender<std::io::Result<TcpStream>>) {
    loop {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        if incoming.send(accepted).await.is_err() {
            return;
        }
    }
}
