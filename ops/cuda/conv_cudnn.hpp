#pragma once
// A 2-D convolution (forward with bias [+ ReLU], data gradient or filter
// gradient) run by cuDNN's graph API, NCHW tensors, fp32 accumulation. At
// construction it picks a deterministic engine (see the constructor); a forward first
// tries conv + bias [+ ReLU] as ONE fused cuDNN graph and otherwise runs the
// convolution alone followed by our bias [+ ReLU] kernel
// (ops/cuda/channel_bias.cu). Work happens on the stream the caller gives;
// run() is what CUDA-graph capture records.
#include <cudnn.h>

#include <cstdint>
#include <string>

#include "ops/cuda/cudnn_graph.hpp"

namespace sg::cuda {

enum class ConvDirection { forward, backward_data, backward_filter };

struct ConvGeometry {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input
  std::int64_t k = 0, r = 0, s = 0;         // filters: k x c x r x s
  std::int64_t stride = 1, padding = 0;
  std::int64_t p() const { return (h + 2 * padding - r) / stride + 1; }
  std::int64_t q() const { return (w + 2 * padding - s) / stride + 1; }
};

// The tensors of one convolution. forward: x, w [, bias] -> y.
// backward_data: y (= dy), w -> x (= dx). backward_filter: x, y (= dy) -> w (= dw).
struct ConvTensors {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  const void* bias = nullptr;
};

struct ConvRequest {
  ConvDirection direction = ConvDirection::forward;
  ConvGeometry geometry;
  cudnnDataType_t io_type = CUDNN_DATA_HALF;  // x, w, y and bias
  bool bias = false;  // forward only
  bool relu = false;  // forward only, after the bias
  // x and y (and dx, dy) are [N,H,W,C] rather than NCHW. cuDNN takes both
  // layouts through the tensors' strides.
  bool channels_last = false;
  // The filter (w, or dw) is [K,R,S,C] rather than [K,C,R,S].
  bool filter_channels_last = false;
};

class CudnnConv {
 public:
  // Builds and picks the plan: the heuristics' first engine that runs, or
  // with `autotune` the fastest of every deterministic engine, timed on
  // `tensors` (their contents are overwritten where they are outputs) and
  // reused for the same problem by every later CudnnConv of the process;
  // with `knob_variants` > 0 autotune then also times up to that many
  // configurations of the three fastest engines with one knob set away from
  // its default (cudnn::knob_variant_plans).
  CudnnConv(const cudnn::Handle& handle, const ConvRequest& request, const ConvTensors& tensors, cudaStream_t stream,
            bool autotune, std::size_t knob_variants = 0);
  std::size_t workspace_bytes() const { return static_cast<std::size_t>(plan_.workspace_bytes); }
  void run(const ConvTensors& tensors, void* workspace, cudaStream_t stream) const;
  // e.g. "cuDNN engine 12, fused bias+relu (fastest of 5)"
  std::string label() const;

 private:
  // Whether three runs of the current plan write the same bits.
  bool deterministic_output(const ConvTensors& tensors, void* workspace, cudaStream_t stream) const;

  const cudnn::Handle& handle_;
  ConvRequest request_;
  cudnn::Plan plan_;
  bool fused_epilogue_ = false;  // bias/ReLU inside the cuDNN graph
  int candidates_ = 0;
  bool timed_ = false;  // chosen by timing here (autotune, first time for this problem)
};

// Adds bias[c] to every element of channel c of NCHW `y` in place, then ReLU
// when `relu`. T is __half, __nv_bfloat16 or float.
template <typename T>
void launch_channel_bias(T* y, const T* bias, std::int64_t n, std::int64_t c, std::int64_t hw, bool relu,
                         cudaStream_t stream);
// (A channels-last y [rows, c] is n = rows, hw = 1.)

}  // namespace sg::cuda
