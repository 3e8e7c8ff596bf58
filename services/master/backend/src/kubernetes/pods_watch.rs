//! The watch on this master's pods: each event folded into the observed state and the
//! executors it concerns reconciled, every executor again each `RESYNC`.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::Duration;

use super::reconcile::ObservedPod;
use super::{Inner, Key, RESYNC};

/// Follows this master's pods, reconciling each executor whose pod changed, and every
/// executor every `RESYNC`.
pub(super) async fn watch_pods(inner: Arc<Inner>) {
    tokio::spawn(super::sweep::sweep_unclaimed_jobs(inner.clone()));
    let config = watcher::Config::default().labels(&inner.selector());
    let mut events = watcher::watcher(inner.pods.clone(), config).boxed();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        let keys: Vec<Key> = tokio::select! {
            event = events.try_next() => match event {
                Ok(Some(event)) => observe(&inner, event),
                Ok(None) => return,
                Err(e) => {
                    // The watcher retries by itself; the next event resumes.
                    tracing::warn!(error = %e, "watching executor pods");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Vec::new()
                }
            },
            _ = resync.tick() => {
                inner.delete_owners_left().await;
                let state = inner.lock();
                state.wanted.keys().chain(state.observed.keys()).cloned().collect()
            }
        };
        inner.changed.send_modify(|n| *n += 1);
        for key in keys {
            inner.reconcile(&key).await;
        }
    }
}

/// Folds one watch event into the observed pods; returns the executors it concerns.
fn observe(inner: &Inner, event: watcher::Event<Pod>) -> Vec<Key> {
    let mut state = inner.lock();
    match event {
        watcher::Event::Apply(pod) => {
            let Some(observed) = ObservedPod::of(&pod) else {
                return Vec::new();
            };
            let key = key_of(&observed);
            state.observed.insert(key.clone(), observed);
            vec![key]
        }
        watcher::Event::InitApply(pod) => {
            if let Some(observed) = ObservedPod::of(&pod) {
                let key = key_of(&observed);
                state.relisted.get_or_insert_default().push(key.clone());
                state.observed.insert(key, observed);
            }
            Vec::new()
        }
        watcher::Event::Delete(pod) => {
            let Some(observed) = ObservedPod::of(&pod) else {
                return Vec::new();
            };
            let key = key_of(&observed);
            // Only if it is the pod gone: a replacement may be observed already.
            if state
                .observed
                .get(&key)
                .is_some_and(|o| o.uid == observed.uid)
            {
                state.observed.remove(&key);
            }
            vec![key]
        }
        watcher::Event::Init => {
            state.relisted = Some(Vec::new());
            Vec::new()
        }
        // The relist is complete: pods absent from it are gone.
        watcher::Event::InitDone => {
            let listed = state.relisted.take().unwrap_or_default();
            state.observed.retain(|key, _| listed.contains(key));
            state.wanted.keys().chain(&listed).cloned().collect()
        }
    }
}

fn key_of(pod: &ObservedPod) -> Key {
    (pod.job.clone(), pod.id.clone())
}
