//! The CUDA side: device discovery, the per-device module cache, device-resident buffers
//! and the kernel launches. Every launch's arguments are checked on the host first (the
//! `Device*` types are only built from validated input), which is what makes the
//! `unsafe` launches sound. `transfers.rs` moves data between the host and a device.

mod dense;
mod transfers;

pub use dense::{CudaDense, DeviceDots};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::GpuError;
use crate::compile::{compile_ptx, nvrtc_available};
use crate::layout::{
    Accumulation, Pooling, RowOptimizer, TableShape, validate_read, validate_update, validate_write,
};

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
    module: Arc<CudaModule>,
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

/// A validated [`PoolingInput`](crate::layout::PoolingInput) on the device, with the row-sorted contribution lists the
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
            module: loaded.module.clone(),
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
}

impl CudaKernels {
    /// Pools into `out` (at least `batch.out_floats()` floats). Asynchronous.
    pub fn gather_pool_on_device(
        &self,
        weights: &DeviceTables,
        batch: &DevicePooling,
        pooling: Pooling,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        check_same_tables(weights, batch)?;
        GpuError::check_len("out", out.len(), batch.out_floats())?;
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
        GpuError::check_len("grad_out", grad_out.len(), batch.out_floats())?;
        GpuError::check_len("grads", grads.len(), batch.grad_floats)?;
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
        GpuError::check_len("grads", grads.len(), ids.len * shape.dim as usize)?;
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
