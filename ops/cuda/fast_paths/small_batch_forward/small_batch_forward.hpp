#pragma once
// A hidden layer's forward for a small batch, as a dependent launch:
//   z[B,N] = x[B,K] w[N,K]^T + bias[N],  y = act(z)
// (act: none, or one of activation.hpp's, applied to z rounded to fp16 as
// the graph's separate bias_add and activation nodes round it; z is written
// out too where a backward reads it: gelu, gelu_tanh, silu)
// cuBLASLt runs these shapes in a few microseconds too, but as an ordinary
// launch: the kernel before must drain before it starts. This one is
// launched with launch_dependent (dependent_launch.cuh): its blocks start
// while the previous kernel runs and load their slice of W before waiting
// for it. For the first layer it can also gather the batch itself (what
// batch_fetch does), so the step needs no separate fetch launch.
// Tensor cores (wmma), fp32 accumulation, the result rounded to fp16 once.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ops/cuda/activation.hpp"

namespace sg::cuda {

// The batch gather folded into the first layer: X row r is image row
// perm[(step % (rows / batch)) * batch + r] scaled to x * scale + shift in
// fp16, exactly as batch_fetch writes it; X and the labels are also written
// out (x_out, labels_out) for the launches that read them later.
struct FoldedBatchFetch {
  const std::int32_t* perm = nullptr;
  std::int64_t rows = 0;  // images in the table (perm's length)
  const std::int32_t* step = nullptr;
  const std::uint8_t* images = nullptr;  // [rows, k] u8
  float scale = 1.f, shift = 0.f;
  const std::uint8_t* labels = nullptr;  // [rows]
  __half* x_out = nullptr;               // [batch, k]; null when no later launch reads x (an eval graph)
  std::int32_t* labels_out = nullptr;    // [batch]
  // Read the step, the permutation, the labels and the pixels before
  // waiting for the previous kernel (x_out and labels_out are written after
  // it). Only where no kernel that may still run then writes the step: the
  // previous kernel let this one start after its own wait (the one-pass
  // column-strip kernel does), so every kernel before it has completed.
  bool gather_before_wait = false;
};

struct SmallBatchLinear {
  const __half* x = nullptr;  // [batch, k]; unused when fetch.images is set
  FoldedBatchFetch fetch;
  const __half* w = nullptr;     // [n, k]
  const __half* bias = nullptr;  // [n]
  __half* y = nullptr;           // [batch, n]
  int batch = 0, n = 0, k = 0;
  std::optional<Activation> activation;  // none: y = z
  // Load W and the bias before waiting for the previous kernel. Only where
  // that kernel (and any still running before it) does not write them: not
  // for the first layer of a step that follows another step in the same
  // graph, whose last launch updates the first layer's weight.
  bool load_weight_early = true;
  // [batch, n]: z, for a backward that reads it; null: not written (never with ReLU).
  __half* pre_activation = nullptr;
};

// Empty when the kernel runs these sizes, else why not.
std::string small_batch_linear_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);

// `dependent`: as a dependent launch (off: a plain launch, the same-run baseline).
void launch_small_batch_linear(const SmallBatchLinear& args, cudaStream_t stream, bool dependent);

}  // namespace sg::cuda
