// One pass over W for a layer's dgrad and its SGD update, column-strip
// variant (dgrad_wgrad_kernels.hpp). Each block owns a strip of S columns of W and walks all N rows of it, 16 at
// a time, its 8 warps taking turns: a warp copies its 16 x S chunk of W and
// the matching 16 columns of dY to shared memory (its next chunks' loads
// already in flight: every operand of the math then comes from shared
// memory, nothing waits on a global load mid-chunk), adds
// dY[:, rows] * chunk to its dX partial, computes the chunk's gradient
// dY[:, rows]^T * X[:, strip], and writes the updated chunk back. The warps'
// dX partials are summed at the end and taken through the activation's
// backward (A, a template argument): for ReLU masked by X > 0, for tanh and
// sigmoid computed from X (their output), for gelu, gelu_tanh and silu from
// the pre-activation `saved` (read at the end).
//
// Where a block per strip would leave SMs idle (narrow layers), a cluster of
// R blocks shares a strip: block rank r's warp w takes chunks w*R + r,
// w*R + r + 8R, ...; ranks 1.. send their dX partial sums to rank 0's
// shared memory (DSMEM), which adds them in rank order, so the result does
// not depend on timing.
#include <cooperative_groups.h>
#include <fmt/format.h>
#include <mma.h>


#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "ops/cuda/kernel_limits.hpp"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda::one_pass {
namespace {

using namespace nvcuda;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <int S, int B>
struct Layout {
  static constexpr int kChunkVectors = 16 * S / 8;                  // uint4 per 16 x S chunk of W
  static constexpr int kVectorsPerLane = kChunkVectors / 32;
  static constexpr int kGradVectorsPerLane = B * 16 / 8 / 32;       // uint4 per lane of dY[:, 16 rows]
  // Chunks in flight per warp (a ring of registers): ~16 uint4 per lane.
  static constexpr int kDepth = 16 / (kVectorsPerLane + kGradVectorsPerLane) > 0
                                    ? 16 / (kVectorsPerLane + kGradVectorsPerLane) : 1;
  static constexpr std::size_t dy_bytes = std::size_t(B) * 16 * 2;    // per warp: dY[:, 16 rows], fp16
  static constexpr std::size_t x_bytes = std::size_t(B) * S * 2;     // X strip, fp16
  static constexpr std::size_t chunk_bytes = std::size_t(16) * S * 2;  // per warp: W chunk, fp16
  static constexpr int kGradLd = S + 4;  // padded: the update's float4 reads spread over the banks
  static constexpr std::size_t grad_bytes = std::size_t(16) * kGradLd * 4;  // per warp: chunk gradient, fp32
  static constexpr std::size_t partial_bytes = std::size_t(kWarps) * B * S * 4;  // dX partials, fp32
  static constexpr std::size_t total = x_bytes + kWarps * (chunk_bytes + grad_bytes + dy_bytes) + partial_bytes;
  static constexpr std::size_t incoming_bytes = std::size_t(B) * S * 4;  // per sending rank: its dX partial sum
};

constexpr int kMaxSplits = kMaxStripSplits;  // blocks sharing a strip (a portable cluster size)

// The folded first-layer update (InputLayerUpdate) of rows col0 .. col0+S-1
// of W_in: warp w takes W_in's 16-column tiles w, w + 8, ...; each tile's
// gradient is dX[:, strip]^T (dxs: [B][S] fp16, as written) times X_in's
// tile, staged in the warp's `grad` scratch; the old rows and X_in come
// from shared memory (`rows`: [S][width], `xin`: [B][width], copied in at
// the start).
template <int S, int B>
__device__ void update_input_rows(const InputLayerUpdate& input, const UpdateScalars& s, int col0, const __half* dxs,
                                  const __half* rows, const __half* xin, float* grad, int warp, int lane) {
  constexpr int kMTiles = B / 16, kSTiles = S / 16, kLd = Layout<S, B>::kGradLd;
  FragAT dxt[kMTiles][kSTiles];  // dX^T's tiles: the same for every column tile
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) wmma::load_matrix_sync(dxt[m][t], dxs + m * 16 * S + t * 16, S);
  const int r = lane / 2, c = (lane % 2) * 8;  // this lane's 8 weights of each 16 x 16 tile
  for (int ct = warp; ct < input.width / 16; ct += kWarps) {
    FragB xb[kMTiles];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
      wmma::load_matrix_sync(xb[m], xin + m * 16 * input.width + ct * 16, input.width);
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) {
      FragC g;
      wmma::fill_fragment(g, 0.f);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::mma_sync(g, dxt[m][t], xb[m], g);
      wmma::store_matrix_sync(grad, g, kLd, wmma::mem_row_major);
      __syncwarp();
      const int row = t * 16 + r, col = ct * 16 + c;
      uint4 packed = *reinterpret_cast<const uint4*>(rows + row * input.width + col);
      auto* h = reinterpret_cast<__half*>(&packed);
#pragma unroll
      for (int q = 0; q < 8; ++q)
        h[q] = __float2half(s.neg_lr * grad[r * kLd + c + q] + s.one_minus_lr_wd * __half2float(h[q]));
      *reinterpret_cast<uint4*>(input.w + std::int64_t(col0 + row) * input.width + col) = packed;
      __syncwarp();
    }
  }
}

