// Batch normalisation of x [rows, channels], channels contiguous (plane == 1:
// BatchNorm1d, or channels-last activations as their [N*H*W, C] view; see
// batch_norm.hpp), over the whole GPU: as one cooperative launch where the
// device has them (batch_norm_rows_grid.cu: x read once), else (or when the
// scratch asks for it) in two launches, here:
//   1. sums: block (slice, group) reads a slice of rows of a group of
//      channels, each warp whole rows in packs of 16 bytes (coalesced), and
//      adds per channel the deviations from the channel's value in row 0 and
//      their squares (the backward also the gradient and the gradient times
//      the deviation); a fixed tree adds the block's lanes and the block
//      writes its partials [slice][k * channels + c] to the workspace. The
//      last block to finish (last_block_done.cuh, which leaves the counter 0
//      for the next launch and graph replay) adds the slices' partials in a
//      fixed order and writes, per channel, the running statistics, dgamma
//      and dbeta and the values the second launch needs.
//   2. apply: the normalisation [+ residual] [+ ReLU] or dx, element-wise on
//      the same packs, a programmatic dependent of the first: its blocks load
//      their first rows while the first launch ends, then wait for its
//      per-channel values.
// No atomics but the finish counter's integer add: the same bits every run
// for a shape and pack width. The moments are batch_norm.cu's
// (batch_norm_moments.cuh), from the same one-pass shifted sums.
//
// Why from kBatchNormRowsMinRows (2048) rows: below that x is at most a few
// hundred kB per 64 channels, each channel one block of batch_norm.cu's
// kernels, which keep its values in registers and run as one launch; there
// two launches and the last block's serial pass over the partials cost more
// than the strided reads. From a few thousand rows the per-channel blocks
// read one value per 32-byte sector from a C-wide stride over few SMs (C
// blocks), while this path streams x once at full width over ~2 blocks per
// SM. The number is a judgement, to be confirmed by a profile of both paths.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "ops/cuda/batch_norm_moments.cuh"
#include "ops/cuda/batch_norm_rows.cuh"
#include "ops/cuda/batch_norm_rows.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/last_block_done.cuh"
#include "ops/cuda/packed_access.cuh"

