// Small-batch forward (small_batch_forward.hpp). A block owns 16 output
// columns (16 rows of W); its 8 warps take K's 16-wide tiles in turn
// (warp w: tiles w, w + 8, ...), each holding its tiles of W as tensor-core
// fragments (loaded before the wait for the previous kernel) and summing
// x[:, tile] * W[cols, tile]^T into a B x 16 partial. The partials are added
// in warp order (deterministic), then the bias and the activation (a
// template argument: the ReLU instance is the kernel it always was).
#include <fmt/format.h>
#include <mma.h>

#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/small_batch_forward/small_batch_forward.hpp"

namespace sg::cuda {
namespace {

using namespace nvcuda;

constexpr int kWarps = 8;
constexpr int kColumns = 16;          // per block
constexpr int kMaxTilesPerWarp = 8;   // K <= kWarps * kMaxTilesPerWarp * 16
constexpr int kMaxK = kWarps * kMaxTilesPerWarp * 16;

using FragX = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragW = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;  // W^T: column c = W row c
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Lane r < B converts image row r's 16 pixels of tile t to fp16 in the warp's
// staging tile (and, in block 0, into x_out when a later launch reads x:
// every tile is some warp's there).
template <int B>
__device__ void stage_fetched_tile(const FoldedBatchFetch& f, int k, int t, const uint4& packed, __half (*stage)[16],
                                   int lane) {
  if (lane < B) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&packed);
    __align__(16) __half h[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) h[i] = __float2half(float(bytes[i]) * f.scale + f.shift);
    auto* dst = reinterpret_cast<uint4*>(stage[lane]);
    dst[0] = reinterpret_cast<const uint4*>(h)[0];
    dst[1] = reinterpret_cast<const uint4*>(h)[1];
    if (blockIdx.x == 0 && f.x_out) {
      auto* out = reinterpret_cast<uint4*>(f.x_out + std::int64_t(lane) * k + t * 16);
      out[0] = dst[0];
      out[1] = dst[1];
    }
  }
  __syncwarp();
}

// The epilogue without an activation (y = x W^T + b).
struct NoActivation {};

// Act: NoActivation or ActivationMath<A>.
template <int B, typename Act>
__global__ void __launch_bounds__(kWarps * 32)
    small_batch_linear_kernel(const __grid_constant__ SmallBatchLinear a) {
  constexpr int kMTiles = B / 16;
  __shared__ __align__(32) float partial[kWarps][B][kColumns];
  __shared__ __align__(32) __half stage[kWarps][B][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col0 = blockIdx.x * kColumns, tiles = a.k / 16;
  const bool fetch = a.fetch.images != nullptr;

  FragW wf[kMaxTilesPerWarp];
  float bias = 0.f;  // this thread's output column's (threadIdx.x % kColumns: see the epilogue)
  auto load_weight = [&] {
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t < tiles) wmma::load_matrix_sync(wf[i], a.w + std::int64_t(col0) * a.k + t * 16, a.k);
    }
    bias = __half2float(a.bias[col0 + threadIdx.x % kColumns]);
  };
  // The folded fetch's gather: lane r < B holds image row r's pixels of each
  // of the warp's tiles, and its label.
  uint4 pixels[kMaxTilesPerWarp];
  std::int32_t label = 0;
  auto gather = [&] {
    if (lane >= B) return;
    const unsigned batches = unsigned(a.fetch.rows) / B;  // (32-bit: rows < 2^31, checked at launch)
    const std::int64_t row = a.fetch.perm[std::int64_t(unsigned(*a.fetch.step) % batches) * B + lane];
    const std::uint8_t* image_row = a.fetch.images + row * a.k;
    label = a.fetch.labels[row];
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t < tiles) pixels[i] = *reinterpret_cast<const uint4*>(image_row + t * 16);
    }
  };
  if (a.load_weight_early) load_weight();
  if (fetch && a.fetch.gather_before_wait) gather();
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
  if (!a.load_weight_early) load_weight();
  if (fetch && !a.fetch.gather_before_wait) gather();

  FragAcc acc[kMTiles];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) wmma::fill_fragment(acc[m], 0.f);
  if (fetch) {
    // (every tile's 16 pixels were loaded before the first is converted: one round trip)
    if (blockIdx.x == 0 && warp == 0 && lane < B) a.fetch.labels_out[lane] = label;
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t >= tiles) break;
      stage_fetched_tile<B>(a.fetch, a.k, t, pixels[i], stage[warp], lane);
      FragX xf[kMTiles];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::load_matrix_sync(xf[m], &stage[warp][m * 16][0], 16);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::mma_sync(acc[m], xf[m], wf[i], acc[m]);
      __syncwarp();  // the staging tile is rewritten next round
    }
  } else {
    // Every tile of x this warp needs is requested before the first product.
    FragX xf[kMaxTilesPerWarp][kMTiles];
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      const int t = warp + i * kWarps;
      if (t < tiles)
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) wmma::load_matrix_sync(xf[i][m], a.x + std::int64_t(m) * 16 * a.k + t * 16, a.k);
    }