template <int S, int B, Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    column_strips_kernel(const __half* dy, const __half* x, int n, int k, __half* w, __half* dx,
                           const UpdateScalars* scalars, __half* bias, const UpdateScalars* bias_scalars,
                           const InputLayerUpdate input, const __half* saved) {
  using L = Layout<S, B>;
  constexpr int kMTiles = B / 16, kSTiles = S / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* xs = reinterpret_cast<__half*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __half* chunk = reinterpret_cast<__half*>(smem + L::x_bytes + warp * L::chunk_bytes);
  float* grad = reinterpret_cast<float*>(smem + L::x_bytes + kWarps * L::chunk_bytes + warp * L::grad_bytes);
  float* partial = reinterpret_cast<float*>(smem + L::x_bytes + kWarps * (L::chunk_bytes + L::grad_bytes));
  __half* dys = reinterpret_cast<__half*>(reinterpret_cast<unsigned char*>(partial) + L::partial_bytes + warp * L::dy_bytes);
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  float* incoming = reinterpret_cast<float*>(smem + L::total);  // [splits - 1][B][S], rank 0's receives
  const int col0 = (blockIdx.x / splits) * S;
  // The folded first-layer update's rows of W_in and the network input X_in
  // (rank 0 only), in flight from here: no kernel still running writes them
  // (X_in's writer, the step's first launch, completed before the
  // kernel before this one started).
  __half* input_rows = reinterpret_cast<__half*>(smem + L::total + (splits - 1) * L::incoming_bytes);
  __half* input_x = input_rows + S * input.width;
  if (input.w && rank == 0) {
    for (int i = threadIdx.x; i < S * input.width / 8; i += kThreads)
      copy_async16(shared_address(input_rows + i * 8), input.w + std::int64_t(col0) * input.width + i * 8);
    for (int i = threadIdx.x; i < B * input.width / 8; i += kThreads)
      copy_async16(shared_address(input_x + i * 8), input.x + i * 8);
    commit_copies();
  }
  // Split barrier: no block stores into rank 0's shared memory before rank 0 has started (waited at the end).
  if (splits > 1) cluster_arrive();

  for (int i = threadIdx.x; i < B * S / 8; i += kThreads) {
    const int r = i / (S / 8), c = (i % (S / 8)) * 8;
    *reinterpret_cast<uint4*>(xs + r * S + c) = *reinterpret_cast<const uint4*>(x + std::int64_t(r) * k + col0 + c);
  }
  __syncthreads();
  const UpdateScalars s = *scalars;
  // What the end of the kernel updates besides W, loaded now (only this
  // kernel writes them, in the previous step): this thread's column of the
  // previous layer's bias (see the column sums below) and the SGD scalars.
  constexpr int kLanesPerColumn = kThreads / S;
  const int bias_column = threadIdx.x / kLanesPerColumn;
  const float bias_old = bias && rank == 0 ? __half2float(bias[col0 + bias_column]) : 0.f;
  const UpdateScalars bias_sgd = bias && rank == 0 ? *bias_scalars : UpdateScalars{};
  const UpdateScalars input_sgd = input.w && rank == 0 ? *input.scalars : UpdateScalars{};

  // X's fragments are the same for every chunk: load them once.
  FragB xb[kMTiles][kSTiles];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) wmma::load_matrix_sync(xb[m][t], xs + m * 16 * S + t * 16, S);

  FragC acc[kMTiles][kSTiles];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int t = 0; t < kSTiles; ++t) wmma::fill_fragment(acc[m][t], 0.f);

  // Where lane's v-th 16-byte piece sits: in a 16 x S chunk of W (row, column)
  // and in dY[:, 16 rows] (batch row, column).
  struct Piece {
    int row, col;
  };
  auto w_piece = [&](int v) {
    const int i = lane + v * 32;
    return Piece{i / (S / 8), (i % (S / 8)) * 8};
  };
  auto dy_piece = [&](int v) {
    const int i = lane + v * 32;
    return Piece{i / 2, (i % 2) * 8};
  };
  // A chunk: rows row0.. row0+15 of W's strip, and the same 16 columns of dY.
  struct Chunk {
    uint4 w[L::kVectorsPerLane];
    uint4 dy[L::kGradVectorsPerLane];
  };
  auto load_w = [&](int row0, Chunk& regs) {
#pragma unroll
    for (int v = 0; v < L::kVectorsPerLane; ++v) {
      const Piece p = w_piece(v);
      regs.w[v] = *reinterpret_cast<const uint4*>(w + std::int64_t(row0 + p.row) * k + col0 + p.col);
    }
  };
  auto load_dy = [&](int row0, Chunk& regs) {
#pragma unroll
    for (int v = 0; v < L::kGradVectorsPerLane; ++v) {
      const Piece p = dy_piece(v);
      regs.dy[v] = *reinterpret_cast<const uint4*>(dy + std::int64_t(p.row) * n + row0 + p.col);
    }
  };
  auto load_chunk = [&](int row0, Chunk& regs) {
    load_w(row0, regs);
    load_dy(row0, regs);
  };
  // The warp's chunks are ch = first, first + stride, ...; kDepth of them
  // are in flight at any time (registers, a ring indexed by compile-time d).
  // The first W loads go out before the wait for the kernel that writes dY.
  const int chunks = n / 16, stride = kWarps * splits, first_chunk = warp * splits + rank;
  Chunk ring[L::kDepth];
