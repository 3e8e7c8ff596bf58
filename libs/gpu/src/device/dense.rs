//! A dense network's launches: cuBLAS's single-precision products over row-major
//! matrices, and the kernels of dense/kernels.cu, on the stream of the [`CudaKernels`] they
//! were made from (a step's embedding and dense work queue behind each other). Every
//! launch checks its buffers' lengths against its shape first.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::CudaKernels;
use crate::dense::{Columns, DenseOps, DotShape, FmShape, HeadLoss, Product, Stored};
use crate::{GpuError, cublas_available};

const BLOCK: u32 = 256;
/// Enough blocks of a grid-stride launch to fill any current device several times over.
const MAX_BLOCKS: u64 = 1 << 16;

struct DenseFunctions {
    bias_activation: CudaFunction,
    relu_backward: CudaFunction,
    dots_forward: CudaFunction,
    dots_backward: CudaFunction,
    head_loss: CudaFunction,
    copy_columns: CudaFunction,
    fm_forward: CudaFunction,
    fm_backward: CudaFunction,
    cross_forward: CudaFunction,
    cross_backward: CudaFunction,
}

/// cuBLAS and the dense kernels on one device and stream.
pub struct CudaDense {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: DenseFunctions,
    /// A row of ones: column sums are its product with the matrix. Grown on demand.
    ones: CudaSlice<f32>,
    /// Pair lists by (dim, vectors), for [`DenseOps`]' interactions.
    pair_lists: HashMap<(usize, usize), DeviceDots>,
}

/// A [`DotShape`]'s pair list on the device.
pub struct DeviceDots {
    shape: DotShape,
    pair_i: CudaSlice<u32>,
    pair_j: CudaSlice<u32>,
}

impl DeviceDots {
    /// Its shape.
    pub fn shape(&self) -> DotShape {
        self.shape
    }
}

