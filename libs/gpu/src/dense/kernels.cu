// Dense-network kernels: the element-wise and interaction parts of a step around cuBLAS's
// matrix products (dense.rs launches them; dense_reference.rs is their CPU reference).
// Matrices are row-major, `rows x cols`. Unlike the embedding kernels these are compared
// with their references within a tolerance: cuBLAS orders its sums as it likes.

typedef unsigned int u32;
typedef unsigned long long u64;

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// values += bias on every row, then ReLU with `relu`.
extern "C" __global__ void bias_activation(float* __restrict__ values, const float* __restrict__ bias,
                                           u32 rows, u32 cols, int relu) {
    GRID_STRIDE(i, (u64)rows * cols) {
        float x = __fadd_rn(values[i], bias[i % cols]);
        values[i] = relu ? fmaxf(x, 0.0f) : x;
    }
}

// The ReLU's derivative: grad is zeroed where the ReLU's output was not positive.
extern "C" __global__ void relu_backward(float* __restrict__ grad, const float* __restrict__ output,
                                         u64 n) {
    GRID_STRIDE(i, n) {
        if (!(output[i] > 0.0f)) grad[i] = 0.0f;
    }
}

// Vector v (0 = the row's `first`, then `rest`'s) of row r.
__device__ __forceinline__ const float* dot_vector(const float* first, const float* rest, u32 r,
                                                   u32 v, u32 dim, u32 vectors) {
    return v == 0 ? first + (u64)r * dim : rest + ((u64)r * (vectors - 1) + (v - 1)) * dim;
}

// Index of pair (i, j), i < j, in row-major order of the upper triangle of `vectors`.
__device__ __forceinline__ u32 pair_index(u32 i, u32 j, u32 vectors) {
    return i * vectors - i * (i + 1) / 2 + (j - i - 1);
}

// DLRM's interaction: out (rows x (dim + pairs)) holds each row's first vector, then the
// dot product of every pair (i < j) of its vectors. pair_i/pair_j list the pairs in order.
extern "C" __global__ void dots_forward(const float* __restrict__ first, const float* __restrict__ rest,
                                        const u32* __restrict__ pair_i, const u32* __restrict__ pair_j,
                                        u32 rows, u32 dim, u32 vectors, u32 pairs,
                                        float* __restrict__ out) {
    u32 width = dim + pairs;
    GRID_STRIDE(i, (u64)rows * width) {
        u32 r = (u32)(i / width), c = (u32)(i % width);
        if (c < dim) {
            out[i] = first[(u64)r * dim + c];
            continue;
        }
        const float* a = dot_vector(first, rest, r, pair_i[c - dim], dim, vectors);
        const float* b = dot_vector(first, rest, r, pair_j[c - dim], dim, vectors);
        float acc = 0.0f;
        for (u32 d = 0; d < dim; d++) acc = fmaf(a[d], b[d], acc);
        out[i] = acc;
    }
}

// The interaction's backward: each vector's gradient, the dot products' gradients times the
// other vector of each pair (and, for the first vector, its own columns' gradient), written
// over grad_first and grad_rest, or added to them with accumulate_*.
extern "C" __global__ void dots_backward(const float* __restrict__ first, const float* __restrict__ rest,
                                         const float* __restrict__ grad_out, u32 rows, u32 dim,
                                         u32 vectors, int accumulate_first, int accumulate_rest,
                                         float* __restrict__ grad_first, float* __restrict__ grad_rest) {
    u32 width = dim + vectors * (vectors - 1) / 2;
    GRID_STRIDE(i, (u64)rows * vectors * dim) {
        u32 d = (u32)(i % dim);
        u64 rv = i / dim;
        u32 v = (u32)(rv % vectors), r = (u32)(rv / vectors);
        const float* g = grad_out + (u64)r * width;
        float acc = v == 0 ? g[d] : 0.0f;
        for (u32 u = 0; u < vectors; u++) {
            if (u == v) continue;
            u32 p = u < v ? pair_index(u, v, vectors) : pair_index(v, u, vectors);
            acc = fmaf(g[dim + p], dot_vector(first, rest, r, u, dim, vectors)[d], acc);
        }
        if (v == 0) {
            float* into = grad_first + (u64)r * dim + d;
            *into = accumulate_first ? *into + acc : acc;
        } else {
            float* into = grad_rest + ((u64)r * (vectors - 1) + (v - 1)) * dim + d;
            *into = accumulate_rest ? *into + acc : acc;
        }
    }
}

