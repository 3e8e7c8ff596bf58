//! [`DenseOps`]: the dense launches as one interface over where the values live, so that
//! code composing them (a model graph's step) runs the same on a GPU ([`CudaDense`]) and
//! on the host over the reference ([`HostDense`]), where it is tested without a GPU.
//!
//! [`CudaDense`]: crate::CudaDense

use super::{Columns, DotShape, FmShape, HeadLoss, Product, reference};
use crate::GpuError;

/// A dense network's operations over buffers of floats in one place (a device, or the
/// host). Every call checks its buffers' lengths against its shape.
pub trait DenseOps {
    /// A buffer of floats where the operations run.
    type Buffer;

    /// `len` zeros.
    fn zeros(&mut self, len: usize) -> Result<Self::Buffer, GpuError>;
    /// A copy of `values`.
    fn upload(&mut self, values: &[f32]) -> Result<Self::Buffer, GpuError>;
    /// Copies `values` over the start of `buffer`, which holds at least as many floats.
    fn write(&mut self, buffer: &mut Self::Buffer, values: &[f32]) -> Result<(), GpuError>;
    /// How many floats `buffer` holds.
    fn floats(buffer: &Self::Buffer) -> usize;
    /// The first `len` floats of `buffer`.
    fn download(&mut self, buffer: &Self::Buffer, len: usize) -> Result<Vec<f32>, GpuError>;
    /// Waits until every operation queued so far is done.
    fn finish(&mut self) -> Result<(), GpuError>;
    /// Sets every float of `buffer` to zero.
    fn fill_zero(&mut self, buffer: &mut Self::Buffer) -> Result<(), GpuError>;
    /// `dst = a · b`, or `dst += a · b`, as `product` describes.
    fn matmul(
        &mut self,
        dst: &mut Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        product: Product,
    ) -> Result<(), GpuError>;
    /// `values (rows x cols) += bias` per row, then ReLU with `relu`.
    fn bias_activation(
        &mut self,
        values: &mut Self::Buffer,
        bias: &Self::Buffer,
        shape: [usize; 2],
        relu: bool,
    ) -> Result<(), GpuError>;
    /// Zeroes the first `len` floats of `grad` where `output` was not positive.
    fn relu_backward(
        &mut self,
        grad: &mut Self::Buffer,
        output: &Self::Buffer,
        len: usize,
    ) -> Result<(), GpuError>;
    /// `dst (1 x cols)`: the column sums of `values (rows x cols)`.
    fn column_sums(
        &mut self,
        dst: &mut Self::Buffer,
        values: &Self::Buffer,
        shape: [usize; 2],
    ) -> Result<(), GpuError>;
    /// Moves the block of columns `columns` describes from `src` into `dst`.
    fn copy_columns(
        &mut self,
        dst: &mut Self::Buffer,
        src: &Self::Buffer,
        columns: Columns,
    ) -> Result<(), GpuError>;
    /// DLRM's interaction of `first (rows x dim)` and `rest (rows x (vectors - 1) * dim)`
    /// into `out (rows x shape.width())`.
    fn dots_forward(
        &mut self,
        shape: DotShape,
        first: &Self::Buffer,
        rest: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), GpuError>;
    /// Its backward into `grad_first` and `grad_rest`, each written or added to.
    fn dots_backward(
        &mut self,
        shape: DotShape,
        inputs: (&Self::Buffer, &Self::Buffer),
        grad_out: &Self::Buffer,
        grad_first: (&mut Self::Buffer, bool),
        grad_rest: (&mut Self::Buffer, bool),
    ) -> Result<(), GpuError>;
    /// The factorisation machine's term of each row of `input` into `out`.
    fn fm_forward(
        &mut self,
        shape: FmShape,
        input: &Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), GpuError>;
    /// Its backward into `grad` (shaped as `input`), written or added to.
    fn fm_backward(
        &mut self,
        shape: FmShape,
        input: &Self::Buffer,
        grad_out: &Self::Buffer,
        grad: (&mut Self::Buffer, bool),
    ) -> Result<(), GpuError>;
    /// A cross layer's output over `len` floats: `next = x0 * z + x`.
    fn cross_forward(
        &mut self,
        len: usize,
        inputs: (&Self::Buffer, &Self::Buffer, &Self::Buffer),
        next: &mut Self::Buffer,
    ) -> Result<(), GpuError>;
    /// Its backward through the product: `dz = g * x0`, `grad_x0 += g * z`.
    fn cross_backward(
        &mut self,
        len: usize,
        inputs: (&Self::Buffer, &Self::Buffer, &Self::Buffer),
        dz: &mut Self::Buffer,
        grad_x0: &mut Self::Buffer,
    ) -> Result<(), GpuError>;
    /// A head over `values` (one per row) against `labels`: predictions and per-row losses,
    /// and the gradient of the weighted mean loss into `grad` (written or added to).
    fn head_loss(
        &mut self,
        inputs: (&Self::Buffer, &Self::Buffer),
        rows: usize,
        loss: (HeadLoss, f32),
        grad: (&mut Self::Buffer, bool),
        outputs: (&mut Self::Buffer, &mut Self::Buffer),
    ) -> Result<(), GpuError>;
}

