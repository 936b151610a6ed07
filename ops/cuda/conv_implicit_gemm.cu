// Implicit-GEMM convolutions (see conv_implicit_gemm.hpp). One tiled GEMM
// kernel serves the three passes: a pass is a small struct saying how to
// fetch A[m,k] and B[k,n] from the NCHW tensors (zero outside the input or
// off the stride grid) and where C[m,n] goes. A 256-thread block computes a
// tile of C, 4 x 4 per thread, over 16-wide slices of K staged in shared
// memory as f32; block z of the grid covers the z-th of `splits` equal
// ranges of K. The tile is 64 x 64, 256 x 16 or 16 x 256, whichever pads the
// GEMM least: a CNN's few channels make one side of C small (10 or 20
// output channels forward; 10 rows of the weight gradient). That GEMM is
// the generic path; small images take the direct kernels (conv_direct.cu).
// The CNN step's convolutions (fast_paths/cnn_step/cnn_step_conv.cuh) are a
// different computation (fp16 tensor-core GEMMs over one example in shared
// memory): they share the window geometry (conv_window.cuh) only.
#include <algorithm>
#include <string>
#include <utility>

#include "ops/cuda/conv_direct.hpp"
#include "ops/cuda/conv_implicit_gemm.hpp"
#include "ops/cuda/conv_window.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

constexpr int kTileK = 16, kGemmThreads = 256;

// The sizes the passes index with (host-computed, so device code needs no ConvShape methods).
struct Dims {
  std::int64_t n, c, h, w, o, kh, kw, stride, padding, oh, ow;
};

Dims dims_of(const ConvShape& s) { return {s.n, s.c, s.h, s.w, s.o, s.kh, s.kw, s.stride, s.padding, s.oh(), s.ow()}; }

// The input element tap (c, i, j) of window (n, oy, ox) reads, zero outside
// the input: the forward's A and the weight gradient's B.
template <typename T>
__device__ __forceinline__ float window_tap(const Dims& d, const T* x, std::int64_t window, std::int64_t tap) {
  const std::int64_t b = window / (d.oh * d.ow), oy = (window / d.ow) % d.oh, ox = window % d.ow;
  const std::int64_t c = tap / (d.kh * d.kw), i = (tap / d.kw) % d.kh, j = tap % d.kw;
  const std::int64_t iy = window_origin(oy, d.stride, d.padding) + i, ix = window_origin(ox, d.stride, d.padding) + j;
  if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) return 0.f;
  return to_float(x[((b * d.c + c) * d.h + iy) * d.w + ix]);
}

// The three passes below are one interface (rows, cols, depth, a, b,
// initial, store: what implicit_gemm_kernel calls) over three layouts: alike
// in shape only.
// Forward: rows m = (n, oy, ox), columns = output channels, k = (c, i, j).
template <typename T>
struct ForwardPass {
  Dims d;
  const T* x;
  const T* w;
  const T* bias;
  bool relu;
  T* y;
  __device__ std::int64_t rows() const { return d.n * d.oh * d.ow; }
  __device__ std::int64_t cols() const { return d.o; }
  __device__ std::int64_t depth() const { return d.c * d.kh * d.kw; }
  __device__ float a(std::int64_t m, std::int64_t k) const { return window_tap(d, x, m, k); }
  __device__ float b(std::int64_t k, std::int64_t o) const { return to_float(w[o * depth() + k]); }
  // The bias starts the sum, as in ref::conv2d.
  __device__ float initial(std::int64_t o) const { return bias ? to_float(bias[o]) : 0.f; }
  __device__ void store(std::int64_t m, std::int64_t o, float v) const {
    const std::int64_t b = m / (d.oh * d.ow), pixel = m % (d.oh * d.ow);
    y[(b * d.o + o) * d.oh * d.ow + pixel] = from_float<T>(relu && !(v > 0.f) ? 0.f : v);
  }
};