fn grid(items: u64) -> LaunchConfig {
    let blocks = items.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaKernels {
    /// The dense launches on this instance's device and stream (cuBLAS loaded now).
    pub fn dense(&self) -> Result<CudaDense, GpuError> {
        if !cublas_available() {
            return Err(GpuError::NoCublas);
        }
        let function = |name: &str| self.module.load_function(name);
        let functions = DenseFunctions {
            bias_activation: function("bias_activation")?,
            relu_backward: function("relu_backward")?,
            dots_forward: function("dots_forward")?,
            dots_backward: function("dots_backward")?,
            head_loss: function("head_loss")?,
            copy_columns: function("copy_columns")?,
            fm_forward: function("fm_forward")?,
            fm_backward: function("fm_backward")?,
            cross_forward: function("cross_forward")?,
            cross_backward: function("cross_backward")?,
        };
        Ok(CudaDense {
            blas: CudaBlas::new(self.stream.clone())?,
            ones: self.stream.alloc_zeros::<f32>(1)?,
            stream: self.stream.clone(),
            functions,
            pair_lists: HashMap::new(),
        })
    }
}

impl CudaDense {
    /// `dst = a · b` (or `dst += a · b`), as `product` describes, on cuBLAS. Asynchronous.
    pub fn matmul(
        &self,
        dst: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        product: Product,
    ) -> Result<(), GpuError> {
        product.check(dst.len(), a.len(), b.len())?;
        let Product { m, k, n, .. } = product;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            if !product.accumulate {
                self.stream.memset_zeros(&mut dst.slice_mut(..m * n))?;
            }
            return Ok(());
        }
        // cuBLAS is column-major: a row-major matrix is its transpose there, so the
        // row-major dst = a · b is the column-major dstᵀ = bᵀ · aᵀ.
        let (transa, lda) = match product.b {
            Stored::AsIs => (cublasOperation_t::CUBLAS_OP_N, n),
            Stored::Transposed => (cublasOperation_t::CUBLAS_OP_T, k),
        };
        let (transb, ldb) = match product.a {
            Stored::AsIs => (cublasOperation_t::CUBLAS_OP_N, k),
            Stored::Transposed => (cublasOperation_t::CUBLAS_OP_T, m),
        };
        let config = GemmConfig {
            transa,
            transb,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: lda as i32,
            ldb: ldb as i32,
            beta: if product.accumulate { 1.0 } else { 0.0 },
            ldc: n as i32,
        };
        // SAFETY: `product.check` verified that a holds m x k floats, b k x n and dst m x n,
        // each dimension within i32; the leading dimensions above are those of the stored
        // layouts, so cuBLAS reads and writes only inside the three buffers.
        unsafe { self.blas.gemm(config, b, a, dst) }?;
        Ok(())
    }

    /// Whether the products may use TF32 tensor cores (inputs rounded to 10 bits of
    /// mantissa, sums in FP32): several times the FP32 throughput on Ampere and later,
    /// and no longer within [`Self::matmul`]'s FP32 tolerance. Off unless set.
    pub fn set_tf32(&mut self, tf32: bool) -> Result<(), GpuError> {
        use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
        let mode = match tf32 {
            true => cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH,
            false => cublasMath_t::CUBLAS_DEFAULT_MATH,
        };
        // SAFETY: the handle is this instance's, alive as long as `blas`.
        unsafe { cublasSetMathMode(*self.blas.handle(), mode) }.result()?;
        Ok(())
    }

    /// `values (rows x cols) += bias` on every row, then ReLU with `relu`. Asynchronous.
    pub fn bias_activation(
        &self,
        values: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        [rows, cols]: [usize; 2],
        relu: bool,
    ) -> Result<(), GpuError> {
        GpuError::check_len("values", values.len(), rows * cols)?;
        GpuError::check_len("bias", bias.len(), cols)?;
        let (rows, cols) = (u32_of("rows", rows)?, u32_of("cols", cols)?);
        let relu = i32::from(relu);
        let mut launch = self.stream.launch_builder(&self.functions.bias_activation);
        launch
            .arg(values)
            .arg(bias)
            .arg(&rows)
            .arg(&cols)
            .arg(&relu);
        // SAFETY: arguments match bias_activation; values holds rows x cols floats and bias
        // cols (checked above), the kernel reads and writes no further.
        unsafe { launch.launch(grid(u64::from(rows) * u64::from(cols))) }?;
        Ok(())
    }

    /// Zeroes the first `len` floats of `grad` where the ReLU's `output` was not positive.
    /// Asynchronous.
    pub fn relu_backward(
        &self,
        grad: &mut CudaSlice<f32>,
        output: &CudaSlice<f32>,
        len: usize,
    ) -> Result<(), GpuError> {
        GpuError::check_len("grad", grad.len(), len)?;
        GpuError::check_len("output", output.len(), len)?;
        let n = len as u64;
        let mut launch = self.stream.launch_builder(&self.functions.relu_backward);
        launch.arg(grad).arg(output).arg(&n);
        // SAFETY: arguments match relu_backward; both buffers hold `len` floats.
        unsafe { launch.launch(grid(n)) }?;
        Ok(())
    }

    /// `dst (1 x cols)`: the per-column sums of `values (rows x cols)`, as the product of a
    /// row of ones with the matrix. Asynchronous.
    pub fn column_sums(
        &mut self,
        dst: &mut CudaSlice<f32>,
        values: &CudaSlice<f32>,
        [rows, cols]: [usize; 2],
    ) -> Result<(), GpuError> {
        if self.ones.len() < rows {
            self.ones = self.stream.clone_htod(&vec![1.0f32; rows])?;
        }
        CudaDense::matmul(self, dst, &self.ones, values, Product::new([1, rows, cols]))
    }

    /// Moves the block of columns `columns` describes from `src` into `dst`. Asynchronous.
    pub fn copy_columns(
        &self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        columns: Columns,
    ) -> Result<(), GpuError> {
        columns.check(dst.len(), src.len())?;
        let [rows, width, src_width, src_at, dst_width, dst_at] = [
            columns.rows,
            columns.width,
            columns.src_width,
            columns.src_at,
            columns.dst_width,
            columns.dst_at,
        ]
        .map(|v| v as u32);
        let accumulate = i32::from(columns.accumulate);
        let mut launch = self.stream.launch_builder(&self.functions.copy_columns);
        launch
            .arg(dst)
            .arg(&dst_width)
            .arg(&dst_at)
            .arg(src)
            .arg(&src_width)
            .arg(&src_at)
            .arg(&rows)
            .arg(&width)
            .arg(&accumulate);
        // SAFETY: arguments match copy_columns; `Columns::check` verified that both blocks
        // lie inside their matrices, the buffers hold both matrices and indices fit 32 bits.
        unsafe { launch.launch(grid(u64::from(rows) * u64::from(width))) }?;
        Ok(())
    }

    /// The factorisation machine's term of each row of `input` into `out`. Asynchronous.
    pub fn fm_forward(
        &self,
        shape: FmShape,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        shape.check(input.len(), out.len())?;
        let [rows, vectors, dim] = [shape.rows, shape.vectors, shape.dim].map(|v| v as u32);
        let mut launch = self.stream.launch_builder(&self.functions.fm_forward);
        launch
            .arg(input)
            .arg(&rows)
            .arg(&vectors)
            .arg(&dim)
            .arg(out);
        // SAFETY: arguments match fm_forward; `FmShape::check` verified both lengths and
        // that indices fit 32 bits.
        unsafe { launch.launch(grid(u64::from(rows))) }?;
        Ok(())
    }

    /// Its backward into `grad` (shaped as `input`), written over or added to with the
    /// flag. Asynchronous.
    pub fn fm_backward(
        &self,
        shape: FmShape,
        input: &CudaSlice<f32>,
        grad_out: &CudaSlice<f32>,
        (grad, accumulate): (&mut CudaSlice<f32>, bool),
    ) -> Result<(), GpuError> {
        shape.check(input.len(), grad_out.len())?;
        GpuError::check_len("grad", grad.len(), shape.rows * shape.width())?;
        let [rows, vectors, dim] = [shape.rows, shape.vectors, shape.dim].map(|v| v as u32);
        let accumulate = i32::from(accumulate);
        let mut launch = self.stream.launch_builder(&self.functions.fm_backward);
        launch
            .arg(input)
            .arg(grad_out)
            .arg(&rows)
            .arg(&vectors)
            .arg(&dim)
            .arg(&accumulate)
            .arg(grad);
        // SAFETY: arguments match fm_backward; every buffer's length was checked against
        // the shape, whose indices fit 32 bits.
        unsafe { launch.launch(grid(u64::from(rows) * u64::from(dim))) }?;
        Ok(())
    }

    /// A cross layer's output over `len` floats: `next = x0 * z + x`. Asynchronous.
    pub fn cross_forward(
        &self,
        len: usize,
        (x0, z, x): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        next: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        for (field, have) in [
            ("x0", x0.len()),
            ("z", z.len()),
            ("x", x.len()),
            ("next", next.len()),
        ] {
            GpuError::check_len(field, have, len)?;
        }
        let n = len as u64;
        let mut launch = self.stream.launch_builder(&self.functions.cross_forward);
        launch.arg(x0).arg(z).arg(x).arg(&n).arg(next);
        // SAFETY: arguments match cross_forward; every buffer holds `len` floats.
        unsafe { launch.launch(grid(n)) }?;
        Ok(())
    }

    /// Its backward through the product: `dz = g * x0`, `grad_x0 += g * z`. Asynchronous.
    pub fn cross_backward(
        &self,
        len: usize,
        (g, x0, z): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        dz: &mut CudaSlice<f32>,
        grad_x0: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        for (field, have) in [
            ("g", g.len()),
            ("x0", x0.len()),
            ("z", z.len()),
            ("dz", dz.len()),
            ("grad_x0", grad_x0.len()),
        ] {
            GpuError::check_len(field, have, len)?;
        }
        let n = len as u64;
        let mut launch = self.stream.launch_builder(&self.functions.cross_backward);
        launch.arg(g).arg(x0).arg(z).arg(&n).arg(dz).arg(grad_x0);
        // SAFETY: arguments match cross_backward; every buffer holds `len` floats.
        unsafe { launch.launch(grid(n)) }?;
        Ok(())
    }

    /// The pair list of `shape` on the device.
    pub fn dots(&self, shape: DotShape) -> Result<DeviceDots, GpuError> {
        shape.check()?;
        let (pair_i, pair_j): (Vec<u32>, Vec<u32>) =
            shape.pair_list().map(|(i, j)| (i as u32, j as u32)).unzip();
        Ok(DeviceDots {
            shape,
            pair_i: self.stream.clone_htod(&pair_i)?,
            pair_j: self.stream.clone_htod(&pair_j)?,
        })
    }

    /// `out (rows x width)`: each row's `first` vector (`rows x dim`), then the dot product of
    /// every pair of its vectors (the first, then `rest`'s, `rows x (vectors - 1) * dim`).
    /// Asynchronous.
    pub fn dots_forward(
        &self,
        dots: &DeviceDots,
        first: &CudaSlice<f32>,
        rest: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let shape = dots.shape;
        check_dot_inputs(shape, first, rest)?;
        GpuError::check_len("out", out.len(), shape.rows * shape.width())?;
        let [rows, dim, vectors, pairs] =
            [shape.rows, shape.dim, shape.vectors, shape.pairs()].map(|v| v as u32);
        let mut launch = self.stream.launch_builder(&self.functions.dots_forward);
        launch
            .arg(first)
            .arg(rest)
            .arg(&dots.pair_i)
            .arg(&dots.pair_j)
            .arg(&rows)
            .arg(&dim)
            .arg(&vectors)
            .arg(&pairs)
            .arg(out);
        // SAFETY: arguments match dots_forward; the pair lists are the shape's (built by
        // `dots`), the inputs and `out` hold what the shape needs (checked above) and every
        // index fits 32 bits (DotShape::check).
        unsafe { launch.launch(grid((shape.rows * shape.width()) as u64)) }?;
        Ok(())
    }

    /// The backward of [`Self::dots_forward`] from `grad_out (rows x width)` into
    /// `grad_first` and `grad_rest` (shaped as `first` and `rest`), each written over, or
    /// added to with its flag. Asynchronous.
    pub fn dots_backward(
        &self,
        dots: &DeviceDots,
        (first, rest): (&CudaSlice<f32>, &CudaSlice<f32>),
        grad_out: &CudaSlice<f32>,
        (grad_first, accumulate_first): (&mut CudaSlice<f32>, bool),
        (grad_rest, accumulate_rest): (&mut CudaSlice<f32>, bool),
    ) -> Result<(), GpuError> {
        let shape = dots.shape;
        check_dot_inputs(shape, first, rest)?;
        GpuError::check_len("grad_out", grad_out.len(), shape.rows * shape.width())?;
        GpuError::check_len("grad_first", grad_first.len(), shape.rows * shape.dim)?;
        GpuError::check_len(
            "grad_rest",
            grad_rest.len(),
            shape.rows * (shape.vectors - 1) * shape.dim,
        )?;
        let [rows, dim, vectors] = [shape.rows, shape.dim, shape.vectors].map(|v| v as u32);
        let (accumulate_first, accumulate_rest) =
            (i32::from(accumulate_first), i32::from(accumulate_rest));
        let mut launch = self.stream.launch_builder(&self.functions.dots_backward);
        launch
            .arg(first)
            .arg(rest)
            .arg(grad_out)
            .arg(&rows)
            .arg(&dim)
            .arg(&vectors)
            .arg(&accumulate_first)
            .arg(&accumulate_rest)
            .arg(grad_first)
            .arg(grad_rest);
        // SAFETY: arguments match dots_backward; every buffer holds what the shape needs
        // (checked above) and every index fits 32 bits (DotShape::check).
        unsafe { launch.launch(grid((shape.rows * shape.vectors * shape.dim) as u64)) }?;
        Ok(())
    }

    /// A head over `values` (one per row, `rows` rows): each row's prediction and loss, and
    /// the weighted gradient of the mean loss into `grad` (written, or added with
    /// `accumulate`). Asynchronous.
    pub fn head_loss(
        &self,
        (values, labels): (&CudaSlice<f32>, &CudaSlice<f32>),
        rows: usize,
        (loss, weight): (HeadLoss, f32),
        (grad, accumulate): (&mut CudaSlice<f32>, bool),
        predictions: &mut CudaSlice<f32>,
        losses: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        for (field, len) in [
            ("values", values.len()),
            ("labels", labels.len()),
            ("grad", grad.len()),
            ("predictions", predictions.len()),
            ("losses", losses.len()),
        ] {
            GpuError::check_len(field, len, rows)?;
        }
        let rows = u32_of("rows", rows)?;
        let (code, accumulate) = (loss.code(), i32::from(accumulate));
        let mut launch = self.stream.launch_builder(&self.functions.head_loss);
        launch
            .arg(values)
            .arg(labels)
            .arg(&rows)
            .arg(&code)
            .arg(&weight)
            .arg(&accumulate)
            .arg(predictions)
            .arg(losses)
            .arg(grad);
        // SAFETY: arguments match head_loss; every buffer holds `rows` floats.
        unsafe { launch.launch(grid(u64::from(rows))) }?;
        Ok(())
    }

    /// Waits until everything queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }
}