/// [`DenseOps`] on the host over [`reference`](mod@reference): what the GPU's are checked against, and
/// how composed code is tested without a GPU.
#[derive(Debug, Default)]
pub struct HostDense;

fn check(field: &str, have: &[f32], need: usize) -> Result<(), GpuError> {
    GpuError::check_len(field, have.len(), need)
}

impl DenseOps for HostDense {
    type Buffer = Vec<f32>;

    fn zeros(&mut self, len: usize) -> Result<Vec<f32>, GpuError> {
        Ok(vec![0.0; len])
    }

    fn upload(&mut self, values: &[f32]) -> Result<Vec<f32>, GpuError> {
        Ok(values.to_vec())
    }

    fn write(&mut self, buffer: &mut Vec<f32>, values: &[f32]) -> Result<(), GpuError> {
        check("buffer", buffer, values.len())?;
        buffer[..values.len()].copy_from_slice(values);
        Ok(())
    }

    fn floats(buffer: &Vec<f32>) -> usize {
        buffer.len()
    }

    fn download(&mut self, buffer: &Vec<f32>, len: usize) -> Result<Vec<f32>, GpuError> {
        check("buffer", buffer, len)?;
        Ok(buffer[..len].to_vec())
    }

    fn finish(&mut self) -> Result<(), GpuError> {
        Ok(())
    }

    fn fill_zero(&mut self, buffer: &mut Vec<f32>) -> Result<(), GpuError> {
        buffer.fill(0.0);
        Ok(())
    }

    fn matmul(
        &mut self,
        dst: &mut Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        product: Product,
    ) -> Result<(), GpuError> {
        product.check(dst.len(), a.len(), b.len())?;
        let Product { m, k, n, .. } = product;
        reference::matmul(&mut dst[..m * n], &a[..m * k], &b[..k * n], product);
        Ok(())
    }

    fn bias_activation(
        &mut self,
        values: &mut Vec<f32>,
        bias: &Vec<f32>,
        [rows, cols]: [usize; 2],
        relu: bool,
    ) -> Result<(), GpuError> {
        check("values", values, rows * cols)?;
        check("bias", bias, cols)?;
        reference::bias_activation(&mut values[..rows * cols], &bias[..cols], relu);
        Ok(())
    }

    fn relu_backward(
        &mut self,
        grad: &mut Vec<f32>,
        output: &Vec<f32>,
        len: usize,
    ) -> Result<(), GpuError> {
        check("grad", grad, len)?;
        check("output", output, len)?;
        reference::relu_backward(&mut grad[..len], &output[..len]);
        Ok(())
    }

    fn column_sums(
        &mut self,
        dst: &mut Vec<f32>,
        values: &Vec<f32>,
        [rows, cols]: [usize; 2],
    ) -> Result<(), GpuError> {
        check("values", values, rows * cols)?;
        check("dst", dst, cols)?;
        dst[..cols].copy_from_slice(&reference::column_sums(&values[..rows * cols], cols));
        Ok(())
    }

    fn copy_columns(
        &mut self,
        dst: &mut Vec<f32>,
        src: &Vec<f32>,
        columns: Columns,
    ) -> Result<(), GpuError> {
        columns.check(dst.len(), src.len())?;
        reference::copy_columns(dst, src, columns);
        Ok(())
    }

