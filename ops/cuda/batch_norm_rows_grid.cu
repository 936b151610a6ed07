// Batch normalisation of x [rows, channels] (batch_norm_rows.cu's path) as ONE
// cooperative launch, where the device has them:
//   1. block (slice, group), as many blocks as are resident at once, loads its
//      rows' packs into registers (up to kHeld per thread and tensor: all of
//      them for the residual CNN's f16 shapes on an H200 but the backward of
//      100352 x 32; rows past those are read again in step 3, mostly from
//      L2), adds the K sums per channel (batch_norm_rows.cu's: deviations
//      from the channel's row-0 value, their squares; the backward's
//      gradient and gradient x deviation), a fixed tree over the block's
//      lanes, and writes its partials [k * channels + c][slice];
//   2. grid sync; the grid's warps add each column of partials over the
//      slices (a lane's slices in order, then a shuffle tree) into totals
//      [k * channels + c]; grid sync;
//   3. each block copies its channels' totals to shared memory (gamma and
//      beta went there at the start); every thread takes its channels'
//      moments from them (the same bits in every block: the same sums, the
//      same operations) and writes y or dx from the values it holds; the
//      first slice's blocks write the running statistics, dgamma and dbeta.
// Against the two launches: x (and dy...) is read from memory once, and the
// second launch's start and the last block's serial pass over the partials
// are gone; two grid syncs (an atomic per block each) take their place.
// Deterministic: no float atomics, and the grid (so every sum's order) is a
// function of the shape, the pack width and the device alone (its SM count
// and this kernel's occupancy there): the same bits every run and replay.
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "ops/cuda/batch_norm_moments.cuh"
#include "ops/cuda/batch_norm_rows.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"

