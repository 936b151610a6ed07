// One pass over W for a layer's dgrad and its SGD update, row-range variant
// (dgrad_wgrad_kernels.hpp).
//
// Work split: a block covers C = 8 warps x S columns of W (a contiguous 256-
// or 128-column strip, so each row it reads is one 512/256-byte run and DRAM
// pages stay open) and a range of W's rows; each warp owns S of the columns.
// The block walks its range 16 rows (a chunk) at a time through a ring of
// shared-memory stages that all its threads fill with 16-byte cp.async
// copies (deep: the bytes in flight, not the math, bound a streaming
// kernel), one barrier per chunk. Per chunk and warp, ldmatrix hands out
//   - dY's A fragments for dX += dY[:, rows] W[rows, cols] and, transposed,
//     for the chunk's gradient G = dY[:, rows]^T X[:, cols];
//   - W's B fragments (transposed) for dX, and W in the accumulator layout
//     of G, so the SGD step is register arithmetic on values the lane holds.
// The updated W goes back to the stage with stmatrix and out to global
// memory with 16-byte stores. (Earlier versions staged and re-read fp32
// gradient tiles, or fetched dY 4 bytes at a time: both were bound by the
// L1/shared-memory pipe; docs/performance.md.)
#include <algorithm>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "ops/cuda/mma_fragments.cuh"

