//! Installing a plan: a barrier round (so no member pushes the chosen rows any more), then
//! every member copies the rows with their optimizer state from the PS; all read the same
//! values.

use std::sync::Arc;

use anyhow::Context;
use primus_embedding::HotRows;
use primus_embedding::hot_set::KeyFrequencies;
use primus_proto::packed::decode_keys;
use primus_proto::v1::HotPlan;

use super::rounds::RoundMode;
use super::{Group, HotKeys, HotSync, Phase, Share};
use crate::store::ParameterStore;

impl HotSync {
    pub(super) async fn install<S: ParameterStore>(
        &mut self,
        store: &Arc<S>,
        plan: HotPlan,
    ) -> anyhow::Result<()> {
        // The barrier round below must find every earlier sum on the PS.
        self.settle().await?;
        let mut members = plan.members.clone();
        members.sort();
        self.generation = self.generation.max(plan.generation);
        let replicas = self
            .specs
            .iter()
            .map(|spec| self.device.replica(spec))
            .collect::<Result<Vec<_>, _>>()?;
        self.phase = Phase::Active(Box::new(Group {
            generation: plan.generation,
            round: 0,
            members,
            replicas,
            expected_coverage: plan.expected_coverage,
            recent: KeyFrequencies::default(),
            next: None,
        }));
        self.publish_keys();
        // The barrier: once every member passed it, no member pushes these rows to the PS
        // any more, so all read the same values.
        self.round(store, Share::empty(self.specs.len()), RoundMode::Step)
            .await?;
        let Phase::Active(group) = &mut self.phase else {
            return Ok(());
        };
        for table in &plan.tables {
            let t = table.table as usize;
            let (Some(spec), Some(replica)) = (self.specs.get(t), group.replicas.get_mut(t)) else {
                anyhow::bail!(
                    "hot-set plan names table {t}; the model has {}",
                    self.specs.len()
                );
            };
            let keys = decode_keys("hot-set plan keys", &table.keys)?;
            if keys.is_empty() {
                continue;
            }
            let stored = store
                .read_rows(&spec.name, &keys)
                .await
                .with_context(|| format!("reading the hot rows of table {:?}", spec.name))?;
            replica.insert_rows(&stored.keys, &stored.values)?;
        }
        tracing::info!(
            generation = group.generation,
            members = ?group.members,
            rows = group.replicas.iter().map(HotRows::len).sum::<usize>(),
            coverage = group.expected_coverage,
            "hot set installed"
        );
        self.publish_keys();
        Ok(())
    }

    pub(super) fn publish_keys(&self) {
        let tables = match &self.phase {
            Phase::Active(group) => group.replicas.iter().map(|r| r.keys().collect()).collect(),
            _ => Vec::new(),
        };
        self.keys.send_replace(Arc::new(HotKeys { tables }));
    }
}