namespace sg::cuda::rows {
namespace {

namespace cg = cooperative_groups;

// Row packs per tensor a thread keeps in registers from step 1 to step 3
// (x, and the backward's combined gradient or the forward's residual), with
// the rows past them (kRest) or without: as many as fit 128 registers a
// thread (2 blocks per SM; the f16 forward without kRest spills ~60 bytes
// a thread, once; the backward ~16). 132 SMs x 2 x 256 threads x 6 packs
// hold the residual CNN's largest forward (100352 x 32 f16: 401k packs);
// its backward holds 4 of the 6 row packs a thread has there.
template <int K, bool kRest>
constexpr int kHeld = K == 2 ? (kRest ? 4 : 6) : 4;
constexpr int kMinBlocksPerSm = 2;
// Row packs per tensor in flight for the rows past the held ones (forward, backward: its four tensors).
constexpr int kForwardStream = 4, kBackwardStream = 1;
// Resident blocks per SM at most: more only add partials and grid-sync arrivals (the loads in flight are enough).
constexpr int kMaxBlocksPerSm = 4;
// Slices at most: 1024 (8 blocks on each of 128 SMs), and at most kMaxGridPartials / channels, which bound
// the workspace (a function of the shape alone) at 4 x 256 kB.
constexpr std::int64_t kMaxGridSlices = 1024, kMaxGridPartials = 65536;
// Partials a lane loads before it adds them (step 2).
constexpr int kColumnBatch = 8;
constexpr int kForwardSums = 2, kBackwardSums = 4;  // (kHeld's 2: the forward's)
constexpr int kMaxDevices = 64;

std::int64_t max_slices(const BatchNormShape& s) {
  return std::clamp<std::int64_t>(kMaxGridPartials / s.channels, 1, kMaxGridSlices);
}

// acc[k * V + e] += sum k of channel e's value x[e] (gradient g[e]).
template <int K, typename T, int V>
__device__ __forceinline__ void add_pack(float (&acc)[K * V], const T (&x)[V], const T (&g)[V],
                                         const float (&shift)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float dev = to_float(x[e]) - shift[e];
    acc[e] += dev;
    acc[V + e] += dev * dev;
    if constexpr (K == kBackwardSums) {
      const float grad = to_float(g[e]);
      acc[2 * V + e] += grad;
      acc[3 * V + e] += grad * dev;
    }
  }
}

// Step 2: totals[q] = the sum over the slices of partials[q][slice], one warp
// per column q across the grid: lane l adds slices l, l + 32, ... in order
// (kColumnBatch loads in flight), then a shuffle tree whose lane 0 is fixed.
// __ldcg: the partials were written on other SMs.
__device__ __forceinline__ void sum_columns(const float* partials, unsigned slices, std::int64_t columns,
                                            float* totals) {
  constexpr int kWarps = kBlockThreads / 32;
  const int lane = int(threadIdx.x) % 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * kWarps;
  for (std::int64_t q = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; q < columns; q += warps) {
    const float* column = partials + q * slices;
    float acc = 0.f;
    for (unsigned s = lane; s < slices; s += kColumnBatch * 32) {
      float v[kColumnBatch];
#pragma unroll
      for (int b = 0; b < kColumnBatch; ++b)
        if (s + b * 32 < slices) v[b] = __ldcg(column + s + b * 32);
#pragma unroll
      for (int b = 0; b < kColumnBatch; ++b)
        if (s + b * 32 < slices) acc += v[b];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0) totals[q] = acc;
  }
}

// Loads the packs of row r of x and (backward) its gradient inputs, (forward) its residual.
template <int K, typename T, int V>
__device__ __forceinline__ void load_row(const GridArgs<T>& a, std::int64_t k, bool skip, T (&x)[V], T (&g)[V],
                                         T (&other)[V], T (&relu)[V]) {
  constexpr int kBytes = V * int(sizeof(T));
  load_packed<kBytes>(a.x + k, x);
  if constexpr (K == kBackwardSums) {
    load_packed<kBytes>(a.dy + k, g);
    if (a.dy_other) load_packed<kBytes>(a.dy_other + k, other);
    if (a.relu_out) load_packed<kBytes>(a.relu_out + k, relu);
  } else if (skip) {
    load_packed<kBytes>(a.residual + k, g);  // (the forward's g holds the residual)
  }
}

// Per-channel values step 3 uses: the forward's mean, rstd * gamma, beta;
// the backward's mean, a, b, c of dx = a * g + b * (x - mean) + c, the
// batch_norm.cu's rstd * (g * gamma - gamma * mean(g) - xhat * gamma *
// mean(g * xhat)) with fewer values held (registers).
constexpr int kValues = 4;

// The forward's y (g: the residual) or the backward's dx (g: the combined
// gradient) of one pack, from the per-channel values of step 3.
template <int K, typename T, int V>
__device__ __forceinline__ void write_out(const GridArgs<T>& a, std::int64_t k, const T (&x)[V], const T (&g)[V],
                                          const float (&v)[kValues][V], float floor) {
  constexpr int kBytes = V * int(sizeof(T));
  T out[V];
  if constexpr (K == kBackwardSums) {
#pragma unroll
    for (int e = 0; e < V; ++e)
      out[e] = from_float<T>(v[1][e] * to_float(g[e]) + (v[2][e] * (to_float(x[e]) - v[0][e]) + v[3][e]));
  } else
    normalise_pack(x, g, a.residual != nullptr, v[0], v[1], v[2], floor, out);
  store_packed<kBytes>(a.out + k, out);
}

// kRest: with the loops over the rows past the held ones (their registers
// cost occupancy, so a grid that holds every row runs without them).
template <typename T, int V, int K, bool kRest>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocksPerSm)
    batch_norm_rows_grid_kernel(GridArgs<T> a, Geometry d, float* partials, float* totals) {
  constexpr bool kBackward = K == kBackwardSums;
  constexpr int H = kHeld<K, kRest>;
  constexpr int B = kBackward ? kBackwardStream : kForwardStream;
  constexpr int M = kBackward ? H : 1;  // the backward's mask and other gradient, until combined
  __shared__ float shared[kBlockThreads * K * V];
  // Everything here reads what the kernel before may write: wait first. The
  // next kernel may start once every block of this one is resident (so its
  // blocks cannot keep any of these from the grid syncs).
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
  const Place p = place_of<V>(d);
  const int width = d.cols * V;  // the group's channels (the last group's may pass the channels)
  const std::int64_t group_first = std::int64_t(blockIdx.x % unsigned(d.groups)) * width;
  // gamma and beta of the group, for step 3: loaded now, their L2 round trip
  // beside step 1's, not after the grid syncs (visible after reduce_lanes' barriers).
  __shared__ float params[2][kMaxGroupPacks * V];
  if (a.out)
    for (int i = int(threadIdx.x); i < width && group_first + i < d.channels; i += kBlockThreads) {
      params[0][i] = to_float(a.gamma[group_first + i]);
      if (!kBackward) params[1][i] = to_float(a.beta[group_first + i]);
    }
  const unsigned slices = gridDim.x / unsigned(d.groups), slice = blockIdx.x / unsigned(d.groups);
  const bool skip = !kBackward && a.residual && a.out;  // the forward's residual, loaded with x
  Place rest = p;                                       // the rows past the held ones
  rest.begin += std::int64_t(H) * p.lanes;
  const auto held = [&](int i) { return p.begin + p.lane + std::int64_t(i) * p.lanes; };
  // Held row i's packs at offset + i * stride.
  std::int64_t offset = (p.begin + p.lane) * d.channels + p.first;
  const std::int64_t stride = std::int64_t(p.lanes) * d.channels;
  float shift[V] = {}, acc[K * V] = {};
  T xs[H][V], gs[H][V];  // gs: the combined gradient (backward) or the residual (forward)
  if (p.active) {
    T row0[V], others[M][V], relus[M][V];
    load_packed<V* int(sizeof(T))>(a.x + p.first, row0);
#pragma unroll
    for (int e = 0; e < V; ++e) shift[e] = to_float(row0[e]);
#pragma unroll
    for (int i = 0; i < H; ++i)
      if (held(i) < p.end) load_row<K>(a, offset + i * stride, skip, xs[i], gs[i], others[i % M], relus[i % M]);
#pragma unroll
    for (int i = 0; i < H; ++i)
      if (held(i) < p.end) {
        if constexpr (kBackward)
          combine_gradient(gs[i], others[i], relus[i], a.dy_other != nullptr, a.relu_out != nullptr);
        add_pack<K>(acc, xs[i], gs[i], shift);
      }
    T bx[B][V], bg[B][V], bo[B][V], br[B][V];
    if constexpr (kRest)
      for_row_batches<B>(
          rest,
          [&](int b, std::int64_t r) { load_row<K>(a, r * d.channels + p.first, false, bx[b], bg[b], bo[b], br[b]); },
          [&](int b, std::int64_t) {
            if constexpr (kBackward)
              combine_gradient(bg[b], bo[b], br[b], a.dy_other != nullptr, a.relu_out != nullptr);
            add_pack<K>(acc, bx[b], bg[b], shift);
          });
  }
  reduce_lanes<K * V>(acc, p, d.cols, shared);
  const std::int64_t columns = K * d.channels;
  if (p.active && p.lane == 0)
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) partials[(k * d.channels + p.first + e) * slices + slice] = acc[k * V + e];
  cg::this_grid().sync();
  sum_columns(partials, slices, columns, totals);
  cg::this_grid().sync();
  // The block's group's totals into shared memory, one L2 read each: read by
  // every thread with __ldcg, the grid's ~34k warps' loads of the same few
  // lines queued at one L2 slice (step 3 took 5-13 us, globaltimer probes).
  for (int i = int(threadIdx.x); i < K * width; i += kBlockThreads) {
    const std::int64_t c = group_first + i % width;
    if (c < d.channels) shared[i] = __ldcg(totals + (i / width) * d.channels + c);
  }
  __syncthreads();
  if (!p.active) return;

  // Step 3: the per-channel values (kValues; batch_norm_rows.cu's finish_channels' formulas).
  // Every load first, then the arithmetic, then the first slice's stores: a
  // store to running_mean (a float*) between two channels' loads would keep
  // the compiler from issuing the second before it, V serial round trips,
  // which every block waits for at the end.
  const float count = float(d.rows);
  const bool first_slice = slice == 0 && p.lane == 0;  // writes the per-channel outputs
  float sums[K][V], gamma[V], beta[V], run_mean[V], run_var[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const std::int64_t c = p.first + e;
#pragma unroll
    for (int k = 0; k < K; ++k) sums[k][e] = shared[k * width + p.col * V + e];
    gamma[e] = a.out ? params[0][p.col * V + e] : 0.f;
    beta[e] = !kBackward && a.out ? params[1][p.col * V + e] : 0.f;
    const bool running = first_slice && a.running_mean;
    run_mean[e] = running ? a.running_mean[c] : 0.f;
    run_var[e] = running ? a.running_var[c] : 0.f;
  }
  float v[kValues][V] = {}, dgamma[V] = {}, dbeta[V] = {};
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const Moments m = moments_from(shift[e], sums[0][e], sums[1][e], count, a.eps);
    updated_running(m, count, a.momentum, run_mean[e], run_var[e]);
    v[0][e] = m.mean;
    if constexpr (kBackward) {
      const float dy_sum = sums[2][e];
      // sum(g * xhat) = rstd * (sum(g * (x - shift)) - (mean - shift) * sum(g)).
      const float dyx_sum = m.rstd * (sums[3][e] - (sums[0][e] / count) * dy_sum);
      dgamma[e] = dyx_sum;
      dbeta[e] = dy_sum;
      v[1][e] = m.rstd * gamma[e];
      v[2][e] = -m.rstd * m.rstd * (gamma[e] * dyx_sum / count);
      v[3][e] = -m.rstd * (gamma[e] * dy_sum / count);
    } else {
      v[1][e] = m.rstd * gamma[e];
      v[2][e] = beta[e];
    }
  }
  if (first_slice)
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const std::int64_t c = p.first + e;
      if (a.running_mean) {
        a.running_mean[c] = run_mean[e];
        a.running_var[c] = run_var[e];
      }
      if (kBackward && a.dgamma) a.dgamma[c] = from_float<T>(dgamma[e]);
      if (kBackward && a.dbeta) a.dbeta[c] = from_float<T>(dbeta[e]);
    }
  if (!a.out) return;
  const float floor = a.relu ? 0.f : -INFINITY;
  // The held rows' addresses again, not kept from step 1: kept, they would
  // take 2 registers per row and tensor across the grid syncs (spills).
  asm volatile("" : "+l"(offset));
