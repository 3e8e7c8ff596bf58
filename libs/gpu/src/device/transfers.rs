//! Copies between the host and a device: uploads of tables, ids and pooling batches
//! (validated first, as every launch relies on), downloads, and [`EmbeddingKernels`] over
//! host slices, each call a round trip through the device.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use super::{CudaKernels, DeviceIds, DevicePooling, DeviceTable, DeviceTables, SortedRows};
use crate::GpuError;
use crate::layout::{
    Accumulation, Pooling, PoolingInput, RowOptimizer, TableShape, table_bases, validate_ids,
    validate_update,
};
use crate::reference::{EmbeddingKernels, validate_grad_out, validate_weights};

impl CudaKernels {
    /// A device copy of `host`; empty slices get one zero element (CUDA cannot allocate 0 bytes).
    pub fn upload<T: DeviceRepr + ValidAsZeroBits + Default + Clone>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>, GpuError> {
        if host.is_empty() {
            return Ok(self.stream.alloc_zeros::<T>(1)?);
        }
        Ok(self.stream.clone_htod(host)?)
    }

    /// `len` zeroed values on the device.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        Ok(self.stream.alloc_zeros::<T>(len.max(1))?)
    }

    /// Copies values from the device.
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        device: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>, GpuError> {
        let mut host = self.stream.clone_dtoh(device)?;
        host.truncate(len);
        Ok(host)
    }

    /// Lays `tables` (with their rows) end to end on the device.
    pub fn upload_tables(
        &self,
        tables: &[TableShape],
        weights: &[&[f32]],
    ) -> Result<DeviceTables, GpuError> {
        validate_weights(tables, weights)?;
        let (bases, total) = table_bases(tables.iter().map(TableShape::floats));
        let mut packed = vec![0.0f32; total];
        for (w, &base) in weights.iter().zip(&bases) {
            packed[base as usize..][..w.len()].copy_from_slice(w);
        }
        Ok(DeviceTables {
            tables: tables.to_vec(),
            bases,
            data: self.upload(&packed)?,
        })
    }

    /// Copies one table's rows to the device.
    pub fn upload_table(&self, shape: TableShape, rows: &[f32]) -> Result<DeviceTable, GpuError> {
        validate_weights(&[shape], &[rows])?;
        Ok(DeviceTable {
            shape,
            data: self.upload(rows)?,
        })
    }

    /// Copies one table's rows from the device.
    pub fn download_table(&self, table: &DeviceTable) -> Result<Vec<f32>, GpuError> {
        self.download(&table.data, table.shape.floats())
    }

    /// Checks that `ids` are distinct rows of `shape` and copies them to the device.
    pub fn upload_ids(&self, shape: TableShape, ids: &[u32]) -> Result<DeviceIds, GpuError> {
        validate_ids(shape.rows, ids)?;
        Ok(DeviceIds {
            rows: shape.rows,
            len: ids.len(),
            ids: self.upload(ids)?,
        })
    }

    /// Validates `input` against the tables of `weights` and copies it to the device.
    /// `backward` is the accumulation its backward will use: the deterministic one needs
    /// each gradient row's contributions sorted on the host, which the forward pass and the
    /// atomic backward do not pay for.
    pub fn upload_pooling(
        &self,
        weights: &DeviceTables,
        input: &PoolingInput,
        backward: Accumulation,
    ) -> Result<DevicePooling, GpuError> {
        let tables = &weights.tables;
        input.validate(tables)?;
        let columns = input.columns(tables);
        let out_width = input.out_width(tables);
        let (grad_bases, grad_floats) =
            table_bases(tables.iter().map(|t| t.rows as usize * t.dim as usize));
        let mut feature_base = Vec::with_capacity(input.features.len());
        let mut feature_meta = Vec::with_capacity(3 * input.features.len());
        let mut grad_base = Vec::with_capacity(input.features.len());
        let mut offsets = vec![0u32];
        let mut rows = Vec::new();
        let mut bag_start = Vec::with_capacity(input.features.len());
        for (f, feature) in input.features.iter().enumerate() {
            let shape = tables[feature.table];
            feature_base.push(weights.bases[feature.table]);
            feature_meta.extend([shape.stride, shape.dim, columns[f] as u32]);
            grad_base.push(grad_bases[feature.table]);
            bag_start.push(offsets.len() as u32 - 1);
            let base = rows.len() as u32;
            offsets.extend(feature.offsets[1..].iter().map(|o| base + o));
            rows.extend_from_slice(&feature.rows);
        }
        let any_inverse = input.features.iter().any(|f| f.inverse.is_some());
        let sample_bag: Option<Vec<u32>> = any_inverse.then(|| {
            input
                .features
                .iter()
                .zip(&bag_start)
                .flat_map(|(feature, &start)| {
                    (0..input.samples).map(move |b| start + feature.bag_of(b) as u32)
                })
                .collect()
        });
        let max_dim = tables.iter().map(|t| t.dim).max().unwrap_or(1);
        let vec4 = out_width.is_multiple_of(4)
            && input
                .features
                .iter()
                .zip(&columns)
                .all(|(feature, &column)| {
                    let t = tables[feature.table];
                    t.dim.is_multiple_of(4)
                        && t.stride.is_multiple_of(4)
                        && column.is_multiple_of(4)
                });
        let sorted = match backward {
            Accumulation::Deterministic => Some(self.sorted_rows(input, tables, &grad_bases)?),
            Accumulation::Atomic => None,
        };
        Ok(DevicePooling {
            tables: tables.clone(),
            features: input.features.len() as u32,
            samples: input.samples as u32,
            out_width: out_width as u32,
            vec4,
            max_dim,
            feature_base: self.upload(&feature_base)?,
            feature_meta: self.upload(&feature_meta)?,
            grad_base: self.upload(&grad_base)?,
            grad_floats,
            offsets: self.upload(&offsets)?,
            rows: self.upload(&rows)?,
            sample_bag: sample_bag.map(|s| self.upload(&s)).transpose()?,
            sorted,
        })
    }

    /// The pooling backward of `grad_out` (on the device) onto each table's rows, copied
    /// to the host: one `rows x dim` gradient per table of `batch`.
    pub fn pool_backward_to_host(
        &self,
        batch: &DevicePooling,
        pooling: Pooling,
        grad_out: &CudaSlice<f32>,
        accumulation: Accumulation,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let mut grads = self.zeros::<f32>(batch.grad_floats)?;
        self.pool_backward_on_device(batch, pooling, grad_out, accumulation, &mut grads)?;
        let flat = self.download(&grads, batch.grad_floats)?;
        let tables = &batch.tables;
        let (bases, _) = table_bases(tables.iter().map(|t| t.rows as usize * t.dim as usize));
        Ok((tables.iter().zip(bases))
            .map(|(t, base)| flat[base as usize..][..t.rows as usize * t.dim as usize].to_vec())
            .collect())
    }

    /// Contributions (work item per bag entry) grouped by gradient row, each group in
    /// ascending item order: the reference's visiting order.
    fn sorted_rows(
        &self,
        input: &PoolingInput,
        tables: &[TableShape],
        grad_bases: &[u64],
    ) -> Result<SortedRows, GpuError> {
        let plan = input.contributions_by_row(tables);
        let row_dst: Vec<u64> = (plan.row_table.iter().zip(&plan.row_id))
            .map(|(&t, &row)| {
                let t = t as usize;
                grad_bases[t] + u64::from(row) * u64::from(tables[t].dim)
            })
            .collect();
        Ok(SortedRows {
            count: row_dst.len() as u32,
            row_dst: self.upload(&row_dst)?,
            row_feature: self.upload(&plan.row_feature)?,
            row_offsets: self.upload(&plan.row_offsets)?,
            contrib_item: self.upload(&plan.contrib_item)?,
        })
    }
}