namespace sg::cuda {
namespace {

using rows::Geometry;
using rows::kBlockThreads;
using rows::Place;

// Values a sums block covers (rows x channels): ~16k, so 100352 rows of 32
// channels make 196 blocks, 25088 x 64 98 and 6272 x 128 49 (the residual
// CNN's), each thread with one or two batches of loads in flight. The last
// block reads every slice's partials alone (one SM's share of L2
// bandwidth, ~6k floats per sum for those shapes), so there are at most
// kMaxSlices slices and at most kMaxPartials / channels (100352 x 128: 128
// slices): longer slices above those.
constexpr std::int64_t kSliceElements = 16384;
constexpr std::int64_t kMaxSlices = 512;
constexpr std::int64_t kMaxPartials = 16384;  // per sum
// Sums per channel: the forward's two (deviations, squares), the backward's four (and gradient, gradient x deviation).
constexpr int kForwardSums = 2, kBackwardSums = 4;
// Per-channel values the last block hands to the apply launch, [kChannelValues][channels].
constexpr int kChannelValues = 4;
// Row packs per tensor an apply thread loads before it waits: one batch
// each, so a block's whole share is in flight before its dependent wait.
constexpr int kApplyBatch = 4;

// The sums' slicing, from the shape alone (the workspace's size may not
// depend on the pack width, which the tensors' alignment picks at launch).
struct Slicing {
  std::int64_t rows_per_slice, slices;
};
Slicing slicing_of(const BatchNormShape& s) {
  Slicing c{std::max<std::int64_t>(1, kSliceElements / s.channels), 0};
  c.slices = (s.n + c.rows_per_slice - 1) / c.rows_per_slice;
  const std::int64_t most = std::clamp<std::int64_t>(kMaxPartials / s.channels, 1, kMaxSlices);
  if (c.slices > most) {
    c.rows_per_slice = (s.n + most - 1) / most;
    c.slices = (s.n + c.rows_per_slice - 1) / c.rows_per_slice;
  }
  return c;
}

// The workspace: partials [slices][kBackwardSums * channels], the last
// block's totals [kBackwardSums * channels], the per-channel values
// [kChannelValues][channels] (batch_norm_workspace_bytes).
struct Workspace {
  float *partials, *totals, *channel;
  unsigned* finished;
};
Workspace workspace_of(const BatchNormShape& s, const BatchNormRowsScratch& scratch) {
  auto* base = static_cast<float*>(scratch.workspace);
  const std::int64_t per_slice = kBackwardSums * s.channels;
  float* totals = base + slicing_of(s).slices * per_slice;
  return {base, totals, totals + per_slice, scratch.finished};
}

// The sums' inputs: x, and the backward's gradient inputs (null in the forward).
template <typename T>
struct SumsIn {
  const T *x, *dy, *dy_other, *relu_out;
};

// What the last block writes per channel, each null when not wanted.
template <typename T>
struct ChannelOut {
  const T *gamma, *beta;
  float *running_mean, *running_var;
  T *dgamma, *dbeta;
  float eps, momentum;
  bool apply;  // the apply launch follows: write its per-channel values
};

// The last block: channel c's moments from the totals and what they give.
// Forward values: mean, rstd * gamma, beta; backward: mean, rstd, gamma *
// mean(dy), gamma * mean(dy * xhat) (batch_norm.cu's formulas).
template <typename T, int K>
__device__ void finish_channels(const T* x, const Geometry& d, const ChannelOut<T>& out, const Workspace& ws) {
  const std::int64_t C = d.channels;
  const float count = float(d.rows);
  for (std::int64_t c = threadIdx.x; c < C; c += kBlockThreads) {
    const float* t = ws.totals + c;
    const Moments m = moments_from(to_float(x[c]), t[0], t[C], count, out.eps);
    if (out.running_mean) update_running(m, count, out.momentum, c, out.running_mean, out.running_var);
    float* v = ws.channel + c;
    if constexpr (K == kForwardSums) {
      if (out.apply) {
        v[0] = m.mean;
        v[C] = m.rstd * to_float(out.gamma[c]);
        v[2 * C] = to_float(out.beta[c]);
      }
    } else {
      const float dy_sum = t[2 * C];
      // sum(dy * xhat) = rstd * (sum(dy * (x - shift)) - (mean - shift) * sum(dy)).
      const float dyx_sum = m.rstd * (t[3 * C] - (t[0] / count) * dy_sum);
      if (out.dgamma) out.dgamma[c] = from_float<T>(dyx_sum);
      if (out.dbeta) out.dbeta[c] = from_float<T>(dy_sum);
      if (out.apply) {
        const float g = to_float(out.gamma[c]);
        v[0] = m.mean;
        v[C] = m.rstd;
        v[2 * C] = g * dy_sum / count;
        v[3 * C] = g * dyx_sum / count;
      }
    }
  }
}

// Launch 1 (see the top): K sums per channel; x and the gradient's inputs
// are read only after the dependent wait (the kernel before writes them).
template <typename T, int V, int K>
__global__ void __launch_bounds__(kBlockThreads)
    batch_norm_rows_sums_kernel(SumsIn<T> in, Geometry d, ChannelOut<T> out, Workspace ws) {
  constexpr int kBytes = V * int(sizeof(T));
  constexpr int B = K == kForwardSums ? 8 : 4;  // row packs in flight per tensor
  constexpr int G = K == kForwardSums ? 1 : B;  // (the forward holds no gradient)
  __shared__ float shared[kBlockThreads * K * V];
  wait_for_previous_kernel();
  // The apply launch's blocks may start now: what they read before their
  // own wait was written before this launch began.
  allow_next_kernel_to_start();
  const Place p = rows::place_of<V>(d);
  float acc[K * V] = {};  // acc[k * V + e]: sum k of channel first + e
  if (p.active) {
    T row0[V], xs[B][V], gs[G][V], others[G][V], relus[G][V];
    load_packed<kBytes>(in.x + p.first, row0);
    float shift[V];
#pragma unroll
    for (int e = 0; e < V; ++e) shift[e] = to_float(row0[e]);
    rows::for_row_batches<B>(
        p,
        [&](int b, std::int64_t r) {
          const std::int64_t k = r * d.channels + p.first;
          load_packed<kBytes>(in.x + k, xs[b]);
          if constexpr (K == kBackwardSums) {
            load_packed<kBytes>(in.dy + k, gs[b]);
            if (in.dy_other) load_packed<kBytes>(in.dy_other + k, others[b]);
            if (in.relu_out) load_packed<kBytes>(in.relu_out + k, relus[b]);
          }
        },
        [&](int b, std::int64_t) {
          if constexpr (K == kBackwardSums)
            rows::combine_gradient(gs[b], others[b], relus[b], in.dy_other != nullptr, in.relu_out != nullptr);
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const float dev = to_float(xs[b][e]) - shift[e];
            acc[e] += dev;
            acc[V + e] += dev * dev;
            if constexpr (K == kBackwardSums) {
              const float grad = to_float(gs[b][e]);
              acc[2 * V + e] += grad;
              acc[3 * V + e] += grad * dev;
            }
          }
        });
  }
  rows::reduce_lanes<K * V>(acc, p, d.cols, shared);
  const std::int64_t columns = K * d.channels;
  if (p.active && p.lane == 0) {
    const std::int64_t slice = blockIdx.x / unsigned(d.groups);
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) ws.partials[slice * columns + k * d.channels + p.first + e] = acc[k * V + e];
    __threadfence();  // this thread's partials visible before its block counts as done
  }
  if (!last_block_done(ws.finished)) return;
  rows::sum_partials(ws.partials, gridDim.x / unsigned(d.groups), columns, ws.totals, shared);
  finish_channels<T, K>(in.x, d, out, ws);
}

