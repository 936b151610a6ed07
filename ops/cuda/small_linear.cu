// Kernels for the classifier layer's matmuls (see small_linear.hpp): CUDA
// cores, and tensor cores for the forward of many rows. All of them are
// dependent launches (dependent_launch.cuh) that wait before reading.
#include <cooperative_groups.h>

#include <algorithm>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/small_linear.hpp"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;      // the forward: a warp per output
constexpr int kRowGroups = 8;          // the weight gradient: chains of rows y, y + 8, ...
constexpr int kDgradThreads = 128;     // the dgrad: a thread per 8 columns of a row
constexpr int kTileRows = 16;          // the tensor-core forward: rows of x per block
constexpr int kTileClasses = 16;       // ... and outputs (two 8-wide mma tiles)
constexpr int kMaxSplits = 8;          // ... and blocks of a cluster splitting K
constexpr int kStepsInFlight = 8;      // ... and 16-wide K steps a warp loads before multiplying

// Adds the products of 8 halves of x and w to acc.
__device__ __forceinline__ float dot8(const uint4& xv, const uint4& wv, float acc) {
  const auto* x2 = reinterpret_cast<const __half2*>(&xv);
  const auto* w2 = reinterpret_cast<const __half2*>(&wv);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 a = __half22float2(x2[q]), b = __half22float2(w2[q]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// x's halves as the forward multiplies them: themselves, or (kActive) their
// activation rounded to fp16 (the element-wise kernel's rounding point).
template <bool kActive, Activation A>
__device__ __forceinline__ __half input_half(__half x) {
  if constexpr (kActive) return from_float<__half>(ActivationMath<A>::forward(to_float(x)));
  else return x;
}
template <bool kActive, Activation A, typename Word>
__device__ __forceinline__ Word input_word(Word word) {
  if constexpr (kActive) {
    auto* h = reinterpret_cast<__half*>(&word);
#pragma unroll
    for (int i = 0; i < int(sizeof(Word) / sizeof(__half)); ++i) h[i] = input_half<true, A>(h[i]);
  }
  return word;
}

// Output (r, c) = dot(x row r, w row c) + bias[c]: one warp per output, so
// the loads in flight are many (a warp per row of x, looping over the N rows
// of w, took 76 us at batch 1024 x 4096: each warp's loads waited in turn).
// The warps of a block share x rows through L1. Lanes stride K 8 halves at a
// time when K % 8 == 0 and both are 16-byte aligned (`vectors`), else one.
// With kActive, x's activation (input_half) is multiplied, and the warps of
// output column 0 write it to `activated` (when not null).
template <bool kActive, Activation A>
__global__ void linear_small_n_kernel(const __half* x, const __half* w, const __half* bias, std::int64_t m,
                                      std::int64_t n, std::int64_t k, bool vectors, __half* y, __half* activated) {
  // A dependent launch: x comes from the kernel before. The output-layer
  // backward that follows is one too; it may start once x's writer is
  // complete (its loads of h need that), and waits for these logits.
  const std::int64_t out = std::int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // (the bias before the wait: the kernels before this one do not write it)
  const float b = out < m * n ? __half2float(bias[out % n]) : 0.f;
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
  if (out >= m * n) return;  // whole warps leave together
  const std::int64_t r = out / n, c = out % n;
  const __half* xr = x + r * k;
  const __half* wc = w + c * k;
  __half* const activated_row = kActive && activated && c == 0 ? activated + r * k : nullptr;
  float s = 0.f;
  if (vectors) {
    const auto* x8 = reinterpret_cast<const uint4*>(xr);
    const auto* w8 = reinterpret_cast<const uint4*>(wc);
#pragma unroll 4
    for (std::int64_t i = lane; i < k / 8; i += 32) {
      const uint4 xv = input_word<kActive, A>(x8[i]);
      if (kActive && activated_row) reinterpret_cast<uint4*>(activated_row)[i] = xv;
      s = dot8(xv, w8[i], s);
    }
  } else {
#pragma unroll 4
    for (std::int64_t i = lane; i < k; i += 32) {
      const __half xv = input_half<kActive, A>(xr[i]);
      if (kActive && activated_row) activated_row[i] = xv;
      s = fmaf(__half2float(xv), __half2float(wc[i]), s);
    }
  }
  s = warp_sum(s);
  if (lane == 0) y[out] = __float2half(s + b);
}

// The same output for many rows (batch 256/1024) on tensor cores: a block
// owns 16 rows of x and all N <= 16 outputs over one slice of K, its 8 warps
// take the slice's 16-wide steps in turn (mma.m16n8k16, operands loaded
// straight from global memory in fragment order, kStepsInFlight steps per
// round trip); the blocks of a cluster split K and add their partial sums
// in rank order in rank 0's shared memory, so the result does not depend on
// timing. The warp-per-output kernel above re-reads a row of w for every
// output: 42 MB of loads at 256 x 8192 (19 us in the step's profile). Each
// x word is loaded by one lane of the grid: with kActive it multiplies the
// word's activation and writes that to `activated` (when not null).
template <bool kActive, Activation A>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    linear_small_n_mma_kernel(const __half* x, const __half* w, const __half* bias, int m, int n, int k, int slice,
                              __half* y, __half* activated) {
  __shared__ float warp_sums[kWarpsPerBlock][kTileRows][kTileClasses];
  __shared__ float rank_sums[kMaxSplits][kTileRows][kTileClasses];  // rank 0's: every rank's block sum
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  if (splits > 1) cluster_arrive();  // waited for before writing to rank 0 (it must be running)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = blockIdx.y * kTileRows;
  const int k_begin = rank * slice, k_end = min(k, k_begin + slice);
  // (the bias before the wait: the kernels before this one do not write it)
  const int out_row = threadIdx.x / kTileClasses, out_class = threadIdx.x % kTileClasses;
  const float b = out_class < n ? __half2float(bias[out_class]) : 0.f;
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
  // Lane (g, t)'s words: x rows row0 + g and + 8, w rows (classes) g and 8 + g.
  const auto word = [](const __half* p) { return *reinterpret_cast<const std::uint32_t*>(p); };
  const bool x_lo = row0 + g < m, x_hi = row0 + g + 8 < m, w_lo = g < n, w_hi = g + 8 < n;
  const __half* x_lo_row = x + std::int64_t(min(row0 + g, m - 1)) * k + 2 * t;
  const __half* x_hi_row = x + std::int64_t(min(row0 + g + 8, m - 1)) * k + 2 * t;
  const __half* w_lo_row = w + std::int64_t(min(g, n - 1)) * k + 2 * t;
  const __half* w_hi_row = w + std::int64_t(min(g + 8, n - 1)) * k + 2 * t;
  // (rows past m point at the last row: their words are neither loaded nor written)
  __half* const act_lo_row = activated ? activated + std::int64_t(min(row0 + g, m - 1)) * k + 2 * t : nullptr;
  __half* const act_hi_row = activated ? activated + std::int64_t(min(row0 + g + 8, m - 1)) * k + 2 * t : nullptr;
  float acc[2][4] = {};
  for (int k0 = k_begin + warp * 16; k0 < k_end; k0 += kWarpsPerBlock * 16 * kStepsInFlight) {
    std::uint32_t a[kStepsInFlight][4], b_lo[kStepsInFlight][2], b_hi[kStepsInFlight][2];
#pragma unroll
    for (int s = 0; s < kStepsInFlight; ++s) {
      const int kk = k0 + s * kWarpsPerBlock * 16;
      const bool in = kk < k_end;
      a[s][0] = in && x_lo ? word(x_lo_row + kk) : 0u;
      a[s][1] = in && x_hi ? word(x_hi_row + kk) : 0u;
      a[s][2] = in && x_lo ? word(x_lo_row + kk + 8) : 0u;
      a[s][3] = in && x_hi ? word(x_hi_row + kk + 8) : 0u;
      b_lo[s][0] = in && w_lo ? word(w_lo_row + kk) : 0u;
      b_lo[s][1] = in && w_lo ? word(w_lo_row + kk + 8) : 0u;
      b_hi[s][0] = in && w_hi ? word(w_hi_row + kk) : 0u;
      b_hi[s][1] = in && w_hi ? word(w_hi_row + kk + 8) : 0u;
    }
    if constexpr (kActive) {
#pragma unroll
      for (int s = 0; s < kStepsInFlight; ++s) {
        const int kk = k0 + s * kWarpsPerBlock * 16;
        if (kk >= k_end) continue;  // (zero words stay zero: sigmoid(0) is not)
        const auto put = [&](std::uint32_t& a_word, bool row_in, __half* row, int at) {
          if (!row_in) return;
          a_word = input_word<true, A>(a_word);
          if (row) *reinterpret_cast<std::uint32_t*>(row + at) = a_word;
        };
        put(a[s][0], x_lo, act_lo_row, kk);
        put(a[s][1], x_hi, act_hi_row, kk);
        put(a[s][2], x_lo, act_lo_row, kk + 8);
        put(a[s][3], x_hi, act_hi_row, kk + 8);
      }
    }
#pragma unroll
    for (int s = 0; s < kStepsInFlight; ++s) {
      mma_16x8x16(acc[0], a[s], b_lo[s][0], b_lo[s][1]);
      mma_16x8x16(acc[1], a[s], b_hi[s][0], b_hi[s][1]);
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    warp_sums[warp][g][8 * j + 2 * t] = acc[j][0];
    warp_sums[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    warp_sums[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    warp_sums[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  // A thread per output of the tile (256 of them): the warps' sums in warp order.
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < kWarpsPerBlock; ++v) sum += warp_sums[v][out_row][out_class];
  if (splits > 1) {
    cluster_wait();
    cluster.map_shared_rank(&rank_sums[0][0][0], 0)[(rank * kTileRows + out_row) * kTileClasses + out_class] = sum;
    cluster_arrive();  // rank 0 reads the sums once every rank has arrived
    cluster_wait();
    if (rank != 0) return;
    sum = 0.f;
    for (int r = 0; r < splits; ++r) sum += rank_sums[r][out_row][out_class];
  }
  if (row0 + out_row < m && out_class < n) y[std::int64_t(row0 + out_row) * n + out_class] = __float2half(sum + b);
}

// w[row, col] -= lr * sum over the batch of dy[b, row] x[b, col]: a block
// owns 32 columns (a lane each) for every row, so x is read once; its 8
// warps are the row chains b = y, y + 8, ..., added in chain order through
// shared memory (the order of the fused output-layer backward, so the bits
// match it).
template <typename W, int MaxM>
__global__ void __launch_bounds__(32 * kRowGroups) wgrad_sgd_small_m_kernel(const __half* dy, const __half* x,
                                                                             std::int64_t batch, std::int64_t m,
                                                                             std::int64_t k, bool dy_pairs, W* w,
                                                                             const UpdateScalars* scalars) {
  __shared__ float partial[kRowGroups][MaxM][32];
  wait_for_previous_kernel();  // (a dependent launch: dy comes from the kernel before)
  allow_next_kernel_to_start();
  const int lane = threadIdx.x, chain = threadIdx.y;
  const std::int64_t col = std::int64_t(blockIdx.x) * 32 + lane;
  float acc[MaxM];
#pragma unroll
  for (int row = 0; row < MaxM; ++row) acc[row] = 0.f;
  if (col < k) {
#pragma unroll 4
    for (std::int64_t b = chain; b < batch; b += kRowGroups) {
      const float xv = __half2float(x[b * k + col]);
      const __half* dy_b = dy + b * m;
      if (dy_pairs) {  // half the loads of dy's row (it is the same for the whole warp)
        const auto* dy2 = reinterpret_cast<const __half2*>(dy_b);
#pragma unroll
        for (int q = 0; q < MaxM / 2; ++q)
          if (2 * q < m) {
            const float2 d = __half22float2(dy2[q]);
            acc[2 * q] += d.x * xv;
            acc[2 * q + 1] += d.y * xv;
          }
      } else {
#pragma unroll
        for (int row = 0; row < MaxM; ++row)
          if (row < m) acc[row] += __half2float(dy_b[row]) * xv;
      }
    }
  }
#pragma unroll
  for (int row = 0; row < MaxM; ++row) partial[chain][row][lane] = acc[row];
  __syncthreads();
  if (col >= k) return;
  const UpdateScalars s = *scalars;
  for (int row = chain; row < m; row += kRowGroups) {
    float g = 0.f;
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) g += partial[y][row][lane];
    const std::int64_t e = row * k + col;
    w[e] = from_float<W>(s.neg_lr * g + s.one_minus_lr_wd * to_float(w[e]));
  }
}

// dx[r, col] = act'(sum over c of dy[r, c] w[c, col], c in order) given the
// saved value (for ReLU: the mask relu_out > 0). A block row per row of dx
// (grid y), a thread per 8 columns when N % 8 == 0 and the arrays are
// 16-byte aligned, else per column.
template <int Cols, Activation A>
__global__ void dgrad_activation_small_k_kernel(const __half* dy, const __half* w, const __half* saved, std::int64_t m,
                                                std::int64_t n, std::int64_t k, __half* dx) {
  wait_for_previous_kernel();  // (a dependent launch: dy comes from the kernel before)
  allow_next_kernel_to_start();
  const std::int64_t col0 = (std::int64_t(blockIdx.x) * kDgradThreads + threadIdx.x) * Cols;
  if (col0 >= n) return;
  for (std::int64_t r = blockIdx.y; r < m; r += gridDim.y) {
    float s[Cols];
#pragma unroll
    for (int j = 0; j < Cols; ++j) s[j] = 0.f;
#pragma unroll 4
    for (std::int64_t c = 0; c < k; ++c) {
      const float d = __half2float(dy[r * k + c]);
      alignas(16) __half wc[Cols];
      if constexpr (Cols == 8) *reinterpret_cast<uint4*>(wc) = *reinterpret_cast<const uint4*>(w + c * n + col0);
      else wc[0] = w[c * n + col0];
#pragma unroll
      for (int j = 0; j < Cols; ++j) s[j] += d * __half2float(wc[j]);
    }
    alignas(16) __half v[Cols], out[Cols];
    if constexpr (Cols == 8) *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(saved + r * n + col0);
    else v[0] = saved[r * n + col0];
#pragma unroll
    for (int j = 0; j < Cols; ++j) {
      if constexpr (A == Activation::relu)  // (the select this kernel always made: the ReLU instance's code is unchanged)
        out[j] = __half2float(v[j]) > 0.f ? __float2half(s[j]) : __float2half(0.f);
      else
        out[j] = __float2half(ActivationMath<A>::backward(s[j], __half2float(v[j])));
    }
    if constexpr (Cols == 8) *reinterpret_cast<uint4*>(dx + r * n + col0) = *reinterpret_cast<const uint4*>(out);
    else dx[r * n + col0] = out[0];
  }
}

}  // namespace

void launch_dgrad_activation_small_k(Activation activation, const __half* dy, const __half* w, const __half* saved,
                                     std::int64_t m, std::int64_t n, std::int64_t k, __half* dx, cudaStream_t stream,
                                     bool dependent) {
  if (k > kSmallLinearMaxDim) throw CudaError("dgrad_activation_small_k_kernel: K above its limit");
  const bool vectors = n % 8 == 0 && aligned16(w) && aligned16(saved) && aligned16(dx);
  const std::int64_t threads = vectors ? n / 8 : n;
  const dim3 grid(static_cast<unsigned>((threads + kDgradThreads - 1) / kDgradThreads),
                  static_cast<unsigned>(std::min<std::int64_t>(m, 65535)));
  with_activation(activation, [&](auto a) {
    constexpr Activation A = decltype(a)::value;
    launch_dependent(vectors ? dgrad_activation_small_k_kernel<8, A> : dgrad_activation_small_k_kernel<1, A>,
                     {grid, dim3(kDgradThreads)}, stream, dependent, dy, w, saved, m, n, k, dx);
  });
}

bool linear_small_n_tiles_fit(std::int64_t m, std::int64_t n, std::int64_t k) {
  return m >= kTensorCoreMinRows && n <= kTileClasses && k % 16 == 0 && k < (std::int64_t(1) << 30) &&
         m <= 65535 * kTileRows;
}

bool linear_small_n_on_tensor_cores(std::int64_t m, std::int64_t n, std::int64_t k) {
  return linear_small_n_tiles_fit(m, n, k) && current_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
}

namespace {

// Calls f(kActive, A) as compile-time constants for `input` (no activation: <false, relu>).
template <typename F>
void with_input(const InputActivation& input, F&& f) {
  if (!input.on) {
    f(std::false_type{}, std::integral_constant<Activation, Activation::relu>{});
    return;
  }
  with_activation(input.activation, [&](auto a) { f(std::true_type{}, a); });
}

}  // namespace

void launch_linear_small_n(const __half* x, const __half* w, const __half* bias, std::int64_t m, std::int64_t n,
                           std::int64_t k, __half* y, cudaStream_t stream, bool dependent, bool tensor_cores,
                           InputActivation input) {
  if (n > kSmallLinearMaxDim) throw CudaError("linear_small_n_kernel: N above its limit");
  __half* const activated = input.on ? input.activated : nullptr;
  if (tensor_cores && linear_small_n_on_tensor_cores(m, n, k) && reinterpret_cast<std::uintptr_t>(x) % 4 == 0 &&
      reinterpret_cast<std::uintptr_t>(w) % 4 == 0 &&
      (!activated || reinterpret_cast<std::uintptr_t>(activated) % 4 == 0)) {
    // Up to 8 blocks split K, each keeping >= 8 of its 16-wide steps (one per warp).
    const std::int64_t steps = k / 16;
    const int splits = static_cast<int>(std::clamp<std::int64_t>(steps / kWarpsPerBlock, 1, kMaxSplits));
    const int slice = static_cast<int>((steps + splits - 1) / splits) * 16;
    const LaunchGeometry geometry{dim3(static_cast<unsigned>(splits), static_cast<unsigned>((m + kTileRows - 1) / kTileRows)),
                                  dim3(kWarpsPerBlock * 32), 0, static_cast<unsigned>(splits)};
    with_input(input, [&](auto active, auto a) {
      launch_dependent(linear_small_n_mma_kernel<decltype(active)::value, decltype(a)::value>, geometry, stream,
                       dependent, x, w, bias, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), slice, y,
                       activated);
    });
    return;
  }
  const std::int64_t blocks = (m * n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const bool vectors = k % 8 == 0 && aligned16(x) && aligned16(w) && (!activated || aligned16(activated));
  with_input(input, [&](auto active, auto a) {
    launch_dependent(linear_small_n_kernel<decltype(active)::value, decltype(a)::value>,
                     {dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32)}, stream, dependent, x, w, bias,
                     m, n, k, vectors, y, activated);
  });
}

template <typename W>
void launch_wgrad_sgd_small_m(const __half* dy, const __half* x, std::int64_t batch, std::int64_t m, std::int64_t k,
                              W* w, const UpdateScalars* scalars, cudaStream_t stream, bool dependent) {
  if (m > kSmallLinearMaxDim) throw CudaError("wgrad_sgd_small_m_kernel: M above its limit");
  const dim3 grid(static_cast<unsigned>((k + 31) / 32)), block(32, kRowGroups);
  const bool dy_pairs = m % 2 == 0 && reinterpret_cast<std::uintptr_t>(dy) % 4 == 0;
  launch_dependent(m <= 16 ? wgrad_sgd_small_m_kernel<W, 16> : wgrad_sgd_small_m_kernel<W, kSmallLinearMaxDim>,
                   {grid, block}, stream, dependent, dy, x, batch, m, k, dy_pairs, w, scalars);
}

template void launch_wgrad_sgd_small_m<__half>(const __half*, const __half*, std::int64_t, std::int64_t, std::int64_t,
                                               __half*, const UpdateScalars*, cudaStream_t, bool);
template void launch_wgrad_sgd_small_m<float>(const __half*, const __half*, std::int64_t, std::int64_t, std::int64_t,
                                              float*, const UpdateScalars*, cudaStream_t, bool);

}  // namespace sg::cuda
