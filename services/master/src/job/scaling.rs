//! Changing a running Job's executors. A new spec generation (`primus apply` of a running
//! Job) moves its data executors and trainers to the replicas it asks for, one executor at
//! a time, without restarting the Job; `status.replicas` says what runs now and each step
//! is an event.
//!
//! A joining executor starts with the same settings as its peers: the trainers find a new
//! data executor in the topology, and a new trainer pulls the dense parameters from the PS
//! (its hot set re-plans as for any membership change). A leaving executor is first taken
//! out of the topology, then stopped: a data executor ends its streams with `leaving` and
//! reports its served offsets, and the queue takes its tasks back at those offsets; a
//! trainer ends its streams, trains on what it was sent, and its totals stay in the Job's
//! progress. A new PS shard count reshards the Job live ([`super::reshard`]). Other fields
//! of a new spec do not apply to a running Job: the `SpecChange` condition names them. The
//! policies of the status tick start and stop executors through the same steps
//! ([`super::actions`]).

use std::ops::ControlFlow;

use primus_proto::v1::{Resource, Role};
use primus_spec::job::JobSpec;
use primus_spec::status::Replicas;

use super::executors::{role_spec, start_executor, wait_serving, with_role};
use super::{JobRun, Outcome};
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;
use primus_job_policy::snapshot::members_of;

/// The roles a running Job scales, and the spec fields that apply live.
const SCALED_ROLES: [ExecutorRole; 2] = [ExecutorRole::DataExecutor, ExecutorRole::Trainer];
const LIVE_FIELDS: [&str; 4] = [
    "topology.data_executors.replicas",
    "topology.trainers.replicas",
    "topology.ps.replicas",
    "scaling",
];

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// A new generation of the Job's spec: its replicas apply now; any other change is
    /// reported as not applied.
    pub(super) async fn on_spec_changed(&mut self, resource: Resource) -> ControlFlow<Outcome> {
        if resource.generation <= self.writer.status.observed_generation {
            return ControlFlow::Continue(());
        }
        self.writer.status.observed_generation = resource.generation;
        let spec: JobSpec = match serde_json::from_str(&resource.spec_json) {
            Ok(spec) => spec,
            Err(e) => {
                let message = format!("generation {}: spec: {e}", resource.generation);
                self.writer
                    .condition("SpecChange", false, "InvalidSpec", message);
                self.writer.write().await;
                return ControlFlow::Continue(());
            }
        };
        let not_applied = fixed_changes(&self.job.spec, &spec);
        let (holds, reason, message) = match not_applied.is_empty() {
            true => (
                true,
                "Applied",
                format!("generation {} applied", resource.generation),
            ),
            false => (
                false,
                "NotAppliedWhileRunning",
                format!(
                    "generation {}: {} cannot change while the Job runs and keep their running values; changes to {} apply",
                    resource.generation,
                    not_applied.join(", "),
                    LIVE_FIELDS.map(|f| format!("spec.{f}")).join(", ")
                ),
            ),
        };
        self.writer.condition("SpecChange", holds, reason, message);
        // Only a role whose replicas the new spec changes is moved to them: the load may
        // have moved the data executors away from the spec's starting point.
        let changed: Vec<ExecutorRole> = SCALED_ROLES
            .into_iter()
            .filter(|&role| replicas(&self.job.spec, role) != replicas(&spec, role))
            .collect();
        let reshard = (spec.topology.ps.replicas != self.job.spec.topology.ps.replicas)
            .then_some(spec.topology.ps.replicas);
        let topology = &mut self.job.spec.topology;
        topology.data_executors.replicas = spec.topology.data_executors.replicas;
        topology.trainers.replicas = spec.topology.trainers.replicas;
        topology.ps.replicas = spec.topology.ps.replicas;
        self.job.spec.scaling = spec.scaling;
        if let Some(shards) = reshard {
            self.reshard_ps(shards).await;
        }
        self.reconcile_replicas(&changed).await;
        self.writer.write().await;
        ControlFlow::Continue(())
    }

    /// Starts or stops executors of `roles`, one at a time, until each runs as many as the
    /// spec asks for.
    pub(super) async fn reconcile_replicas(&mut self, roles: &[ExecutorRole]) {
        for &role in roles {
            let wanted = replicas(&self.job.spec, role);
            let why = format!("spec.topology.{}.replicas is {wanted}", plural(role));
            loop {
                let running = self.members(role).len();
                let scaled = match running.cmp(&(wanted as usize)) {
                    std::cmp::Ordering::Less => self.add_executor(role, &why).await,
                    std::cmp::Ordering::Greater => self.remove_executor(role, &why).await,
                    std::cmp::Ordering::Equal => break,
                };
                if let Err(message) = scaled {
                    self.writer.event("ScalingFailed", message);
                    break;
                }
            }
        }
        self.show_replicas();
    }

    /// Starts one more executor of `role` (the lowest free index) and waits until it
    /// serves.
    pub(super) async fn add_executor(
        &mut self,
        role: ExecutorRole,
        why: &str,
    ) -> Result<(), String> {
        let members = self.members(role);
        let index = (0..)
            .find(|i| !members.iter().any(|(member, _)| member == i))
            .unwrap_or(0);
        let parts = self.job.parts(&self.name, &self.memory_given);
        let starting = std::time::Instant::now();
        let endpoint = start_executor(self.context, &parts, role, index)
            .await
            .map_err(|e| format!("starting {} {index}: {e}", role.as_str()))?;
        // An executor started again under a departed one's id has not finished, and its
        // reports count again.
        self.trainers_done.remove(&endpoint.id);
        self.fold.rejoin(&endpoint.id);
        wait_serving(&endpoint).await?;
        self.policies.optimizer.started_in(starting.elapsed());
        let message = format!(
            "started {}: {} {} -> {} ({why})",
            endpoint.id,
            plural(role),
            members.len(),
            members.len() + 1
        );
        self.writer.event("ScaledOut", message);
        Ok(())
    }

    /// Stops the executor of `role` with the highest index: out of the topology first,
    /// then stopped; a data executor's tasks go back to the queue at its final offsets.
    pub(super) async fn remove_executor(
        &mut self,
        role: ExecutorRole,
        why: &str,
    ) -> Result<(), String> {
        let members = self.members(role);
        let Some((_, id)) = members.last().cloned() else {
            return Ok(());
        };
        self.context.topologies.remove(&self.name, &id);
        self.context
            .backend
            .release(&self.name, &id)
            .await
            .map_err(|e| format!("stopping {id}: {e}"))?;
        self.fold.retire(&id);
        let mut message = format!(
            "stopped {id}: {} {} -> {} ({why})",
            plural(role),
            members.len(),
            members.len() - 1
        );
        if role == ExecutorRole::DataExecutor {
            let requeued = self
                .tasks
                .queue
                .release_executor(&id)
                .await
                .map_err(|e| format!("taking back the tasks of {id}: {e}"))?;
            message.push_str(&format!("; {requeued} of its tasks back in the queue"));
        }
        self.writer.event("ScaledIn", message);
        Ok(())
    }

    /// The executors of `role` in the topology now: (index, id), by index.
    pub(super) fn members(&self, role: ExecutorRole) -> Vec<(u32, String)> {
        members_of(&self.endpoints(), role)
    }

    /// Puts what runs now in `status.replicas` (written with the next write).
    pub(super) fn show_replicas(&mut self) {
        let endpoints = self.endpoints();
        self.writer.show_executors(&endpoints);
        let count = |role: Role| with_role(&endpoints, role).len() as u32;
        self.writer.status.replicas = Some(Replicas {
            ps: count(Role::Ps),
            data_executors: count(Role::DataExecutor),
            trainers: count(Role::Trainer),
            serving: count(Role::Serving),
        });
    }

    /// Every trainer the Job runs now has finished (its data ended).
    pub(super) fn trainers_finished(&self) -> bool {
        let trainers = self.members(ExecutorRole::Trainer);
        !trainers.is_empty()
            && trainers
                .iter()
                .all(|(_, id)| self.trainers_done.contains(id))
    }
}

