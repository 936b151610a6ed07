// The classifier head in one launch (classifier_head.hpp). Block b takes
// examples [b R, b R + R) through five phases, each ending at a barrier
// (slots of one element where K or a tensor's alignment rules out 16 bytes):
//   A. the features into shared memory, the plane means of the pooled
//      activation (channels-last by 16-byte slots of channels with the
//      positions split over thread groups, NCHW by a warp per plane);
//   B. the logits, a warp per (example, class): the lanes' 16-byte slots of
//      features and weights, the warp's sum, + bias, rounded;
//   C. softmax cross-entropy's dlogits, a warp per example (softmax_row.cuh);
//   D. dX = dlogits W, a thread per 16-byte slot of features (the classes
//      in order), rounded, then spread over the pooled plane as dY / (H W);
//   E. the last block to finish sums the loss over all rows' logits, as the
//      loss kernel (softmax_xent.cu) does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fmt/format.h>

#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/classifier_head/classifier_head.hpp"
#include "ops/cuda/last_block_done.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace classifier_head {
namespace {

constexpr int kWarps = 8, kBlockThreads = kWarps * 32;  // 8 warps: the loss kernel's block_total
constexpr int kMaxFeatures = 8192, kMaxClasses = 256;
constexpr int kMaxShared = 48 * 1024;

template <typename T>
constexpr int kVector = 16 / int(sizeof(T));  // elements in a 16-byte load

struct HeadDims {
  int n, k, c, plane, rows_per_block;
  HeadFeatures source;
  bool vectors;      // 16-byte slots of 16 / sizeof(T) features (K a multiple, every tensor aligned)
  int units, groups; // channels-last pooling: slots per position, position groups
  bool dgrad;        // dX or the pool's gradient wanted
  float inv_rows;    // dlogits' scale / N
};

// Shared floats: features [R][K], dlogits [R][C], the pooling's group sums; then the rounded logits [R][C].
__host__ __device__ inline int pool_partial_floats(const HeadDims& d) { return d.groups > 1 ? d.groups * d.k : 0; }
__host__ __device__ inline int shared_floats(const HeadDims& d) {
  return d.rows_per_block * (d.k + d.c) + pool_partial_floats(d);
}
template <typename T>
int shared_bytes(const HeadDims& d) {
  return shared_floats(d) * 4 + (d.rows_per_block * d.c * int(sizeof(T)) + 15) / 16 * 16;
}

template <typename T>
__device__ __forceinline__ void load_vector(const T* p, float (&out)[kVector<T>]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector<T>; ++i) out[i] = to_float(e[i]);
}

