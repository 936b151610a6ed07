#pragma once
// Device pieces of batch_norm_rows.cu: where a thread sits in x [rows,
// channels], its rows in batches of loads, and the two fixed-order
// reductions (a block's lanes; the slices' partials in the last block). Every
// order depends on the shape and the pack width alone: the same bits every run.
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/batch_norm.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"

namespace sg::cuda::rows {

constexpr int kBlockThreads = 256;

// x [rows, channels] cut into slices of rows_per_slice rows (the last may be
// shorter) and groups of `cols` packs of V channels (the last may be
// narrower); block b takes slice b / groups, group b % groups.
struct Geometry {
  std::int64_t rows, channels, rows_per_slice;
  int groups, cols;
};

// A thread's place: pack `col` of its block's group (channels first ..
// first + V), rows begin + lane, begin + lane + lanes, ... below end. Threads
// past the last lane or the last channel are not active.
struct Place {
  int lane, lanes, col;
  std::int64_t first, begin, end;
  bool active;
};

template <int V>
__device__ __forceinline__ Place place_of(const Geometry& d) {
  Place p;
  const auto groups = unsigned(d.groups);
  p.lanes = kBlockThreads / d.cols;
  p.lane = int(threadIdx.x) / d.cols;
  p.col = int(threadIdx.x) % d.cols;
  p.first = (std::int64_t(blockIdx.x % groups) * d.cols + p.col) * V;
  p.begin = std::int64_t(blockIdx.x / groups) * d.rows_per_slice;
  p.end = d.rows - p.begin < d.rows_per_slice ? d.rows : p.begin + d.rows_per_slice;
  p.active = p.lane < p.lanes && p.first < d.channels;
  return p;
}

// The thread's rows, B at a time: load(b, row) for each row of a batch,
// then use(b, row) for each, so B loads are in flight before the first use
// waits on one.
template <int B, typename Load, typename Use>
__device__ __forceinline__ void for_row_batches(const Place& p, Load&& load, Use&& use) {
  const std::int64_t lanes = p.lanes;
  for (std::int64_t r = p.begin + p.lane; r < p.end; r += B * lanes) {
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (r + b * lanes < p.end) load(b, r + b * lanes);
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (r + b * lanes < p.end) use(b, r + b * lanes);
  }
}

// Adds the lanes' acc into lane 0's (every thread of the block calls it:
// barriers inside). A halving tree: at each level the upper lanes [s, 2s)
// publish their M values and lanes [0, s) add them, an order fixed by
// `lanes` alone. `shared` holds kBlockThreads * M floats, value e of thread
// slot t at e * kBlockThreads + t: consecutive threads, consecutive banks (a
// thread's M values side by side put a warp's 32 stores in one bank at M =
// 32: the backward's reduction took 5 us, measured with globaltimer probes;
// now ~1.5. A shuffle tree inside the warps measured no faster).
template <int M>
__device__ __forceinline__ void reduce_lanes(float (&acc)[M], const Place& p, int cols, float* shared) {
  int s = 1;
  while (2 * s < p.lanes) s *= 2;  // lanes <= 2s
  for (; s >= 1; s /= 2) {
    if (p.lane >= s && p.lane < 2 * s && p.lane < p.lanes)
#pragma unroll
      for (int e = 0; e < M; ++e) shared[e * kBlockThreads + (p.lane - s) * cols + p.col] = acc[e];
    __syncthreads();
    if (p.lane < s && p.lane + s < p.lanes)
#pragma unroll
      for (int e = 0; e < M; ++e) acc[e] += shared[e * kBlockThreads + p.lane * cols + p.col];
    __syncthreads();
  }
}

// totals[q] = the sum over the slices of partials[slice][q], q < columns
// (the block's threads together; `shared` holds kBlockThreads floats). When the
// columns are fewer than the threads, `segments` threads share a column:
// segment k adds slices k, k + segments, ... in order, then one thread adds
// the segments' sums in order. __ldcg: the other blocks' partials are in
// L2, not in this SM's L1. totals is visible to the whole block on return.
__device__ __forceinline__ void sum_partials(const float* partials, std::int64_t slices, std::int64_t columns,
                                             float* totals, float* shared) {
  constexpr int kBatch = 16;  // loads in flight per thread: the slices' partials take few round trips
  const int width = columns < kBlockThreads ? int(columns) : kBlockThreads;
  const int segments = kBlockThreads / width;
  const int segment = int(threadIdx.x) / width, column = int(threadIdx.x) % width;
  for (std::int64_t base = 0; base < columns; base += width) {
    const std::int64_t q = base + column;
    float acc = 0.f;
    if (segment < segments && q < columns)
      for (std::int64_t s = segment; s < slices; s += kBatch * segments) {
        float v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (s + b * segments < slices) v[b] = __ldcg(partials + (s + b * segments) * columns + q);
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (s + b * segments < slices) acc += v[b];
      }
    if (segments == 1) {  // (width == kBlockThreads: every thread its own column)
      if (q < columns) totals[q] = acc;
      continue;
    }
    // segments > 1: width == columns, this is the only round.
    if (segment < segments) shared[segment * width + column] = acc;
    __syncthreads();
    if (int(threadIdx.x) < width) {
      float total = 0.f;
      for (int k = 0; k < segments; ++k) total += shared[k * width + int(threadIdx.x)];
      totals[q] = total;
    }
  }
  __syncthreads();
}

// The gradient of batch_norm's output from the backward's inputs (as
// batch_norm.cu's GradientIn): with dy_other, dy + dy_other rounded to T;
// with relu_out, only where relu_out > 0 (relu_backward's rule).
template <typename T, int V>
__device__ __forceinline__ void combine_gradient(T (&g)[V], const T (&other)[V], const T (&relu_out)[V],
                                                 bool with_other, bool with_relu) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    if (with_other) g[e] = from_float<T>(to_float(g[e]) + to_float(other[e]));
    if (with_relu && !(to_float(relu_out[e]) > 0.f)) g[e] = from_float<T>(0.f);
  }
}