namespace sg::cuda::one_pass {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <int S, int B>
struct Shape {
  static constexpr int kTiles = S / 8;  // 8-column mma tiles of a warp's columns
  static constexpr int kBatchTiles = B / 16;
  static constexpr int kBlockColumns = kWarps * S;
  // Stage rows padded by 16 bytes: the 8 row addresses of an ldmatrix fall in distinct banks.
  static constexpr int kWLd = kBlockColumns + 8, kDyLd = 16 + 8;  // halves
  static constexpr int kStageHalves = 16 * kWLd + B * kDyLd;      // W[16][kWLd], then dY[B][kDyLd]
  // As many stages as ~160 KB hold (one block per SM: the registers of
  // 8 warps x S columns of accumulators and fragments need more than half an SM's).
  static constexpr int kDepth = std::min(16, 160 * 1024 / (kStageHalves * 2));
  static constexpr std::size_t smem_bytes = std::size_t(kDepth) * kStageHalves * 2;
  static_assert(kStageHalves % 8 == 0, "stages must stay 16-byte aligned");
};

// Queue rows row0..row0+15 of the block's strip of W, and the same 16 columns
// of dY, into a stage (every thread its share of 16-byte pieces).
template <int S, int B>
__device__ __forceinline__ void fetch_w_rows(std::uint32_t stage, const __half* w, int k, int row0, int strip0) {
  using Sh = Shape<S, B>;
  constexpr int kRowPieces = Sh::kBlockColumns / 8, kWPieces = 16 * kRowPieces;
#pragma unroll
  for (int i = threadIdx.x; i < kWPieces; i += kThreads) {
    const int r = i / kRowPieces, c = (i % kRowPieces) * 8;
    if (strip0 + c < k)
      copy_async16(stage + (r * Sh::kWLd + c) * 2, w + std::int64_t(row0 + r) * k + strip0 + c);
  }
}
template <int S, int B>
__device__ __forceinline__ void fetch_dy_columns(std::uint32_t stage, const __half* dy, int n, int row0) {
  using Sh = Shape<S, B>;
  const std::uint32_t dy_stage = stage + 16 * Sh::kWLd * 2;
  for (int i = threadIdx.x; i < 2 * B; i += kThreads) {
    const int b = i / 2, c = (i % 2) * 8;
    copy_async16(dy_stage + (b * Sh::kDyLd + c) * 2, dy + std::int64_t(b) * n + row0 + c);
  }
}
// Both, as one commit group.
template <int S, int B>
__device__ __forceinline__ void fetch_chunk(std::uint32_t stage, const __half* w, const __half* dy, int n, int k,
                                            int row0, int strip0) {
  fetch_w_rows<S, B>(stage, w, k, row0, strip0);
  fetch_dy_columns<S, B>(stage, dy, n, row0);
  commit_copies();
}

// One warp's work on one chunk: dX partial += dY[:, rows] W[rows, cols], then
// W = (1 - lr*wd) W - lr G, G = dY[:, rows]^T X[:, cols], rounded once to fp16,
// written back into the stage (the caller copies it out).
template <int S, int B>
__device__ __forceinline__ void apply_chunk(std::uint32_t w_stage, std::uint32_t dy_stage, int lane,
                                            const std::uint32_t (&xf)[B / 16][S / 8][2],
                                            float (&dx_acc)[B / 16][S / 8][4], const UpdateScalars& s) {
  using Sh = Shape<S, B>;
  constexpr int kTiles = Sh::kTiles, kBatchTiles = Sh::kBatchTiles;
  // ldmatrix addressing: lanes 0-15 rows 0-15 at column 0, lanes 16-31 the same rows at column 8;
  // for dY^T, matrix i = lane / 8 is (batch rows 8*(i/2).., W rows 8*(i%2)..).
  const int row = lane % 16, half = (lane / 16) * 8;
  std::uint32_t dy_a[kBatchTiles][4], dy_t[kBatchTiles][4];
#pragma unroll
  for (int mb = 0; mb < kBatchTiles; ++mb) {
    load_matrices(dy_a[mb], dy_stage + ((mb * 16 + row) * Sh::kDyLd + half) * 2);
    const int b = mb * 16 + lane % 8 + (lane / 16) * 8, c = ((lane / 8) % 2) * 8;
    load_matrices_transposed(dy_t[mb], dy_stage + (b * Sh::kDyLd + c) * 2);
  }
#pragma unroll
  for (int q = 0; q < kTiles / 2; ++q) {  // tiles 2q and 2q + 1
    const std::uint32_t at = w_stage + (row * Sh::kWLd + 16 * q + half) * 2;
    std::uint32_t wb[4], wc[4];
    load_matrices_transposed(wb, at);  // B fragments: tile 2q b0 b1, tile 2q+1 b0 b1
    load_matrices(wc, at);             // C layout: tile 2q top, bottom, tile 2q+1 top, bottom
    std::uint32_t updated[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int p = 2 * q + h;
#pragma unroll
      for (int mb = 0; mb < kBatchTiles; ++mb) mma_16x8x16(dx_acc[mb][p], dy_a[mb], wb[2 * h], wb[2 * h + 1]);
      float grad[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kb = 0; kb < kBatchTiles; ++kb) mma_16x8x16(grad, dy_t[kb], xf[kb][p][0], xf[kb][p][1]);
      const float2 top = unpack_half2(wc[2 * h]), bottom = unpack_half2(wc[2 * h + 1]);
      updated[2 * h] = pack_half2(__float2half(s.neg_lr * grad[0] + s.one_minus_lr_wd * top.x),
                                  __float2half(s.neg_lr * grad[1] + s.one_minus_lr_wd * top.y));
      updated[2 * h + 1] = pack_half2(__float2half(s.neg_lr * grad[2] + s.one_minus_lr_wd * bottom.x),
                                      __float2half(s.neg_lr * grad[3] + s.one_minus_lr_wd * bottom.y));
    }
    store_matrices(at, updated);
  }
}

// dx[:, strip] = act'(sum of the ranges' fp32 partials, in range order),
// rounded to fp16 (A: the activation; for ReLU masked by x > 0; `saved`:
// the pre-activation for gelu, gelu_tanh and silu, else x is read); with bias, the previous layer's bias takes its SGD step
// from the column sums of that rounded dx. Four columns per item, every
// item's loads independent (this runs on one block: the loads in flight,
// not the arithmetic, set its time). `rounded` is B x Columns floats of
// shared memory.
template <int B, int Columns, Activation A>
__device__ void finish_strip(const float* partials, unsigned ranges, const __half* x, int k, int col0, __half* dx,
                             __half* bias, const UpdateScalars* bias_scalars, float* rounded, const __half* saved) {
  constexpr int kGroups = Columns / 4, kItems = B * kGroups / kThreads;
  static_assert(B * kGroups % kThreads == 0);
  float4 sum[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) sum[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  // Two ranges' loads of every item in flight at once; sums still in range order.
  constexpr int kUnroll = 2;
  for (unsigned r0 = 0; r0 < ranges; r0 += kUnroll) {
    float4 v[kUnroll][kItems];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int item = threadIdx.x + j * kThreads, b = item / kGroups, c = col0 + (item % kGroups) * 4;
        const unsigned r = r0 + u;
        v[u][j] = r < ranges && c < k
                      ? __ldcg(reinterpret_cast<const float4*>(partials + (std::int64_t(r) * B + b) * k + c))
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        sum[j].x += v[u][j].x, sum[j].y += v[u][j].y, sum[j].z += v[u][j].z, sum[j].w += v[u][j].w;
  }
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int item = threadIdx.x + j * kThreads, b = item / kGroups, c = col0 + (item % kGroups) * 4;
    if (c >= k) continue;
    const std::int64_t at = std::int64_t(b) * k + c;
    const uint2 xq = *reinterpret_cast<const uint2*>((kBackwardReadsInput<A> ? saved : x) + at);
    const float2 x01 = unpack_half2(xq.x), x23 = unpack_half2(xq.y);
    __half h0, h1, h2, h3;
    if constexpr (A == Activation::relu) {  // (the selects this kernel always made: the ReLU instance is unchanged)
      h0 = __float2half(x01.x > 0.f ? sum[j].x : 0.f), h1 = __float2half(x01.y > 0.f ? sum[j].y : 0.f);
      h2 = __float2half(x23.x > 0.f ? sum[j].z : 0.f), h3 = __float2half(x23.y > 0.f ? sum[j].w : 0.f);
    } else {
      using Math = ActivationMath<A>;
      h0 = __float2half(Math::backward(sum[j].x, x01.x)), h1 = __float2half(Math::backward(sum[j].y, x01.y));
      h2 = __float2half(Math::backward(sum[j].z, x23.x)), h3 = __float2half(Math::backward(sum[j].w, x23.y));
    }
    *reinterpret_cast<uint2*>(dx + at) = uint2{pack_half2(h0, h1), pack_half2(h2, h3)};
    float* row = rounded + b * Columns + (c - col0);
    row[0] = __half2float(h0), row[1] = __half2float(h1), row[2] = __half2float(h2), row[3] = __half2float(h3);
  }
  if (!bias) return;
  __syncthreads();
  const int c = col0 + threadIdx.x;
  if (threadIdx.x < Columns && c < k) {
    float column_sum = 0.f;
#pragma unroll 8
    for (int b = 0; b < B; ++b) column_sum += rounded[b * Columns + threadIdx.x];
    const UpdateScalars bs = *bias_scalars;
    bias[c] = __float2half(bs.neg_lr * column_sum + bs.one_minus_lr_wd * __half2float(bias[c]));
  }
}

// Grid: (strips of kBlockColumns columns, ranges of rows_per_range rows).
template <int S, int B, Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    row_ranges_kernel(const __half* dy, const __half* x, int n, int k, int rows_per_range, __half* w,
                           __half* dx, const UpdateScalars* scalars, __half* bias, const UpdateScalars* bias_scalars,
                           float* partials, unsigned* arrivals, const __half* saved) {
  using Sh = Shape<S, B>;
  constexpr int kTiles = Sh::kTiles, kBatchTiles = Sh::kBatchTiles, kDepth = Sh::kDepth;
  extern __shared__ __align__(128) __half stages[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int strip0 = blockIdx.x * Sh::kBlockColumns, col0 = strip0 + warp * S;  // the warp's columns
  const bool active = col0 < k;
  const int row_begin = blockIdx.y * rows_per_range;
  const int chunks = (min(n, row_begin + rows_per_range) - row_begin) / 16;
  const std::uint32_t ring = shared_address(stages);
  constexpr std::uint32_t kStageBytes = Sh::kStageHalves * 2;

  allow_next_kernel_to_start();
  // The first stages' W rows go out before the wait for the kernel that
  // writes dY; they join the first stage's commit group (one group per
  // stage, even an empty one).
#pragma unroll
  for (int d = 0; d < kDepth - 1; ++d)
    if (d < chunks) fetch_w_rows<S, B>(ring + d * kStageBytes, w, k, row_begin + d * 16, strip0);
  wait_for_previous_kernel();
#pragma unroll
  for (int d = 0; d < kDepth - 1; ++d) {
    if (d < chunks) fetch_dy_columns<S, B>(ring + d * kStageBytes, dy, n, row_begin + d * 16);
    commit_copies();
  }
  const UpdateScalars s = *scalars;
  // X's B fragments (k = batch, n = column), the same for every chunk.
  std::uint32_t xf[kBatchTiles][kTiles][2];
#pragma unroll
  for (int kb = 0; kb < kBatchTiles; ++kb)
#pragma unroll
    for (int p = 0; p < kTiles; ++p) {
      const __half* col = x + std::int64_t(kb * 16 + 2 * t) * k + min(col0 + 8 * p + g, k - 1);
      xf[kb][p][0] = pack_half2(col[0], col[k]);
      xf[kb][p][1] = pack_half2(col[std::int64_t(8) * k], col[std::int64_t(9) * k]);
    }
  float dx_acc[kBatchTiles][kTiles][4] = {};

  for (int i = 0; i < chunks; ++i) {
    wait_copies<kDepth - 2>();  // chunk i landed (this thread's pieces)...
    __syncthreads();            // ...everyone's, and everyone is done with chunk i - 1's stage
    const int ahead = i + kDepth - 1;
    if (ahead < chunks)
      fetch_chunk<S, B>(ring + (ahead % kDepth) * kStageBytes, w, dy, n, k, row_begin + ahead * 16, strip0);
    else
      commit_copies();
    if (!active) continue;
    const std::uint32_t stage = ring + (i % kDepth) * kStageBytes;
    const std::uint32_t w_stage = stage + warp * S * 2;  // this warp's columns of the W rows
    apply_chunk<S, B>(w_stage, stage + 16 * Sh::kWLd * 2, lane, xf, dx_acc, s);
    __syncwarp();
    // the updated 16 x S chunk, 16 bytes per lane and store
    const __half* updated = stages + (i % kDepth) * Sh::kStageHalves + warp * S;
    const int row0 = row_begin + i * 16;
#pragma unroll
    for (int j = lane; j < 16 * S / 8; j += 32) {
      const int r = j / (S / 8), c = (j % (S / 8)) * 8;
      *reinterpret_cast<uint4*>(w + std::int64_t(row0 + r) * k + col0 + c) =
          *reinterpret_cast<const uint4*>(updated + r * Sh::kWLd + c);
    }
  }
  wait_copies<0>();

  float* partial = partials + std::int64_t(blockIdx.y) * B * k;
  if (active)
#pragma unroll
    for (int mb = 0; mb < kBatchTiles; ++mb)
#pragma unroll
      for (int p = 0; p < kTiles; ++p) {
        float* at = partial + std::int64_t(mb * 16 + g) * k + col0 + 8 * p + 2 * t;
        *reinterpret_cast<float2*>(at) = make_float2(dx_acc[mb][p][0], dx_acc[mb][p][1]);
        *reinterpret_cast<float2*>(at + std::int64_t(8) * k) = make_float2(dx_acc[mb][p][2], dx_acc[mb][p][3]);
      }

  // The last block of this strip to finish sums the ranges' partials in order.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(arrivals + blockIdx.x, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  finish_strip<B, Sh::kBlockColumns, A>(partials, gridDim.y, x, k, strip0, dx, bias, bias_scalars,
                                        reinterpret_cast<float*>(stages), saved);
  if (threadIdx.x == 0) arrivals[blockIdx.x] = 0;  // ready for the next launch
}

// Columns per warp: 32 (256-column strips) from K = 4096 up, where the
// longer DRAM runs pay; below, 16 (more strips, fewer row ranges to sum).
// Measured on an H100 at batch 32 with W L2-warm (docs/performance.md,
// section 11): K = 8192 111.7 vs 136.1 us, 4096 36.4 vs 41.5, 2048 19.1 vs 17.4.
int warp_columns(std::int64_t k) { return k % 32 == 0 && k >= 4096 ? 32 : 16; }

struct Instance {
  void (*kernel)(const __half*, const __half*, int, int, int, __half*, __half*, const UpdateScalars*, __half*,
                 const UpdateScalars*, float*, unsigned*, const __half*);
  std::size_t smem;
};

template <int S, int B, Activation A>
Instance instance() {
  return {row_ranges_kernel<S, B, A>, Shape<S, B>::smem_bytes};
}
template <int B, Activation A>
Instance instance_for_columns(int s) {
  return s == 32 ? instance<32, B, A>() : instance<16, B, A>();
}
Instance instance_for(std::int64_t batch, int s, Activation activation) {
  return with_activation(activation, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    return batch == 16 ? instance_for_columns<16, A>(s) : instance_for_columns<32, A>(s);
  });
}

}  // namespace

