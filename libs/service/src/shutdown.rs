use tokio::sync::watch;

/// A one-way "stop now" flag shared by every task of a service.
#[derive(Clone, Debug)]
pub struct Shutdown {
    sender: watch::Sender<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not triggered yet.
    pub fn new() -> Self {
        Self {
            sender: watch::Sender::new(false),
        }
    }

    /// Triggers it: every waiter wakes.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Whether it was triggered.
    pub fn is_triggered(&self) -> bool {
        *self.sender.borrow()
    }

    /// Resolves once [`Shutdown::trigger`] was called (at once if it already was).
    pub async fn wait(&self) {
        let mut receiver = self.sender.subscribe();
        // Only fails if the sender is gone, which cannot happen while `self` holds it.
        let _ = receiver.wait_for(|stop| *stop).await;
    }

    /// Triggers on SIGTERM or SIGINT (must run inside the tokio runtime).
    pub fn trigger_on_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutting down");
            this.trigger();
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let shutdown = Shutdown::new();
        let waiter = shutdown.clone();
        let waiting = tokio::spawn(async move { waiter.wait().await });
        assert!(!shutdown.is_triggered());
        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken")
            .expect("task");
        // Waiting after the fact returns at once.
        tokio::time::timeout(Duration::from_millis(100), shutdown.wait())
            .await
            .expect("already triggered");
    }
}
