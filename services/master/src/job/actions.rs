//! The one place what the Job's policies decide is carried out. A policy returns
//! [`Action`]s from a [`Snapshot`](primus_job_policy::Snapshot); [`JobRun::apply`] starts and stops
//! executors, gives memory, reshards, marks stragglers and takes tasks back through the
//! backend, the executors and the task queue, records each outcome as an event, and writes
//! the Job's status once.

use primus_proto::v1::dataset_service_client::DatasetServiceClient;
use primus_proto::v1::parameter_server_client::ParameterServerClient;
use primus_proto::v1::{Endpoint, SetMemoryLimitRequest, YieldTaskRequest};

use primus_resource_model::Allocation;
use tokio::time::Instant;

use super::JobRun;
use super::executors::{answered, role_spec};
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;
use primus_job_policy::snapshot::{members_of, role_of};
use primus_job_policy::{Action, Shortfall};

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// Carries out `actions` in order, then shows the replicas and writes the status.
    pub(super) async fn apply(&mut self, actions: Vec<Action>) {
        if actions.is_empty() {
            return;
        }
        for action in actions {
            self.act(action).await;
        }
        self.show_replicas();
        self.writer.write().await;
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::AddExecutor { role, why } => {
                if let Err(message) = self.add_executor(role, &why).await {
                    self.writer.event("ScalingFailed", message);
                }
            }
            Action::RemoveExecutor { role, why } => {
                if let Err(message) = self.remove_executor(role, &why).await {
                    self.writer.event("ScalingFailed", message);
                }
            }
            Action::AddPsShard => self.add_ps_shard().await,
            Action::RaiseShardMemory { id, bytes, figures } => {
                self.raise_shard_memory(&id, bytes, &figures).await;
            }
            Action::Resize {
                id,
                bytes,
                figures,
                otherwise,
            } => self.resize(&id, bytes, &figures, otherwise).await,
            Action::Move {
                current,
                target,
                message,
            } => self.move_to(current, target, message).await,
            Action::MarkStragglers(ids) => {
                self.tasks.stragglers.replace(ids);
            }
            Action::TakeBack { task, holder } => {
                let (reason, message) = match self.take_back(&task, &holder).await {
                    Ok(offset) => (
                        "StragglerTaskMoved",
                        format!(
                            "{task} taken back from {holder} at offset {offset}: a faster data executor is idle"
                        ),
                    ),
                    Err(message) => (
                        "StragglerTaskKept",
                        format!("{task} stays with {holder}: {message}"),
                    ),
                };
                self.writer.event(reason, message);
            }
            Action::Event { reason, message } => self.writer.event(reason, message),
            Action::Condition {
                kind,
                holds,
                reason,
                message,
            } => self.writer.condition(kind, holds, reason, message),
        }
    }

    async fn add_ps_shard(&mut self) {
        let shards = members_of(&self.endpoints(), ExecutorRole::Ps).len() as u32;
        self.reshard_ps(shards + 1).await;
    }

    /// Gives executor `id` `bytes` through the backend; records the outcome.
    async fn resize(&mut self, id: &str, bytes: u64, figures: &str, otherwise: Shortfall) {
        let endpoints = self.endpoints();
        let cpu = (endpoints.iter().find(|e| e.id == id))
            .and_then(role_of)
            .and_then(|role| role_spec(&self.job.spec, role))
            .map_or(0.0, |spec| spec.cpu);
        match self
            .context
            .backend
            .resize(&self.name, id, cpu, bytes)
            .await
        {
            Ok(()) => {
                self.memory_given.insert(id.to_owned(), bytes);
                self.writer
                    .event("MemoryRaised", format!("{figures}: given {bytes} bytes"));
            }
            Err(e) => match otherwise {
                Shortfall::ShortOnce if self.memory_short.insert(id.to_owned()) => {
                    self.writer.event("MemoryShort", format!("{figures}; {e}"));
                }
                Shortfall::ShortOnce => {}
                Shortfall::Killed => self
                    .writer
                    .event("OutOfMemory", format!("{figures}; not given more: {e}")),
            },
        }
    }

    /// Moves the Job's trainers and PS shards from `current` to `target`.
    async fn move_to(&mut self, current: Allocation, target: Allocation, message: String) {
        tracing::info!(job = self.name, %message, "optimizer");
        self.writer.event("Optimized", message.clone());
        if target.ps != current.ps {
            self.job.spec.topology.ps.replicas = target.ps;
            self.reshard_ps(target.ps).await;
        }
        if target.trainers != current.trainers {
            self.job.spec.topology.trainers.replicas = target.trainers;
            self.reconcile_replicas(&[ExecutorRole::Trainer]).await;
        }
        self.policies.optimizer.moved(Instant::now());
        self.writer
            .condition("ResourcePlan", true, "Applied", message);
    }

    /// Gives PS shard `id` `bytes`; where it cannot, adds a PS shard.
    async fn raise_shard_memory(&mut self, id: &str, bytes: u64, figures: &str) {
        let endpoints = self.endpoints();
        let raised = match endpoints.iter().find(|e| e.id == id) {
            Some(shard) => self.give_shard(shard, bytes).await,
            None => Err(format!("{id} is not in the topology")),
        };
        match raised {
            Ok(()) => {
                self.memory_given.insert(id.to_owned(), bytes);
                let message = format!("{figures}: given {bytes} bytes");
                tracing::info!(job = self.name, %message, "PS memory raised");
                self.writer.event("MemoryRaised", message);
            }
            Err(why) => {
                let message = format!("{figures}; not given more ({why}): adding a PS shard");
                tracing::info!(job = self.name, %message, "PS memory forecast");
                self.writer.event("MemoryForecast", message);
                self.add_ps_shard().await;
            }
        }
    }

    /// The backend's allotment of `shard`, then the shard's own limit.
    async fn give_shard(&self, shard: &Endpoint, bytes: u64) -> Result<(), String> {
        let cpu = self.job.spec.topology.ps.cpu;
        self.context
            .backend
            .resize(&self.name, &shard.id, cpu, bytes)
            .await
            .map_err(|e| e.to_string())?;
        let set = async {
            let mut client = ParameterServerClient::connect(format!("http://{}", shard.grpc_addr))
                .await
                .map_err(|e| e.to_string())?;
            client
                .set_memory_limit(SetMemoryLimitRequest { bytes })
                .await
                .map(|_| ())
                .map_err(|s| s.message().to_owned())
        };
        answered(&shard.id, set).await
    }

    /// Asks `holder` to give `task` back and puts it back in the queue from the rows it
    /// served; returns that offset.
    async fn take_back(&self, task: &str, holder: &str) -> Result<u64, String> {
        let endpoints = self.endpoints();
        let addr = endpoints
            .iter()
            .find(|e| e.id == holder)
            .map(|e| e.grpc_addr.clone())
            .ok_or_else(|| format!("{holder} is not in the topology"))?;
        let request = YieldTaskRequest {
            job: self.name.clone(),
            task_id: task.to_owned(),
        };
        let yielded = async {
            let mut client = DatasetServiceClient::connect(format!("http://{addr}"))
                .await
                .map_err(|e| e.to_string())?;
            (client.yield_task(request).await)
                .map(|answer| answer.into_inner().served_offset)
                .map_err(|s| s.message().to_owned())
        };
        let offset = answered(holder, yielded).await?;
        let yielded = self
            .tasks
            .queue
            .yield_task(holder, task, offset)
            .await
            .map_err(|e| e.to_string())?;
        match yielded {
            true => Ok(offset),
            false => Err("the queue no longer lists it as its task".to_owned()),
        }
    }
}