// The per-channel value `which` of the thread's channels, from the last block
// of launch 1 (__ldcg: written on another SM).
template <int V>
__device__ __forceinline__ void channel_values(const Workspace& ws, std::int64_t channels, int which,
                                               std::int64_t first, float (&v)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = __ldcg(ws.channel + which * channels + first + e);
}

// Launch 2 of the forward: y = (x - mean) * rstd * gamma + beta [rounded to
// T, + residual] [then ReLU], as batch_norm.cu's `normalised`.
template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads)
    batch_norm_rows_forward_kernel(const T* x, const T* residual, Geometry d, Workspace ws, T* y, bool relu) {
  constexpr int kBytes = V * int(sizeof(T));
  const Place p = rows::place_of<V>(d);
  if (!p.active) return;
  T xs[kApplyBatch][V], skips[kApplyBatch][V];
  float mean[V], scale[V], bias[V];
  bool ready = false;
  const float floor = relu ? 0.f : -INFINITY;
  rows::for_row_batches<kApplyBatch>(
      p,
      [&](int b, std::int64_t r) {
        const std::int64_t k = r * d.channels + p.first;
        load_packed<kBytes>(x + k, xs[b]);
        if (residual) load_packed<kBytes>(residual + k, skips[b]);
      },
      [&](int b, std::int64_t r) {
        if (!ready) {  // the first batch's loads are in flight: now the per-channel values
          wait_for_previous_kernel();
          channel_values(ws, d.channels, 0, p.first, mean);
          channel_values(ws, d.channels, 1, p.first, scale);
          channel_values(ws, d.channels, 2, p.first, bias);
          ready = true;
        }
        T out[V];
        rows::normalise_pack(xs[b], skips[b], residual != nullptr, mean, scale, bias, floor, out);
        store_packed<kBytes>(y + r * d.channels + p.first, out);
      });
}

