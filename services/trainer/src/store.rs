//! Where a trainer's parameters live: the job's PS shards over gRPC ([`RemoteStore`]), or
//! tables and a dense store in this process ([`LocalStore`], for single-process training
//! and for measuring what distribution costs). Both apply the same optimizers.

use std::collections::HashMap;
use std::future::Future;

use anyhow::Context;
use primus_embedding::DenseValues;
use primus_embedding::{DenseStore, Table, TableOptions};
use primus_model::ParamTensor;
use primus_ps_client::{PsClient, StoredRows, TableGrads, TableKeys};
use primus_spec::job::{OptimizerSpec, TableSpec};

use crate::mirror::DenseMirror;

/// Embedding rows and dense parameters, with server-side optimizers.
pub trait ParameterStore: Send + Sync + 'static {
    /// Rows of `keys` (`dim` floats each, request order).
    fn lookup(
        &self,
        table: &str,
        keys: &[u64],
    ) -> impl Future<Output = anyhow::Result<Vec<f32>>> + Send;

    /// Applies gradients of unique `keys` with the table's optimizer.
    fn push(
        &self,
        table: &str,
        keys: &[u64],
        grads: &[f32],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Rows of several tables' keys at once, in the order of `tables`.
    fn lookup_tables(
        &self,
        tables: &[TableKeys<'_>],
    ) -> impl Future<Output = anyhow::Result<Vec<Vec<f32>>>> + Send;

    /// Applies several tables' gradients at once, then looks up `then_lookup` (rows in
    /// its order, as [`ParameterStore::lookup_tables`] gives them after the push). The
    /// gradients of a `minibatch` identity (`Receipt::minibatch`, 0: none) are applied
    /// once, however often the minibatch is trained.
    fn push_tables(
        &self,
        tables: &[TableGrads<'_>],
        then_lookup: &[TableKeys<'_>],
        minibatch: u64,
    ) -> impl Future<Output = anyhow::Result<Vec<Vec<f32>>>> + Send;

    /// The stored rows of `keys` with their optimizer state (keys without a row are left
    /// out): what a trainer copies its hot rows from.
    fn read_rows(
        &self,
        table: &str,
        keys: &[u64],
    ) -> impl Future<Output = anyhow::Result<StoredRows>> + Send;

    /// Offers initial dense values; existing tensors keep theirs.
    fn init_dense(
        &self,
        tensors: &[ParamTensor],
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    fn pull_dense(
        &self,
        names: &[String],
    ) -> impl Future<Output = anyhow::Result<Vec<ParamTensor>>> + Send;

    /// Applies dense gradients, once per `minibatch` identity as `push_tables`; the store
    /// may send them on after it returns, in order.
    fn push_dense(
        &self,
        grads: Vec<ParamTensor>,
        minibatch: u64,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Waits until every push has reached the store (a checkpoint barrier, the end).
    fn flush(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// The job's PS shards, and this trainer's copy of the dense parameters while it is
/// their only writer (see the `mirror` module).
pub struct RemoteStore {
    client: PsClient,
    dense: tokio::sync::Mutex<DenseMirror>,
}

impl RemoteStore {
    pub fn new(client: PsClient) -> Self {
        Self {
            client,
            dense: tokio::sync::Mutex::default(),
        }
    }
}

impl ParameterStore for RemoteStore {
    async fn lookup(&self, table: &str, keys: &[u64]) -> anyhow::Result<Vec<f32>> {
        Ok(self.client.lookup(table, keys).await?.0)
    }

    async fn push(&self, table: &str, keys: &[u64], grads: &[f32]) -> anyhow::Result<()> {
        self.client.push(table, keys, grads).await?;
        Ok(())
    }

    async fn lookup_tables(&self, tables: &[TableKeys<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let looked_up = self.client.lookup_tables(tables).await?;
        Ok(looked_up.into_iter().map(|t| t.rows).collect())
    }

    async fn push_tables(
        &self,
        tables: &[TableGrads<'_>],
        then_lookup: &[TableKeys<'_>],
        minibatch: u64,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let (_, looked_up) = self
            .client
            .push_tables_then_lookup(tables, then_lookup, minibatch)
            .await?;
        Ok(looked_up.into_iter().map(|t| t.rows).collect())
    }

    async fn read_rows(&self, table: &str, keys: &[u64]) -> anyhow::Result<StoredRows> {
        Ok(self.client.read_rows(table, keys).await?)
    }

    async fn init_dense(&self, tensors: &[ParamTensor]) -> anyhow::Result<()> {
        let wire: Vec<DenseValues> = tensors.iter().cloned().map(DenseValues::from).collect();
        self.client.init_dense(&wire).await?;
        Ok(())
    }

    async fn pull_dense(&self, names: &[String]) -> anyhow::Result<Vec<ParamTensor>> {
        let pulled = self.dense.lock().await.pull(&self.client, names).await?;
        Ok(pulled.into_iter().map(ParamTensor::from).collect())
    }

    async fn push_dense(&self, grads: Vec<ParamTensor>, minibatch: u64) -> anyhow::Result<()> {
        let wire: Vec<DenseValues> = grads.into_iter().map(DenseValues::from).collect();
        (self.dense.lock().await)
            .push(&self.client, wire, minibatch)
            .await
    }

    async fn flush(&self) -> anyhow::Result<()> {
        self.dense.lock().await.flush().await
    }
}

/// Tables and dense parameters in this process.
pub struct LocalStore {
    tables: HashMap<String, Table>,
    dense: DenseStore,
}

impl LocalStore {
    pub fn new(
        tables: &[TableSpec],
        dense_optimizer: &OptimizerSpec,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let options = TableOptions {
            seed,
            ..TableOptions::default()
        };
        let tables = tables
            .iter()
            .map(|spec| {
                let table =
                    Table::new(spec, options).with_context(|| format!("table {:?}", spec.name))?;
                Ok((spec.name.clone(), table))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            tables,
            dense: DenseStore::new(dense_optimizer),
        })
    }

    fn table(&self, name: &str) -> anyhow::Result<&Table> {
        self.tables
            .get(name)
            .with_context(|| format!("no table {name:?}"))
    }
}

impl ParameterStore for LocalStore {
    async fn lookup(&self, table: &str, keys: &[u64]) -> anyhow::Result<Vec<f32>> {
        let table = self.table(table)?;
        let mut rows = vec![0.0; keys.len() * table.dim()];
        table.lookup(keys, &mut rows)?;
        Ok(rows)
    }

    async fn push(&self, table: &str, keys: &[u64], grads: &[f32]) -> anyhow::Result<()> {
        self.table(table)?
            .push(keys, grads, primus_spec::time::unix_secs())?;
        Ok(())
    }

    async fn lookup_tables(&self, tables: &[TableKeys<'_>]) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut all = Vec::with_capacity(tables.len());
        for asked in tables {
            all.push(self.lookup(asked.table, asked.keys).await?);
        }
        Ok(all)
    }

    // In one process no trainer dies alone, so no minibatch comes twice.
    async fn push_tables(
        &self,
        tables: &[TableGrads<'_>],
        then_lookup: &[TableKeys<'_>],
        _minibatch: u64,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        for pushed in tables {
            self.push(pushed.table, pushed.keys, pushed.grads)
                .await
                .with_context(|| format!("pushing table {:?}", pushed.table))?;
        }
        self.lookup_tables(then_lookup).await
    }

    async fn read_rows(&self, table: &str, keys: &[u64]) -> anyhow::Result<StoredRows> {
        let table = self.table(table)?;
        let (keys, values) = table.read_rows(keys)?;
        Ok(StoredRows {
            dim: table.dim(),
            stride: table.row_width(),
            keys,
            values,
        })
    }

    async fn init_dense(&self, tensors: &[ParamTensor]) -> anyhow::Result<()> {
        let values: Vec<DenseValues> = tensors.iter().cloned().map(DenseValues::from).collect();
        self.dense.init(&values)?;
        Ok(())
    }

    async fn pull_dense(&self, names: &[String]) -> anyhow::Result<Vec<ParamTensor>> {
        let (pulled, _) = self.dense.pull(names)?;
        Ok(pulled.into_iter().map(ParamTensor::from).collect())
    }

    async fn push_dense(&self, grads: Vec<ParamTensor>, _minibatch: u64) -> anyhow::Result<()> {
        let values: Vec<DenseValues> = grads.into_iter().map(DenseValues::from).collect();
        self.dense.push(&values)?;
        Ok(())
    }

    async fn flush(&self) -> anyhow::Result<()> {
        Ok(())
    }
}