#pragma unroll
    for (int i = 0; i < kMaxTilesPerWarp; ++i) {
      if (warp + i * kWarps >= tiles) break;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) wmma::mma_sync(acc[m], xf[i][m], wf[i], acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
    wmma::store_matrix_sync(&partial[warp][m * 16][0], acc[m], kColumns, wmma::mem_row_major);
  __syncthreads();
  static_assert(kWarps * 32 % kColumns == 0, "a thread's outputs share its column");
  for (int e = threadIdx.x; e < B * kColumns; e += kWarps * 32) {
    const int r = e / kColumns, c = e % kColumns;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][r][c];
    sum += bias;
    const std::int64_t e_out = std::int64_t(r) * a.n + col0 + c;
    if constexpr (std::is_same_v<Act, ActivationMath<Activation::relu>>) {
      sum = Act::forward(sum);
    } else if constexpr (!std::is_same_v<Act, NoActivation>) {
      // act(z) of z rounded to fp16, as the graph's bias_add and activation nodes compute it
      const __half z = __float2half(sum);
      if (a.pre_activation) a.pre_activation[e_out] = z;
      sum = Act::forward(__half2float(z));
    }
    a.y[e_out] = __float2half(sum);
  }
}

}  // namespace

std::string small_batch_linear_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k) {
  if (batch != 16 && batch != 32) return fmt::format("batch {} (16 or 32 supported)", batch);
  if (n <= 0 || k <= 0 || n % kColumns != 0 || k % 16 != 0)
    return fmt::format("weight [{},{}] is not a multiple of 16 both ways", n, k);
  if (k > kMaxK) return fmt::format("K = {} above {}", k, kMaxK);
  if (n > (std::int64_t(1) << 24)) return fmt::format("N = {} too large", n);
  return {};
}

void launch_small_batch_linear(const SmallBatchLinear& args, cudaStream_t stream, bool dependent) {
  if (const std::string why = small_batch_linear_unsupported(args.batch, args.n, args.k); !why.empty())
    throw CudaError("small-batch forward: unsupported: " + why);
  if (args.fetch.images && (!args.fetch.perm || !args.fetch.step || !args.fetch.labels ||
                            !args.fetch.labels_out || args.fetch.rows < args.batch ||
                            args.fetch.rows >= (std::int64_t(1) << 31)))
    throw CudaError("small-batch forward: the folded batch fetch is missing a table or an output");
  if (args.activation == Activation::relu && args.pre_activation)
    throw CudaError("small-batch forward: a ReLU epilogue writes no pre-activation");
  const LaunchGeometry geometry{dim3(unsigned(args.n / kColumns)), dim3(kWarps * 32)};
  const auto launch = [&](auto act) {
    using Act = decltype(act);
    if (args.batch == 16) launch_dependent(small_batch_linear_kernel<16, Act>, geometry, stream, dependent, args);
    else launch_dependent(small_batch_linear_kernel<32, Act>, geometry, stream, dependent, args);
  };
  if (!args.activation) launch(NoActivation{});
  else with_activation(*args.activation, [&](auto a) { launch(ActivationMath<decltype(a)::value>{}); });
}

}  // namespace sg::cuda
