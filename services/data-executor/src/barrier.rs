//! The executor's side of a checkpoint barrier: while paused for checkpoint `id`, no
//! minibatch leaves the serving buffers, so the served offsets it reports to the master
//! are exactly the rows that came before the barrier marker on every stream.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BarrierError {
    #[error("paused for checkpoint {paused}, not {asked}")]
    OtherCheckpoint { paused: u64, asked: u64 },
}

pub(crate) struct Barrier {
    /// The checkpoint paused for, and the pause's generation (so a stale timeout never
    /// ends a later pause).
    paused: Mutex<Option<(u64, u64)>>,
    /// Bumped on every pause and resume: wakes streams waiting on either.
    changes: watch::Sender<u64>,
}

impl Default for Barrier {
    fn default() -> Self {
        Self {
            paused: Mutex::new(None),
            changes: watch::channel(0).0,
        }
    }
}

impl Barrier {
    fn state(&self) -> std::sync::MutexGuard<'_, Option<(u64, u64)>> {
        self.paused.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pauses for checkpoint `id` (again: a no-op) and returns the pause's generation,
    /// for [`Barrier::expire`]. Once this returns, no `serve` closure runs until resumed.
    pub(crate) fn pause(&self, id: u64) -> Result<u64, BarrierError> {
        let mut state = self.state();
        match *state {
            Some((paused, generation)) if paused == id => Ok(generation),
            Some((paused, _)) => Err(BarrierError::OtherCheckpoint { paused, asked: id }),
            None => {
                let generation = *self.changes.borrow() + 1;
                *state = Some((id, generation));
                self.changes.send_replace(generation);
                Ok(generation)
            }
        }
    }

    /// Ends the pause for `id`; resuming when not paused is a no-op (the pause may have
    /// expired).
    pub(crate) fn resume(&self, id: u64) -> Result<(), BarrierError> {
        let mut state = self.state();
        match *state {
            Some((paused, _)) if paused != id => {
                Err(BarrierError::OtherCheckpoint { paused, asked: id })
            }
            Some(_) => {
                *state = None;
                self.changes.send_modify(|g| *g += 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Ends the pause of `generation` after `timeout` unless it ended before.
    pub(crate) async fn expire(&self, generation: u64, timeout: Duration) {
        tokio::time::sleep(timeout).await;
        let mut state = self.state();
        if let Some((id, g)) = *state
            && g == generation
        {
            tracing::warn!(
                checkpoint = id,
                "no resume within the pause's timeout; serving again"
            );
            *state = None;
            self.changes.send_modify(|g| *g += 1);
        }
    }

    /// Runs `serve` unless paused (then returns the checkpoint id). A pause waits for a
    /// running `serve` to finish, so what `serve` takes is counted before the pause returns.
    pub(crate) fn unless_paused<T>(&self, serve: impl FnOnce() -> T) -> Result<T, u64> {
        let state = self.state();
        match *state {
            Some((id, _)) => Err(id),
            None => Ok(serve()),
        }
    }

    /// Wakes on every pause and resume after this call.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_blocks_serving_until_the_same_checkpoint_resumes() {
        let barrier = Barrier::default();
        assert_eq!(barrier.unless_paused(|| 1), Ok(1));
        barrier.pause(7).expect("pause");
        assert!(barrier.pause(7).is_ok(), "pausing again is a no-op");
        assert_eq!(
            barrier.pause(8),
            Err(BarrierError::OtherCheckpoint {
                paused: 7,
                asked: 8
            })
        );
        assert_eq!(barrier.unless_paused(|| 1), Err(7));
        assert!(barrier.resume(8).is_err());
        barrier.resume(7).expect("resume");
        assert_eq!(barrier.unless_paused(|| 2), Ok(2));
        barrier.resume(7).expect("resuming twice is a no-op");
    }

    #[tokio::test]
    async fn a_pause_expires_but_a_stale_timeout_never_ends_a_later_one() {
        let barrier = Barrier::default();
        let first = barrier.pause(1).expect("pause");
        barrier.resume(1).expect("resume");
        barrier.pause(2).expect("pause");
        barrier.expire(first, Duration::from_millis(5)).await;
        assert_eq!(barrier.unless_paused(|| ()), Err(2));
        let changes = barrier.subscribe();
        let second = barrier.pause(2).expect("same pause");
        barrier.expire(second, Duration::from_millis(5)).await;
        assert!(changes.has_changed().expect("open"));
        assert_eq!(barrier.unless_paused(|| ()), Ok(()));
    }
}
