// The fused CNN step on the host: its shared-memory plan (the report CNN of
// issue 22 must fit one Hopper block, or the step falls back to the
// per-launch schedule, which the GPU tests would not notice) and the reason
// a CNN graph does not run as it.
#include <doctest/doctest.h>

#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"
#include "runtime/cuda/fast_paths/whole_step/cnn_step.hpp"
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
  const int sizes[] = {10 * 25, 10, 20 * 250, 20, 50 * 320, 50, 10 * 50, 10};  // conv1, conv2, fc1, fc2: W, b
  for (int t = 0; t < a.tensors; ++t) a.param_offset[t + 1] = a.param_offset[t] + sizes[t];
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

TEST_CASE("the report CNN's parameter image: layer order, the linear layers late, apart from the zeroed borders") {
  const CnnStepArgs a = report_cnn_args(64);
  const CnnStepLaunch l = cnn_step_layout(a, 1);
  // conv1 (layer 1) opens the image, conv2 (layer 4) its second part, fc1
  // (layer 9) its third: conv1 runs while the later layers' weights are
  // still copied in.
  CHECK(l.weight_offset[1] == l.image_offset);
  CHECK(l.part_layer[0] == 4);
  CHECK(l.part_layer[1] == 9);
  CHECK(l.image_offset + l.part_start[0] == l.weight_offset[4]);
  CHECK(l.image_offset + l.part_start[1] == l.weight_offset[9]);
  CHECK(l.weight_offset[4] < l.weight_t_offset[4]);
  CHECK(l.weight_t_offset[4] < l.bias_offset[4]);
  CHECK(l.bias_offset[4] < l.weight_offset[9]);
  CHECK(l.bias_offset[11] + 10 <= l.image_offset + l.image_floats);
  // fp16 weights: conv1 10 x (32 + 8), conv2 20 x (256 + 8) and 10 x (512 + 8), fc1 50 x 320, fc2 10 x 50 halves.
  const int halves = 10 * 40 + 20 * 264 + 10 * 520 + 50 * 320 + 10 * 50;
  CHECK(l.image_floats >= halves / 2 + 10 + 20 + 50 + 10);
  CHECK(l.image_floats <= halves / 2 + 10 + 20 + 50 + 10 + 4 * 9);  // each part rounded up to 16 bytes
  CHECK(l.image_offset % 4 == 0);   // 16-byte copies
  CHECK(l.part_start[0] % 4 == 0);
  CHECK(l.part_start[1] % 4 == 0);
  // conv2's bordered dY is zeroed once per block, outside the image (which is copied over).
  CHECK(l.zeroed_offset >= l.image_offset + l.image_floats);
  CHECK(l.border_offset[4] >= l.zeroed_offset);
  CHECK(l.border_offset[4] + 20 * 16 * 16 <= l.zeroed_offset + l.zeroed_floats);
}

TEST_CASE("the report CNN's gradient workspace: conv tensors in the blocks' slices, linear layers as factors") {
  const CnnStepArgs a = report_cnn_args(64);
  // One example per block: conv1 and conv2's weights and biases, in tensor
  // order, summed per block; fc1's dZ (50) and x (320), then fc2's dZ (10)
  // and x (50), per example: 430 floats where the outer products took 16,510.
  const CnnStepLaunch one = cnn_step_layout(a, 1);
  CHECK(one.slice_offset[0] == 0);
  CHECK(one.slice_offset[1] == 250);
  CHECK(one.slice_offset[2] == 260);
  CHECK(one.slice_offset[3] == 5260);
  CHECK(one.slice_floats == 5280);
  for (int t = 4; t < 8; ++t) CHECK(one.slice_offset[t] == -1);
  CHECK(one.factor_offset[9] == 0);
  CHECK(one.factor_offset[12] == 370);
  CHECK(one.factor_floats == 430);
  // Two examples per block: every tensor in the slices, no factors.
  const CnnStepLaunch two = cnn_step_layout(a, 2);
  CHECK(two.slice_offset[4] == 5280);
  CHECK(two.slice_offset[7] == 5280 + 16000 + 50 + 500);
  CHECK(two.slice_floats == int(a.param_offset[8]));
  CHECK(two.factor_floats == 0);
  CHECK(two.factor_offset[9] == -1);
  CHECK(two.factor_offset[12] == -1);
}