// Backward data: rows m = (n, y, x) of dX, columns = input channels, k = (o, i, j):
// dX[n,c,y,x] = sum dY[n,o,oy,ox] W[o,c,i,j] over y = oy*s - p + i.
template <typename T>
struct BackwardDataPass {
  Dims d;
  const T* dy;
  const T* w;
  T* dx;
  __device__ std::int64_t rows() const { return d.n * d.h * d.w; }
  __device__ std::int64_t cols() const { return d.c; }
  __device__ std::int64_t depth() const { return d.o * d.kh * d.kw; }
  __device__ float a(std::int64_t m, std::int64_t k) const {
    const std::int64_t b = m / (d.h * d.w), y = (m / d.w) % d.h, x = m % d.w;
    const std::int64_t o = k / (d.kh * d.kw), i = (k / d.kw) % d.kh, j = k % d.kw;
    const std::int64_t ty = y + d.padding - i, tx = x + d.padding - j;
    if (ty < 0 || tx < 0 || ty % d.stride != 0 || tx % d.stride != 0) return 0.f;
    const std::int64_t oy = ty / d.stride, ox = tx / d.stride;
    if (oy >= d.oh || ox >= d.ow) return 0.f;
    return to_float(dy[((b * d.o + o) * d.oh + oy) * d.ow + ox]);
  }
  __device__ float b(std::int64_t k, std::int64_t c) const {
    const std::int64_t taps = d.kh * d.kw, o = k / taps;
    return to_float(w[(o * d.c + c) * taps + k % taps]);
  }
  __device__ float initial(std::int64_t) const { return 0.f; }
  __device__ void store(std::int64_t m, std::int64_t c, float v) const {
    const std::int64_t b = m / (d.h * d.w), pixel = m % (d.h * d.w);
    dx[(b * d.c + c) * d.h * d.w + pixel] = from_float<T>(v);
  }
};

// Backward filter: rows = output channels, columns = (c, i, j), k = (n, oy, ox).
template <typename T>
struct BackwardFilterPass {
  Dims d;
  const T* dy;
  const T* x;
  T* dw;
  __device__ std::int64_t rows() const { return d.o; }
  __device__ std::int64_t cols() const { return d.c * d.kh * d.kw; }
  __device__ std::int64_t depth() const { return d.n * d.oh * d.ow; }
  bool dy_last;  // dY [n, oh, ow, o]
  __device__ float a(std::int64_t o, std::int64_t k) const {
    if (dy_last) return to_float(dy[k * d.o + o]);  // k = image * oh * ow + pixel
    const std::int64_t b = k / (d.oh * d.ow), pixel = k % (d.oh * d.ow);
    return to_float(dy[(b * d.o + o) * d.oh * d.ow + pixel]);
  }
  __device__ float b(std::int64_t k, std::int64_t col) const { return window_tap(d, x, k, col); }
  __device__ float initial(std::int64_t) const { return 0.f; }
  __device__ void store(std::int64_t o, std::int64_t col, float v) const { dw[o * cols() + col] = from_float<T>(v); }
};

// C tile (blockIdx.y, blockIdx.x) over K range blockIdx.z of `splits`. With
// one split the tile is stored through the pass; else its f32 partial goes
// to partials[z][m][n] for implicit_gemm_finish.
template <int kTileM, int kTileN, typename Pass>
__global__ void __launch_bounds__(kGemmThreads) implicit_gemm_kernel(Pass p, int splits, float* partials) {
  static_assert(kTileM * kTileN == 16 * kGemmThreads, "each thread computes 4 x 4 of the tile");
  __shared__ float a_tile[kTileK][kTileM];
  __shared__ float b_tile[kTileK][kTileN];
  const std::int64_t rows = p.rows(), cols = p.cols(), depth = p.depth();
  const std::int64_t m0 = std::int64_t(blockIdx.y) * kTileM, n0 = std::int64_t(blockIdx.x) * kTileN;
  const std::int64_t per_split = (depth + splits - 1) / splits;
  const std::int64_t k_begin = blockIdx.z * per_split;
  const std::int64_t k_end = k_begin + per_split < depth ? k_begin + per_split : depth;
  const int tm = threadIdx.x / (kTileN / 4), tn = threadIdx.x % (kTileN / 4);  // this thread's 4 x 4 of the tile
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t n = n0 + tn * 4 + j;
      acc[i][j] = blockIdx.z == 0 && n < cols ? p.initial(n) : 0.f;
    }
  for (std::int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    // Stage A[m0.., k0..] and B[k0.., n0..]; consecutive threads take
    // consecutive m (n), which are neighbouring addresses in NCHW.
    for (int e = threadIdx.x; e < kTileK * kTileM; e += kGemmThreads) {
      const int kk = e / kTileM, mm = e % kTileM;
      const std::int64_t m = m0 + mm, k = k0 + kk;
      a_tile[kk][mm] = m < rows && k < k_end ? p.a(m, k) : 0.f;
    }
    for (int e = threadIdx.x; e < kTileK * kTileN; e += kGemmThreads) {
      const int kk = e / kTileN, nn = e % kTileN;
      const std::int64_t n = n0 + nn, k = k0 + kk;
      b_tile[kk][nn] = n < cols && k < k_end ? p.b(k, n) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = a_tile[kk][tm * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = b_tile[kk][tn * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::int64_t m = m0 + tm * 4 + i, n = n0 + tn * 4 + j;
      if (m >= rows || n >= cols) continue;
      if (splits == 1)
        p.store(m, n, acc[i][j]);
      else
        partials[(blockIdx.z * rows + m) * cols + n] = acc[i][j];
    }
}

// Adds the splits' partials in split order and stores each element.
template <typename Pass>
__global__ void implicit_gemm_finish(Pass p, int splits, const float* partials) {
  const std::int64_t rows = p.rows(), cols = p.cols();
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < rows * cols;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < splits; ++z) v += partials[z * rows * cols + e];
    p.store(e / cols, e % cols, v);
  }
}

