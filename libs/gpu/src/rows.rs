//! Row stores: one table's rows (weights, then optimizer state) in one block of memory
//! addressed by row id, read, written and updated in batches, which is the form GPU memory
//! needs. [`DeviceRows`] keeps them on a GPU and does the work with the kernels;
//! [`HostRows`] is its CPU reference: the same signatures and the same float operations, so
//! the code that drives a store (the PS's tables) is tested on machines without a GPU.

use std::sync::Arc;

use crate::GpuError;
use crate::device::{CudaKernels, DeviceTable};
use crate::layout::{RowOptimizer, TableShape, validate_grads, validate_read, validate_write};
use crate::reference::{CpuKernels, EmbeddingKernels};

/// One table shard's rows in one block addressed by row id, read, written and updated in batches.
pub trait RowStore: Send + Sync {
    /// `rows` is the capacity: row ids below it are valid.
    fn shape(&self) -> TableShape;

    /// Resizes to `rows` rows, keeping the values of the rows both sizes hold; new rows are
    /// zero.
    fn resize(&mut self, rows: u32) -> Result<(), GpuError>;

    /// The first `floats` floats of each row in `ids` (repeats allowed), row after row.
    fn read(&self, ids: &[u32], floats: u32) -> Result<Vec<f32>, GpuError>;

    /// Overwrites whole rows: `stride` floats per id; the ids are distinct.
    fn write(&mut self, ids: &[u32], values: &[f32]) -> Result<(), GpuError>;

    /// Applies one gradient row (`dim` floats) per distinct id with `optimizer`.
    fn update(
        &mut self,
        optimizer: RowOptimizer,
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError>;

    /// Memory held, capacity included.
    fn bytes(&self) -> u64 {
        self.shape().floats() as u64 * 4
    }
}

/// Rows in host memory, handled by the CPU references of the device kernels.
pub struct HostRows {
    shape: TableShape,
    data: Vec<f32>,
}

impl HostRows {
    /// An empty store of rows of `stride` floats, the first `dim` the weights.
    pub fn new(dim: u32, stride: u32) -> Self {
        Self {
            shape: TableShape {
                rows: 0,
                dim,
                stride,
            },
            data: Vec::new(),
        }
    }
}

impl RowStore for HostRows {
    fn shape(&self) -> TableShape {
        self.shape
    }

    fn resize(&mut self, rows: u32) -> Result<(), GpuError> {
        self.shape.rows = rows;
        self.data.resize(self.shape.floats(), 0.0);
        Ok(())
    }

    fn read(&self, ids: &[u32], floats: u32) -> Result<Vec<f32>, GpuError> {
        validate_read(self.shape, ids, floats)?;
        let (floats, stride) = (floats as usize, self.shape.stride as usize);
        let mut out = Vec::with_capacity(ids.len() * floats);
        for &id in ids {
            out.extend_from_slice(&self.data[id as usize * stride..][..floats]);
        }
        Ok(out)
    }

    fn write(&mut self, ids: &[u32], values: &[f32]) -> Result<(), GpuError> {
        validate_write(self.shape, ids, values)?;
        let stride = self.shape.stride as usize;
        for (&id, row) in ids.iter().zip(values.chunks_exact(stride.max(1))) {
            self.data[id as usize * stride..][..stride].copy_from_slice(row);
        }
        Ok(())
    }

    fn update(
        &mut self,
        optimizer: RowOptimizer,
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError> {
        CpuKernels.update_rows(self.shape, optimizer, &mut self.data, ids, grads)
    }
}

/// Rows in one GPU's memory; every operation is a kernel launch on the kernels' stream.
pub struct DeviceRows {
    kernels: Arc<CudaKernels>,
    table: DeviceTable,
}

impl DeviceRows {
    /// An empty store on `kernels`' device, of rows of `stride` floats, the first `dim` the weights.
    pub fn new(kernels: Arc<CudaKernels>, dim: u32, stride: u32) -> Result<Self, GpuError> {
        let shape = TableShape {
            rows: 0,
            dim,
            stride,
        };
        let table = kernels.upload_table(shape, &[])?;
        Ok(Self { kernels, table })
    }
}

impl RowStore for DeviceRows {
    fn shape(&self) -> TableShape {
        self.table.shape
    }

    fn resize(&mut self, rows: u32) -> Result<(), GpuError> {
        self.kernels.resize_table(&mut self.table, rows)
    }

    fn read(&self, ids: &[u32], floats: u32) -> Result<Vec<f32>, GpuError> {
        self.kernels.read_rows(&self.table, ids, floats)
    }

    fn write(&mut self, ids: &[u32], values: &[f32]) -> Result<(), GpuError> {
        self.kernels.write_rows(&mut self.table, ids, values)
    }

    fn update(
        &mut self,
        optimizer: RowOptimizer,
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError> {
        let shape = self.table.shape;
        // upload_ids checks the ids and update_rows_on_device the stride.
        validate_grads(shape, ids.len(), grads)?;
        let ids = self.kernels.upload_ids(shape, ids)?;
        let grads = self.kernels.upload(grads)?;
        self.kernels
            .update_rows_on_device(&mut self.table, optimizer, &ids, &grads)
    }
}
