//! The CUDA side: device discovery, the per-device module cache, device-resident buffers
//! and the kernel launches. Every launch's arguments are checked on the host first (the
//! `Device*` types are only built from validated input), which is what makes the
//! `unsafe` launches sound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::GpuError;
use crate::compile::{compile_ptx, nvrtc_available};
use crate::layout::{
    Accumulation, Pooling, PoolingInput, RowOptimizer, TableShape, table_bases, validate_ids,
    validate_read, validate_update, validate_write,
};
use crate::reference::{EmbeddingKernels, validate_grad_out, validate_weights};

const BLOCK: u32 = 256;
/// Samples per thread group in the gather kernels (`ITEMS` in kernels.cu).
const GATHER_ITEMS: u32 = 4;

/// Whether this process can run kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaStatus {
    /// Kernels can run.
    Ready {
        /// Devices present.
        devices: usize,
    },
    /// No libcuda.so: no NVIDIA driver on this machine.
    NoDriver,
    /// A driver but no device (or the driver failed to start).
    NoDevice(String),
}

/// Whether a driver and a device are present (loads nothing when none is).
pub fn cuda_status() -> CudaStatus {
    // SAFETY: only tries to dlopen libcuda by its candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return CudaStatus::NoDriver;
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => CudaStatus::Ready {
            devices: n as usize,
        },
        Ok(_) => CudaStatus::NoDevice("the driver reports 0 devices".into()),
        Err(e) => CudaStatus::NoDevice(e.to_string()),
    }
}

struct Loaded {
    context: Arc<CudaContext>,
    module: Arc<CudaModule>,
}

/// Modules per device ordinal, PTX per architecture: NVRTC runs once per architecture.
fn load(ordinal: usize) -> Result<Arc<Loaded>, GpuError> {
    static LOADED: OnceLock<Mutex<HashMap<usize, Arc<Loaded>>>> = OnceLock::new();
    static PTX: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = loaded.get(&ordinal) {
        return Ok(found.clone());
    }
    match cuda_status() {
        CudaStatus::Ready { devices } if ordinal < devices => {}
        CudaStatus::Ready { devices } => {
            return Err(GpuError::NoDevice(format!(
                "device {ordinal} requested, {devices} present"
            )));
        }
        CudaStatus::NoDriver => return Err(GpuError::NoDevice("no NVIDIA driver".into())),
        CudaStatus::NoDevice(why) => return Err(GpuError::NoDevice(why)),
    }
    if !nvrtc_available() {
        return Err(GpuError::NoNvrtc);
    }
    let context = CudaContext::new(ordinal)?;
    let (major, minor) = context.compute_capability()?;
    let arch = format!("compute_{major}{minor}");
    let ptx = {
        let mut cache = PTX
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match cache.get(&arch) {
            Some(ptx) => ptx.clone(),
            None => {
                let ptx = compile_ptx(&arch)?;
                cache.insert(arch, ptx.clone());
                ptx
            }
        }
    };
    let module = context.load_module(Ptx::from_src(ptx))?;
    let entry = Arc::new(Loaded { context, module });
    loaded.insert(ordinal, entry.clone());
    Ok(entry)
}

struct Functions {
    gather_pool_vec4: CudaFunction,
    gather_pool_scalar: CudaFunction,
    pool_backward_atomic: CudaFunction,
    pool_backward_sorted: CudaFunction,
    adagrad_update: CudaFunction,
    adam_update: CudaFunction,
    gather_rows: CudaFunction,
    scatter_rows: CudaFunction,
}

/// The kernels on one device, launched on one stream.
pub struct CudaKernels {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: Functions,
}

/// Tables laid end to end on the device (each start 16-byte aligned).
pub struct DeviceTables {
    tables: Vec<TableShape>,
    bases: Vec<u64>,
    /// Every table's floats, end to end.
    pub data: CudaSlice<f32>,
}

/// One table's rows (weights and optimizer state) on the device.
pub struct DeviceTable {
    /// Rows, weights and floats per row.
    pub shape: TableShape,
    /// The rows' floats.
    pub data: CudaSlice<f32>,
}