fn check_dot_inputs(
    shape: DotShape,
    first: &CudaSlice<f32>,
    rest: &CudaSlice<f32>,
) -> Result<(), GpuError> {
    GpuError::check_len("first", first.len(), shape.rows * shape.dim)?;
    GpuError::check_len(
        "rest",
        rest.len(),
        shape.rows * (shape.vectors - 1) * shape.dim,
    )
}

fn u32_of(field: &str, value: usize) -> Result<u32, GpuError> {
    u32::try_from(value)
        .map_err(|_| GpuError::invalid(field, format!("{value} is past the kernels' 32 bits")))
}

impl CudaDense {
    /// The pair list of `shape`'s dim and vector count, built once, shaped for its rows.
    fn cached_dots(&mut self, shape: DotShape) -> Result<&DeviceDots, GpuError> {
        shape.check()?;
        let key = (shape.dim, shape.vectors);
        if !self.pair_lists.contains_key(&key) {
            let dots = self.dots(shape)?;
            self.pair_lists.insert(key, dots);
        }
        let dots = self
            .pair_lists
            .get_mut(&key)
            .ok_or_else(|| GpuError::invalid("dots", "pair list missing after insert"))?;
        // The pairs do not depend on the rows.
        dots.shape = shape;
        Ok(dots)
    }
}