// (rows, cols, depth) of a pass on the host.
struct GemmSize {
  std::int64_t rows, cols, depth;
};

GemmSize gemm_size(ConvPass pass, const ConvShape& s) {
  switch (pass) {
    case ConvPass::forward:
      return {s.n * s.oh() * s.ow(), s.o, s.c * s.kh * s.kw};
    case ConvPass::backward_data:
      return {s.n * s.h * s.w, s.c, s.o * s.kh * s.kw};
    default:
      return {s.o, s.c * s.kh * s.kw, s.n * s.oh() * s.ow()};
  }
}

template <int kTileM, int kTileN, typename Pass>
void run_tiles(const ImplicitGemmPlan& plan, const GemmSize& size, const Pass& pass, float* workspace,
               cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((size.cols + kTileN - 1) / kTileN),
                  static_cast<unsigned>((size.rows + kTileM - 1) / kTileM), static_cast<unsigned>(plan.splits));
  if (grid.y > 65535) throw CudaError("implicit-GEMM conv: more than 65535 row tiles (" + std::to_string(grid.y) + ")");
  implicit_gemm_kernel<kTileM, kTileN><<<grid, kGemmThreads, 0, stream>>>(pass, plan.splits, workspace);
  SG_LAUNCH_CHECK("implicit_gemm_kernel");
}

template <typename Pass>
void run_gemm(const ImplicitGemmPlan& plan, const Pass& pass, float* workspace, cudaStream_t stream) {
  const GemmSize size = gemm_size(plan.pass, plan.shape);
  if (plan.splits > 1 && !workspace) throw CudaError("implicit-GEMM conv: a split-K plan needs its workspace");
  if (plan.tile_m == 256) run_tiles<256, 16>(plan, size, pass, workspace, stream);
  else if (plan.tile_m == 16) run_tiles<16, 256>(plan, size, pass, workspace, stream);
  else run_tiles<64, 64>(plan, size, pass, workspace, stream);
  if (plan.splits == 1) return;
  implicit_gemm_finish<<<blocks_for(size.rows * size.cols), kThreads, 0, stream>>>(pass, plan.splits, workspace);
  SG_LAUNCH_CHECK("implicit_gemm_finish");
}

}  // namespace

std::size_t ImplicitGemmPlan::workspace_bytes() const {
  if (direct)
    return pass == ConvPass::backward_filter
               ? static_cast<std::size_t>(
                     std::max(conv_direct::wgrad_parts(*this), conv_direct::mma_wgrad_parts(*this)) * shape.o *
                     (shape.c * shape.kh * shape.kw + (bias_gradient ? 1 : 0))) *
                     sizeof(float)
               : 0;
  if (splits == 1) return 0;
  const GemmSize size = gemm_size(pass, shape);
  return static_cast<std::size_t>(splits) * static_cast<std::size_t>(size.rows * size.cols) * sizeof(float);
}

// The tile that pads C least (64 x 64 on ties); K split only when the output
// tiles alone leave most of the GPU idle and each split still gets >= 8
// slices of K: two blocks per multiprocessor.
ImplicitGemmPlan plan_implicit_gemm(ConvPass pass, const ConvShape& shape, int multiprocessors, bool direct_path,
                                    bool bias_gradient) {
  ImplicitGemmPlan plan{};
  plan.pass = pass;
  plan.shape = shape;
  plan.bias_gradient = bias_gradient && pass == ConvPass::backward_filter;
  if (direct_path && conv_direct::plan(plan, multiprocessors)) return plan;
  plan.direct = false;
  plan.bias_gradient = false;
  const GemmSize size = gemm_size(pass, shape);
  auto padded = [&](std::int64_t tm, std::int64_t tn) {
    return ((size.rows + tm - 1) / tm) * tm * (((size.cols + tn - 1) / tn) * tn);
  };
  for (const auto& [tm, tn] : {std::pair<int, int>{256, 16}, std::pair<int, int>{16, 256}})
    if (padded(tm, tn) < padded(plan.tile_m, plan.tile_n)) {
      plan.tile_m = tm;
      plan.tile_n = tn;
    }
  const std::int64_t tiles =
      ((size.rows + plan.tile_m - 1) / plan.tile_m) * ((size.cols + plan.tile_n - 1) / plan.tile_n);
  const std::int64_t wanted = (2 * std::int64_t(multiprocessors) + tiles - 1) / tiles;
  const std::int64_t most = std::max<std::int64_t>(1, size.depth / (8 * kTileK));
  plan.splits = static_cast<int>(std::clamp<std::int64_t>(wanted, 1, std::min<std::int64_t>(most, 64)));
  return plan;
}