RowRangeGrid plan_row_ranges(std::int64_t batch, std::int64_t n, std::int64_t k, Activation activation) {
  RowRangeGrid grid;
  grid.columns_per_warp = warp_columns(k);
  const Instance in = instance_for(batch, grid.columns_per_warp, activation);
  SG_CUDA_CHECK(cudaFuncSetAttribute(in.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(in.smem)));
  // One wave: the strips times the row ranges fill the SMs once (a block per SM).
  grid.strips = (k + kWarps * grid.columns_per_warp - 1) / (kWarps * grid.columns_per_warp);
  const std::int64_t chunks = n / 16;
  const std::int64_t wanted = std::clamp<std::int64_t>(multiprocessor_count() / grid.strips, 1, chunks);
  grid.rows_per_range = (chunks + wanted - 1) / wanted * 16;
  grid.ranges = (n + grid.rows_per_range - 1) / grid.rows_per_range;
  grid.partial_floats = std::size_t(grid.ranges * batch * k);
  return grid;
}

void launch_row_ranges(const RowRangeGrid& grid, const __half* dy, const __half* x, std::int64_t batch, std::int64_t n,
                       std::int64_t k, __half* w, __half* dx, const UpdateScalars* scalars, cudaStream_t stream,
                       bool dependent, __half* bias, const UpdateScalars* bias_scalars, float* partials,
                       unsigned* arrivals, Activation activation, const __half* saved) {
  if (backward_reads_input(activation) && !saved)
    throw CudaError("one-pass dgrad+SGD: the activation's backward needs the pre-activation");
  const Instance in = instance_for(batch, grid.columns_per_warp, activation);
  const dim3 blocks{unsigned(grid.strips), unsigned(grid.ranges)};
  launch_dependent(in.kernel, {blocks, dim3(kThreads), in.smem}, stream, dependent, dy, x, int(n), int(k),
                   int(grid.rows_per_range), w, dx, scalars, bias, bias_scalars, partials, arrivals, saved);
}

}  // namespace sg::cuda::one_pass