impl EmbeddingKernels for CudaKernels {
    fn gather_pool(
        &self,
        tables: &[TableShape],
        weights: &[&[f32]],
        input: &PoolingInput,
        pooling: Pooling,
    ) -> Result<Vec<f32>, GpuError> {
        let device_tables = self.upload_tables(tables, weights)?;
        let batch = self.upload_pooling(&device_tables, input, Accumulation::Atomic)?;
        let mut out = self.zeros::<f32>(batch.out_floats())?;
        self.gather_pool_on_device(&device_tables, &batch, pooling, &mut out)?;
        self.download(&out, batch.out_floats())
    }

    fn pool_backward(
        &self,
        tables: &[TableShape],
        input: &PoolingInput,
        pooling: Pooling,
        grad_out: &[f32],
        accumulation: Accumulation,
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        // The backward reads no weights; an empty stand-in carries the table shapes.
        let shapes = DeviceTables {
            tables: tables.to_vec(),
            bases: vec![0; tables.len()],
            data: self.zeros::<f32>(1)?,
        };
        // Validates the input, which validate_grad_out's widths rely on.
        let batch = self.upload_pooling(&shapes, input, accumulation)?;
        validate_grad_out(tables, input, grad_out)?;
        let grad_out = self.upload(grad_out)?;
        self.pool_backward_to_host(&batch, pooling, &grad_out, accumulation)
    }

    fn update_rows(
        &self,
        shape: TableShape,
        optimizer: RowOptimizer,
        table: &mut [f32],
        ids: &[u32],
        grads: &[f32],
    ) -> Result<(), GpuError> {
        validate_update(shape, optimizer, table.len(), ids, grads)?;
        let mut device_table = self.upload_table(shape, table)?;
        let device_ids = self.upload_ids(shape, ids)?;
        let device_grads = self.upload(grads)?;
        self.update_rows_on_device(&mut device_table, optimizer, &device_ids, &device_grads)?;
        let updated = self.download_table(&device_table)?;
        table.copy_from_slice(&updated);
        Ok(())
    }
}
