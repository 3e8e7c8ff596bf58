//! The Lease (`coordination.k8s.io/v1`) a master holds on its shard of PrimusJobs, so that
//! two masters of one shard (a restarted one and its predecessor, or a second replica)
//! never drive a Job at once. A master drives nothing until it holds the Lease, renews it
//! every third of its duration, and stops (its Jobs left to the next master) once it can
//! no longer renew.
//!
//! Expiry is judged as client-go judges it, free of clock skew: a Lease whose record has
//! not changed for its whole duration, as this master observed it, is free.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use primus_service::Shutdown;

/// What a master does with the Lease it observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseDecision {
    /// It is this master's: renew it.
    Renew,
    /// It is free or expired: take it.
    Take,
    /// Another master holds it: wait.
    Wait,
}

/// The decision on a Lease held by `holder`, whose record this master has seen unchanged
/// for `unchanged_for`.
pub(crate) fn decide(
    holder: Option<&str>,
    me: &str,
    unchanged_for: Duration,
    duration: Duration,
) -> LeaseDecision {
    match holder {
        Some(holder) if holder == me => LeaseDecision::Renew,
        None | Some("") => LeaseDecision::Take,
        Some(_) if unchanged_for >= duration => LeaseDecision::Take,
        Some(_) => LeaseDecision::Wait,
    }
}

/// One shard's Lease, as one master holds or waits for it.
pub(crate) struct ShardLease {
    leases: Api<Lease>,
    name: String,
    me: String,
    duration: Duration,
}

impl ShardLease {
    /// The Lease `primus-master-<i>-of-<n>` of `shard`, held as `me` for `duration`.
    pub(crate) fn new(
        leases: Api<Lease>,
        shard: (u32, u32),
        me: String,
        duration: Duration,
    ) -> Self {
        Self {
            leases,
            name: format!("primus-master-{}-of-{}", shard.0, shard.1),
            me,
            duration,
        }
    }

    /// Returns once this master holds the Lease (false: `shutdown` came first).
    pub(crate) async fn acquire(&self, shutdown: &Shutdown) -> bool {
        let mut observed: Option<(String, Instant)> = None;
        let mut waiting_logged = false;
        while !shutdown.is_triggered() {
            match self.try_acquire(&mut observed).await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, holder = %self.me, "acquired the shard's Lease");
                    return true;
                }
                Ok(false) if !waiting_logged => {
                    tracing::info!(lease = %self.name, "waiting for the shard's Lease, held by another master");
                    waiting_logged = true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "the shard's Lease"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.duration / 3) => {}
                _ = shutdown.wait() => {}
            }
        }
        false
    }

    /// One look at the Lease, taking it when [`decide`] says so.
    async fn try_acquire(
        &self,
        observed: &mut Option<(String, Instant)>,
    ) -> Result<bool, kube::Error> {
        let Some(lease) = self.leases.get_opt(&self.name).await? else {
            let created = self
                .leases
                .create(&PostParams::default(), &self.record(None, 0))
                .await;
            return match created {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let unchanged_for = match observed {
            Some((seen, since)) if *seen == version => since.elapsed(),
            _ => {
                *observed = Some((version, Instant::now()));
                Duration::ZERO
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref();
        match decide(holder, &self.me, unchanged_for, self.duration) {
            LeaseDecision::Wait => Ok(false),
            LeaseDecision::Renew | LeaseDecision::Take => {
                let transitions = spec.lease_transitions.unwrap_or(0);
                let next = if holder == Some(self.me.as_str()) {
                    transitions
                } else {
                    transitions + 1
                };
                self.replace(lease, next).await
            }
        }
    }

    /// Renews the Lease until it is lost or `shutdown`; returns when it was lost.
    pub(crate) async fn hold(&self, shutdown: &Shutdown) {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.duration / 3) => {}
                _ = shutdown.wait() => return,
            }
            let held = match self.leases.get_opt(&self.name).await {
                Ok(Some(lease)) if lease_holder(&lease) == Some(self.me.as_str()) => {
                    let transitions = lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.lease_transitions)
                        .unwrap_or(0);
                    self.replace(lease, transitions).await
                }
                Ok(_) => {
                    tracing::error!(lease = %self.name, "another master holds the shard's Lease");
                    return;
                }
                Err(e) => Err(e),
            };
            match held {
                Ok(true) => renewed = Instant::now(),
                Ok(false) | Err(_) if renewed.elapsed() >= self.duration => {
                    tracing::error!(lease = %self.name, "the shard's Lease could not be renewed within its duration");
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "renewing the shard's Lease")
                }
            }
        }
    }

    /// Writes `lease` back as held by this master now (compare-and-swap on its version:
    /// false when someone wrote it in between).
    async fn replace(&self, lease: Lease, transitions: i32) -> Result<bool, kube::Error> {
        let acquired = (lease.spec.as_ref())
            .filter(|s| s.holder_identity.as_deref() == Some(self.me.as_str()))
            .and_then(|s| s.acquire_time.clone());
        let mut record = self.record(acquired, transitions);
        record.metadata.resource_version = lease.metadata.resource_version;
        match self
            .leases
            .replace(&self.name, &PostParams::default(), &record)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn record(&self, acquired: Option<MicroTime>, transitions: i32) -> Lease {
        let now = MicroTime(Timestamp::now());
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
                acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }
}

fn lease_holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DURATION: Duration = Duration::from_secs(15);

    #[test]
    fn a_lease_is_renewed_by_its_holder_and_taken_only_when_free_or_expired() {
        let seen = |s| Duration::from_secs(s);
        assert_eq!(
            decide(Some("a"), "a", seen(60), DURATION),
            LeaseDecision::Renew
        );
        assert_eq!(decide(None, "a", seen(0), DURATION), LeaseDecision::Take);
        assert_eq!(
            decide(Some(""), "a", seen(0), DURATION),
            LeaseDecision::Take
        );
        assert_eq!(
            decide(Some("b"), "a", seen(0), DURATION),
            LeaseDecision::Wait
        );
        assert_eq!(
            decide(Some("b"), "a", seen(14), DURATION),
            LeaseDecision::Wait
        );
        assert_eq!(
            decide(Some("b"), "a", seen(15), DURATION),
            LeaseDecision::Take
        );
    }
}