/// Distinct row ids of one table, checked against its shape.
pub struct DeviceIds {
    rows: u32,
    len: usize,
    ids: CudaSlice<u32>,
}

impl DeviceIds {
    /// Ids held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A validated [`PoolingInput`] on the device, with the row-sorted contribution lists the
/// deterministic backward walks.
pub struct DevicePooling {
    tables: Vec<TableShape>,
    features: u32,
    samples: u32,
    out_width: u32,
    vec4: bool,
    max_dim: u32,
    feature_base: CudaSlice<u64>,
    feature_meta: CudaSlice<u32>,
    grad_base: CudaSlice<u64>,
    grad_floats: usize,
    offsets: CudaSlice<u32>,
    rows: CudaSlice<u32>,
    sample_bag: Option<CudaSlice<u32>>,
    /// Built only for a batch whose backward is deterministic.
    sorted: Option<SortedRows>,
}

/// Per gradient row touched: where it goes, a feature that reads it (for its dim), and its
/// contributions (work items) in the reference's order.
struct SortedRows {
    count: u32,
    row_dst: CudaSlice<u64>,
    row_feature: CudaSlice<u32>,
    row_offsets: CudaSlice<u32>,
    contrib_item: CudaSlice<u32>,
}

impl DevicePooling {
    /// Floats of the gradient buffer [`CudaKernels::pool_backward_on_device`] writes.
    pub fn grad_floats(&self) -> usize {
        self.grad_floats
    }

