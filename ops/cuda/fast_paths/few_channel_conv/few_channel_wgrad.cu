// The few-channel convolution's weight gradient (few_channel_conv.hpp) on
// tensor cores: a GEMM of M = the output channels, N = the taps c*kh*kw
// (and one column of ones: the bias gradient), K = the band's output
// pixels. Block (band, image, tap chunk) stages the band's dY rows (they are
// contiguous channels-last) as sdy [pixel][channel], its input rows, and
// where each pixel's first tap reads them; warp w takes the 16-pixel K steps
// w, w + 8, ...: A = dY^T by ldmatrix.trans from sdy, B gathered from the
// staged input at the pixels' bases plus each thread's tap offsets. The
// warps' accumulators are then added in a fixed tree (4 + 4, 2 + 2, 1 + 1)
// into the block's partial, and wgrad_partials_finish adds the partials in
// block order: the same bits every run. dY is staged by cp.async (every
// copy of the band in flight at once; a load-then-store loop had a few in
// flight a thread). With an activation gate, the activation's saved value
// is staged beside it and dY becomes act_backward(dY, saved) rounded to T in
// shared memory, as the graph's activation-backward node would have stored
// it: that node needs no launch and its output no buffer.
#include <fmt/format.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/fast_paths/few_channel_conv/few_channel_common.cuh"
#include "ops/cuda/wgrad_partials.cuh"