#pragma unroll
  for (int i = 0; i < H; ++i)
    if (held(i) < p.end) write_out<K>(a, offset + i * stride, xs[i], gs[i], v, floor);
  if constexpr (!kRest) return;
  T bx[B][V], bg[B][V], bo[B][V], br[B][V];
  for_row_batches<B>(
      rest, [&](int b, std::int64_t r) { load_row<K>(a, r * d.channels + p.first, skip, bx[b], bg[b], bo[b], br[b]); },
      [&](int b, std::int64_t r) {
        if constexpr (kBackward) combine_gradient(bg[b], bo[b], br[b], a.dy_other != nullptr, a.relu_out != nullptr);
        write_out<K>(a, r * d.channels + p.first, bx[b], bg[b], v, floor);
      });
}

// Blocks of batch_norm_rows_grid_kernel<T, V, K, kRest> resident at once on the
// current device (at most kMaxBlocksPerSm per SM); 0 without cooperative
// launches. Read once per device: the launch's grid, so its sums' order,
// stays the same for the process.
template <typename T, int V, int K, bool kRest>
int resident_blocks() {
  static std::array<std::atomic<int>, kMaxDevices> known{};  // the count + 1; 0: not read yet
  int device = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices && known[std::size_t(device)].load() > 0) return known[std::size_t(device)].load() - 1;
  int blocks = 0;
  if (current_device_attribute(cudaDevAttrCooperativeLaunch) != 0) {
    SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, batch_norm_rows_grid_kernel<T, V, K, kRest>,
                                                                kBlockThreads, 0));
    blocks = std::min(blocks, kMaxBlocksPerSm) * multiprocessor_count();
  }
  if (device < kMaxDevices) known[std::size_t(device)].store(blocks + 1);
  return blocks;
}