/// How many executors of `role` `spec` asks for.
fn replicas(spec: &JobSpec, role: ExecutorRole) -> u32 {
    role_spec(spec, role).map_or(0, |spec| spec.replicas)
}

/// `trainers` for the trainer role: the role's name in the spec's topology.
fn plural(role: ExecutorRole) -> &'static str {
    match role {
        ExecutorRole::Ps => "ps",
        ExecutorRole::DataExecutor => "data_executors",
        ExecutorRole::Trainer => "trainers",
        ExecutorRole::Serving => "serving",
    }
}

/// The spec fields (`spec.` paths) that differ between `running` and `next` and do not
/// apply to a running Job.
fn fixed_changes(running: &JobSpec, next: &JobSpec) -> Vec<String> {
    let (Ok(running), Ok(next)) = (serde_json::to_value(running), serde_json::to_value(next))
    else {
        return vec!["spec".to_owned()];
    };
    let mut changed = Vec::new();
    differing_paths("", &running, &next, &mut changed);
    changed
        .into_iter()
        .filter(|path| {
            !LIVE_FIELDS
                .iter()
                .any(|live| path == live || path.starts_with(&format!("{live}.")))
        })
        .map(|path| format!("spec.{path}"))
        .collect()
}

/// Dotted paths of the leaves where `a` and `b` differ (a whole list when its items do).
fn differing_paths(
    path: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let child = match path.is_empty() {
                    true => key.clone(),
                    false => format!("{path}.{key}"),
                };
                let (a, b) = (a.get(key), b.get(key));
                match (a, b) {
                    (Some(a), Some(b)) => differing_paths(&child, a, b, out),
                    _ => out.push(child),
                }
            }
        }
        (a, b) if a != b => out.push(path.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_spec::{Resource, parse_documents};

    const EXAMPLE: &str = include_str!("../../../../examples/criteo-like.yaml");

    fn job(text: &str) -> JobSpec {
        parse_documents("criteo-like.yaml", text)
            .expect("example parses")
            .into_iter()
            .find_map(|r| match r {
                Resource::Job(job) => Some(job.spec),
                _ => None,
            })
            .expect("a job")
    }

    #[test]
    fn replicas_and_scaling_apply_live_and_other_changes_are_named() {
        let running = job(EXAMPLE);
        let scaled = EXAMPLE.replace(
            "trainers: {replicas: 1, cpu: 1, memory: 2Gi}",
            "trainers: {replicas: 3, cpu: 1, memory: 2Gi}",
        );
        assert_ne!(scaled, EXAMPLE, "the example's trainers line changed");
        assert_eq!(fixed_changes(&running, &job(&scaled)), Vec::<String>::new());
        let resharded = scaled.replace(
            "ps: {replicas: 2, cpu: 0.5, memory: 2Gi}",
            "ps: {replicas: 3, cpu: 0.5, memory: 2Gi}",
        );
        assert_ne!(resharded, scaled, "the example's ps line changed");
        assert_eq!(
            fixed_changes(&running, &job(&resharded)),
            Vec::<String>::new()
        );
        let bigger = resharded.replace(
            "ps: {replicas: 3, cpu: 0.5, memory: 2Gi}",
            "ps: {replicas: 3, cpu: 1, memory: 2Gi}",
        );
        assert_eq!(
            fixed_changes(&running, &job(&bigger)),
            vec!["spec.topology.ps.cpu".to_owned()]
        );
    }
}
