// Embedding kernels, compiled at run time by NVRTC (primus-gpu). Every kernel has a CPU
// reference in reference.rs that performs the same float operations in the same order;
// the explicit __f*_rn intrinsics keep the compiler from fusing a multiply and an add,
// so forward pooling, the deterministic backward and both optimizers are bitwise equal
// to their references. Only the atomic backward may differ (addition order).
//
// Shared layout (see layout.rs): every feature f reads rows of one table.
//   feature_base[f]   element offset of the table's row 0 in `weights`
//   feature_meta[3f]  row stride (floats), dim, output column
//   grad_base[f]      element offset of the table's row 0 in the gradient buffer (stride = dim)
// Work item g = f * samples + b is sample b of feature f. Its bag is g itself, or
// sample_bag[g] when the features come from an inverse keyed jagged tensor (RecD IKJT),
// where samples that share a deduplicated row share one bag. Bag k spans
// indices[offsets[k] .. offsets[k + 1]].

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 bag_of(const u32* sample_bag, int has_sample_bag, u32 g) {
    return has_sample_bag ? sample_bag[g] : g;
}

// Samples of one feature that a thread group pools together: their row loads are
// independent, so ITEMS of them are in flight per thread instead of one behind a chain
// of dependent index loads (the difference between ~55% and ~80% of copy bandwidth for
// 64-byte rows).
#define ITEMS 4

// `lanes` threads cooperate on ITEMS consecutive samples of one feature; each thread owns
// columns lane*VEC, lane*VEC + lanes*VEC, ... Each sample's rows are still added in bag
// order, as the reference adds them.
template <int VEC>
__device__ __forceinline__ void gather_pool_impl(
    const float* __restrict__ weights, const u64* __restrict__ feature_base,
    const u32* __restrict__ feature_meta, const u32* __restrict__ offsets,
    const u32* __restrict__ indices, const u32* __restrict__ sample_bag, int has_sample_bag,
    u32 features, u32 samples, u32 out_width, int mean, u32 lanes, float* __restrict__ out) {
    u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 group = thread / lanes;
    u32 lane = (u32)(thread % lanes);
    u32 chunks = (samples + ITEMS - 1) / ITEMS;
    if (group >= (u64)features * chunks) return;
    u32 f = (u32)(group / chunks);
    u32 first = (u32)(group % chunks) * ITEMS;
    u64 base = feature_base[f];
    u32 stride = feature_meta[3 * f], dim = feature_meta[3 * f + 1], col = feature_meta[3 * f + 2];
    u32 start[ITEMS], len[ITEMS], longest = 0;
#pragma unroll
    for (int k = 0; k < ITEMS; k++) {
        start[k] = 0;
        len[k] = 0;
        if (first + k < samples) {
            u32 bag = bag_of(sample_bag, has_sample_bag, f * samples + first + k);
            start[k] = offsets[bag];
            len[k] = offsets[bag + 1] - start[k];
            longest = max(longest, len[k]);
        }
    }
    for (u32 c = lane * VEC; c < dim; c += lanes * VEC) {
        float acc[ITEMS][VEC];
#pragma unroll
        for (int k = 0; k < ITEMS; k++)
#pragma unroll
            for (int v = 0; v < VEC; v++) acc[k][v] = 0.0f;
        for (u32 j = 0; j < longest; j++) {
#pragma unroll
            for (int k = 0; k < ITEMS; k++) {
                if (j >= len[k]) continue;
                const float* src = weights + base + (u64)indices[start[k] + j] * stride + c;
                if (VEC == 4) {
                    float4 w = __ldg(reinterpret_cast<const float4*>(src));
                    acc[k][0] = __fadd_rn(acc[k][0], w.x);
                    acc[k][1] = __fadd_rn(acc[k][1], w.y);
                    acc[k][2] = __fadd_rn(acc[k][2], w.z);
                    acc[k][3] = __fadd_rn(acc[k][3], w.w);
                } else {
                    acc[k][0] = __fadd_rn(acc[k][0], __ldg(src));
                }
            }
        }
#pragma unroll
        for (int k = 0; k < ITEMS; k++) {
            if (first + k >= samples) continue;
            if (mean && len[k] > 0) {
                float n = (float)len[k];
#pragma unroll
                for (int v = 0; v < VEC; v++) acc[k][v] = __fdiv_rn(acc[k][v], n);
            }
            float* dst = out + (u64)(first + k) * out_width + col + c;
            if (VEC == 4) {
                *reinterpret_cast<float4*>(dst) = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
            } else {
                dst[0] = acc[k][0];
            }
        }
    }
}