#pragma unroll
  for (int d = 0; d < L::kDepth; ++d)
    if (first_chunk + d * stride < chunks) load_w((first_chunk + d * stride) * 16, ring[d]);
  wait_for_previous_kernel();
  // Only now may the next kernel start: every kernel before this one has
  // completed, which the next step's first launch relies on (it gathers its
  // batch before its own wait; small_batch_forward.hpp).
  allow_next_kernel_to_start();
#pragma unroll
  for (int d = 0; d < L::kDepth; ++d)
    if (first_chunk + d * stride < chunks) load_dy((first_chunk + d * stride) * 16, ring[d]);
  for (int first = first_chunk; first < chunks; first += stride * L::kDepth) {
#pragma unroll
    for (int d = 0; d < L::kDepth; ++d) {
      const int ch = first + d * stride;
      if (ch >= chunks) break;
      const int row0 = ch * 16;
#pragma unroll
      for (int v = 0; v < L::kVectorsPerLane; ++v) {
        const Piece p = w_piece(v);
        *reinterpret_cast<uint4*>(chunk + p.row * S + p.col) = ring[d].w[v];
      }
#pragma unroll
      for (int v = 0; v < L::kGradVectorsPerLane; ++v) {  // dys: [B][16], row-major
        const Piece p = dy_piece(v);
        *reinterpret_cast<uint4*>(dys + p.row * 16 + p.col) = ring[d].dy[v];
      }
      uint4 current[L::kVectorsPerLane];  // this lane's weights, kept for the update
#pragma unroll
      for (int v = 0; v < L::kVectorsPerLane; ++v) current[v] = ring[d].w[v];
      const int refill = ch + stride * L::kDepth;
      if (refill < chunks) load_chunk(refill * 16, ring[d]);
      __syncwarp();
      // dX partial += dY[:, rows] * chunk
      FragA a[kMTiles];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::load_matrix_sync(a[m], dys + m * 16 * 16, 16);
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
        FragB b;
        wmma::load_matrix_sync(b, chunk + t * 16, S);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) wmma::mma_sync(acc[m][t], a[m], b, acc[m][t]);
      }
      // the chunk's gradient dY[:, rows]^T X[:, strip]
      FragAT at[kMTiles];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::load_matrix_sync(at[m], dys + m * 16 * 16, 16);
