//! A trainer's replica of one table's hot rows (HypeReca's `R` chunk): weights and
//! optimizer state copied from the parameter servers, then trained in place with the
//! table's own optimizer. Every trainer of a job applies the same summed gradients in the
//! same order, so the replicas stay bitwise equal to each other and to the PS rows, which
//! receive those same gradients once per step.
//!
//! The rows live in the trainer's memory, or in a [`RowStore`] (a GPU's memory), where
//! the table's fused kernel trains them; the kernels follow the CPU optimizers' float
//! operations, so both forms stay equal to the PS.

use std::collections::HashMap;

use primus_gpu::{RowOptimizer, RowStore};
use primus_spec::job::TableSpec;

use crate::EmbeddingError;
use crate::optimizer::Optimizer;
use crate::table::{UpdateWaves, check_gradients, check_width, device_error};

/// Hot rows of one table, `dim` weights then the optimizer's state per row.
pub struct HotRows {
    name: String,
    dim: usize,
    stride: usize,
    optimizer: Optimizer,
    /// Key -> row id, ids dense from 0.
    slots: HashMap<u64, u32>,
    rows: Rows,
}

enum Rows {
    /// In the trainer's memory, trained row by row with the table's optimizer.
    Host(Vec<f32>),
    /// In a row store, trained by the optimizer's fused kernel.
    Stored {
        store: Box<dyn RowStore>,
        kernel: RowOptimizer,
    },
}

impl std::fmt::Debug for HotRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = match self.rows {
            Rows::Host(_) => "host",
            Rows::Stored { .. } => "row store",
        };
        f.debug_struct("HotRows")
            .field("name", &self.name)
            .field("rows", &self.slots.len())
            .field("at", &at)
            .finish()
    }
}

impl HotRows {
    /// An empty replica in the trainer's memory, laid out as `spec`'s table is on the PS.
    pub fn new(spec: &TableSpec) -> Result<Self, EmbeddingError> {
        Self::with_rows(spec, |_| Ok(Rows::Host(Vec::new())))
    }

    /// An empty replica whose rows live in `store` (made for the table's dim and stride).
    /// The table's optimizer must have a fused kernel (adagrad or adam).
    pub fn in_store(
        spec: &TableSpec,
        make: impl FnOnce(u32, u32) -> Result<Box<dyn RowStore>, primus_gpu::GpuError>,
    ) -> Result<Self, EmbeddingError> {
        Self::with_rows(spec, |optimizer| {
            let kernel = optimizer.kernel().ok_or_else(|| EmbeddingError::NoKernel {
                table: spec.name.clone(),
                optimizer: optimizer.name(),
            })?;
            let dim = spec.dim;
            let stride = dim as usize + optimizer.state_len(dim as usize);
            let store = make(dim, stride as u32).map_err(|e| device_error(&spec.name, e))?;
            Ok(Rows::Stored { store, kernel })
        })
    }

