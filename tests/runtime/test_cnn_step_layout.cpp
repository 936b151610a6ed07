// The fused CNN step on the host: its shared-memory plan (the report CNN of
// issue 22 must fit one Hopper block, or the step falls back to the
// per-launch schedule, which the GPU tests would not notice) and the reason
// a CNN graph does not run as it.
#include <doctest/doctest.h>

#include "ops/cuda/cnn_step.hpp"
#include "runtime/cuda/lowerings/cnn_step.hpp"
#include "tests/runtime/report_cnn.hpp"

using namespace sg::cuda;

namespace {

CnnLayer layer(CnnLayerOp op, int in_c, int in_h, int in_w, int out_c, int out_h, int out_w) {
  CnnLayer L;
  L.op = op;
  L.in_c = in_c, L.in_h = in_h, L.in_w = in_w;
  L.out_c = out_c, L.out_h = out_h, L.out_w = out_w;
  return L;
}

CnnLayer conv(int in_c, int in_hw, int out_c, int kernel, int weight, bool input_gradient) {
  CnnLayer L = layer(CnnLayerOp::conv2d, in_c, in_hw, in_hw, out_c, in_hw - kernel + 1, in_hw - kernel + 1);
  L.kernel_h = L.kernel_w = kernel;
  L.weight = weight, L.bias = weight + 1;
  L.input_gradient = input_gradient;
  return L;
}

CnnLayer pool(int c, int in_hw) {
  CnnLayer L = layer(CnnLayerOp::max_pool2d, c, in_hw, in_hw, c, in_hw / 2, in_hw / 2);
  L.kernel_h = L.kernel_w = L.stride = 2;
  return L;
}

CnnLayer linear(int in, int out, int weight) {
  CnnLayer L = layer(CnnLayerOp::linear, in, 1, 1, out, 1, 1);
  L.weight = weight, L.bias = weight + 1;
  L.input_gradient = true;
  return L;
}

// The layers `stepgraph inspect -c configs/mnist_cnn.yaml` lists for cnn_step.
CnnStepArgs report_cnn_args(int batch) {
  const CnnLayer layers[] = {
      layer(CnnLayerOp::view, 784, 1, 1, 1, 28, 28),
      conv(1, 28, 10, 5, 0, false),
      pool(10, 24),
      layer(CnnLayerOp::relu, 10, 12, 12, 10, 12, 12),
      conv(10, 12, 20, 5, 2, true),
      layer(CnnLayerOp::dropout2d, 20, 8, 8, 20, 8, 8),
      pool(20, 8),
      layer(CnnLayerOp::relu, 20, 4, 4, 20, 4, 4),
      layer(CnnLayerOp::view, 20, 4, 4, 320, 1, 1),
      linear(320, 50, 4),
      layer(CnnLayerOp::relu, 50, 1, 1, 50, 1, 1),
      layer(CnnLayerOp::dropout, 50, 1, 1, 50, 1, 1),
      linear(50, 10, 6),
  };
  CnnStepArgs a;
  a.batch = batch;
  a.rows = 60000;
  for (const CnnLayer& L : layers) a.layer[a.layers++] = L;
  a.tensors = 8;
  return a;
}

// cudaDevAttrMaxSharedMemoryPerBlockOptin on the H100 and the H200 (227 KB).
constexpr std::size_t kHopperBlockSharedBytes = 232448;

}  // namespace

TEST_CASE("the report CNN's fused step fits one Hopper block's shared memory") {
  for (int batch : {64, 256}) {
    const std::size_t bytes = cnn_step_shared_bytes(report_cnn_args(batch));
    CAPTURE(batch);
    CAPTURE(bytes);
    CHECK(bytes <= kHopperBlockSharedBytes);
    // The activations alone (12.8 K floats) and the fp16 weights (~12 K floats): a plan below them is wrong.
    CHECK(bytes > std::size_t(24000) * sizeof(float));
  }
}

TEST_CASE("a CNN graph the fused step does not run says why (no GPU: structural reasons only)") {
  using sg::test::report_cnn;
  using sg::test::report_cnn_cuda_graph;
  const sg::Graph report = report_cnn_cuda_graph(report_cnn());
  sg::BackendOptions off;
  off.whole_step = false;
  CHECK(cnn_step_blocker(report, off).find("turned off") != std::string::npos);
  sg::BackendOptions cudnn;
  cudnn.conv_kernels = sg::ConvKernels::cudnn;
  CHECK(cnn_step_blocker(report, cudnn).find("backend.conv_kernels") != std::string::npos);
  auto adamw = report_cnn();
  adamw.sgd.kind = sg::OptimizerKind::adamw;
  const std::string why = cnn_step_blocker(report_cnn_cuda_graph(adamw), sg::BackendOptions{});
  CHECK(why.rfind("the graph is not a plain CNN training step: ", 0) == 0);
  CHECK(why.size() > std::string("the graph is not a plain CNN training step: ").size());  // the matcher's reason
  auto f16_weights = report_cnn();
  f16_weights.model.weight_dtype = sg::DType::f16;
  CHECK(cnn_step_blocker(report_cnn_cuda_graph(f16_weights), sg::BackendOptions{}).find("master") != std::string::npos);
}