    /// Floats of the pooled output.
    pub fn out_floats(&self) -> usize {
        self.samples as usize * self.out_width as usize
    }
}

fn lanes_for(dim: u32) -> u32 {
    dim.max(1).next_power_of_two().min(32)
}

fn launch_config(items: u64, lanes: u32) -> Result<LaunchConfig, GpuError> {
    let blocks = (items * u64::from(lanes)).div_ceil(u64::from(BLOCK)).max(1);
    let blocks = u32::try_from(blocks).map_err(|_| {
        GpuError::invalid(
            "input",
            format!("{items} work items is too many for one launch"),
        )
    })?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

impl CudaKernels {
    /// The kernels on device `ordinal`, compiled by NVRTC on first use in this process.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        let loaded = load(ordinal)?;
        let function = |name: &str| loaded.module.load_function(name);
        let functions = Functions {
            gather_pool_vec4: function("gather_pool_vec4")?,
            gather_pool_scalar: function("gather_pool_scalar")?,
            pool_backward_atomic: function("pool_backward_atomic")?,
            pool_backward_sorted: function("pool_backward_sorted")?,
            adagrad_update: function("adagrad_update")?,
            adam_update: function("adam_update")?,
            gather_rows: function("gather_rows")?,
            scatter_rows: function("scatter_rows")?,
        };
        Ok(Self {
            context: loaded.context.clone(),
            stream: loaded.context.new_stream()?,
            functions,
        })
    }

    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub fn device_name(&self) -> Result<String, GpuError> {
        Ok(self.context.name()?)
    }

    /// The stream every launch of this instance goes to (for events and copies).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits until every launched kernel has finished.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }

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

    /// Contributions (work item per bag entry) grouped by gradient row, each group in
    /// ascending item order: a stable sort of the reference's visiting order.
    fn sorted_rows(
        &self,
        input: &PoolingInput,
        tables: &[TableShape],
        grad_bases: &[u64],
    ) -> Result<SortedRows, GpuError> {
        let mut pairs: Vec<(u64, u32)> = Vec::new();
        for (f, feature) in input.features.iter().enumerate() {
            let dim = u64::from(tables[feature.table].dim);
            for b in 0..input.samples {
                let item = (f * input.samples + b) as u32;
                for &row in feature.bag(feature.bag_of(b)) {
                    pairs.push((grad_bases[feature.table] + u64::from(row) * dim, item));
                }
            }
        }
        pairs.sort_by_key(|&(dst, _)| dst);
        let mut row_dst = Vec::new();
        let mut row_feature = Vec::new();
        let mut row_offsets = vec![0u32];
        let mut contrib_item = Vec::with_capacity(pairs.len());
        for (k, &(dst, item)) in pairs.iter().enumerate() {
            if k == 0 || pairs[k - 1].0 != dst {
                if k > 0 {
                    row_offsets.push(k as u32);
                }
                row_dst.push(dst);
                row_feature.push(item / input.samples.max(1) as u32);
            }
            contrib_item.push(item);
        }
        row_offsets.push(pairs.len() as u32);
        if pairs.is_empty() {
            row_offsets.truncate(1);
        }
        Ok(SortedRows {
            count: row_dst.len() as u32,
            row_dst: self.upload(&row_dst)?,
            row_feature: self.upload(&row_feature)?,
            row_offsets: self.upload(&row_offsets)?,
            contrib_item: self.upload(&contrib_item)?,
        })
    }

    /// Pools into `out` (at least `batch.out_floats()` floats). Asynchronous.
    pub fn gather_pool_on_device(
        &self,
        weights: &DeviceTables,
        batch: &DevicePooling,
        pooling: Pooling,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        check_same_tables(weights, batch)?;
        check_len("out", out.len(), batch.out_floats())?;
        let (function, lanes) = if batch.vec4 {
            (
                &self.functions.gather_pool_vec4,
                lanes_for(batch.max_dim.div_ceil(4)),
            )
        } else {
            (&self.functions.gather_pool_scalar, lanes_for(batch.max_dim))
        };
        // One thread group per GATHER_ITEMS samples of a feature (ITEMS in kernels.cu).
        let groups = u64::from(batch.features) * u64::from(batch.samples.div_ceil(GATHER_ITEMS));
        let has_sample_bag = i32::from(batch.sample_bag.is_some());
        let sample_bag = batch.sample_bag.as_ref().unwrap_or(&batch.offsets);
        let mean = i32::from(pooling == Pooling::Mean);
        let mut launch = self.stream.launch_builder(function);
        launch
            .arg(&weights.data)
            .arg(&batch.feature_base)
            .arg(&batch.feature_meta)
            .arg(&batch.offsets)
            .arg(&batch.rows)
            .arg(sample_bag)
            .arg(&has_sample_bag)
            .arg(&batch.features)
            .arg(&batch.samples)
            .arg(&batch.out_width)
            .arg(&mean)
            .arg(&lanes)
            .arg(out);
        // SAFETY: the arguments match gather_pool_* in kernels.cu in order and type; every
        // index the kernel follows was range-checked by PoolingInput::validate against the
        // tables `weights` was built from (checked above), and `out` holds every output.
        unsafe { launch.launch(launch_config(groups, lanes)?) }?;
        Ok(())
    }

    /// Writes the pooling backward into `grads` (at least `batch.grad_floats()` floats,
    /// zeroed here first). Asynchronous.
    pub fn pool_backward_on_device(
        &self,
        batch: &DevicePooling,
        pooling: Pooling,
        grad_out: &CudaSlice<f32>,
        accumulation: Accumulation,
        grads: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        check_len("grad_out", grad_out.len(), batch.out_floats())?;
        check_len("grads", grads.len(), batch.grad_floats)?;
        self.stream.memset_zeros(grads)?;
        let has_sample_bag = i32::from(batch.sample_bag.is_some());
        let sample_bag = batch.sample_bag.as_ref().unwrap_or(&batch.offsets);
        let mean = i32::from(pooling == Pooling::Mean);
        let lanes = lanes_for(batch.max_dim);
        match accumulation {
            Accumulation::Atomic => {
                let items = u64::from(batch.features) * u64::from(batch.samples);
                let mut launch = self
                    .stream
                    .launch_builder(&self.functions.pool_backward_atomic);
                launch
                    .arg(grad_out)
                    .arg(&batch.grad_base)
                    .arg(&batch.feature_meta)
                    .arg(&batch.offsets)
                    .arg(&batch.rows)
                    .arg(sample_bag)
                    .arg(&has_sample_bag)
                    .arg(&batch.features)
                    .arg(&batch.samples)
                    .arg(&batch.out_width)
                    .arg(&mean)
                    .arg(&lanes)
                    .arg(grads);
                // SAFETY: arguments match pool_backward_atomic; indices were validated at
                // upload and gradient offsets stay inside grad_floats (checked above).
                unsafe { launch.launch(launch_config(items, lanes)?) }?;
            }
            Accumulation::Deterministic => {
                let sorted = batch.sorted.as_ref().ok_or_else(|| {
                    GpuError::invalid(
                        "batch",
                        "uploaded for the atomic backward, not the deterministic one",
                    )
                })?;
                let mut launch = self
                    .stream
                    .launch_builder(&self.functions.pool_backward_sorted);
                launch
                    .arg(grad_out)
                    .arg(&batch.feature_meta)
                    .arg(&batch.offsets)
                    .arg(sample_bag)
                    .arg(&has_sample_bag)
                    .arg(&sorted.row_dst)
                    .arg(&sorted.row_feature)
                    .arg(&sorted.row_offsets)
                    .arg(&sorted.contrib_item)
                    .arg(&sorted.count)
                    .arg(&batch.samples)
                    .arg(&batch.out_width)
                    .arg(&mean)
                    .arg(&lanes)
                    .arg(grads);
                // SAFETY: arguments match pool_backward_sorted; the row lists were built
                // on the host from validated input and point inside grad_floats.
                unsafe { launch.launch(launch_config(u64::from(sorted.count), lanes)?) }?;
            }
        }
        Ok(())
    }

    /// Applies `grads` (`ids.len() x dim`) to the rows `ids` of `table`. Asynchronous.
    pub fn update_rows_on_device(
        &self,
        table: &mut DeviceTable,
        optimizer: RowOptimizer,
        ids: &DeviceIds,
        grads: &CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let shape = table.shape;
        validate_state_room(shape, optimizer)?;
        if ids.rows != shape.rows {
            return Err(GpuError::invalid(
                "ids",
                format!(
                    "checked against {} rows, table has {}",
                    ids.rows, shape.rows
                ),
            ));
        }
        check_len("grads", grads.len(), ids.len * shape.dim as usize)?;
        if ids.len == 0 {
            return Ok(());
        }
        let n = ids.len as u32;
        let lanes = lanes_for(shape.dim);
        let config = launch_config(u64::from(n), lanes)?;
        match optimizer {
            RowOptimizer::Adagrad { lr, epsilon } => {
                let mut launch = self.stream.launch_builder(&self.functions.adagrad_update);
                launch
                    .arg(&mut table.data)
                    .arg(&shape.stride)
                    .arg(&shape.dim)
                    .arg(&ids.ids)
                    .arg(grads)
                    .arg(&n)
                    .arg(&lr)
                    .arg(&epsilon)
                    .arg(&lanes);
                // SAFETY: arguments match adagrad_update; ids are distinct rows of this
                // shape (DeviceIds), the stride holds the state, grads has n x dim floats.
                unsafe { launch.launch(config) }?;
            }
            RowOptimizer::Adam {
                lr,
                beta1,
                beta2,
                epsilon,
            } => {
                let mut launch = self.stream.launch_builder(&self.functions.adam_update);
                launch
                    .arg(&mut table.data)
                    .arg(&shape.stride)
                    .arg(&shape.dim)
                    .arg(&ids.ids)
                    .arg(grads)
                    .arg(&n)
                    .arg(&lr)
                    .arg(&beta1)
                    .arg(&beta2)
                    .arg(&epsilon)
                    .arg(&lanes);
                // SAFETY: as for Adagrad; lanes is a power of two <= 32, so a row's
                // threads share a warp, as the kernel's __syncwarp requires.
                unsafe { launch.launch(config) }?;
            }
        }
        Ok(())
    }
}

impl CudaKernels {
    /// Resizes `table` to `rows` rows, keeping the values of the rows both sizes hold
    /// (new rows are zero).
    pub fn resize_table(&self, table: &mut DeviceTable, rows: u32) -> Result<(), GpuError> {
        let shape = TableShape {
            rows,
            ..table.shape
        };
        let mut data = self.zeros::<f32>(shape.floats())?;
        let kept = table.shape.floats().min(shape.floats());
        if kept > 0 {
            self.stream
                .memcpy_dtod(&table.data.slice(..kept), &mut data.slice_mut(..kept))?;
        }
        *table = DeviceTable { shape, data };
        Ok(())
    }

