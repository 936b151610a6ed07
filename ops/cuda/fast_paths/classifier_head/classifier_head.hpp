#pragma once
// A training step's classifier head after a global average pool, in one
// launch (issue 37; any CNN ending "global pool, linear, softmax
// cross-entropy"): the plane means of a [N,C,H,W] or channels-last [N,H,W,C]
// activation, the logits of one linear layer (+bias), softmax
// cross-entropy's loss and dlogits, the data gradient dlogits W and the
// pool's backward, dX / (H W) over every plane, in the activation's layout.
// Per-op launches spent ~45 us on mnist_resnet's (two layout permutes, the
// pool and its backward, the forward, the loss, a cuBLASLt dgrad) for ~3 MB.
// A block takes a few examples end to end; the last block to finish sums the
// loss over every row's logits as the loss kernel does (same order: same
// bits). The rounding points are the per-op launches': pooled features,
// logits, dlogits and dX each rounded to the element type once.
// (Features from a flatten or a hidden layer stay with the per-op kernels,
// small_n_forward and small_k_dgrad_relu under dependent launches: one block
// per example was measured slower there, docs/performance.md section 33.)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

enum class HeadFeatures : std::uint8_t { pool_nchw, pool_channels_last };

struct ClassifierHeadShape {
  std::int64_t rows = 0, features = 0, classes = 0;
  HeadFeatures source = HeadFeatures::pool_channels_last;
  std::int64_t plane = 1;     // H * W of the pooled activation
  float gradient_scale = 1.f; // softmax_xent_backward's scale (dlogits = (p - onehot) * scale / rows)
};

// T = float, __half or __nv_bfloat16 for every tensor; each pointer below
// marked "or null" may be null.
template <typename T>
struct ClassifierHeadTensors {
  const T* x = nullptr;          // the pooled activation: [N, K, H, W] or [N, H, W, K]
  T* pooled = nullptr;           // the features [N, K], or null
  const T* w = nullptr;          // [classes, K]
  const T* bias = nullptr;       // [classes], or null
  const std::int32_t* labels = nullptr;
  T* logits = nullptr;           // [N, classes]: always written (the loss pass reads them)
  float* loss = nullptr;
  T* dlogits = nullptr;          // [N, classes]
  T* dx = nullptr;               // [N, K] the features' gradient, or null
  T* pool_grad = nullptr;        // the pooled activation's gradient (its layout), or null
};

// Why the kernel does not take `shape` ("" when it does).
std::string classifier_head_why_not(const ClassifierHeadShape& shape);

// One launch site: its plan (examples a block) and the last-block counter.
class ClassifierHead {
 public:
  ClassifierHead(const ClassifierHeadShape& shape, int multiprocessors);

  // `dependent`: a programmatic dependent launch (dependent_launch.cuh).
  template <typename T>
  void run(const ClassifierHeadTensors<T>& t, cudaStream_t stream, bool dependent) const;

  std::string describe() const;

 private:
  ClassifierHeadShape shape_;
  int rows_per_block_ = 1, blocks_ = 1, shared_bytes_ = 0;
  DeviceBuffer finished_;  // one unsigned, 0 between launches
};

}  // namespace sg::cuda