namespace sg::cuda {
namespace few_channel {
namespace {

constexpr int kWarps = kBlockThreads / 32;
constexpr int kAccTiles = 16;  // m-tiles x n-tiles a thread accumulates (64 registers)

int wgrad_cols(const FewChannelConvShape& s) { return int((s.ow() - 1) * s.stride + s.kw); }
// 16-channel m-tiles: a power of two (the kernel's template), and dY's row stride (16-byte rows, no bank conflicts).
int m_tiles(const FewChannelConvShape& s) {
  int mt = 1;
  while (mt * 16 < s.o) mt *= 2;
  return mt;
}
__host__ __device__ inline int dy_stride(int mt) { return mt * 16 + 8; }

struct WgradGeometry {
  int outs, n_tiles, per_chunk, chunks;  // outs: taps (+1 with the bias) a partial holds per output channel
};

WgradGeometry wgrad_geometry(const FewChannelConvShape& s, bool bias) {
  WgradGeometry w;
  w.outs = int(s.c * s.kh * s.kw) + (bias ? 1 : 0);
  w.n_tiles = (w.outs + 7) / 8;
  w.per_chunk = 2;  // a power of two (the kernel's template), at most kAccTiles / m-tiles
  while (w.per_chunk < w.n_tiles && w.per_chunk * m_tiles(s) < kAccTiles) w.per_chunk *= 2;
  w.chunks = (w.n_tiles + w.per_chunk - 1) / w.per_chunk;
  return w;
}

struct WgradDims {
  Dims d;
  int outs, ckk;
  bool bias;
  const void* gate;         // the activation's saved value beside dY [n,oh,ow,o], or null
  Activation activation;    // the gate's activation
};

// 8 channels of dY at `d` through the activation's backward with its saved
// values at `v` (both staged), rounded to T in place.
template <typename T>
__device__ __forceinline__ void gate_vector(T* d, const T* v, Activation a) {
  uint4 dq = *reinterpret_cast<const uint4*>(d);
  const uint4 vq = *reinterpret_cast<const uint4*>(v);
  T* de = reinterpret_cast<T*>(&dq);
  const T* ve = reinterpret_cast<const T*>(&vq);
  with_activation(a, [&](auto tag) {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      de[e] = from_float<T>(ActivationMath<decltype(tag)::value>::backward(to_float(de[e]), to_float(ve[e])));
  });
  *reinterpret_cast<uint4*>(d) = dq;
}

// Where the gate's staging starts (T elements, 16-byte aligned): after dY's
// [most padded pixels][ds], the input band and the pixels' bases.
__host__ __device__ inline int gate_offset(const Dims& d, int ds) {
  const int most = (d.band_rows * d.ow + 15) / 16 * 16;
  const int end = (most * ds + staged_input_elements(d) + 1) / 2 * 2 + most * 2;  // T elements: bases are 2 each
  return (end + 7) / 8 * 8;
}

// MT: 16-channel m-tiles; NTC: the 8-tap n-tiles of a chunk.
template <int MT, int NTC, typename T>
__global__ void __launch_bounds__(kBlockThreads) few_channel_wgrad_kernel(WgradDims wd, const T* dy, const T* x, float* partials) {
  const Dims& d = wd.d;
  extern __shared__ float4 few_channel_shared[];
  const int first_row = blockIdx.x * d.band_rows, n = blockIdx.y;
  const int pixels = min(d.band_rows, d.oh - first_row) * d.ow, padded = (pixels + 15) / 16 * 16;
  const int ds = dy_stride(MT), vectors = (d.o + 7) / 8;  // 8 channels a vector, zero past o
  T* sdy = reinterpret_cast<T*>(few_channel_shared);  // [padded pixels][ds]
  const int most = (d.band_rows * d.ow + 15) / 16 * 16;  // the first band's padded pixels: every band's at most
  T* sx = sdy + most * ds;                                // [c][in_rows][pitch]
  int* bases = reinterpret_cast<int*>(few_channel_shared) + (most * ds + staged_input_elements(d) + 1) / 2;  // [padded]
  T* sgate = reinterpret_cast<T*>(few_channel_shared) + gate_offset(d, ds);  // [pixels][ds], with a gate
  const std::int64_t band = (std::int64_t(n) * d.oh + first_row) * d.ow * d.o;
  const T* gate = wd.gate ? static_cast<const T*>(wd.gate) + band : nullptr;
  if (d.o % 8 == 0) {  // a pixel's channels are whole 16-byte vectors
    const uint4* src = reinterpret_cast<const uint4*>(dy + band);
    const std::uint32_t sdy_at = shared_address(sdy), sgate_at = shared_address(sgate);
    for_each_cell(pixels, vectors, [=](int p, int v) {
      const int at = (p * ds + v * 8) * int(sizeof(T));
      copy_async16(sdy_at + at, src + p * vectors + v);
      if (gate) copy_async16(sgate_at + at, reinterpret_cast<const uint4*>(gate) + p * vectors + v);
    });
    commit_copies();
  } else {  // rows of o elements start anywhere: element by element, zeros up to the last vector's end
    const T* src = dy + band;
    const T zero = from_float<T>(0.f);
    for_each_cell(pixels, vectors * 8, [=](int p, int ch) {
      const bool real = ch < d.o;
      sdy[p * ds + ch] = real ? src[p * d.o + ch] : zero;
      if (gate) sgate[p * ds + ch] = real ? gate[p * d.o + ch] : zero;
    });
  }
  // Zeros in the channels past o and the pixels past the band (K steps of 16).
  const int spare = MT * 2 - vectors;
  if (spare > 0)
    for_each_cell(pixels, spare, [=](int p, int v) {
      *reinterpret_cast<uint4*>(sdy + p * ds + (vectors + v) * 8) = uint4{0, 0, 0, 0};
    });
  if (padded > pixels)
    for_each_cell(padded - pixels, MT * 2, [=](int p, int v) {
      *reinterpret_cast<uint4*>(sdy + (pixels + p) * ds + v * 8) = uint4{0, 0, 0, 0};
    });
  stage_input_band(x + std::int64_t(n) * d.h * d.w * d.c, d, first_row * d.stride - d.padding, sx);
  for (int p = threadIdx.x; p < padded; p += blockDim.x) {
    const int row = p / d.ow, ox = p - row * d.ow;
    bases[p] = p < pixels ? (row * d.pitch + ox) * d.stride : 0;
  }
  wait_copies<0>();
  __syncthreads();
  if (gate) {
    // Each thread gates the cells it copied: its own copies, complete after its wait.
    for_each_cell(pixels, vectors, [=](int p, int v) {
      gate_vector(sdy + p * ds + v * 8, sgate + p * ds + v * 8, wd.activation);
    });
    __syncthreads();
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  // This thread's taps (column g of each n-tile), where they read; the bias's column reads ones.
  int offset[NTC];
  bool ones[NTC];
#pragma unroll
  for (int nt = 0; nt < NTC; ++nt) {
    const int tap = (blockIdx.z * NTC + nt) * 8 + g;
    offset[nt] = tap_offset(d, tap);
    ones[nt] = wd.bias && tap == wd.ckk;
  }
  // ldmatrix.trans row addresses: lane l gives pixel 8 * (l / 16) + l % 8 of a step, channels 8 * (l / 8 % 2) of an m-tile.
  const std::uint32_t dy_lane = shared_address(sdy + (8 * (lane / 16) + lane % 8) * ds + 8 * (lane / 8 % 2));
  const T one = from_float<T>(1.f);
  float acc[MT][NTC][4] = {};
  for (int step = warp; step * 16 < padded; step += kWarps) {
    const int p = step * 16 + 2 * t;
    const T* x0 = sx + bases[p];
    const T* x1 = sx + bases[p + 1];
    const T* x8 = sx + bases[p + 8];
    const T* x9 = sx + bases[p + 9];
    std::uint32_t b[NTC][2];
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt) {
      const int o = offset[nt];
      b[nt][0] = ones[nt] ? pack_pair(one, one) : pack_pair(x0[o], x1[o]);
      b[nt][1] = ones[nt] ? pack_pair(one, one) : pack_pair(x8[o], x9[o]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      std::uint32_t a[4];
      load_matrices_transposed(a, dy_lane + (step * 16 * ds + mt * 16) * 2);
#pragma unroll
      for (int nt = 0; nt < NTC; ++nt) mma_16x8x16<T>(acc[mt][nt], a, b[nt][0], b[nt][1]);
    }
  }
  // The warps' sums in a fixed tree, through shared memory laid out [mt][nt][e][lane] per warp.
  float* red = reinterpret_cast<float*>(few_channel_shared);
  constexpr int kPerWarp = MT * NTC * 4 * 32;
  for (int half = kWarps / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (warp >= half && warp < 2 * half)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[(warp - half) * kPerWarp + ((mt * NTC + nt) * 4 + e) * 32 + lane] = acc[mt][nt][e];
    __syncthreads();
    if (warp < half)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] += red[warp * kPerWarp + ((mt * NTC + nt) * 4 + e) * 32 + lane];
  }
  if (warp != 0) return;
  float* part = partials + (std::int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * d.o * wd.outs;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int o = mt * 16 + g + (e >= 2 ? 8 : 0), tap = (blockIdx.z * NTC + nt) * 8 + 2 * t + (e & 1);
        if (o < d.o && tap < wd.outs) part[o * wd.outs + tap] = acc[mt][nt][e];
      }
}

// The shared memory of a block of `rows` output rows: the staging (with the
// gate's, when gated), or the warps' tree, whichever is more.
std::int64_t shared_bytes(const FewChannelConvShape& s, int rows, bool gated) {
  const Dims d = dims_for(s, rows, wgrad_cols(s));
  const std::int64_t padded = (std::int64_t(rows) * s.ow() + 15) / 16 * 16, ds = dy_stride(m_tiles(s));
  const std::int64_t staging = (padded * ds + staged_input_elements(d) + 1) / 2 * 4 + padded * 4;
  const std::int64_t with_gate = gated ? (gate_offset(d, int(ds)) + padded * ds) * 2 : staging;
  return std::max<std::int64_t>(with_gate, std::int64_t(kWarps / 2) * kAccTiles * 4 * 32 * 4);
}

}  // namespace
}  // namespace few_channel

std::int64_t few_channel_wgrad_shared_bytes(const FewChannelConvShape& s, int rows, bool gated) {
  return few_channel::shared_bytes(s, rows, gated);
}

bool few_channel_wgrad_gate_fits(const FewChannelConvShape& s) {
  return few_channel::shared_bytes(s, 1, true) <= few_channel::kMaxShared;
}

FewChannelWgrad::FewChannelWgrad(const FewChannelConvShape& s, bool bias_gradient, int multiprocessors, int band_rows,
                                 std::optional<Activation> gate)
    : shape_(s), bias_gradient_(bias_gradient), gate_(gate) {
  using namespace few_channel;
  const std::string why = few_channel_conv_why_not(s);
  if (!why.empty()) throw CudaError("few-channel convolution: " + why);
  const WgradGeometry w = wgrad_geometry(s, bias_gradient);
  // Bands for about two blocks a multiprocessor: each band is one more partial to add.
  const std::int64_t oh = s.oh();
  const std::int64_t bands =
      std::clamp<std::int64_t>((2 * std::int64_t(multiprocessors) + s.n * w.chunks - 1) / (s.n * w.chunks), 1, oh);
  std::int64_t band = band_rows > 0 ? std::min<std::int64_t>(band_rows, oh) : (oh + bands - 1) / bands;
  while (band > 1 && shared_bytes(s, int(band), gate_.has_value()) > kMaxShared) band = (band + 1) / 2;
  band_rows_ = int(band);
  bands_ = int((oh + band - 1) / band);
  shared_bytes_ = int(shared_bytes(s, band_rows_, gate_.has_value()));
  partials_ = DeviceBuffer(static_cast<std::size_t>(s.n * bands_ * s.o * w.outs) * sizeof(float));
}

std::string FewChannelWgrad::describe() const {
  const few_channel::WgradGeometry w = few_channel::wgrad_geometry(shape_, bias_gradient_);
  return fmt::format("few-channel wgrad{}{} on tensor cores: {} bands of {} rows an image, {} tap chunk(s) of {} "
                     "n-tiles, {} ordered partials, {} B shared",
                     gate_ ? fmt::format(" of {}_backward(dY)", activation_op_name(*gate_)) : "",
                     bias_gradient_ ? "+bias" : "", bands_, band_rows_, w.chunks, w.per_chunk, shape_.n * bands_,
                     shared_bytes_);
}

template <typename T, typename B>
void FewChannelWgrad::run(const T* dy, const T* x, T* dw, B* db, cudaStream_t stream, const T* gate) const {
  using namespace few_channel;
  // Whole 16-byte vectors of channels are copied as such (a count not a multiple of 8 goes element by element).
  const auto misaligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 != 0; };
  if (shape_.o % 8 == 0 && (misaligned(dy) || misaligned(gate)))
    throw CudaError("few-channel weight gradient: dY or the activation's saved value is not 16-byte aligned");
  if (gate_.has_value() != (gate != nullptr))
    throw CudaError("few-channel weight gradient: the activation gate was planned otherwise");
  if (bias_gradient_ != (db != nullptr)) throw CudaError("few-channel weight gradient: the bias gradient was planned otherwise");
  const FewChannelConvShape& s = shape_;
  const WgradGeometry w = wgrad_geometry(s, bias_gradient_);
  const WgradDims wd{dims_for(s, band_rows_, wgrad_cols(s)), w.outs, int(s.c * s.kh * s.kw), bias_gradient_, gate,
                     gate_.value_or(Activation::relu)};
  const dim3 grid(static_cast<unsigned>(bands_), static_cast<unsigned>(s.n), static_cast<unsigned>(w.chunks));
  float* partials = partials_.as<float>();
  const auto go = [&](auto kernel) {
    conv_direct::allow_shared(kernel, shared_bytes_);
    kernel<<<grid, kBlockThreads, shared_bytes_, stream>>>(wd, dy, x, partials);
  };
  switch (m_tiles(s) * 100 + w.per_chunk) {
    case 102: go(few_channel_wgrad_kernel<1, 2, T>); break;
    case 104: go(few_channel_wgrad_kernel<1, 4, T>); break;
    case 108: go(few_channel_wgrad_kernel<1, 8, T>); break;
    case 116: go(few_channel_wgrad_kernel<1, 16, T>); break;
    case 202: go(few_channel_wgrad_kernel<2, 2, T>); break;
    case 204: go(few_channel_wgrad_kernel<2, 4, T>); break;
    case 208: go(few_channel_wgrad_kernel<2, 8, T>); break;
    case 402: go(few_channel_wgrad_kernel<4, 2, T>); break;
    case 404: go(few_channel_wgrad_kernel<4, 4, T>); break;
    default: go(few_channel_wgrad_kernel<8, 2, T>);
  }
  SG_LAUNCH_CHECK("few_channel_wgrad_kernel");
  const int elements = int(s.o) * w.outs;
  launch_wgrad_partials_finish(partials, int(s.n * bands_), elements, w.outs, wd.ckk, dw, db, stream);
  SG_LAUNCH_CHECK("wgrad_partials_finish");
}

#define SG_FEW_CHANNEL_WGRAD(T)                                                                        \
  template void FewChannelWgrad::run<T, T>(const T*, const T*, T*, T*, cudaStream_t, const T*) const;           \
  template void FewChannelWgrad::run<T, float>(const T*, const T*, T*, float*, cudaStream_t, const T*) const;
SG_FEW_CHANNEL_WGRAD(__half)
SG_FEW_CHANNEL_WGRAD(__nv_bfloat16)

}  // namespace sg::cuda