// Launch 2 of the backward: dx = rstd * (g * gamma - gamma * mean(g) - xhat
// * gamma * mean(g * xhat)), g the combined gradient.
template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads)
    batch_norm_rows_backward_kernel(SumsIn<T> in, const T* gamma, Geometry d, Workspace ws, T* dx) {
  constexpr int kBytes = V * int(sizeof(T));
  const Place p = rows::place_of<V>(d);
  if (!p.active) return;
  T xs[kApplyBatch][V], gs[kApplyBatch][V], others[kApplyBatch][V], relus[kApplyBatch][V];
  T gamma_pack[V];
  load_packed<kBytes>(gamma + p.first, gamma_pack);  // (first is a multiple of V: gamma's packs are aligned)
  float gamma_f[V], mean[V], rstd[V], g_mean[V], gx_mean[V];
#pragma unroll
  for (int e = 0; e < V; ++e) gamma_f[e] = to_float(gamma_pack[e]);
  bool ready = false;
  rows::for_row_batches<kApplyBatch>(
      p,
      [&](int b, std::int64_t r) {
        const std::int64_t k = r * d.channels + p.first;
        load_packed<kBytes>(in.x + k, xs[b]);
        load_packed<kBytes>(in.dy + k, gs[b]);
        if (in.dy_other) load_packed<kBytes>(in.dy_other + k, others[b]);
        if (in.relu_out) load_packed<kBytes>(in.relu_out + k, relus[b]);
      },
      [&](int b, std::int64_t r) {
        if (!ready) {
          wait_for_previous_kernel();
          channel_values(ws, d.channels, 0, p.first, mean);
          channel_values(ws, d.channels, 1, p.first, rstd);
          channel_values(ws, d.channels, 2, p.first, g_mean);
          channel_values(ws, d.channels, 3, p.first, gx_mean);
          ready = true;
        }
        rows::combine_gradient(gs[b], others[b], relus[b], in.dy_other != nullptr, in.relu_out != nullptr);
        T out[V];
        rows::gradient_pack(xs[b], gs[b], mean, rstd, gamma_f, g_mean, gx_mean, out);
        store_packed<kBytes>(dx + r * d.channels + p.first, out);
      });
}

using rows::pack_width;
using rows::with_pack_width;

// The grid of `s` in packs of v channels: the sums' slices, or (apply) one
// batch of kApplyBatch rows per lane.
struct Grid {
  Geometry d;
  LaunchGeometry launch;
};
Grid grid_of(const BatchNormShape& s, int v, bool apply) {
  const std::int64_t packs = s.channels / v;
  const std::int64_t groups = rows::groups_of(packs);
  const int cols = rows::cols_of(packs);
  const std::int64_t rows_per_slice =
      apply ? std::int64_t(kBlockThreads / cols) * kApplyBatch : slicing_of(s).rows_per_slice;
  const std::int64_t blocks = (s.n + rows_per_slice - 1) / rows_per_slice * groups;
  if (blocks > std::int64_t(0x7fffffff))
    throw std::invalid_argument("batch_norm: " + std::to_string(blocks) + " blocks for " + std::to_string(s.n) +
                                " rows of " + std::to_string(s.channels) + " channels");
  return {{s.n, s.channels, rows_per_slice, static_cast<int>(groups), cols},
          {dim3(static_cast<unsigned>(blocks)), dim3(kBlockThreads)}};
}

}  // namespace

bool batch_norm_rows_path(const BatchNormShape& s, const BatchNormRowsScratch& rows) {
  return batch_norm_workspace_bytes(s) > 0 && rows.workspace && rows.finished;
}

std::size_t batch_norm_workspace_bytes(const BatchNormShape& s) {
  if (s.plane != 1 || s.n < kBatchNormRowsMinRows || s.channels < 1) return 0;
  // Either path's: the scratch's flag and the device pick one at launch.
  const std::int64_t two = ((slicing_of(s).slices + 1) * kBackwardSums + kChannelValues) * s.channels;
  return static_cast<std::size_t>(std::max(two, rows::grid_workspace_floats(s))) * sizeof(float);
}