impl DenseOps for CudaDense {
    type Buffer = CudaSlice<f32>;

    fn zeros(&mut self, len: usize) -> Result<CudaSlice<f32>, GpuError> {
        Ok(self.stream.alloc_zeros::<f32>(len.max(1))?)
    }

    fn upload(&mut self, values: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
        if values.is_empty() {
            return self.zeros(1);
        }
        Ok(self.stream.clone_htod(values)?)
    }

    fn write(&mut self, buffer: &mut CudaSlice<f32>, values: &[f32]) -> Result<(), GpuError> {
        GpuError::check_len("buffer", buffer.len(), values.len())?;
        if values.is_empty() {
            return Ok(());
        }
        Ok(self.stream.memcpy_htod(values, buffer)?)
    }

    fn floats(buffer: &CudaSlice<f32>) -> usize {
        buffer.len()
    }

    fn download(&mut self, buffer: &CudaSlice<f32>, len: usize) -> Result<Vec<f32>, GpuError> {
        GpuError::check_len("buffer", buffer.len(), len)?;
        let mut host = self.stream.clone_dtoh(buffer)?;
        host.truncate(len);
        Ok(host)
    }

    fn finish(&mut self) -> Result<(), GpuError> {
        self.synchronize()
    }

    fn fill_zero(&mut self, buffer: &mut CudaSlice<f32>) -> Result<(), GpuError> {
        Ok(self.stream.memset_zeros(buffer)?)
    }

