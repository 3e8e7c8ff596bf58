//! The trainer's own copy of the dense parameters, kept exact while it is their only
//! writer, so neither the dense push nor the pull waits on the PS in a step.
//!
//! The copy starts from the shards' tensors with their optimizer state and applies each
//! push with the shards' own optimizer code before the push goes to the PS in the
//! background; a pull then reads the copy without waiting for that push. The push's answer,
//! awaited by the next push (or `flush`), says whether the copy is still exact: each
//! shard's version must have advanced by exactly one. Anything else (another trainer's push,
//! a restore, a move of tensors to another shard) drops the copy, and pulls go to the PS
//! again (after this trainer's push in flight has landed) until `RESYNC_AFTER` pushes in a
//! row found no other writer; then the copy is read again. So a pull sees another writer's
//! push at most one push later than the PS has it. At most one push is in flight, so the
//! PS applies them in order.

use std::collections::BTreeMap;

use anyhow::Context;
use primus_embedding::{DenseStore, DenseValues};
use primus_ps_client::{DensePushed, PsClient, PsClientError};
use primus_spec::job::OptimizerSpec;
use tokio::task::JoinHandle;

/// Pushes in a row that must find no other writer before the copy is read again.
const RESYNC_AFTER: u32 = 4;

type Push = JoinHandle<Result<DensePushed, PsClientError>>;

/// The dense parameters as this trainer last knew them on the PS.
pub(crate) struct DenseMirror {
    copy: Option<DenseStore>,
    /// Each shard's version after this trainer's last push (or the copy's reading).
    versions: BTreeMap<String, u64>,
    /// Pushes in a row that found no other writer (counts up to a resync).
    quiet: u32,
    in_flight: Option<Push>,
}

impl Default for DenseMirror {
    fn default() -> Self {
        Self {
            copy: None,
            versions: BTreeMap::new(),
            // The first pull reads the copy.
            quiet: RESYNC_AFTER,
            in_flight: None,
        }
    }
}

impl DenseMirror {
    /// Current values of `names`: from the copy while it is exact, else from the PS once
    /// the push in flight has landed.
    pub(crate) async fn pull(
        &mut self,
        client: &PsClient,
        names: &[String],
    ) -> anyhow::Result<Vec<DenseValues>> {
        if self.copy.is_none() {
            self.flush().await?;
            if self.quiet >= RESYNC_AFTER {
                self.read_copy(client, names).await?;
            }
        }
        match &self.copy {
            Some(copy) => Ok(copy.pull(names)?.0),
            None => Ok(client.pull_dense(names).await?),
        }
    }

    /// Applies `grads` to the copy, then sends them to the PS without waiting for it. A
    /// shard that applied `minibatch` already leaves it out, and the copy is dropped then,
    /// as for another writer: its version did not advance.
    pub(crate) async fn push(
        &mut self,
        client: &PsClient,
        grads: Vec<DenseValues>,
        minibatch: u64,
    ) -> anyhow::Result<()> {
        self.flush().await?;
        if let Some(copy) = &self.copy {
            copy.push(&grads)?;
        }
        let client = client.clone();
        self.in_flight = Some(tokio::spawn(async move {
            client.push_dense(grads, minibatch).await
        }));
        Ok(())
    }

    /// Waits for the push in flight; fails with its error.
    pub(crate) async fn flush(&mut self) -> anyhow::Result<()> {
        let Some(push) = self.in_flight.take() else {
            return Ok(());
        };
        let outcome = (push.await.context("the dense push task"))
            .and_then(|pushed| pushed.context("pushing dense gradients"));
        let pushed = match outcome {
            Ok(pushed) => pushed,
            Err(e) => {
                // The copy holds a push the PS may lack.
                (self.copy, self.quiet) = (None, 0);
                return Err(e);
            }
        };
        let alone = !pushed.moved
            && !pushed.versions.is_empty()
            && (pushed.versions.iter()).all(|(shard, v)| {
                self.versions
                    .get(shard)
                    .is_some_and(|known| *v == known + 1)
            });
        self.versions = pushed.versions;
        if alone {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.quiet = 0;
            if self.copy.take().is_some() {
                if pushed.repeated {
                    tracing::info!(
                        "the PS had this minibatch's dense gradients already (it was served again): pulling the dense parameters from the PS"
                    );
                } else {
                    tracing::info!(
                        "another writer of the dense parameters: pulling them from the PS"
                    );
                }
            }
        }
        Ok(())
    }

    /// Reads the tensors with their optimizer state into a new copy.
    async fn read_copy(&mut self, client: &PsClient, names: &[String]) -> anyhow::Result<()> {
        let state = client.pull_dense_state(names).await?;
        let optimizer: OptimizerSpec = serde_json::from_str(&state.optimizer_json)
            .with_context(|| format!("the PS's dense optimizer {:?}", state.optimizer_json))?;
        let copy = DenseStore::new(&optimizer);
        let mut versions = BTreeMap::new();
        for (shard, (version, tensors)) in state.shards {
            copy.merge_where(&tensors, |_| true)
                .with_context(|| format!("the dense parameters of PS shard {shard}"))?;
            versions.insert(shard, version);
        }
        self.copy = Some(copy);
        self.versions = versions;
        Ok(())
    }
}