template <typename T>
void launch_batch_norm_rows_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                                    cudaStream_t stream, float* running_mean, float* running_var, const T* residual,
                                    bool relu, const BatchNormRowsScratch& rows) {
  const rows::GridArgs<T> a{x,    nullptr, nullptr,      nullptr,     residual,   gamma,   beta,  y,
                            nullptr, nullptr, running_mean, running_var, s.eps, s.momentum, relu};
  if (rows.cooperative && rows::launch_grid(a, s, false, stream, rows)) return;
  const Workspace ws = workspace_of(s, rows);
  const ChannelOut<T> out{gamma, beta, running_mean, running_var, nullptr, nullptr, s.eps, s.momentum, y != nullptr};
  with_pack_width<T>(pack_width<T>(s, {x, y, residual}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const Grid sums = grid_of(s, V, false);
    launch_dependent(batch_norm_rows_sums_kernel<T, V, kForwardSums>, sums.launch, stream, rows.dependent_launch,
                     SumsIn<T>{x, nullptr, nullptr, nullptr}, sums.d, out, ws);
    SG_LAUNCH_CHECK("batch_norm_rows_sums_kernel");
    if (!y) return;  // the running statistics alone
    const Grid apply = grid_of(s, V, true);
    launch_dependent(batch_norm_rows_forward_kernel<T, V>, apply.launch, stream, rows.dependent_launch, x, residual,
                     apply.d, ws, y, relu);
    SG_LAUNCH_CHECK("batch_norm_rows_forward_kernel");
  });
}

template <typename T>
void launch_batch_norm_rows_backward(const T* dy, const T* x, const T* gamma, const BatchNormShape& s, T* dx, T* dgamma,
                                     T* dbeta, cudaStream_t stream, const T* relu_out, const T* dy_other,
                                     const BatchNormRowsScratch& rows) {
  if (!dx && !dgamma && !dbeta) return;  // nothing reads any of them
  const rows::GridArgs<T> a{x,  dy,     dy_other, relu_out, nullptr, gamma, nullptr,   dx,
                            dgamma, dbeta, nullptr,  nullptr,  s.eps,   s.momentum, false};
  if (rows.cooperative && rows::launch_grid(a, s, true, stream, rows)) return;
  const Workspace ws = workspace_of(s, rows);
  const SumsIn<T> in{x, dy, dy_other, relu_out};
  const ChannelOut<T> out{gamma, nullptr, nullptr, nullptr, dgamma, dbeta, s.eps, s.momentum, dx != nullptr};
  with_pack_width<T>(pack_width<T>(s, {dy, x, dx, relu_out, dy_other, gamma}), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const Grid sums = grid_of(s, V, false);
    launch_dependent(batch_norm_rows_sums_kernel<T, V, kBackwardSums>, sums.launch, stream, rows.dependent_launch, in,
                     sums.d, out, ws);
    SG_LAUNCH_CHECK("batch_norm_rows_sums_kernel (backward)");
    if (!dx) return;
    const Grid apply = grid_of(s, V, true);
    launch_dependent(batch_norm_rows_backward_kernel<T, V>, apply.launch, stream, rows.dependent_launch, in, gamma,
                     apply.d, ws, dx);
    SG_LAUNCH_CHECK("batch_norm_rows_backward_kernel");
  });
}

// The forward's sums without y: the cooperative kernel returns after the
// per-channel values, the two launches skip the apply launch.
template <typename T>
void launch_batch_norm_rows_stats_update(const T* x, const BatchNormShape& s, float* running_mean, float* running_var,
                                         cudaStream_t stream, const BatchNormRowsScratch& rows) {
  launch_batch_norm_rows_forward<T>(x, nullptr, nullptr, s, nullptr, stream, running_mean, running_var, nullptr, false,
                                    rows);
}

#define SG_INSTANTIATE_BATCH_NORM_ROWS(T)                                                                             \
  template void launch_batch_norm_rows_forward<T>(const T*, const T*, const T*, const BatchNormShape&, T*,            \
                                                  cudaStream_t, float*, float*, const T*, bool,                       \
                                                  const BatchNormRowsScratch&);                                       \
  template void launch_batch_norm_rows_backward<T>(const T*, const T*, const T*, const BatchNormShape&, T*, T*, T*,   \
                                                   cudaStream_t, const T*, const T*, const BatchNormRowsScratch&);    \
  template void launch_batch_norm_rows_stats_update<T>(const T*, const BatchNormShape&, float*, float*, cudaStream_t, \
                                                       const BatchNormRowsScratch&);
SG_INSTANTIATE_BATCH_NORM_ROWS(float)
SG_INSTANTIATE_BATCH_NORM_ROWS(__half)
SG_INSTANTIATE_BATCH_NORM_ROWS(__nv_bfloat16)
#undef SG_INSTANTIATE_BATCH_NORM_ROWS

}  // namespace sg::cuda