template <typename T>
__device__ __forceinline__ void store_vector(T* p, const float* in) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector<T>; ++i) e[i] = from_float<T>(in[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}

// Phase A for a channels-last [N, plane, K] activation: feat[r][k] = the mean over the plane.
template <typename T>
__device__ void pool_channels_last(const HeadDims& d, const T* x, std::int64_t first, int rows, float* feat,
                                   float* part, T* pooled) {
  constexpr int V = kVector<T>;
  const int width = d.vectors ? V : 1;
  for (int r = 0; r < rows; ++r) {
    const T* base = x + (first + r) * d.plane * d.k;
    float* sums = d.groups > 1 ? part : feat + r * d.k;  // one group: the sum is the total
    for (int u = threadIdx.x; u < d.units * d.groups; u += blockDim.x) {
      const int v = u % d.units, group = u / d.units;
      float acc[V] = {};
      for (int q = group; q < d.plane; q += d.groups) {
        if (d.vectors) {
          float e[V];
          load_vector(base + std::int64_t(q) * d.k + v * V, e);
#pragma unroll
          for (int i = 0; i < V; ++i) acc[i] += e[i];
        } else {
          acc[0] += to_float(base[std::int64_t(q) * d.k + v]);
        }
      }
      for (int i = 0; i < width; ++i) sums[(d.groups > 1 ? group * d.k : 0) + v * width + i] = acc[i];
    }
    __syncthreads();
    for (int k = threadIdx.x; k < d.k; k += blockDim.x) {
      float total = 0.f;
      if (d.groups > 1)
        for (int group = 0; group < d.groups; ++group) total += part[group * d.k + k];
      else
        total = feat[r * d.k + k];
      const T mean = from_float<T>(total / float(d.plane));
      feat[r * d.k + k] = to_float(mean);
      if (pooled) pooled[(first + r) * d.k + k] = mean;
    }
    __syncthreads();
  }
}

// Phase B: a warp per (example, class) dot product over the lanes' slots.
template <typename T>
__device__ void logits_of_rows(const HeadDims& d, const ClassifierHeadTensors<T>& t, std::int64_t first, int rows,
                               const float* feat, T* lg) {
  constexpr int V = kVector<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int width = d.vectors ? V : 1, slots = d.k / width;
  for (int p = warp; p < rows * d.c; p += kWarps) {
    const int r = p / d.c, j = p - r * d.c;
    const T* w = t.w + std::int64_t(j) * d.k;
    const float* f = feat + r * d.k;
    float acc = 0.f;
    for (int u = lane; u < slots; u += 32) {
      if (d.vectors) {
        float wv[V];
        load_vector(w + u * V, wv);
#pragma unroll
        for (int i = 0; i < V; ++i) acc += f[u * V + i] * wv[i];
      } else {
        acc += f[u] * to_float(w[u]);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const T logit = from_float<T>(t.bias ? acc + to_float(t.bias[j]) : acc);
      lg[p] = logit;
      t.logits[first * d.c + p] = logit;
    }
  }
}

// Phase D: dX = dlogits W by 16-byte slots (classes in order), rounded
// once; feat gets dX / (H W) for the pool's backward.
template <typename T>
__device__ void data_gradient(const HeadDims& d, const ClassifierHeadTensors<T>& t, std::int64_t first, int rows,
                              const float* dl, float* feat) {
  constexpr int V = kVector<T>;
  const int width = d.vectors ? V : 1, slots = d.k / width;
  for (int u = threadIdx.x; u < rows * slots; u += blockDim.x) {
    const int r = u / slots, v = u - r * slots;
    float s[V] = {};
    for (int j = 0; j < d.c; ++j) {
      const float g = dl[r * d.c + j];
      const T* w = t.w + std::int64_t(j) * d.k + v * width;
      if (d.vectors) {
        float wv[V];
        load_vector(w, wv);
#pragma unroll
        for (int i = 0; i < V; ++i) s[i] += g * wv[i];
      } else {
        s[0] += g * to_float(*w);
      }
    }
    float out[V];
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = to_float(from_float<T>(s[i]));
    const std::int64_t at = (first + r) * d.k + v * width;
    if (t.dx) {
      if (d.vectors) store_vector(t.dx + at, out);
      else t.dx[at] = from_float<T>(out[0]);
    }
    for (int i = 0; i < width; ++i) feat[r * d.k + v * width + i] = out[i] / float(d.plane);
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) classifier_head_kernel(HeadDims d, ClassifierHeadTensors<T> t,
                                                                        unsigned* finished) {
  wait_for_previous_kernel();  // (a dependent launch: the features come from the kernel before)
  allow_next_kernel_to_start();
  extern __shared__ __align__(16) float shared[];
  const int R = d.rows_per_block;
  float* feat = shared;                 // [R][K]
  float* dl = feat + R * d.k;           // [R][C]
  float* part = dl + R * d.c;           // [groups][K]
  T* lg = reinterpret_cast<T*>(part + pool_partial_floats(d));  // [R][C]
  constexpr int V = kVector<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t first = std::int64_t(blockIdx.x) * R;
  const int rows = int(min(std::int64_t(R), d.n - first));
  // A. Features.
  if (d.source == HeadFeatures::pool_nchw) {
    for (int p = warp; p < rows * d.k; p += kWarps) {  // plane p of the block's [rows][K] planes
      const T* values = t.x + (first * d.k + p) * d.plane;
      float acc = 0.f;
      for (int q = lane; q < d.plane; q += 32) acc += to_float(values[q]);
      acc = warp_sum(acc);
      if (lane == 0) {
        const T mean = from_float<T>(acc / float(d.plane));
        feat[p] = to_float(mean);
        if (t.pooled) t.pooled[first * d.k + p] = mean;
      }
    }
  } else {
    pool_channels_last(d, t.x, first, rows, feat, part, t.pooled);
  }
  __syncthreads();
  // B. Logits.
  logits_of_rows(d, t, first, rows, feat, lg);
  __syncthreads();
  // C. dlogits.
  for (int r = warp; r < rows; r += kWarps)
    softmax_xent_lanes_to<32>(lg + r * d.c, d.c, t.labels[first + r], d.inv_rows, true, [&](std::int64_t c, float g) {
      const T v = from_float<T>(g);
      t.dlogits[(first + r) * d.c + c] = v;
      dl[r * d.c + c] = to_float(v);
    });
  __syncthreads();
  // D. dX, then the pool's gradient: every element of plane (n, k) gets dX[n, k] / (H W).
  if (d.dgrad) {
    data_gradient(d, t, first, rows, dl, feat);
    if (t.pool_grad) {
      __syncthreads();
      const std::int64_t per_row = std::int64_t(d.plane) * d.k;
      T* out = t.pool_grad + first * per_row;
      if (d.source == HeadFeatures::pool_nchw) {
        for (std::int64_t e = threadIdx.x; e < rows * per_row; e += blockDim.x)
          out[e] = from_float<T>(feat[e / d.plane]);  // e / plane = r * K + k
      } else if (d.vectors) {
        const std::int64_t per_row_vectors = per_row / V;
        for (std::int64_t u = threadIdx.x; u < rows * per_row_vectors; u += blockDim.x) {
          const std::int64_t r = u / per_row_vectors, v = u % d.units;
          store_vector(out + u * V, feat + r * d.k + v * V);
        }
      } else {
        for (std::int64_t e = threadIdx.x; e < rows * per_row; e += blockDim.x)
          out[e] = from_float<T>(feat[(e / per_row) * d.k + e % d.k]);
      }
    }
  }
  // E. The loss, by the last block: every block's logits are written.
  if (!last_block_done(finished)) return;
  float partial = 0.f;
  for (int r = threadIdx.x; r < d.n; r += blockDim.x)
    partial += row_loss_by_thread(t.logits + std::int64_t(r) * d.c, d.c, t.labels[r]);
  block_total<kWarps>(warp_sum(partial), t.loss, 1.f / float(d.n));
}

}  // namespace
}  // namespace classifier_head

std::string classifier_head_why_not(const ClassifierHeadShape& s) {
  using namespace classifier_head;
  if (s.classes < 1 || s.classes > kMaxClasses)
    return fmt::format("{} classes (the kernel takes 1-{})", s.classes, kMaxClasses);
  if (s.features < 1 || s.features > kMaxFeatures)
    return fmt::format("{} features (the kernel takes 1-{})", s.features, kMaxFeatures);
  if (s.rows < 1 || s.plane < 1) return "no rows or an empty plane";
  if (s.rows * std::max(s.features * s.plane, s.classes) >= (std::int64_t(1) << 31)) return "over 2^31 elements";
  return "";
}

namespace {

classifier_head::HeadDims dims_of(const ClassifierHeadShape& s, int rows_per_block, bool vectors, int vector) {
  classifier_head::HeadDims d{};
  d.n = int(s.rows), d.k = int(s.features), d.c = int(s.classes), d.plane = int(s.plane);
  d.rows_per_block = rows_per_block;
  d.source = s.source;
  d.vectors = vectors && s.features % vector == 0;
  d.units = d.vectors ? d.k / vector : d.k;
  d.groups = s.source == HeadFeatures::pool_channels_last
                 ? std::max(1, std::min(d.plane, classifier_head::kBlockThreads / d.units))
                 : 1;
  d.inv_rows = s.gradient_scale / static_cast<float>(s.rows);
  return d;
}

}  // namespace

ClassifierHead::ClassifierHead(const ClassifierHeadShape& s, int multiprocessors)
    : shape_(s), finished_(sizeof(unsigned)) {
  using namespace classifier_head;
  if (const std::string why = classifier_head_why_not(s); !why.empty()) throw CudaError("classifier head: " + why);
  // The most any element type's layout takes (run() picks 16-byte vectors where the tensors allow).
  const auto most_bytes = [&](int rows) {
    return std::max({shared_bytes<float>(dims_of(s, rows, false, 1)), shared_bytes<float>(dims_of(s, rows, true, 4)),
                     shared_bytes<__half>(dims_of(s, rows, true, 8))});
  };
  // About two blocks a multiprocessor (the pooled activations are the bytes), fewer rows where shared memory runs out.
  int rows = int(std::max<std::int64_t>(1, (s.rows + 2 * multiprocessors - 1) / (2 * std::int64_t(multiprocessors))));
  while (rows > 1 && most_bytes(rows) > kMaxShared) --rows;
  rows_per_block_ = rows;
  blocks_ = int((s.rows + rows - 1) / rows);
  shared_bytes_ = most_bytes(rows);
  finished_.fill_bytes(0);
}

std::string ClassifierHead::describe() const {
  return fmt::format("classifier head: {} blocks of {} example(s); the {} global average pool of {} planes; {} -> "
                     "{} classes",
                     blocks_, rows_per_block_, shape_.source == HeadFeatures::pool_nchw ? "NCHW" : "channels-last",
                     shape_.plane, shape_.features, shape_.classes);
}

template <typename T>
void ClassifierHead::run(const ClassifierHeadTensors<T>& t, cudaStream_t stream, bool dependent) const {
  using namespace classifier_head;
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool vectors =
      aligned(t.x) && aligned(t.w) && aligned(t.pooled) && aligned(t.dx) && aligned(t.pool_grad);  // (null is aligned)
  HeadDims d = dims_of(shape_, rows_per_block_, vectors, kVector<T>);
  d.dgrad = t.dx != nullptr || t.pool_grad != nullptr;
  if (!t.logits || !t.dlogits || !t.loss || !t.labels || !t.w || !t.x)
    throw CudaError("classifier head: a required tensor is missing");
  const int bytes = shared_bytes<T>(d);
  if (bytes > shared_bytes_) throw CudaError("classifier head: shared memory above its plan");
  unsigned* finished = finished_.as<unsigned>();
  launch_dependent(classifier_head_kernel<T>, {dim3(blocks_), dim3(kBlockThreads), std::size_t(bytes)}, stream,
                   dependent, d, t, finished);
}

template void ClassifierHead::run<float>(const ClassifierHeadTensors<float>&, cudaStream_t, bool) const;
template void ClassifierHead::run<__half>(const ClassifierHeadTensors<__half>&, cudaStream_t, bool) const;
template void ClassifierHead::run<__nv_bfloat16>(const ClassifierHeadTensors<__nv_bfloat16>&, cudaStream_t, bool) const;

}  // namespace sg::cuda