// The grid over x in packs of v channels with `resident` blocks at most:
// slices of even row counts, at least one row per lane, as many as fit
// (each thread then holds the fewest rows). 0 blocks: it does not fit.
struct Plan {
  Geometry d;
  unsigned blocks;
};
Plan plan_of(const BatchNormShape& s, int v, int resident) {
  const std::int64_t packs = s.channels / v;
  const int groups = groups_of(packs), cols = cols_of(packs);
  const std::int64_t lanes = kBlockThreads / cols;
  std::int64_t slices = std::min({std::int64_t(resident / groups), max_slices(s), (s.n + lanes - 1) / lanes});
  if (slices < 1) return {{}, 0};
  const std::int64_t rows_per_slice = (s.n + slices - 1) / slices;
  slices = (s.n + rows_per_slice - 1) / rows_per_slice;  // (none empty)
  return {{s.n, s.channels, rows_per_slice, groups, cols}, unsigned(slices * groups)};
}

// Rows a lane of the grid takes.
std::int64_t rows_per_lane(const Geometry& d) {
  const std::int64_t lanes = kBlockThreads / d.cols;
  return (d.rows_per_slice + lanes - 1) / lanes;
}

}  // namespace

std::int64_t grid_workspace_floats(const BatchNormShape& s) { return (max_slices(s) + 1) * kBackwardSums * s.channels; }

