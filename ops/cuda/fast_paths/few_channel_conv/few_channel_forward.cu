// The few-channel convolution's forward (few_channel_conv.hpp) on tensor
// cores: an implicit GEMM of M = the band's output pixels, N = the output
// channels, K = c*kh*kw padded to 16. Block (band, image) stages the filter
// as W [n][k] (zero past K and past O) and its input band, both in T, and a
// table of where each tap reads; warp w takes the band's 16-pixel tiles w, w
// + 8, ...: each thread gathers its A elements (pixel g and g + 8, taps 2t,
// 2t + 1, 2t + 8, 2t + 9 of a K step) from the staged input, the B fragments
// come from W by ldmatrix, and the epilogue adds the bias, applies the relu
// and stores channel pairs. With a FewChannelFetch the block first finds
// its image in the dataset's u8 table and stages from there (the step's
// batch fetch in the same launch: few_channel_conv.hpp).
#include <fmt/format.h>

#include "ops/cuda/fast_paths/few_channel_conv/few_channel_common.cuh"

namespace sg::cuda {
namespace few_channel {
namespace {

constexpr int kWarps = kBlockThreads / 32;

int forward_cols(const FewChannelConvShape& s) { return int((s.ow() - 1) * s.stride + s.kw); }
int padded_k(const FewChannelConvShape& s) { return int((s.c * s.kh * s.kw + 15) / 16 * 16); }
// Output channels in pairs of mma tiles (ldmatrix.x4 loads two), and W's row stride (16-byte rows, no bank conflicts).
int padded_o(const FewChannelConvShape& s) { return int((s.o + 15) / 16 * 16); }
__host__ __device__ inline int w_stride(int kpad) { return kpad + 8; }

std::int64_t forward_shared_bytes(const FewChannelConvShape& s, const Dims& d) {
  const int kpad = padded_k(s);
  return (std::int64_t(padded_o(s)) * w_stride(kpad) + staged_input_elements(d) + 1) / 2 * 4 + kpad * 4;
}

// The fetched image's rows this block writes to X (when a later launch
// reads X): band b owns input rows [b, b + 1) * band_rows * stride, the
// last band every row from its first to the image's end.
template <typename T>
__device__ void write_fetched_rows(const std::uint8_t* image, const FewChannelFetch& f, const Dims& d,
                                   int image_index) {
  const int owned = d.band_rows * d.stride, first = int(blockIdx.x) * owned;
  const int last = blockIdx.x + 1 == gridDim.x ? d.h : min(d.h, first + owned);
  T* out = static_cast<T*>(f.x_out) + std::int64_t(image_index) * d.h * d.w * d.c;
  for (int e = first * d.w * d.c + int(threadIdx.x); e < last * d.w * d.c; e += int(blockDim.x))
    out[e] = scaled_pixel<T>(image[e], f.scale, f.shift);
}

// A parameter element as T: the value, or the fp32 master value rounded (FewChannelForwardArgs::params_f32).
template <typename T>
__device__ __forceinline__ T parameter(const void* p, int i, bool f32) {
  return f32 ? from_float<T>(static_cast<const float*>(p)[i]) : static_cast<const T*>(p)[i];
}

// Channels o and (when `second`) o + 1 of an output row, one element at a time.
template <typename T>
__device__ __forceinline__ void store_pair(T* at, float a, float b, bool second) {
  at[0] = from_float<T>(a);
  if (second) at[1] = from_float<T>(b);
}

// NT: the output channels' 8-wide tiles a thread accumulates (the next even count at or above o / 8).
template <int NT, typename T>
__global__ void __launch_bounds__(kBlockThreads)
    few_channel_forward_kernel(Dims d, int kpad, FewChannelForwardArgs args) {
  const T* x = static_cast<const T*>(args.x);
  const FewChannelFetch& f = args.fetch;
  T* y = static_cast<T*>(args.y);
  extern __shared__ float4 few_channel_shared[];
  const int ws = w_stride(kpad), ckk = d.c * d.kh * d.kw;
  T* sw = reinterpret_cast<T*>(few_channel_shared);  // [NT * 8][ws]
  T* sx = sw + NT * 8 * ws;                          // [c][in_rows][pitch]
  int* taps = reinterpret_cast<int*>(few_channel_shared) + (NT * 8 * ws + staged_input_elements(d) + 1) / 2;  // [kpad]
  const int first_row = blockIdx.x * d.band_rows, n = blockIdx.y;
  const int pixels = min(d.band_rows, d.oh - first_row) * d.ow;
  for_each_cell(NT * 8, kpad, [=](int o, int k) {
    sw[o * ws + k] = o < d.o && k < ckk ? parameter<T>(args.w, o * ckk + k, args.params_f32) : from_float<T>(0.f);
  });
  if (f.images) {
    const std::int64_t global = std::int64_t(d.n) * f.ranks;
    const std::int64_t row = f.perm[std::int64_t(*f.step) % (f.rows / global) * global + f.rank * d.n + n];
    const std::uint8_t* image = f.images + row * d.h * d.w * d.c;
    stage_fetched_band(image, f.scale, f.shift, d, first_row * d.stride - d.padding, sx);
    if (f.x_out) write_fetched_rows<T>(image, f, d, n);
    if (blockIdx.x == 0 && threadIdx.x == 0) f.labels_out[n] = f.labels[row];
  } else {
    stage_input_band(x + std::int64_t(n) * d.h * d.w * d.c, d, first_row * d.stride - d.padding, sx);
  }
  for (int k = threadIdx.x; k < kpad; k += blockDim.x) taps[k] = tap_offset(d, k);
  __syncthreads();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // ldmatrix row addresses: lane l gives row (l % 8) of matrix l / 8: output channel
  // 8 * (l / 16) + l % 8 of a tile pair, k columns 8 * (l / 8 % 2) of a K step.
  const std::uint32_t w_lane = shared_address(sw + (8 * (lane / 16) + lane % 8) * ws + 8 * (lane / 8 % 2));
  const std::int64_t out_first = (std::int64_t(n) * d.oh + first_row) * d.ow;
  for (int tile = threadIdx.x / 32; tile * 16 < pixels; tile += kWarps) {
    const int q0 = tile * 16 + g, q1 = q0 + 8;
    const auto base = [&](int q) {
      q = min(q, pixels - 1);
      const int row = q / d.ow, ox = q - row * d.ow;
      return (row * d.pitch + ox) * d.stride;
    };
    const T* x0 = sx + base(q0);
    const T* x1 = sx + base(q1);
    float acc[NT][4] = {};
    for (int k0 = 0; k0 < kpad; k0 += 16) {
      const int lo = taps[k0 + 2 * t], lo1 = taps[k0 + 2 * t + 1], hi = taps[k0 + 2 * t + 8], hi1 = taps[k0 + 2 * t + 9];
      const std::uint32_t a[4] = {pack_pair(x0[lo], x0[lo1]), pack_pair(x1[lo], x1[lo1]), pack_pair(x0[hi], x0[hi1]),
                                  pack_pair(x1[hi], x1[hi1])};
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        std::uint32_t b[4];  // b0, b1 of tile nt, then of tile nt + 1
        load_matrices(b, w_lane + (nt * 8 * ws + k0) * 2);
        mma_16x8x16<T>(acc[nt], a, b[0], b[1]);
        mma_16x8x16<T>(acc[nt + 1], a, b[2], b[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int o = nt * 8 + 2 * t;
      if (o >= d.o) break;
      const bool second = o + 1 < d.o;  // false for an odd count's last channel
      const float b0 = args.bias ? to_float(parameter<T>(args.bias, o, args.params_f32)) : 0.f,
                  b1 = args.bias && second ? to_float(parameter<T>(args.bias, o + 1, args.params_f32)) : 0.f;
      float v[4] = {acc[nt][0] + b0, acc[nt][1] + b1, acc[nt][2] + b0, acc[nt][3] + b1};
      if (args.relu)
#pragma unroll
        for (float& e : v) e = fmaxf(e, 0.f);
      if (d.o % 2 == 0) {  // o even: a channel pair is one aligned 4-byte word of a pixel's row
        if (q0 < pixels) *reinterpret_cast<std::uint32_t*>(y + (out_first + q0) * d.o + o) = pack_floats<T>(v[0], v[1]);
        if (q1 < pixels) *reinterpret_cast<std::uint32_t*>(y + (out_first + q1) * d.o + o) = pack_floats<T>(v[2], v[3]);
      } else {  // an odd count: rows start at odd elements, and the last pair's second channel is not there
        if (q0 < pixels) store_pair(y + (out_first + q0) * d.o + o, v[0], v[1], second);
        if (q1 < pixels) store_pair(y + (out_first + q1) * d.o + o, v[2], v[3], second);
      }
    }
  }
}

template <typename T>
void launch_forward(const FewChannelForwardPlan& p, const Dims& d, const FewChannelForwardArgs& args,
                    cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.bands), static_cast<unsigned>(d.n));
  const int kpad = padded_k(p.shape);
  const auto go = [&](auto kernel) {
    conv_direct::allow_shared(kernel, p.shared_bytes);
    kernel<<<grid, kBlockThreads, p.shared_bytes, stream>>>(d, kpad, args);
  };
  switch (padded_o(p.shape) / 8) {
    case 2: go(few_channel_forward_kernel<2, T>); break;
    case 4: go(few_channel_forward_kernel<4, T>); break;
    case 6: go(few_channel_forward_kernel<6, T>); break;
    case 8: go(few_channel_forward_kernel<8, T>); break;
    case 10: go(few_channel_forward_kernel<10, T>); break;
    case 12: go(few_channel_forward_kernel<12, T>); break;
    case 14: go(few_channel_forward_kernel<14, T>); break;
    default: go(few_channel_forward_kernel<16, T>);
  }
  SG_LAUNCH_CHECK("few_channel_forward_kernel");
}

}  // namespace
}  // namespace few_channel

std::string few_channel_conv_why_not(const FewChannelConvShape& s) {
  using namespace few_channel;
  if (s.c < 1 || s.c > kFewChannelMax) return fmt::format("{} input channels (these kernels take 1-{})", s.c, kFewChannelMax);
  if (s.o < 1 || s.o > kMaxOutputs)
    return fmt::format("{} output channels (these kernels take 1-{})", s.o, kMaxOutputs);
  if (s.kh < 1 || s.kw < 1 || s.kh > kMaxKernel || s.kw > kMaxKernel)
    return fmt::format("a {}x{} kernel (these kernels take up to {}x{})", s.kh, s.kw, kMaxKernel, kMaxKernel);
  if (s.stride < 1 || s.stride > 2) return fmt::format("stride {} (these kernels take 1 or 2)", s.stride);
  if (s.padding < 0 || s.padding >= std::min(s.kh, s.kw))
    return fmt::format("padding {} with a {}x{} kernel (these kernels take less than the kernel)", s.padding, s.kh, s.kw);
  if (s.oh() < 1 || s.ow() < 1) return "no output pixels";
  if (s.n * s.h * s.w * s.c >= (std::int64_t(1) << 31) || s.n * s.oh() * s.ow() * s.o >= (std::int64_t(1) << 31))
    return "over 2^31 elements (32-bit indexing)";
  // One output row a block: the least shared memory either pass needs.
  if (forward_shared_bytes(s, dims_for(s, 1, forward_cols(s))) > kMaxShared || few_channel_wgrad_shared_bytes(s, 1) > kMaxShared)
    return "one output row's operands over 100 KiB of shared memory";
  return "";
}

FewChannelForwardPlan plan_few_channel_forward(const FewChannelConvShape& s, int multiprocessors, int band_rows) {
  using namespace few_channel;
  FewChannelForwardPlan p;
  p.shape = s;
  const std::string why = few_channel_conv_why_not(s);
  if (!why.empty()) throw CudaError("few-channel convolution: " + why);
  // Bands for about two blocks a multiprocessor: each block stages the filter, so no more.
  const std::int64_t oh = s.oh();
  const std::int64_t bands = std::clamp<std::int64_t>((2 * std::int64_t(multiprocessors) + s.n - 1) / s.n, 1, oh);
  std::int64_t band = band_rows > 0 ? std::min<std::int64_t>(band_rows, oh) : (oh + bands - 1) / bands;
  const auto shared = [&](std::int64_t rows) { return forward_shared_bytes(s, dims_for(s, int(rows), forward_cols(s))); };
  while (band > 1 && shared(band) > kMaxShared) band = (band + 1) / 2;
  p.band_rows = int(band);
  p.bands = int((oh + band - 1) / band);
  p.shared_bytes = int(shared(band));
  return p;
}

std::string FewChannelForwardPlan::describe() const {
  return fmt::format("few-channel forward on tensor cores: {} bands of {} rows an image, K {} padded to {}, {} B shared",
                     bands, band_rows, shape.c * shape.kh * shape.kw, few_channel::padded_k(shape), shared_bytes);
}

template <typename T>
void launch_few_channel_forward(const FewChannelForwardPlan& p, const FewChannelForwardArgs& args,
                                cudaStream_t stream) {
  using namespace few_channel;
  if (reinterpret_cast<std::uintptr_t>(args.y) % 16 != 0)
    throw CudaError("few-channel convolution: y is not 16-byte aligned");
  const FewChannelFetch& f = args.fetch;
  if (f.images && (!f.perm || !f.step || !f.labels || !f.labels_out || f.ranks < 1 || f.rank < 0 ||
                   f.rank >= f.ranks || f.rows < p.shape.n * f.ranks))
    throw CudaError("few-channel convolution: the batch fetch needs the permutation, the step, both tables, the "
                    "labels' output, 0 <= rank < ranks and a table of at least one global batch");
  if (!f.images && !args.x) throw CudaError("few-channel convolution: no input (x or a batch fetch)");
  launch_forward<T>(p, dims_for(p.shape, p.band_rows, forward_cols(p.shape)), args, stream);
}

template <typename T>
void launch_few_channel_forward(const FewChannelForwardPlan& p, const T* x, const T* w, const T* bias, bool relu, T* y,
                                cudaStream_t stream) {
  FewChannelForwardArgs args;
  args.x = x;
  args.w = w;
  args.bias = bias;
  args.relu = relu;
  args.y = y;
  launch_few_channel_forward<T>(p, args, stream);
}

template void launch_few_channel_forward<__half>(const FewChannelForwardPlan&, const __half*, const __half*,
                                                 const __half*, bool, __half*, cudaStream_t);
template void launch_few_channel_forward<__nv_bfloat16>(const FewChannelForwardPlan&, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, const __nv_bfloat16*, bool,
                                                        __nv_bfloat16*, cudaStream_t);

template void launch_few_channel_forward<__half>(const FewChannelForwardPlan&, const FewChannelForwardArgs&,
                                                 cudaStream_t);
template void launch_few_channel_forward<__nv_bfloat16>(const FewChannelForwardPlan&, const FewChannelForwardArgs&,
                                                        cudaStream_t);

}  // namespace sg::cuda