TEST_CASE("the report CNN's GEMM index tables: windows, taps, the data gradient's rows and columns") {
  const CnnStepArgs a = report_cnn_args(64);
  const CnnStepLaunch l = cnn_step_layout(a, 1);
  const std::vector<int2> tables = cnn_step_index_tables(a, l);
  REQUIRE(tables.size() * 2 == std::size_t(l.tables_floats));
  const auto at = [&](int offset, int i) { return tables[std::size_t((offset - l.tables_offset) / 2 + i)]; };
  const int none = int(0x80000000u);
  // conv1 (1x28x28 -> 10x24x24, 5x5): window p = (y, x) starts at y * 28 + x;
  // tap k = (ky, kx) is ky * 28 + kx; y holds the corner / displacement.
  CHECK(at(l.windows_offset[1], 25).x == 1 * 28 + 1);
  CHECK(at(l.windows_offset[1], 25).y == (1 << 16 | 1));
  CHECK(at(l.windows_offset[1], 575).x == 23 * 28 + 23);
  CHECK(at(l.taps_offset[1], 7).x == 1 * 28 + 2);
  CHECK(at(l.taps_offset[1], 24).x == 4 * 28 + 4);
  CHECK(at(l.taps_offset[1], 25).y == none);  // past K = 25, up to 32
  CHECK(at(l.taps_offset[1], 31).y == none);
  // conv2 (10x12x12 -> 20x8x8): tap (ci 3, ky 2, kx 1) is 3 * 144 + 2 * 12 + 1.
  CHECK(at(l.taps_offset[4], 3 * 25 + 2 * 5 + 1).x == 3 * 144 + 2 * 12 + 1);
  CHECK(at(l.windows_offset[4], 63).x == 7 * 12 + 7);
  // Its data gradient reads dY bordered to 16x16 per channel: input position
  // (y, x) at y * 16 + x; column (co, ky, kx) at co * 256 + (4 - ky) * 16 + (4 - kx).
  CHECK(at(l.data_rows_offset[4], 143).x == 11 * 16 + 11);
  CHECK(at(l.data_columns_offset[4], 0).x == 4 * 16 + 4);
  CHECK(at(l.data_columns_offset[4], 19 * 25 + 24).x == 19 * 256);
  CHECK(at(l.data_columns_offset[4], 500).y == none);  // past K = 500, up to 512
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
  auto clipped = report_cnn();
  clipped.optimizer.kind = sg::OptimizerKind::adamw;
  clipped.optimizer.clip_grad_norm = 1.0;
  const std::string why = cnn_step_blocker(report_cnn_cuda_graph(clipped), sg::BackendOptions{});
  CHECK(why.rfind("the graph is not a plain CNN training step: ", 0) == 0);
  CHECK(why.size() > std::string("the graph is not a plain CNN training step: ").size());  // the matcher's reason
  // Any optimizer is the kernels' (AdamW, RMSprop and Nesterov SGD reach
  // the device's check, which a machine without a GPU cannot pass), in fp16
  // or bf16.
  auto nesterov = report_cnn();
  nesterov.optimizer.momentum = 0.9;
  nesterov.optimizer.nesterov = true;
  sg::cuda::CnnStepFit fit;
  fit.bf16 = true;
  CHECK(cnn_step_structural_blocker(report_cnn_cuda_graph(nesterov), sg::BackendOptions{}, &fit) == "");
  CHECK_FALSE(fit.bf16);
  auto in_bf16 = nesterov;
  in_bf16.model.compute_dtype = sg::DType::bf16;
  CHECK(cnn_step_structural_blocker(report_cnn_cuda_graph(in_bf16), sg::BackendOptions{}, &fit) == "");
  CHECK(fit.bf16);
  auto f16_weights = report_cnn();
  f16_weights.model.weight_dtype = sg::DType::f16;
  CHECK(cnn_step_blocker(report_cnn_cuda_graph(f16_weights), sg::BackendOptions{}).find("master") != std::string::npos);
}