    /// The first `floats` floats of each row in `ids` (repeats allowed), row after row.
    pub fn read_rows(
        &self,
        table: &DeviceTable,
        ids: &[u32],
        floats: u32,
    ) -> Result<Vec<f32>, GpuError> {
        let shape = table.shape;
        validate_read(shape, ids, floats)?;
        let total = ids.len() * floats as usize;
        if total == 0 {
            return Ok(Vec::new());
        }
        let n = ids.len() as u32;
        let device_ids = self.upload(ids)?;
        let mut out = self.zeros::<f32>(total)?;
        let mut launch = self.stream.launch_builder(&self.functions.gather_rows);
        launch
            .arg(&table.data)
            .arg(&shape.stride)
            .arg(&device_ids)
            .arg(&n)
            .arg(&floats)
            .arg(&mut out);
        // SAFETY: arguments match gather_rows; every id is a row of `shape` and `floats`
        // is at most its stride (validate_read), `out` holds n x floats.
        unsafe { launch.launch(launch_config(total as u64, 1)?) }?;
        self.download(&out, total)
    }

    /// Overwrites whole rows (weights and state): `values` holds `stride` floats per id,
    /// and the ids are distinct rows. Asynchronous.
    pub fn write_rows(
        &self,
        table: &mut DeviceTable,
        ids: &[u32],
        values: &[f32],
    ) -> Result<(), GpuError> {
        let shape = table.shape;
        validate_write(shape, ids, values)?;
        if values.is_empty() {
            return Ok(());
        }
        let n = ids.len() as u32;
        let device_ids = self.upload(ids)?;
        let device_values = self.upload(values)?;
        let mut launch = self.stream.launch_builder(&self.functions.scatter_rows);
        launch
            .arg(&mut table.data)
            .arg(&shape.stride)
            .arg(&device_ids)
            .arg(&n)
            .arg(&device_values);
        // SAFETY: arguments match scatter_rows; the ids are distinct rows of `shape` and
        // `values` holds n x stride floats (validate_write).
        unsafe { launch.launch(launch_config(values.len() as u64, 1)?) }?;
        Ok(())
    }
}

fn check_len(field: &str, have: usize, need: usize) -> Result<(), GpuError> {
    if have < need {
        return Err(GpuError::invalid(
            field,
            format!("{have} elements, {need} needed"),
        ));
    }
    Ok(())
}

fn check_same_tables(weights: &DeviceTables, batch: &DevicePooling) -> Result<(), GpuError> {
    if weights.tables != batch.tables {
        return Err(GpuError::invalid(
            "weights",
            "not the tables this batch was uploaded for",
        ));
    }
    Ok(())
}

fn validate_state_room(shape: TableShape, optimizer: RowOptimizer) -> Result<(), GpuError> {
    validate_update(shape, optimizer, shape.floats(), &[], &[])
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
        let mut grads = self.zeros::<f32>(batch.grad_floats)?;
        self.pool_backward_on_device(&batch, pooling, &grad_out, accumulation, &mut grads)?;
        let flat = self.download(&grads, batch.grad_floats)?;
        let (bases, _) = table_bases(tables.iter().map(|t| t.rows as usize * t.dim as usize));
        Ok(tables
            .iter()
            .zip(bases)
            .map(|(t, base)| flat[base as usize..][..t.rows as usize * t.dim as usize].to_vec())
            .collect())
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
