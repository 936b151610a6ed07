// The weight gradient's tile straight into an update rule (wgrad_update.hpp).
// A block of 8 warps owns a 64 x 64 tile of W. dY and X come in 64-row chunks
// of the batch through shared memory (zero past the edges; the next chunk's
// loads in flight during the products); the first chunk's loads go out
// before the quads of W and its state slots, so the small L2 reads are not queued behind
// the DRAM stream, whose latency hides behind the matmul. Each warp
// accumulates two 16 x 16 wmma tiles; the tile goes through shared memory
// once so each thread updates four contiguous quads of a row. With the bias
// riding along, the blocks of the first column tile also sum their 64 rows of
// dY over the batch from the staged chunks (four partial sums per row, added
// in order at the end) and update those bias elements.
#include <mma.h>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/fused_update/wgrad_update.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/quad_access.cuh"
#include "ops/cuda/update_rules/all_rules.cuh"
#include "ops/cuda/update_rules/each_slot.cuh"

namespace sg::cuda {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;            // rows and columns of W per block
constexpr int kChunk = 64;           // batch rows per shared-memory chunk
constexpr int kBlockThreads = 256;        // 8 warps: 4 row tiles x 2 pairs of column tiles
constexpr int kHalfLd = kTile + 8;   // padded rows (halves) of the dY and X chunks
constexpr int kAccLd = kTile + 4;    // padded rows (floats) of the gradient tile
constexpr int kQuads = kTile * kTile / 4 / kBlockThreads;  // 4 quads of W per thread

template <class Rule, typename W, typename G>
__global__ void __launch_bounds__(kBlockThreads) wgrad_update_kernel(const __half* dy, const __half* x, int batch, int n,
                                                                     int k, W* w, StateSlots state,
                                                                     const UpdateScalars* scalars,
                                                                     const std::int32_t* step, HyperOf<Rule> hyper,
                                                                     TileBias<Rule, W> bias) {
  constexpr int S = Rule::kStates;
  __shared__ __align__(128) __half dy_chunk[kChunk][kHalfLd];  // dY[b0 + b][row0 + i]
  __shared__ __align__(128) __half x_chunk[kChunk][kHalfLd];   // X[b0 + b][col0 + j]
  __shared__ __align__(128) float grad[kTile][kAccLd];
  __shared__ float bias_partial[kBlockThreads / kTile][kTile];  // [batch quarter][row of the tile]
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int t = threadIdx.x, warp = t / 32;
  const bool sums_bias = bias.bias != nullptr && blockIdx.x == 0;
  float bias_sum = 0.f;  // row row0 + t % 64 over the batch rows of quarter t / 64 of each chunk
  wait_for_previous_kernel();  // dY (and X) come from the kernels before
  // This thread's share of a chunk: elements e = t + kBlockThreads * i of the chunk's 16-byte pieces.
  constexpr int kPieces = kChunk * kTile / 8 / kBlockThreads;
  uint4 dy_v[kPieces], x_v[kPieces];
  const auto load_chunk = [&](int b0) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int e = t + kBlockThreads * i, b = e / (kTile / 8), c = 8 * (e % (kTile / 8));
      dy_v[i] = x_v[i] = make_uint4(0, 0, 0, 0);
      if (b0 + b < batch) {
        const __half* dy_row = dy + std::int64_t(b0 + b) * n;
        if (n % 8 == 0) {
          if (row0 + c < n) dy_v[i] = *reinterpret_cast<const uint4*>(dy_row + row0 + c);
        } else {  // rows not 16-byte aligned: by element, zero past N
          alignas(16) __half piece[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) piece[j] = row0 + c + j < n ? dy_row[row0 + c + j] : __float2half(0.f);
          dy_v[i] = *reinterpret_cast<const uint4*>(piece);
        }
        if (col0 + c < k) x_v[i] = *reinterpret_cast<const uint4*>(x + std::int64_t(b0 + b) * k + col0 + c);
      }
    }
  };
  // The first chunk's loads (L2) go out ahead of the DRAM stream of W and its slots.
  load_chunk(0);
  // Thread t's quads: row row0 + t / 16 + 16 q, columns col0 + 4 (t % 16) .. + 3.
  const int quad_row = t / 16, quad_col = 4 * (t % 16);
  const bool col_ok = col0 + quad_col < k;  // (k % 4 == 0: a quad is all in or all out)
  Quad<W> wq[kQuads];
  Quad<float> sq[S][kQuads];
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const int row = row0 + quad_row + 16 * q;
    if (row < n && col_ok) {
      const std::int64_t i = std::int64_t(row) * k + col0 + quad_col;
      wq[q] = load_quad(w + i);
      each_slot<Rule>(hyper, [&](auto slot) { sq[slot.value][q] = load_quad(state.slot[slot.value] + i); });
    }
  }
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  const int tile_row = warp / 2, tile_col = 2 * (warp % 2);
  for (int b0 = 0; b0 < batch; b0 += kChunk) {
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int e = t + kBlockThreads * i, b = e / (kTile / 8), c = 8 * (e % (kTile / 8));
      *reinterpret_cast<uint4*>(&dy_chunk[b][c]) = dy_v[i];
      *reinterpret_cast<uint4*>(&x_chunk[b][c]) = x_v[i];
    }
    __syncthreads();
    if (b0 + kChunk < batch) load_chunk(b0 + kChunk);  // in flight during this chunk's products
    if (sums_bias) {
      constexpr int kRowsEach = kChunk / (kBlockThreads / kTile);
#pragma unroll
      for (int b = 0; b < kRowsEach; ++b) bias_sum += __half2float(dy_chunk[(t / kTile) * kRowsEach + b][t % kTile]);
    }
