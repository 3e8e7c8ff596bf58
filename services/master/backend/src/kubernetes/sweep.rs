//! Deleting a Job's objects, and those of Jobs this master does not drive: Jobs gone
//! from the listing of this shard's Jobs (deleted while no master followed them) at once,
//! and Jobs no driver claimed within the adoption window (ended while no master ran).

use kube::api::{DeleteParams, ListParams};
use std::sync::Arc;

use super::{ADOPTION, Inner, kube_message, render};

impl Inner {
    /// Deletes `job`'s pods, their settings Secrets and its owner: itself, rather than
    /// leaving what the owner owns to the garbage collector, which lags after an API
    /// server restart.
    pub(super) async fn delete_job_objects(&self, job: &str) -> Result<(), kube::Error> {
        let of_job = ListParams::default().labels(&format!(
            "{},{}={}",
            self.selector(),
            render::LABEL_JOB,
            render::dns_label(job, 63)
        ));
        let graceful = DeleteParams::background();
        self.pods.delete_collection(&graceful, &of_job).await?;
        self.secrets.delete_collection(&graceful, &of_job).await?;
        self.delete_owner(job).await
    }

    /// The Jobs whose owners carry this master's shard label.
    async fn jobs_with_owners(&self) -> Result<Vec<String>, kube::Error> {
        let params = ListParams::default().labels(&self.selector());
        let owners = self.config_maps.list(&params).await?;
        Ok((owners.into_iter())
            .filter_map(|owner| (owner.metadata.annotations?).remove(render::ANNOTATION_JOB))
            .collect())
    }

    /// Deletes the objects of every Job of `jobs` the watch on pods sees no driver claim.
    async fn delete_unclaimed(&self, jobs: impl IntoIterator<Item = String>, why: &str) {
        for job in jobs {
            let claimed = {
                let state = self.lock();
                state.owners.contains_key(&job) || state.wanted.keys().any(|(j, _)| *j == job)
            };
            if claimed {
                continue;
            }
            tracing::info!(job, why, "deleting the objects of a Job no longer driven");
            if let Err(e) = self.delete_job_objects(&job).await {
                tracing::warn!(job, error = %kube_message(&e), "deleting a Job's objects; trying again every resync");
                self.lock().owners_to_delete.insert(job);
            }
        }
    }

    /// Deletes the objects of Jobs of this shard absent from `listed`, every Job of the
    /// shard: Jobs deleted while no master followed them.
    pub(super) async fn delete_jobs_not_listed(&self, listed: &[String]) {
        match self.jobs_with_owners().await {
            Ok(jobs) => {
                let gone = jobs.into_iter().filter(|job| !listed.contains(job));
                self.delete_unclaimed(gone, "the Job is deleted").await;
            }
            Err(e) => tracing::warn!(error = %kube_message(&e), "listing Job owners to sweep"),
        }
    }
}

/// Once the adoption window is over, deletes the objects of Jobs of this shard that no
/// Job driven now claimed: Jobs that ended while no master ran.
pub(super) async fn sweep_unclaimed_jobs(inner: Arc<Inner>) {
    tokio::time::sleep(ADOPTION.saturating_sub(inner.started.elapsed())).await;
    match inner.jobs_with_owners().await {
        Ok(jobs) => {
            (inner.delete_unclaimed(jobs, "no driver claimed it in the adoption window")).await
        }
        Err(e) => tracing::warn!(error = %kube_message(&e), "listing Job owners to sweep"),
    }
}
