//! A succeeded Job's serving replicas: they take the final checkpoint's model, and keep
//! serving it after the rest of the Job stopped, until the Job is deleted, the master
//! stops, or `spec.serving_sync.keep_serving_seconds` pass.

use std::time::Duration;

use primus_proto::v1::serving_service_client::ServingServiceClient;
use primus_proto::v1::{LoadCheckpointRequest, ServedTower};
use primus_spec::job::TrainingMode;
use tokio::sync::watch;

use super::JobRun;
use primus_backend::{ExecutorRole, ResourceBackend};
use primus_data_tasks::plan::Catalog;

/// Serving replicas kept after their Job succeeded.
pub(super) struct KeptServing {
    /// How long; None: until the Job is deleted.
    pub(super) keep: Option<Duration>,
}

impl KeptServing {
    /// Returns once the time is up or `cancelled` (the Job deleted, the master stopping).
    pub(super) async fn wait(&self, cancelled: &mut watch::Receiver<bool>) {
        let time_up = async {
            match self.keep {
                Some(keep) => tokio::time::sleep(keep).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = time_up => {}
            _ = cancelled.wait_for(|c| *c) => {}
        }
    }
}

impl<B: ResourceBackend, C: Catalog> JobRun<'_, B, C> {
    /// At success: the replicas load the final snapshots (`manifests`, when the Job has a
    /// checkpoint) and every other executor stops. None (nothing kept) when the Job has no
    /// replica or keeps none; `message` says what the replicas serve.
    pub(super) async fn keep_serving(
        &mut self,
        manifests: Option<&[String]>,
        message: &mut String,
    ) -> Option<KeptServing> {
        let replicas = self.members(ExecutorRole::Serving);
        let keep = self.job.spec.serving_sync.keep_serving_seconds;
        if replicas.is_empty() || keep == Some(0) {
            return None;
        }
        match manifests {
            Some(manifests) => match self.load_into_replicas(manifests).await {
                Ok(()) => message.push_str(&format!(
                    "; {} serving replicas serve the final checkpoint",
                    replicas.len()
                )),
                Err(e) => message.push_str(&format!(
                    "; the serving replicas could not load the final checkpoint ({e}) and \
                     serve what serving-sync gave them last"
                )),
            },
            None => message.push_str(&format!(
                "; {} serving replicas serve what serving-sync gave them last (set \
                 spec.checkpoint for the final model)",
                replicas.len()
            )),
        }
        for role in [
            ExecutorRole::DataExecutor,
            ExecutorRole::Trainer,
            ExecutorRole::Ps,
        ] {
            for (_, id) in self.members(role) {
                self.context.topologies.remove(&self.name, &id);
                if let Err(e) = self.context.backend.release(&self.name, &id).await {
                    tracing::warn!(job = self.name, executor = id, error = %e, "stopping");
                }
            }
        }
        message.push_str(&match keep {
            Some(seconds) => format!(" for {seconds} s"),
            None => " until the Job is deleted".into(),
        });
        Some(KeptServing {
            keep: keep.map(Duration::from_secs),
        })
    }

    /// Every replica loads the snapshots at `manifests`.
    pub(super) async fn load_into_replicas(&self, manifests: &[String]) -> Result<(), String> {
        // As serving-sync exports it: MTRM's memory tower for a batch-only Job.
        let tower = match self.job.spec.mode {
            TrainingMode::Batch => ServedTower::Memory,
            _ => ServedTower::Adapt,
        };
        let endpoints = self.endpoints();
        let replicas = super::executors::with_role(&endpoints, ExecutorRole::Serving.proto());
        for replica in replicas {
            let mut client = ServingServiceClient::connect(format!("http://{}", replica.grpc_addr))
                .await
                .map_err(|e| format!("{}: {e}", replica.id))?;
            let mut request = LoadCheckpointRequest {
                manifest_uris: manifests.to_vec(),
                ..Default::default()
            };
            request.set_tower(tower);
            client
                .load_checkpoint(request)
                .await
                .map_err(|status| format!("{}: {}", replica.id, status.message()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kept_replicas_go_when_their_time_is_up_or_the_job_is_deleted() {
        let (cancel, mut cancelled) = watch::channel(false);
        let timed = KeptServing {
            keep: Some(Duration::from_millis(20)),
        };
        tokio::time::timeout(Duration::from_secs(5), timed.wait(&mut cancelled))
            .await
            .expect("the time is up");

        let forever = KeptServing { keep: None };
        let still_kept =
            tokio::time::timeout(Duration::from_millis(100), forever.wait(&mut cancelled)).await;
        assert!(still_kept.is_err(), "kept until the Job is deleted");
        cancel.send(true).expect("cancel");
        tokio::time::timeout(Duration::from_secs(5), forever.wait(&mut cancelled))
            .await
            .expect("deleted");
    }
}