    fn with_rows(
        spec: &TableSpec,
        rows: impl FnOnce(&Optimizer) -> Result<Rows, EmbeddingError>,
    ) -> Result<Self, EmbeddingError> {
        let dim = spec.dim as usize;
        if dim == 0 {
            return Err(EmbeddingError::ZeroDim {
                table: spec.name.clone(),
            });
        }
        let optimizer = Optimizer::from_spec(&spec.optimizer);
        Ok(Self {
            name: spec.name.clone(),
            dim,
            stride: dim + optimizer.state_len(dim),
            rows: rows(&optimizer)?,
            optimizer,
            slots: HashMap::new(),
        })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Weights per row.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Floats of optimizer state per row.
    pub fn state_len(&self) -> usize {
        self.stride - self.dim
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether `key`'s row is held.
    pub fn contains(&self, key: u64) -> bool {
        self.slots.contains_key(&key)
    }

    /// The keys held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.keys().copied()
    }

    /// Adds (or replaces) `key`'s row: `values` holds its weights then its optimizer state,
    /// as the PS's `ReadRows` returns them.
    pub fn insert(&mut self, key: u64, values: &[f32]) -> Result<(), EmbeddingError> {
        self.insert_rows(&[key], values)
    }

    /// Adds (or replaces) the rows of `keys`, weights then optimizer state for each, in one
    /// write; of a key given twice, the later row stays. Nothing changes on an error.
    pub fn insert_rows(&mut self, keys: &[u64], values: &[f32]) -> Result<(), EmbeddingError> {
        check_width("row values", keys.len(), values.len(), self.stride)?;
        let stride = self.stride;
        let mut added: HashMap<u64, u32> = HashMap::new();
        // Row id -> position in `ids`, so a repeated key writes its row once.
        let mut batch: HashMap<u32, usize> = HashMap::new();
        let mut ids = Vec::with_capacity(keys.len());
        let mut rows = Vec::with_capacity(values.len());
        for (key, row) in keys.iter().zip(values.chunks_exact(stride)) {
            let next = (self.slots.len() + added.len()) as u32;
            let id = match self.slots.get(key) {
                Some(&id) => id,
                None => *added.entry(*key).or_insert(next),
            };
            match batch.get(&id) {
                Some(&at) => rows[at * stride..][..stride].copy_from_slice(row),
                None => {
                    batch.insert(id, ids.len());
                    ids.push(id);
                    rows.extend_from_slice(row);
                }
            }
        }
        let needed = (self.slots.len() + added.len()) as u32;
        match &mut self.rows {
            Rows::Host(values) => {
                values.resize(needed as usize * stride, 0.0);
                for (&id, row) in ids.iter().zip(rows.chunks_exact(stride)) {
                    values[id as usize * stride..][..stride].copy_from_slice(row);
                }
            }
            Rows::Stored { store, .. } => {
                let capacity = store.shape().rows;
                if needed > capacity {
                    let grown = needed.max(capacity.saturating_mul(2)).max(64);
                    store
                        .resize(grown)
                        .map_err(|e| device_error(&self.name, e))?;
                }
                store
                    .write(&ids, &rows)
                    .map_err(|e| device_error(&self.name, e))?;
            }
        }
        self.slots.extend(added);
        Ok(())
    }

    /// Writes the weights of the hot keys among `keys` into their rows of `out` (`dim`
    /// floats per key, in `keys`' order) and marks them in `filled`; other rows stay.
    /// Returns how many were hot. One batched read from a row store.
    pub fn fill_weights(
        &self,
        keys: &[u64],
        out: &mut [f32],
        filled: &mut [bool],
    ) -> Result<usize, EmbeddingError> {
        let dim = self.dim;
        check_width("weights", keys.len(), out.len(), dim)?;
        check_width("filled", keys.len(), filled.len(), 1)?;
        let (positions, ids): (Vec<usize>, Vec<u32>) = keys
            .iter()
            .enumerate()
            .filter_map(|(p, key)| self.slots.get(key).map(|&id| (p, id)))
            .unzip();
        let read = match &self.rows {
            Rows::Host(values) => {
                let rows = ids
                    .iter()
                    .map(|&id| &values[id as usize * self.stride..][..dim]);
                rows.flatten().copied().collect::<Vec<f32>>()
            }
            Rows::Stored { store, .. } => store
                .read(&ids, dim as u32)
                .map_err(|e| device_error(&self.name, e))?,
        };
        for (&p, weights) in positions.iter().zip(read.chunks_exact(dim)) {
            out[p * dim..][..dim].copy_from_slice(weights);
            filled[p] = true;
        }
        Ok(positions.len())
    }

    /// `key`'s weights then optimizer state, if it is hot.
    pub fn values(&self, key: u64) -> Result<Option<Vec<f32>>, EmbeddingError> {
        let Some(&id) = self.slots.get(&key) else {
            return Ok(None);
        };
        match &self.rows {
            Rows::Host(values) => Ok(Some(
                values[id as usize * self.stride..][..self.stride].to_vec(),
            )),
            Rows::Stored { store, .. } => store
                .read(&[id], self.stride as u32)
                .map(Some)
                .map_err(|e| device_error(&self.name, e)),
        }
    }

    /// Applies `grads` (`dim` floats per key, keys in the order given) with the table's
    /// optimizer. Every key must be hot and every gradient finite; otherwise nothing
    /// changes.
    pub fn apply(&mut self, keys: &[u64], grads: &[f32]) -> Result<(), EmbeddingError> {
        check_gradients(keys, grads, self.dim)?;
        let ids = keys
            .iter()
            .map(|key| {
                self.slots
                    .get(key)
                    .copied()
                    .ok_or_else(|| EmbeddingError::NotHot {
                        table: self.name.clone(),
                        key: *key,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let grads = grads.chunks_exact(self.dim);
        match &mut self.rows {
            Rows::Host(values) => {
                for (id, grad) in ids.into_iter().zip(grads) {
                    let row = &mut values[id as usize * self.stride..][..self.stride];
                    let (weights, state) = row.split_at_mut(self.dim);
                    self.optimizer.apply(weights, state, grad);
                }
                Ok(())
            }
            Rows::Stored { store, kernel } => {
                let mut waves = UpdateWaves::default();
                for (id, grad) in ids.into_iter().zip(grads) {
                    waves.add(id, grad);
                }
                waves
                    .apply(store.as_mut(), *kernel)
                    .map_err(|e| device_error(&self.name, e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Table, TableOptions};
    use primus_spec::job::OptimizerSpec;

    fn spec(optimizer: OptimizerSpec) -> TableSpec {
        TableSpec::new("t", 4, optimizer)
    }

    /// The replica of rows copied from a table, trained with the same gradients, ends
    /// bitwise equal to the table for every optimizer.
    #[test]
    fn a_replica_trained_like_the_table_stays_bitwise_equal_to_it() {
        let optimizers = [
            OptimizerSpec::Sgd {
                learning_rate: 0.05,
            },
            OptimizerSpec::adagrad(0.05),
            OptimizerSpec::adam(0.01),
            OptimizerSpec::Ftrl {
                alpha: 0.1,
                beta: 1.0,
                l1: 0.01,
                l2: 0.01,
            },
        ];
        for optimizer in optimizers {
            let spec = spec(optimizer.clone());
            let table = Table::new(&spec, TableOptions::default()).expect("table");
            let keys = [3u64, 17, 1 << 40];
            let grads: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.01).collect();
            table.push(&keys, &grads, 1).expect("push");
            let mut hot = HotRows::new(&spec).expect("replica");
            for &key in &keys {
                let (weights, state, _) = table.row(key).expect("read").expect("row");
                hot.insert(key, &[weights, state].concat()).expect("insert");
            }
            for step in 0..20 {
                let grads: Vec<f32> = (0..12)
                    .map(|i| ((i * 7 + step * 3) % 11) as f32 * 0.02 - 0.1)
                    .collect();
                table.push(&keys, &grads, 2).expect("push");
                hot.apply(&keys, &grads).expect("apply");
            }
            for &key in &keys {
                let (weights, state, _) = table.row(key).expect("read").expect("row");
                assert_eq!(
                    hot.values(key).expect("read"),
                    Some([weights, state].concat()),
                    "{optimizer:?}"
                );
            }
        }
    }

    #[test]
    fn bad_rows_and_gradients_are_refused_without_a_change() {
        let spec = spec(OptimizerSpec::adagrad(0.05));
        let mut hot = HotRows::new(&spec).expect("replica");
        assert!(matches!(
            hot.insert(1, &[0.0; 4]),
            Err(EmbeddingError::Width { want: 8, .. })
        ));
        hot.insert(1, &[0.5; 8]).expect("insert");
        assert_eq!(
            hot.apply(&[1, 2], &[0.1; 8]),
            Err(EmbeddingError::NotHot {
                table: "t".into(),
                key: 2
            })
        );
        let mut grads = [0.1; 4];
        grads[2] = f32::NAN;
        assert!(matches!(
            hot.apply(&[1], &grads),
            Err(EmbeddingError::NonFinite { key: 1, .. })
        ));
        assert_eq!(hot.values(1), Ok(Some(vec![0.5; 8])));
    }

    fn host_store(dim: u32, stride: u32) -> Result<Box<dyn RowStore>, primus_gpu::GpuError> {
        Ok(Box::new(primus_gpu::HostRows::new(dim, stride)))
    }

    /// The row-store form, trained by the fused kernel, stays bitwise equal to the host
    /// form: rows inserted in several batches (the store grows), repeated keys in one
    /// apply, weights filled in. Checked on the CPU reference store, and on a GPU's
    /// memory when one is present.
    #[test]
    #[expect(
        clippy::print_stdout,
        reason = "a check that cannot run here says so on stdout, beside the test's name"
    )]
    fn a_replica_in_a_row_store_trains_like_one_in_host_memory() {
        check_row_store_replica(host_store);
        match primus_gpu::CudaKernels::new(0) {
            Ok(kernels) => {
                let kernels = std::sync::Arc::new(kernels);
                check_row_store_replica(|dim, stride| {
                    let rows = primus_gpu::DeviceRows::new(kernels.clone(), dim, stride)?;
                    Ok(Box::new(rows) as Box<dyn RowStore>)
                });
            }
            Err(e) => println!("SKIPPED the GPU row store ({e}): checked the CPU reference only"),
        }
    }

    fn check_row_store_replica(
        make: impl Fn(u32, u32) -> Result<Box<dyn RowStore>, primus_gpu::GpuError>,
    ) {
        for optimizer in [OptimizerSpec::adagrad(0.05), OptimizerSpec::adam(0.01)] {
            let spec = spec(optimizer.clone());
            let mut host = HotRows::new(&spec).expect("host replica");
            let mut stored = HotRows::in_store(&spec, &make).expect("stored replica");
            let stride = 4 + host.state_len();
            let keys: Vec<u64> = (0..150u64).map(|k| k * 7919 + (1 << 40)).collect();
            for chunk in keys.chunks(50) {
                let values: Vec<f32> = (0..chunk.len() * stride)
                    .map(|i| (i % 13) as f32 * 0.03 + 0.1)
                    .collect();
                host.insert_rows(chunk, &values).expect("insert");
                stored.insert_rows(chunk, &values).expect("insert");
            }
            for step in 0..10 {
                // Every key once, then the first ten again: repeats apply in order.
                let mut applied = keys.clone();
                applied.extend_from_slice(&keys[..10]);
                let grads: Vec<f32> = (0..applied.len() * 4)
                    .map(|i| ((i * 5 + step * 3) % 17) as f32 * 0.01 - 0.08)
                    .collect();
                host.apply(&applied, &grads).expect("apply");
                stored.apply(&applied, &grads).expect("apply");
            }
            for &key in &keys {
                assert_eq!(
                    host.values(key).expect("read"),
                    stored.values(key).expect("read"),
                    "{optimizer:?} key {key}"
                );
            }
            let asked = [keys[3], 5, keys[149], keys[3]];
            let (mut from_host, mut from_store) = (vec![-1.0; 16], vec![-1.0; 16]);
            let (mut host_filled, mut store_filled) = (vec![false; 4], vec![false; 4]);
            let hot = host
                .fill_weights(&asked, &mut from_host, &mut host_filled)
                .expect("fill");
            stored
                .fill_weights(&asked, &mut from_store, &mut store_filled)
                .expect("fill");
            assert_eq!(hot, 3);
            assert_eq!(host_filled, [true, false, true, true]);
            assert_eq!((from_host, host_filled), (from_store, store_filled));
        }
    }

    #[test]
    fn a_row_store_replica_needs_a_kernel_optimizer() {
        let spec = spec(OptimizerSpec::Sgd {
            learning_rate: 0.05,
        });
        assert!(matches!(
            HotRows::in_store(&spec, host_store),
            Err(EmbeddingError::NoKernel {
                optimizer: "sgd",
                ..
            })
        ));
    }
}