#pragma unroll
      for (int t = 0; t < kSTiles; ++t) {
        FragC g;
        wmma::fill_fragment(g, 0.f);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) wmma::mma_sync(g, at[m], xb[m][t], g);
        wmma::store_matrix_sync(grad + t * 16, g, L::kGradLd, wmma::mem_row_major);
      }
      __syncwarp();
#pragma unroll
      for (int v = 0; v < L::kVectorsPerLane; ++v) {
        const auto [r, c] = w_piece(v);
        uint4 packed = current[v];
        auto* h = reinterpret_cast<__half*>(&packed);
        const float4 g0 = *reinterpret_cast<const float4*>(grad + r * L::kGradLd + c);
        const float4 g1 = *reinterpret_cast<const float4*>(grad + r * L::kGradLd + c + 4);
        const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
        for (int q = 0; q < 8; ++q) h[q] = __float2half(s.neg_lr * g[q] + s.one_minus_lr_wd * __half2float(h[q]));
        *reinterpret_cast<uint4*>(w + std::int64_t(row0 + r) * k + col0 + c) = packed;
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int t = 0; t < kSTiles; ++t)
      wmma::store_matrix_sync(partial + warp * B * S + m * 16 * S + t * 16, acc[m][t], S, wmma::mem_row_major);
  __syncthreads();
  // This block's dX partial: its warps' partials added in warp order.
  const auto block_sum = [&](int e) {
    float sum = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += partial[wi * B * S + e];
    return sum;
  };
  if (splits > 1) {
    cluster_wait();  // (the arrive at the top) rank 0 is running
    if (rank != 0) {
      float* target = cluster.map_shared_rank(incoming, 0) + (rank - 1) * B * S;
      for (int e = threadIdx.x; e < B * S; e += kThreads) target[e] = block_sum(e);
    }
    cluster_arrive();  // the sums are in rank 0's shared memory once all have arrived
    cluster_wait();
    if (rank != 0) return;
  }
  for (int e = threadIdx.x; e < B * S; e += kThreads) {
    float sum = block_sum(e);
    for (int q = 0; q < splits - 1; ++q) sum += incoming[q * B * S + e];  // rank order
    const int r = e / S, c = e % S;
    __half v;
    if constexpr (A == Activation::relu)  // (the select this kernel always made: the ReLU instance is unchanged)
      v = __half2float(xs[e]) > 0.f ? __float2half(sum) : __float2half(0.f);
    else
      v = __float2half(ActivationMath<A>::backward(
          sum, __half2float(kBackwardReadsInput<A> ? saved[std::int64_t(r) * k + col0 + c] : xs[e])));
    if (dx) dx[std::int64_t(r) * k + col0 + c] = v;
    if (bias) partial[e] = __half2float(v);  // slot e of warp 0's partials: only this thread reads it
    xs[e] = v;  // (only this thread read xs[e]; the folded input update reads dX from here)
  }
  if (!bias && !input.w) return;
  if (input.w) wait_copies<0>();
  __syncthreads();
  // The previous layer's bias gradient is the column sum of dx (as rounded):
  // kThreads / S lanes per column (of one warp) each add every such row, then
  // a butterfly over them (not one thread's serial chain of B adds).
  if (bias) {
    static_assert(kLanesPerColumn <= 32 && B % kLanesPerColumn == 0, "a column's lanes are in one warp");
    const int g = threadIdx.x % kLanesPerColumn;
    float column_sum = 0.f;
#pragma unroll
    for (int r = g; r < B; r += kLanesPerColumn) column_sum += partial[r * S + bias_column];
    column_sum = warp_sum<kLanesPerColumn>(column_sum);
    if (g == 0)
      bias[col0 + bias_column] = __float2half(bias_sgd.neg_lr * column_sum + bias_sgd.one_minus_lr_wd * bias_old);
  }
  if (input.w) update_input_rows<S, B>(input, input_sgd, col0, xs, input_rows, input_x, grad, warp, lane);
}

