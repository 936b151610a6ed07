// One pass over W for a layer's dgrad and its SGD update, column-strip
// variant (dgrad_wgrad_kernels.hpp). Each block owns a strip of S columns of W and walks all N rows of it, 16 at
// a time, its 8 warps taking turns: a warp copies its 16 x S chunk of W and
// the matching 16 columns of dY to shared memory (its next chunks' loads
// already in flight: every operand of the math then comes from shared
// memory, nothing waits on a global load mid-chunk), adds
// dY[:, rows] * chunk to its dX partial, computes the chunk's gradient
// dY[:, rows]^T * X[:, strip], and writes the updated chunk back. The warps'
// dX partials are summed at the end and masked by X > 0.
#include <mma.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dgrad_wgrad_kernels.hpp"

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
};

template <int S, int B>
__global__ void __launch_bounds__(kThreads, 1)
    column_strips_kernel(const __half* dy, const __half* x, int n, int k, __half* w, __half* dx,
                           const SgdScalars* scalars, __half* bias, const SgdScalars* bias_scalars) {
  using L = Layout<S, B>;
  constexpr int kMTiles = B / 16, kSTiles = S / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  __half* xs = reinterpret_cast<__half*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __half* chunk = reinterpret_cast<__half*>(smem + L::x_bytes + warp * L::chunk_bytes);
  float* grad = reinterpret_cast<float*>(smem + L::x_bytes + kWarps * L::chunk_bytes + warp * L::grad_bytes);
  float* partial = reinterpret_cast<float*>(smem + L::x_bytes + kWarps * (L::chunk_bytes + L::grad_bytes));
  __half* dys = reinterpret_cast<__half*>(reinterpret_cast<unsigned char*>(partial) + L::partial_bytes + warp * L::dy_bytes);
  const int col0 = blockIdx.x * S;

  for (int i = threadIdx.x; i < B * S / 8; i += kThreads) {
    const int r = i / (S / 8), c = (i % (S / 8)) * 8;
    *reinterpret_cast<uint4*>(xs + r * S + c) = *reinterpret_cast<const uint4*>(x + std::int64_t(r) * k + col0 + c);
  }
  __syncthreads();
  const SgdScalars s = *scalars;

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
  auto load_chunk = [&](int row0, Chunk& regs) {
#pragma unroll
    for (int v = 0; v < L::kVectorsPerLane; ++v) {
      const Piece p = w_piece(v);
      regs.w[v] = *reinterpret_cast<const uint4*>(w + std::int64_t(row0 + p.row) * k + col0 + p.col);
    }
#pragma unroll
    for (int v = 0; v < L::kGradVectorsPerLane; ++v) {
      const Piece p = dy_piece(v);
      regs.dy[v] = *reinterpret_cast<const uint4*>(dy + std::int64_t(p.row) * n + row0 + p.col);
    }
  };
  // The warp's chunks are ch = warp, warp + 8, ...; kDepth of them are in
  // flight at any time (registers, a ring indexed by compile-time d).
  const int chunks = n / 16;
  Chunk ring[L::kDepth];
#pragma unroll
  for (int d = 0; d < L::kDepth; ++d)
    if (warp + d * kWarps < chunks) load_chunk((warp + d * kWarps) * 16, ring[d]);
  for (int first = warp; first < chunks; first += kWarps * L::kDepth) {
#pragma unroll
    for (int d = 0; d < L::kDepth; ++d) {
      const int ch = first + d * kWarps;
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
      const int refill = ch + kWarps * L::kDepth;
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
  for (int e = threadIdx.x; e < B * S; e += kThreads) {
    float sum = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += partial[wi * B * S + e];
    const int r = e / S, c = e % S;
    const __half v = __half2float(xs[e]) > 0.f ? __float2half(sum) : __float2half(0.f);
    dx[std::int64_t(r) * k + col0 + c] = v;
    if (bias) partial[e] = __half2float(v);  // slot e of warp 0's partials: only this thread reads it
  }
  if (!bias) return;
  __syncthreads();
  // The previous layer's bias gradient is the column sum of dx (as rounded).
  if (threadIdx.x < S) {
    float column_sum = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) column_sum += partial[r * S + threadIdx.x];
    const SgdScalars bs = *bias_scalars;
    __half* b = bias + col0 + threadIdx.x;
    *b = __float2half(bs.neg_lr * column_sum + bs.one_minus_lr_wd * __half2float(*b));
  }
}

// Strip width: 32 columns when that still gives ~one block per SM, else 16.
// (64 would need X's fragments and the dX accumulators in more registers
// than a thread has: measured slower.)
int strip_width(std::int64_t k) { return k % 32 == 0 && k / 32 >= 128 ? 32 : 16; }

// The instance for (S, B) and its shared-memory bytes.
struct Instance {
  void (*kernel)(const __half*, const __half*, int, int, __half*, __half*, const SgdScalars*, __half*,
                 const SgdScalars*);
  std::size_t smem;
  int strip;
};

template <int S, int B>
Instance instance() {
  return {column_strips_kernel<S, B>, Layout<S, B>::total, S};
}

template <int B>
Instance instance_for_strip(int strip) {
  return strip == 32 ? instance<32, B>() : instance<16, B>();
}

Instance instance_for(std::int64_t batch, std::int64_t k) {
  const int strip = strip_width(k);
  return batch == 16 ? instance_for_strip<16>(strip) : instance_for_strip<32>(strip);
}

}  // namespace

void prepare_column_strips(std::int64_t batch, std::int64_t k) {
  const Instance in = instance_for(batch, k);
  SG_CUDA_CHECK(cudaFuncSetAttribute(in.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(in.smem)));
}

void launch_column_strips(const __half* dy, const __half* x, std::int64_t batch, std::int64_t n, std::int64_t k,
                          __half* w, __half* dx, const SgdScalars* scalars, cudaStream_t stream, __half* bias,
                          const SgdScalars* bias_scalars) {
  const Instance in = instance_for(batch, k);
  in.kernel<<<unsigned(k / in.strip), kThreads, in.smem, stream>>>(dy, x, int(n), int(k), w, dx, scalars, bias,
                                                                   bias_scalars);
  SG_LAUNCH_CHECK("one-pass dgrad+SGD (column strips)");
}

}  // namespace sg::cuda::one_pass