// y of one pack: (x - mean) * scale + bias [rounded to T, + skip] [then
// ReLU: floor 0, else -inf], as batch_norm.cu's `normalised`.
template <typename T, int V>
__device__ __forceinline__ void normalise_pack(const T (&x)[V], const T (&skip)[V], bool with_skip,
                                               const float (&mean)[V], const float (&scale)[V],
                                               const float (&bias)[V], float floor, T (&out)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    float v = (to_float(x[e]) - mean[e]) * scale[e] + bias[e];
    // The add rounds as the graph stores it: the normalised value to T, then the sum.
    if (with_skip) v = to_float(from_float<T>(v)) + to_float(skip[e]);
    out[e] = from_float<T>(fmaxf(v, floor));
  }
}

// dx of one pack: rstd * (g * gamma - gamma * mean(g) - xhat * gamma *
// mean(g * xhat)), g the combined gradient (g_mean, gx_mean: the gamma * means).
template <typename T, int V>
__device__ __forceinline__ void gradient_pack(const T (&x)[V], const T (&g)[V], const float (&mean)[V],
                                              const float (&rstd)[V], const float (&gamma)[V],
                                              const float (&g_mean)[V], const float (&gx_mean)[V], T (&out)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float xhat = (to_float(x[e]) - mean[e]) * rstd[e];
    out[e] = from_float<T>(rstd[e] * (to_float(g[e]) * gamma[e] - g_mean[e] - xhat * gx_mean[e]));
  }
}

// The pack width: 16 bytes of channels where the channels split into them
// and every tensor is 16-byte aligned (then every row's packs are), else
// one value (odd channel counts: still a warp's consecutive values).
template <typename T>
int pack_width(const BatchNormShape& s, std::initializer_list<const void*> tensors) {
  if (s.channels % kVec<T> != 0) return 1;
  for (const void* t : tensors)
    if (t && !aligned_to(t, 16)) return 1;
  return kVec<T>;
}

// Calls f(std::integral_constant<int, V>{}) for the pack width v.
template <typename T, typename F>
void with_pack_width(int v, F&& f) {
  if (v == kVec<T>)
    f(std::integral_constant<int, kVec<T>>{});
  else
    f(std::integral_constant<int, 1>{});
}

// Packs of a row one block takes: a warp's width, so that a block keeps at
// least 8 row lanes for loads in flight. groups of channels: ceil(packs /
// this), each `cols` packs wide (groups of even widths).
constexpr int kMaxGroupPacks = 32;
inline int groups_of(std::int64_t packs) { return int((packs + kMaxGroupPacks - 1) / kMaxGroupPacks); }
inline int cols_of(std::int64_t packs) { return int((packs + groups_of(packs) - 1) / groups_of(packs)); }

// Every tensor of one op for the one-launch path (batch_norm_rows_grid.cu),
// null where not given; out is y (forward) or dx (backward, null: none).
template <typename T>
struct GridArgs {
  const T *x, *dy, *dy_other, *relu_out, *residual, *gamma, *beta;
  T *out, *dgamma, *dbeta;
  float *running_mean, *running_var;
  float eps, momentum;
  bool relu;
};

// The op as one cooperative launch (the forward's two sums, the backward's
// four); false, with nothing launched, where the device or shape cannot
// have it (the caller runs the two launches instead).
template <typename T>
bool launch_grid(const GridArgs<T>& a, const BatchNormShape& s, bool backward, cudaStream_t stream,
                 const BatchNormRowsScratch& scratch);
// The workspace floats launch_grid needs for s (its partials and totals).
std::int64_t grid_workspace_floats(const BatchNormShape& s);

}  // namespace sg::cuda::rows