// Strip width: 32 columns when that still gives ~one block per SM, else 16.
// (64 would need X's fragments and the dX accumulators in more registers
// than a thread has: measured slower.)
int strip_width(std::int64_t k) { return k % 32 == 0 && k / 32 >= 128 ? 32 : 16; }

// The instance for (S, B) and its shared-memory bytes.
struct Instance {
  void (*kernel)(const __half*, const __half*, int, int, __half*, __half*, const UpdateScalars*, __half*,
                 const UpdateScalars*, InputLayerUpdate, const __half*);
  std::size_t smem;
  int strip;
};

template <int S, int B, Activation A>
Instance instance() {
  return {column_strips_kernel<S, B, A>, Layout<S, B>::total, S};
}

template <int B, Activation A>
Instance instance_for_strip(int strip) {
  return strip == 32 ? instance<32, B, A>() : instance<16, B, A>();
}

template <int B>
std::size_t strip_incoming_bytes(int strip) {
  return strip == 32 ? Layout<32, B>::incoming_bytes : Layout<16, B>::incoming_bytes;
}

Instance instance_for(std::int64_t batch, std::int64_t k, Activation activation) {
  const int strip = strip_width(k);
  return with_activation(activation, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    return batch == 16 ? instance_for_strip<16, A>(strip) : instance_for_strip<32, A>(strip);
  });
}

// Blocks per strip: double while the blocks still fit the SMs once and every
// warp keeps at least kMinChunksPerWarp chunks of 16 rows. Measured inside
// the step (H100, batch 32, docs/performance.md section 15): K = N = 1024
// with 2 blocks per strip (4 chunks a warp) 42.0 -> 39.9 us per step; 512
// with 4 (1 chunk a warp) 34.4 -> 37.5, slower.
constexpr int kMinChunksPerWarp = 4;

int strip_splits(std::int64_t strips, std::int64_t chunks) {
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) < 9) return 1;  // clusters: Hopper on
  const std::int64_t sms = multiprocessor_count();
  int splits = 1;
  while (splits * 2 <= kMaxSplits && strips * splits * 2 <= sms &&
         chunks >= std::int64_t(kWarps) * splits * 2 * kMinChunksPerWarp)
    splits *= 2;
  return splits;
}

}  // namespace

ColumnStripGrid plan_column_strips(std::int64_t batch, std::int64_t n, std::int64_t k, int splits,
                                   int input_width, Activation activation) {
  const Instance in = instance_for(batch, k, activation);
  ColumnStripGrid grid;
  grid.strips = k / in.strip;
  grid.splits = splits > 0 ? splits : strip_splits(grid.strips, n / 16);
  if (grid.splits < 1 || grid.splits > kMaxSplits || (grid.splits & (grid.splits - 1)) != 0)
    throw CudaError(fmt::format("one-pass dgrad+SGD: {} blocks per strip (a power of two up to {})", grid.splits,
                                kMaxSplits));
  grid.smem = in.smem + std::size_t(grid.splits - 1) * (batch == 16 ? strip_incoming_bytes<16>(in.strip)
                                                                    : strip_incoming_bytes<32>(in.strip));
  grid.smem += std::size_t(in.strip + batch) * input_width * sizeof(__half);  // the folded update's W_in rows, X_in
  SG_CUDA_CHECK(cudaFuncSetAttribute(in.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(grid.smem)));
  return grid;
}

void launch_column_strips(const ColumnStripGrid& grid, const __half* dy, const __half* x, std::int64_t batch,
                          std::int64_t n, std::int64_t k, __half* w, __half* dx, const UpdateScalars* scalars,
                          cudaStream_t stream, bool dependent, __half* bias, const UpdateScalars* bias_scalars,
                          const InputLayerUpdate& input, Activation activation, const __half* saved) {
  if (backward_reads_input(activation) && !saved)
    throw CudaError("one-pass dgrad+SGD: the activation's backward needs the pre-activation");
  const Instance in = instance_for(batch, k, activation);
  const LaunchGeometry geometry{dim3(unsigned(grid.strips * grid.splits)), dim3(kThreads), grid.smem,
                                unsigned(grid.splits)};
  launch_dependent(in.kernel, geometry, stream, dependent, dy, x, int(n), int(k), w, dx, scalars, bias, bias_scalars,
                   input, saved);
}

}  // namespace sg::cuda::one_pass