    fn matmul(
        &mut self,
        dst: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        product: Product,
    ) -> Result<(), GpuError> {
        CudaDense::matmul(self, dst, a, b, product)
    }

    fn bias_activation(
        &mut self,
        values: &mut CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        shape: [usize; 2],
        relu: bool,
    ) -> Result<(), GpuError> {
        CudaDense::bias_activation(self, values, bias, shape, relu)
    }

    fn relu_backward(
        &mut self,
        grad: &mut CudaSlice<f32>,
        output: &CudaSlice<f32>,
        len: usize,
    ) -> Result<(), GpuError> {
        CudaDense::relu_backward(self, grad, output, len)
    }

    fn column_sums(
        &mut self,
        dst: &mut CudaSlice<f32>,
        values: &CudaSlice<f32>,
        shape: [usize; 2],
    ) -> Result<(), GpuError> {
        CudaDense::column_sums(self, dst, values, shape)
    }

    fn copy_columns(
        &mut self,
        dst: &mut CudaSlice<f32>,
        src: &CudaSlice<f32>,
        columns: Columns,
    ) -> Result<(), GpuError> {
        CudaDense::copy_columns(self, dst, src, columns)
    }

    fn fm_forward(
        &mut self,
        shape: FmShape,
        input: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        CudaDense::fm_forward(self, shape, input, out)
    }