#pragma unroll
    for (int kk = 0; kk < kChunk; kk += 16) {
      // A = dY^T: element (i, b) at dy_chunk[b][i], column-major.
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major> a;
      wmma::load_matrix_sync(a, &dy_chunk[kk][16 * tile_row], kHalfLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
        wmma::load_matrix_sync(b, &x_chunk[kk][16 * (tile_col + j)], kHalfLd);
        wmma::mma_sync(acc[j], a, b, acc[j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 2; ++j)
    wmma::store_matrix_sync(&grad[16 * tile_row][16 * (tile_col + j)], acc[j], kAccLd, wmma::mem_row_major);
  if (sums_bias) bias_partial[t / kTile][t % kTile] = bias_sum;
  __syncthreads();
  if (sums_bias && t < kTile && row0 + t < n) {
    float total = 0.f;
#pragma unroll
    for (int q = 0; q < kBlockThreads / kTile; ++q) total += bias_partial[q][t];
    const Rule bias_rule(bias.hyper, bias.scalars->lr, step, nullptr);
    float st[S];
    each_slot<Rule>(bias.hyper, [&](auto slot) { st[slot.value] = bias.state.slot[slot.value][row0 + t]; });
    W& b = bias.bias[row0 + t];
    b = from_float<W>(bias_rule(to_float(b), to_float(from_float<G>(total)), [&](int s) -> float& { return st[s]; }));
    each_slot<Rule>(bias.hyper, [&](auto slot) { bias.state.slot[slot.value][row0 + t] = st[slot.value]; });
  }
  const Rule rule(hyper, scalars->lr, step, nullptr);
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const int row = row0 + quad_row + 16 * q;
    if (row >= n || !col_ok) continue;
    const float4 g4 = *reinterpret_cast<const float4*>(&grad[quad_row + 16 * q][quad_col]);
    const float g[4] = {g4.x, g4.y, g4.z, g4.w};
#pragma unroll
    for (int e = 0; e < 4; ++e)  // the gradient as the matmul would have written it (type G)
      wq[q].v[e] = from_float<W>(rule(to_float(wq[q].v[e]), to_float(from_float<G>(g[e])),
                                      [&](int s) -> float& { return sq[s][q].v[e]; }));
    const std::int64_t i = std::int64_t(row) * k + col0 + quad_col;
    store_quad(w + i, wq[q]);
    each_slot<Rule>(hyper, [&](auto slot) { store_quad(state.slot[slot.value] + i, sq[slot.value][q]); });
  }
}

}  // namespace

std::string wgrad_update_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k) {
  if (batch <= 0 || n <= 0 || k <= 0) return fmt::format("empty sizes (batch {}, W [{},{}])", batch, n, k);
  if (k % 8 != 0) return fmt::format("W [{},{}]: columns a multiple of 8", n, k);
  if (batch > (1 << 24) || n > (1 << 24) || k > (1 << 24) || n * k > (std::int64_t(1) << 40))
    return fmt::format("batch {}, W [{},{}]: too large", batch, n, k);
  if ((n + kTile - 1) / kTile > 65535) return fmt::format("W [{},{}]: too many row tiles", n, k);
  return {};
}

template <class Rule, typename W, typename G>
void launch_wgrad_update(const __half* dy, const __half* x, std::int64_t batch, std::int64_t n, std::int64_t k, W* w,
                         StateSlots state, const UpdateScalars* scalars, const std::int32_t* step,
                         HyperOf<Rule> hyper, cudaStream_t stream, bool dependent, TileBias<Rule, W> bias) {
  if (const std::string why = wgrad_update_unsupported(batch, n, k); !why.empty())
    throw CudaError("weight gradient + update: unsupported: " + why);
  bool states_aligned = true;
  for (int s = 0; s < Rule::kStates; ++s)
    if (state.slot[s]) states_aligned = states_aligned && aligned16(state.slot[s]);
  if (bias.bias && !bias.scalars) throw CudaError("weight gradient + update: a bias without its update scalars");
  if (!aligned16(dy) || !aligned16(x) || !aligned16(w) || !states_aligned)
    throw CudaError("weight gradient + update: dY, X, W and the state slots must be 16-byte aligned");
  const dim3 grid(unsigned((k + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile));
  launch_dependent(wgrad_update_kernel<Rule, W, G>, {grid, dim3(kBlockThreads)}, stream, dependent, dy, x, int(batch),
                   int(n), int(k), w, state, scalars, step, hyper, bias);
}

#define SG_WGRAD_UPDATE(Rule, W, G)                                                                                \
  template void launch_wgrad_update<Rule, W, G>(const __half*, const __half*, std::int64_t, std::int64_t,          \
                                                std::int64_t, W*, StateSlots, const UpdateScalars*,                \
                                                const std::int32_t*, HyperOf<Rule>, cudaStream_t, bool,          \
                                                TileBias<Rule, W>);
#define SG_WGRAD_UPDATE_TYPES(Rule)       \
  SG_WGRAD_UPDATE(Rule, __half, __half)   \
  SG_WGRAD_UPDATE(Rule, float, __half)    \
  SG_WGRAD_UPDATE(Rule, float, float)
SG_FOR_EACH_UPDATE_RULE(SG_WGRAD_UPDATE_TYPES)
#undef SG_WGRAD_UPDATE_TYPES
#undef SG_WGRAD_UPDATE

}  // namespace sg::cuda