// Pooled embeddings: out[b, col_f .. col_f + dim_f] = sum (or mean) of the bag's rows.
// An empty bag pools to zeros. The vec4 form needs every base, stride, dim, column and
// the output width to be multiples of 4 (the host checks).
extern "C" __global__ void gather_pool_vec4(
    const float* weights, const u64* feature_base, const u32* feature_meta, const u32* offsets,
    const u32* indices, const u32* sample_bag, int has_sample_bag, u32 features, u32 samples,
    u32 out_width, int mean, u32 lanes, float* out) {
    gather_pool_impl<4>(weights, feature_base, feature_meta, offsets, indices, sample_bag,
                        has_sample_bag, features, samples, out_width, mean, lanes, out);
}

extern "C" __global__ void gather_pool_scalar(
    const float* weights, const u64* feature_base, const u32* feature_meta, const u32* offsets,
    const u32* indices, const u32* sample_bag, int has_sample_bag, u32 features, u32 samples,
    u32 out_width, int mean, u32 lanes, float* out) {
    gather_pool_impl<1>(weights, feature_base, feature_meta, offsets, indices, sample_bag,
                        has_sample_bag, features, samples, out_width, mean, lanes, out);
}

__device__ __forceinline__ float bag_scale(const u32* offsets, u32 bag, int mean) {
    u32 n = offsets[bag + 1] - offsets[bag];
    return (mean && n > 0) ? __fdiv_rn(1.0f, (float)n) : 1.0f;
}

// Backward of pooling by atomics: every (bag entry, column) adds its share of the pooled
// gradient into its row's gradient. Correct with repeated ids; the order of the additions,
// and so the last bits, vary from run to run. `grad_rows` must start zeroed.
extern "C" __global__ void pool_backward_atomic(
    const float* __restrict__ grad_out, const u64* __restrict__ grad_base,
    const u32* __restrict__ feature_meta, const u32* __restrict__ offsets,
    const u32* __restrict__ indices, const u32* __restrict__ sample_bag, int has_sample_bag,
    u32 features, u32 samples, u32 out_width, int mean, u32 lanes, float* grad_rows) {
    u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 item = thread / lanes;
    u32 lane = (u32)(thread % lanes);
    if (item >= (u64)features * samples) return;
    u32 f = (u32)(item / samples);
    u32 b = (u32)(item % samples);
    u32 dim = feature_meta[3 * f + 1], col = feature_meta[3 * f + 2];
    u32 bag = bag_of(sample_bag, has_sample_bag, (u32)item);
    float scale = bag_scale(offsets, bag, mean);
    const float* src = grad_out + (u64)b * out_width + col;
    for (u32 i = offsets[bag]; i < offsets[bag + 1]; i++) {
        float* dst = grad_rows + grad_base[f] + (u64)indices[i] * dim;
        for (u32 c = lane; c < dim; c += lanes) atomicAdd(dst + c, __fmul_rn(src[c], scale));
    }
}

// Deterministic backward: one thread group per gradient row sums that row's contributions
// in the order the host listed them (ascending work item, then position in the bag: the
// reference's order), so the result is the same on every run and equals the reference.
// Contribution k of row r (k in row_offsets[r] .. row_offsets[r + 1]) is work item
// contrib_item[k]; row r's gradient lives at grad_rows[row_dst[r] .. + dim].
extern "C" __global__ void pool_backward_sorted(
    const float* __restrict__ grad_out, const u32* __restrict__ feature_meta,
    const u32* __restrict__ offsets, const u32* __restrict__ sample_bag, int has_sample_bag,
    const u64* __restrict__ row_dst, const u32* __restrict__ row_feature,
    const u32* __restrict__ row_offsets, const u32* __restrict__ contrib_item, u32 rows,
    u32 samples, u32 out_width, int mean, u32 lanes, float* __restrict__ grad_rows) {
    u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 r = thread / lanes;
    u32 lane = (u32)(thread % lanes);
    if (r >= rows) return;
    u32 dim = feature_meta[3 * row_feature[r] + 1];
    float* dst = grad_rows + row_dst[r];
    for (u32 c = lane; c < dim; c += lanes) {
        float acc = 0.0f;
        for (u32 k = row_offsets[r]; k < row_offsets[r + 1]; k++) {
            u32 item = contrib_item[k];
            u32 f = item / samples, b = item % samples;
            u32 col = feature_meta[3 * f + 2];
            float scale = bag_scale(offsets, bag_of(sample_bag, has_sample_bag, item), mean);
            acc = __fadd_rn(acc, __fmul_rn(grad_out[(u64)b * out_width + col + c], scale));
        }
        dst[c] = acc;
    }
}