// A head over one value per row: binary cross-entropy on logits (loss 0) or squared error
// (loss 1). Writes each row's prediction (probability or value) and loss, and the weighted
// gradient of the mean loss (written, or added with accumulate).
extern "C" __global__ void head_loss(const float* __restrict__ values, const float* __restrict__ labels,
                                     u32 rows, int loss, float weight, int accumulate,
                                     float* __restrict__ predictions, float* __restrict__ losses,
                                     float* __restrict__ grad) {
    GRID_STRIDE(i, (u64)rows) {
        float z = values[i], y = labels[i], dz;
        if (loss == 0) {
            // max(z, 0) - z*y + log(1 + exp(-|z|)), stable for any z.
            losses[i] = fmaxf(z, 0.0f) - z * y + log1pf(expf(-fabsf(z)));
            float p = 1.0f / (1.0f + expf(-z));
            predictions[i] = p;
            dz = weight * (p - y) / (float)rows;
        } else {
            float e = z - y;
            losses[i] = e * e;
            predictions[i] = z;
            dz = weight * 2.0f * e / (float)rows;
        }
        grad[i] = accumulate ? grad[i] + dz : dz;
    }
}

// dst[r, dst_at + c] = src[r, src_at + c] (or +=, with accumulate) for c < width: moving
// blocks of columns between matrices of different widths (concatenation and its
// backward, sums, inputs of some of the columns).
extern "C" __global__ void copy_columns(float* __restrict__ dst, u32 dst_width, u32 dst_at,
                                        const float* __restrict__ src, u32 src_width, u32 src_at,
                                        u32 rows, u32 width, int accumulate) {
    GRID_STRIDE(i, (u64)rows * width) {
        u64 r = i / width;
        u32 c = (u32)(i % width);
        float v = src[r * src_width + src_at + c];
        float* into = dst + r * dst_width + dst_at + c;
        *into = accumulate ? __fadd_rn(*into, v) : v;
    }
}

// The factorisation machine's second-order term over `vectors` vectors of `dim` per row:
// out[r] = (|sum_v e_v|^2 - sum_v |e_v|^2) / 2.
extern "C" __global__ void fm_forward(const float* __restrict__ e, u32 rows, u32 vectors, u32 dim,
                                      float* __restrict__ out) {
    GRID_STRIDE(r, (u64)rows) {
        const float* row = e + r * vectors * dim;
        float sums = 0.0f, squares = 0.0f;
        for (u32 d = 0; d < dim; d++) {
            float s = 0.0f;
            for (u32 v = 0; v < vectors; v++) {
                float x = row[(u64)v * dim + d];
                s += x;
                squares = fmaf(x, x, squares);
            }
            sums = fmaf(s, s, sums);
        }
        out[r] = 0.5f * (sums - squares);
    }
}

// Its backward: grad[r, v, d] = grad_out[r] * (sum_u e[r, u, d] - e[r, v, d]), written or
// added with accumulate.
extern "C" __global__ void fm_backward(const float* __restrict__ e, const float* __restrict__ grad_out,
                                       u32 rows, u32 vectors, u32 dim, int accumulate,
                                       float* __restrict__ grad) {
    GRID_STRIDE(i, (u64)rows * dim) {
        u64 r = i / dim;
        u32 d = (u32)(i % dim);
        const float* row = e + r * vectors * dim;
        float s = 0.0f;
        for (u32 v = 0; v < vectors; v++) s += row[(u64)v * dim + d];
        float g = grad_out[r];
        for (u32 v = 0; v < vectors; v++) {
            u64 at = r * vectors * dim + (u64)v * dim + d;
            float x = g * (s - e[at]);
            grad[at] = accumulate ? grad[at] + x : x;
        }
    }
}

// A DCN-v2 cross layer's output from its product z = W x + b: next = x0 * z + x.
extern "C" __global__ void cross_forward(const float* __restrict__ x0, const float* __restrict__ z,
                                         const float* __restrict__ x, u64 n, float* __restrict__ next) {
    GRID_STRIDE(i, n) { next[i] = __fadd_rn(__fmul_rn(x0[i], z[i]), x[i]); }
}

// Its backward through the product: dz = g * x0, and grad_x0 += g * z.
extern "C" __global__ void cross_backward(const float* __restrict__ g, const float* __restrict__ x0,
                                          const float* __restrict__ z, u64 n, float* __restrict__ dz,
                                          float* __restrict__ grad_x0) {
    GRID_STRIDE(i, n) {
        dz[i] = __fmul_rn(g[i], x0[i]);
        grad_x0[i] = __fadd_rn(grad_x0[i], __fmul_rn(g[i], z[i]));
    }
}