std::string describe_plan(const ImplicitGemmPlan& p) {
  if (!p.direct) return "tiled implicit GEMM " + std::to_string(p.tile_m) + "x" + std::to_string(p.tile_n) + ", " +
                        std::to_string(p.splits) + " K splits";
  std::string what = "direct, " + std::to_string(p.group) + " channels per thread, " + std::to_string(p.threads) +
                     " threads, " + std::to_string(p.shared_bytes) + " B shared";
  if (p.pass != ConvPass::backward_filter && p.ci_chunk < (p.pass == ConvPass::forward ? p.shape.c : p.shape.o))
    what += ", input channels in chunks of " + std::to_string(p.ci_chunk);
  if (p.pass == ConvPass::backward_filter)
    what += ", " + std::to_string(conv_direct::wgrad_parts(p)) + " ordered partials" +
            (p.bias_gradient ? ", with the bias gradient" : "") +
            (p.mma.usable ? "; f16/bf16 on tensor cores: " + std::to_string(conv_direct::mma_wgrad_parts(p)) +
                                " ordered partials, blocks of " + std::to_string(p.mma.range_pixels) + " pixels x " +
                                std::to_string(p.mma.image_group) + " images x " +
                                std::to_string(p.mma.column_blocks) + " column blocks"
                          : "");
  return what;
}

template <typename T>
void launch_conv_forward(const ImplicitGemmPlan& plan, const T* x, const T* w, const T* bias, bool relu, T* y,
                         float* workspace, cudaStream_t stream) {
  if (plan.direct) return conv_direct::launch_conv<false>(plan, x, w, bias, relu, y, stream);
  run_gemm(plan, ForwardPass<T>{dims_of(plan.shape), x, w, bias, relu, y}, workspace, stream);
}

template <typename T>
void launch_conv_backward_data(const ImplicitGemmPlan& plan, const T* dy, const T* w, T* dx, float* workspace,
                               cudaStream_t stream) {
  if (plan.direct)
    return conv_direct::launch_conv<true>(plan, dy, w, static_cast<const T*>(nullptr), false, dx, stream);
  run_gemm(plan, BackwardDataPass<T>{dims_of(plan.shape), dy, w, dx}, workspace, stream);
}

template <typename T>
void launch_conv_backward_filter(const ImplicitGemmPlan& plan, const T* dy, const T* x, T* dw, float* workspace,
                                 cudaStream_t stream, ConvBiasGradient bias) {
  if (plan.bias_gradient != (bias.sums != nullptr))
    throw CudaError("conv weight gradient: the bias gradient's output and the plan disagree");
  if (plan.direct) return conv_direct::launch_wgrad(plan, dy, x, dw, bias, workspace, stream);
  run_gemm(plan, BackwardFilterPass<T>{dims_of(plan.shape), dy, x, dw, plan.shape.dy_channels_last}, workspace, stream);
}

#define SG_INSTANTIATE_CONV(T)                                                                                       \
  template void launch_conv_forward<T>(const ImplicitGemmPlan&, const T*, const T*, const T*, bool, T*, float*,      \
                                       cudaStream_t);                                                                \
  template void launch_conv_backward_data<T>(const ImplicitGemmPlan&, const T*, const T*, T*, float*, cudaStream_t); \
  template void launch_conv_backward_filter<T>(const ImplicitGemmPlan&, const T*, const T*, T*, float*, cudaStream_t, \
                                               ConvBiasGradient);
SG_INSTANTIATE_CONV(float)
SG_INSTANTIATE_CONV(__half)
SG_INSTANTIATE_CONV(__nv_bfloat16)
#undef SG_INSTANTIATE_CONV

}  // namespace sg::cuda