// Fused sparse Adagrad on device-resident rows laid out as in the CPU arena:
// row = weights[dim] followed by the accumulator[dim], `stride` floats apart.
// ids must be distinct (the host checks), so no two groups touch one row.
extern "C" __global__ void adagrad_update(
    float* __restrict__ table, u32 stride, u32 dim, const u32* __restrict__ ids,
    const float* __restrict__ grads, u32 n, float lr, float epsilon, u32 lanes) {
    u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 r = thread / lanes;
    u32 lane = (u32)(thread % lanes);
    if (r >= n) return;
    float* w = table + (u64)ids[r] * stride;
    float* acc = w + dim;
    const float* g = grads + r * dim;
    for (u32 c = lane; c < dim; c += lanes) {
        float gc = g[c];
        float a = __fadd_rn(acc[c], __fmul_rn(gc, gc));
        acc[c] = a;
        w[c] = __fsub_rn(w[c], __fdiv_rn(__fmul_rn(lr, gc), __fadd_rn(__fsqrt_rn(a), epsilon)));
    }
}

// Fused sparse Adam: row = weights[dim], m[dim], v[dim], beta1^t, beta2^t (per-row bias
// correction, as the CPU table keeps it). Every lane reads the old powers before the
// group's first lane writes the new ones, hence the warp barrier; groups never span warps.
extern "C" __global__ void adam_update(
    float* __restrict__ table, u32 stride, u32 dim, const u32* __restrict__ ids,
    const float* __restrict__ grads, u32 n, float lr, float beta1, float beta2, float epsilon,
    u32 lanes) {
    u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 r = thread / lanes;
    u32 lane = (u32)(thread % lanes);
    bool active = r < n;
    float p1 = 0.0f, p2 = 0.0f;
    float* w = nullptr;
    if (active) {
        w = table + (u64)ids[r] * stride;
        p1 = __fmul_rn(w[3 * dim], beta1);
        p2 = __fmul_rn(w[3 * dim + 1], beta2);
    }
    __syncwarp();
    if (!active) return;
    if (lane == 0) {
        w[3 * dim] = p1;
        w[3 * dim + 1] = p2;
    }
    float step = __fdiv_rn(__fmul_rn(lr, __fsqrt_rn(__fsub_rn(1.0f, p2))), __fsub_rn(1.0f, p1));
    float* m = w + dim;
    float* v = w + 2 * dim;
    const float* g = grads + r * dim;
    for (u32 c = lane; c < dim; c += lanes) {
        float gc = g[c];
        float mc = __fadd_rn(__fmul_rn(beta1, m[c]), __fmul_rn(__fsub_rn(1.0f, beta1), gc));
        float vc = __fadd_rn(__fmul_rn(beta2, v[c]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, beta2), gc), gc));
        m[c] = mc;
        v[c] = vc;
        w[c] = __fsub_rn(w[c], __fdiv_rn(__fmul_rn(step, mc), __fadd_rn(__fsqrt_rn(vc), epsilon)));
    }
}

// A row store's reads: the first `floats` floats of rows ids[0..n] (repeats allowed), one
// thread per float, into out (n x floats, row after row).
extern "C" __global__ void gather_rows(
    const float* __restrict__ table, u32 stride, const u32* __restrict__ ids, u32 n,
    u32 floats, float* __restrict__ out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n * floats) return;
    u64 r = i / floats;
    u32 c = (u32)(i % floats);
    out[i] = table[(u64)ids[r] * stride + c];
}

// A row store's writes: whole rows (weights and state) of distinct ids[0..n] from values
// (n x stride), one thread per float.
extern "C" __global__ void scatter_rows(
    float* __restrict__ table, u32 stride, const u32* __restrict__ ids, u32 n,
    const float* __restrict__ values) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n * stride) return;
    u64 r = i / stride;
    u32 c = (u32)(i % stride);
    table[(u64)ids[r] * stride + c] = values[i];
}