    fn fm_backward(
        &mut self,
        shape: FmShape,
        input: &CudaSlice<f32>,
        grad_out: &CudaSlice<f32>,
        grad: (&mut CudaSlice<f32>, bool),
    ) -> Result<(), GpuError> {
        CudaDense::fm_backward(self, shape, input, grad_out, grad)
    }

    fn cross_forward(
        &mut self,
        len: usize,
        inputs: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        next: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        CudaDense::cross_forward(self, len, inputs, next)
    }

    fn cross_backward(
        &mut self,
        len: usize,
        inputs: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        dz: &mut CudaSlice<f32>,
        grad_x0: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        CudaDense::cross_backward(self, len, inputs, dz, grad_x0)
    }

    fn dots_forward(
        &mut self,
        shape: DotShape,
        first: &CudaSlice<f32>,
        rest: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        self.cached_dots(shape)?;
        let dots = &self.pair_lists[&(shape.dim, shape.vectors)];
        CudaDense::dots_forward(self, dots, first, rest, out)
    }

    fn dots_backward(
        &mut self,
        shape: DotShape,
        inputs: (&CudaSlice<f32>, &CudaSlice<f32>),
        grad_out: &CudaSlice<f32>,
        grad_first: (&mut CudaSlice<f32>, bool),
        grad_rest: (&mut CudaSlice<f32>, bool),
    ) -> Result<(), GpuError> {
        self.cached_dots(shape)?;
        let dots = &self.pair_lists[&(shape.dim, shape.vectors)];
        CudaDense::dots_backward(self, dots, inputs, grad_out, grad_first, grad_rest)
    }

    fn head_loss(
        &mut self,
        inputs: (&CudaSlice<f32>, &CudaSlice<f32>),
        rows: usize,
        loss: (HeadLoss, f32),
        grad: (&mut CudaSlice<f32>, bool),
        (predictions, losses): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    ) -> Result<(), GpuError> {
        CudaDense::head_loss(self, inputs, rows, loss, grad, predictions, losses)
    }
}