template <typename T>
bool launch_grid(const GridArgs<T>& a, const BatchNormShape& s, bool backward, cudaStream_t stream,
                 const BatchNormRowsScratch& scratch) {
  const std::initializer_list<const void*> tensors = {a.x, a.dy, a.dy_other, a.relu_out, a.residual, a.out};
  bool launched = false;
  with_pack_width<T>(pack_width<T>(s, tensors), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const auto launch = [&](auto kernel, const Plan& plan) {
      if (plan.blocks == 0) return;
      // partials [sums * channels][slices], then totals [sums * channels] (grid_workspace_floats).
      auto* partials = static_cast<float*>(scratch.workspace);
      float* totals = partials + max_slices(s) * kBackwardSums * s.channels;
      cudaLaunchAttribute attrs[2]{};
      unsigned count = 0;
      attrs[count].id = cudaLaunchAttributeCooperative;  // every block resident: the grid syncs
      attrs[count++].val.cooperative = 1;
      if (scratch.dependent_launch && dependent_launch_supported()) {
        attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[count++].val.programmaticStreamSerializationAllowed = 1;
      }
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(plan.blocks);
      config.blockDim = dim3(kBlockThreads);
      config.stream = stream;
      config.attrs = attrs;
      config.numAttrs = count;
      SG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a, plan.d, partials, totals));
      SG_LAUNCH_CHECK("batch_norm_rows_grid_kernel");
      launched = true;
    };
    // Without the rest loops where the grid holds every row, else with them.
    const auto run = [&](auto sums) {
      constexpr int K = decltype(sums)::value;
      const Plan held = plan_of(s, V, resident_blocks<T, V, K, false>());
      if (held.blocks > 0 && rows_per_lane(held.d) <= kHeld<K, false>)
        launch(batch_norm_rows_grid_kernel<T, V, K, false>, held);
      else
        launch(batch_norm_rows_grid_kernel<T, V, K, true>, plan_of(s, V, resident_blocks<T, V, K, true>()));
    };
    if (backward)
      run(std::integral_constant<int, kBackwardSums>{});
    else
      run(std::integral_constant<int, kForwardSums>{});
  });
  return launched;
}

#define SG_INSTANTIATE_BATCH_NORM_ROWS_GRID(T)                                                \
  template bool launch_grid<T>(const GridArgs<T>&, const BatchNormShape&, bool, cudaStream_t, \
                               const BatchNormRowsScratch&);
SG_INSTANTIATE_BATCH_NORM_ROWS_GRID(float)
SG_INSTANTIATE_BATCH_NORM_ROWS_GRID(__half)
SG_INSTANTIATE_BATCH_NORM_ROWS_GRID(__nv_bfloat16)
#undef SG_INSTANTIATE_BATCH_NORM_ROWS_GRID

}  // namespace sg::cuda::rows