    fn dots_forward(
        &mut self,
        shape: DotShape,
        first: &Vec<f32>,
        rest: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), GpuError> {
        shape.check()?;
        check("first", first, shape.rows * shape.dim)?;
        check("rest", rest, shape.rows * (shape.vectors - 1) * shape.dim)?;
        check("out", out, shape.rows * shape.width())?;
        reference::dots_forward(first, rest, shape, &mut out[..shape.rows * shape.width()]);
        Ok(())
    }

    fn dots_backward(
        &mut self,
        shape: DotShape,
        (first, rest): (&Vec<f32>, &Vec<f32>),
        grad_out: &Vec<f32>,
        (grad_first, accumulate_first): (&mut Vec<f32>, bool),
        (grad_rest, accumulate_rest): (&mut Vec<f32>, bool),
    ) -> Result<(), GpuError> {
        shape.check()?;
        let rest_len = shape.rows * (shape.vectors - 1) * shape.dim;
        check("first", first, shape.rows * shape.dim)?;
        check("rest", rest, rest_len)?;
        check("grad_out", grad_out, shape.rows * shape.width())?;
        check("grad_first", grad_first, shape.rows * shape.dim)?;
        check("grad_rest", grad_rest, rest_len)?;
        reference::dots_backward(
            (first, rest),
            &grad_out[..shape.rows * shape.width()],
            shape,
            (grad_first, accumulate_first),
            (grad_rest, accumulate_rest),
        );
        Ok(())
    }

    fn fm_forward(
        &mut self,
        shape: FmShape,
        input: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<(), GpuError> {
        shape.check(input.len(), out.len())?;
        let len = shape.rows * shape.width();
        reference::fm_forward(&input[..len], shape, &mut out[..shape.rows]);
        Ok(())
    }

    fn fm_backward(
        &mut self,
        shape: FmShape,
        input: &Vec<f32>,
        grad_out: &Vec<f32>,
        (grad, accumulate): (&mut Vec<f32>, bool),
    ) -> Result<(), GpuError> {
        shape.check(input.len(), grad_out.len())?;
        let len = shape.rows * shape.width();
        check("grad", grad, len)?;
        let grad = (&mut grad[..len], accumulate);
        reference::fm_backward(&input[..len], &grad_out[..shape.rows], shape, grad);
        Ok(())
    }

    fn cross_forward(
        &mut self,
        len: usize,
        (x0, z, x): (&Vec<f32>, &Vec<f32>, &Vec<f32>),
        next: &mut Vec<f32>,
    ) -> Result<(), GpuError> {
        for (field, buffer) in [("x0", x0), ("z", z), ("x", x)] {
            check(field, buffer, len)?;
        }
        check("next", next, len)?;
        reference::cross_forward(&x0[..len], &z[..len], &x[..len], &mut next[..len]);
        Ok(())
    }

    fn cross_backward(
        &mut self,
        len: usize,
        (g, x0, z): (&Vec<f32>, &Vec<f32>, &Vec<f32>),
        dz: &mut Vec<f32>,
        grad_x0: &mut Vec<f32>,
    ) -> Result<(), GpuError> {
        for (field, buffer) in [("g", g), ("x0", x0), ("z", z)] {
            check(field, buffer, len)?;
        }
        check("dz", dz, len)?;
        check("grad_x0", grad_x0, len)?;
        let (dz, grad_x0) = (&mut dz[..len], &mut grad_x0[..len]);
        reference::cross_backward(&g[..len], &x0[..len], &z[..len], dz, grad_x0);
        Ok(())
    }

    fn head_loss(
        &mut self,
        (values, labels): (&Vec<f32>, &Vec<f32>),
        rows: usize,
        (loss, weight): (HeadLoss, f32),
        (grad, accumulate): (&mut Vec<f32>, bool),
        (predictions, losses): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<(), GpuError> {
        for (field, buffer) in [("values", values), ("labels", labels)] {
            check(field, buffer, rows)?;
        }
        check("grad", grad, rows)?;
        check("predictions", predictions, rows)?;
        check("losses", losses, rows)?;
        let (p, l) = reference::head_loss(
            &values[..rows],
            &labels[..rows],
            loss,
            weight,
            (&mut grad[..rows], accumulate),
        );
        predictions[..rows].copy_from_slice(&p);
        losses[..rows].copy_from_slice(&l);
        Ok(())
    }
}
