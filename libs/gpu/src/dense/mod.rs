//! A dense network's parts on a GPU: the shapes and checks shared by the launches
//! ([`CudaDense`](crate::CudaDense): cuBLAS's products, and kernels.cu beside this file for
//! the bias and activation, the ReLU's backward, DLRM's dot interaction, FM, DCN-v2's
//! cross layers, column-block copies and the heads' losses, forward and backward), their
//! CPU reference ([`reference`](mod@reference)), and [`DenseOps`], the launches as one
//! interface over a GPU or the host.

mod ops;
pub mod reference;

pub use ops::{DenseOps, HostDense};

use crate::GpuError;

/// How an operand of a matrix product is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// As used: `rows x cols` row-major.
    AsIs,
    /// Transposed: the operand's transpose is stored row-major.
    Transposed,
}

/// A matrix product `dst (m x n) = a (m x k) · b (k x n)`, each operand as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    /// Rows of `a` and `dst`.
    pub m: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and `dst`.
    pub n: usize,
    /// How `a` is stored.
    pub a: Stored,
    /// How `b` is stored.
    pub b: Stored,
    /// Add the product to `dst` instead of writing over it.
    pub accumulate: bool,
}

impl Product {
    /// `dst = a · b`, both stored as used.
    pub fn new([m, k, n]: [usize; 3]) -> Self {
        Self {
            m,
            k,
            n,
            a: Stored::AsIs,
            b: Stored::AsIs,
            accumulate: false,
        }
    }

    /// With `a` stored as `stored`.
    pub fn a(self, stored: Stored) -> Self {
        Self { a: stored, ..self }
    }

    /// With `b` stored as `stored`.
    pub fn b(self, stored: Stored) -> Self {
        Self { b: stored, ..self }
    }

    /// Adding into `dst` when `accumulate`.
    pub fn accumulate(self, accumulate: bool) -> Self {
        Self { accumulate, ..self }
    }

    /// Checks the three buffers' lengths against the shape.
    pub(crate) fn check(&self, dst: usize, a: usize, b: usize) -> Result<(), GpuError> {
        let Self { m, k, n, .. } = *self;
        GpuError::check_len("a", a, m * k)?;
        GpuError::check_len("b", b, k * n)?;
        GpuError::check_len("dst", dst, m * n)?;
        let max = i32::MAX as usize;
        if m > max || k > max || n > max {
            return Err(GpuError::invalid(
                "product",
                format!("{m} x {k} x {n} has a side past cuBLAS's 32-bit sizes"),
            ));
        }
        Ok(())
    }
}

/// DLRM's dot interaction over `vectors` vectors of `dim` per row: the first, then the
/// rest side by side. Its output per row: the first vector, then each pair's dot product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DotShape {
    /// Rows of the minibatch.
    pub rows: usize,
    /// Floats per vector.
    pub dim: usize,
    /// Vectors per row, the first included (at least 2).
    pub vectors: usize,
}

impl DotShape {
    /// Pairs `(i, j)`, `i < j`.
    pub fn pairs(&self) -> usize {
        self.vectors * (self.vectors - 1) / 2
    }

    /// Floats per output row: the first vector, then the pairs' dot products.
    pub fn width(&self) -> usize {
        self.dim + self.pairs()
    }

    /// Every pair `(i, j)`, `i < j`, in row-major order of the upper triangle.
    pub fn pair_list(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.vectors).flat_map(move |i| (i + 1..self.vectors).map(move |j| (i, j)))
    }

    pub(crate) fn check(&self) -> Result<(), GpuError> {
        if self.vectors < 2 || self.dim == 0 {
            return Err(GpuError::invalid(
                "dots",
                format!(
                    "{} vectors of {} floats: at least two vectors of one float are needed",
                    self.vectors, self.dim
                ),
            ));
        }
        let floats = self
            .rows
            .saturating_mul(self.width().max(self.vectors * self.dim));
        if floats > u32::MAX as usize {
            return Err(GpuError::invalid(
                "dots",
                format!("{floats} floats is past the kernels' 32-bit row and column indices"),
            ));
        }
        Ok(())
    }
}

/// A block of columns moved between two row-major matrices: `width` columns of `rows`
/// rows, from column `src_at` of a `src_width`-wide matrix to column `dst_at` of a
/// `dst_width`-wide one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    /// Rows moved.
    pub rows: usize,
    /// Columns moved.
    pub width: usize,
    /// The source's columns per row.
    pub src_width: usize,
    /// The first source column moved.
    pub src_at: usize,
    /// The destination's columns per row.
    pub dst_width: usize,
    /// The first destination column written.
    pub dst_at: usize,
    /// Add to the destination instead of writing over it.
    pub accumulate: bool,
}

impl Columns {
    /// `width` columns of `rows` rows, from `(src_width, src_at)` to `(dst_width, dst_at)`:
    /// each matrix's columns per row and the block's first column in it.
    pub fn new(
        rows: usize,
        width: usize,
        (src_width, src_at): (usize, usize),
        (dst_width, dst_at): (usize, usize),
        accumulate: bool,
    ) -> Self {
        Self {
            rows,
            width,
            src_width,
            src_at,
            dst_width,
            dst_at,
            accumulate,
        }
    }

    /// Checks the block against both matrices and the buffers' lengths.
    pub(crate) fn check(&self, dst: usize, src: usize) -> Result<(), GpuError> {
        for (field, at, width) in [
            ("src", self.src_at, self.src_width),
            ("dst", self.dst_at, self.dst_width),
        ] {
            if at + self.width > width {
                return Err(GpuError::invalid(
                    field,
                    format!("columns {at}..{} of a matrix {width} wide", at + self.width),
                ));
            }
        }
        GpuError::check_len("src", src, self.rows * self.src_width)?;
        GpuError::check_len("dst", dst, self.rows * self.dst_width)?;
        let floats = self.rows.saturating_mul(self.src_width.max(self.dst_width));
        if floats > u32::MAX as usize {
            return Err(GpuError::invalid(
                "columns",
                format!("{floats} floats is past the kernels' 32-bit indices"),
            ));
        }
        Ok(())
    }
}

/// The factorisation machine's term over `vectors` vectors of `dim` per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FmShape {
    /// Rows of the minibatch.
    pub rows: usize,
    /// Vectors per row.
    pub vectors: usize,
    /// Floats per vector.
    pub dim: usize,
}

impl FmShape {
    /// Floats per row of its input.
    pub fn width(&self) -> usize {
        self.vectors * self.dim
    }

    pub(crate) fn check(&self, input: usize, output: usize) -> Result<(), GpuError> {
        GpuError::check_len("input", input, self.rows * self.width())?;
        GpuError::check_len("output", output, self.rows)?;
        if self.rows.saturating_mul(self.width()) > u32::MAX as usize {
            return Err(GpuError::invalid(
                "fm",
                "past the kernels' 32-bit row and column indices",
            ));
        }
        Ok(())
    }
}

/// What a head minimises over its one value per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadLoss {
    /// Binary cross-entropy on a logit; the prediction is the probability.
    BinaryCrossEntropy,
    /// Squared error; the prediction is the value.
    SquaredError,
}

impl HeadLoss {
    pub(crate) fn code(self) -> i32 {
        match self {
            Self::BinaryCrossEntropy => 0,
            Self::SquaredError => 1,
        }
    }
}
