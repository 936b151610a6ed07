// The CNN step's host-side layout (cnn_step.hpp): kernel 1's shared memory,
// the gradient workspace, the conv GEMMs' index tables, the phase names and
// the buffers' sizes. No GPU needed.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_parts.hpp"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_shapes.cuh"

namespace sg::cuda {
namespace cnn_step_parts {
namespace {

int align4(int floats) { return (floats + 3) / 4 * 4; }

}  // namespace

SharedLayout shared_layout(const CnnStepArgs& a) {
  SharedLayout s;
  int at = 0;
  auto take = [&](int floats) {
    const int start = at;
    at += align4(floats);
    return start;
  };
  const CnnLayer& first = a.layer[0];
  s.launch.act_offset[0] = take(first.in_c * first.in_h * first.in_w);
  int grad = 0, dy = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    const int in = L.in_c * L.in_h * L.in_w, out = L.out_c * L.out_h * L.out_w;
    s.launch.act_offset[i + 1] = L.op == CnnLayerOp::view ? s.launch.act_offset[i] : take(out);
    grad = std::max({grad, in, out});
    if (L.op == CnnLayerOp::conv2d) dy = std::max(dy, (L.out_c * dy_stride(L) + 1) / 2);
  }
  s.launch.grad_offset[0] = take(grad);
  s.launch.grad_offset[1] = take(grad);
  // The parameter image (copied in as it is), in layer order: every layer's
  // 16-bit (fp16 or bf16) weights (forward / linear layout, then a conv's data-gradient
  // layout) and rounded bias, in kImageParts parts (CnnStepLaunch::part_start).
  s.launch.image_offset = at;
  int part = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    if (!has_parameters(L)) continue;
    // Part 1 opens at the second parameter layer, part 2 at the first linear
    // layer after the first parameter layer (so part 1 may be empty).
    const int opens = at == s.launch.image_offset ? 0 : part == 0 && L.op == CnnLayerOp::conv2d ? 1
                      : part < 2 && L.op == CnnLayerOp::linear                                  ? 2
                                                                                                : part;
    for (; part < opens; ++part) {
      s.launch.part_start[part] = at - s.launch.image_offset;
      s.launch.part_layer[part] = i;
    }
    if (L.op == CnnLayerOp::conv2d) {
      s.launch.weight_offset[i] = take((L.out_c * forward_stride(L) + 1) / 2);
      if (L.input_gradient) s.launch.weight_t_offset[i] = take((L.in_c * data_stride(L) + 1) / 2);
    }
    if (L.op == CnnLayerOp::linear) s.launch.weight_offset[i] = take((L.out_c * L.in_c * L.in_h * L.in_w + 1) / 2);
    s.launch.bias_offset[i] = take(L.out_c);
  }
  s.launch.image_floats = at - s.launch.image_offset;
  for (; part < kImageParts - 1; ++part) s.launch.part_start[part] = s.launch.image_floats;  // empty parts at the end
  // Zeroed once per block: each conv layer's bordered dY.
  s.launch.zeroed_offset = at;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::conv2d && L.input_gradient) s.launch.border_offset[i] = take(bordered_size(L));
  }
  s.launch.zeroed_floats = at - s.launch.zeroed_offset;
  for (int i = 0; i < a.layers; ++i) {  // a dropout layer's keep bits: per element, or per channel (dropout2d)
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::dropout) s.launch.mask_offset[i] = take((L.out_c * L.out_h * L.out_w + 3) / 4);
    if (L.op == CnnLayerOp::dropout2d) s.launch.mask_offset[i] = take((L.out_c + 3) / 4);
  }
  s.launch.tables_offset = at;
  for (int i = 0; i < a.layers; ++i) {  // every conv GEMM's index tables (cnn_step_index_tables), int2 each
    const CnnLayer& L = a.layer[i];
    if (L.op != CnnLayerOp::conv2d) continue;
    s.launch.windows_offset[i] = take(2 * round_up(L.out_h * L.out_w, 16));
    s.launch.taps_offset[i] = take(2 * round_up(L.in_c * L.kernel_h * L.kernel_w, 16));
    if (!L.input_gradient) continue;
    s.launch.data_rows_offset[i] = take(2 * round_up(L.in_h * L.in_w, 16));
    s.launch.data_columns_offset[i] = take(2 * round_up(L.out_c * L.kernel_h * L.kernel_w, 16));
  }
  s.launch.tables_floats = at - s.launch.tables_offset;
  s.launch.dy_offset = dy <= grad ? -1 : take(dy);
  // Each warp's slot of the conv GEMMs (block_gemm); a linear layer's gradient through its ReLU.
  int outputs = 0;
  for (int i = 0; i < a.layers; ++i) outputs = std::max(outputs, a.layer[i].out_c);
  s.launch.reduce_offset = take(std::max(kExampleThreads / 32 * kColumnTiles * 128, outputs));
  for (int i = 0; i < a.layers; ++i)
    s.launch.relu[i] = relu_fused_into(a, i) ? kReluAfter : fused_relu(a, i) ? kReluRunByLayerBefore : 0;
  s.launch.threads = kExampleThreads;
  s.bytes = std::size_t(at) * sizeof(float);
  s.launch.shared_bytes = s.bytes;
  return s;
}

void plan_gradients(const CnnStepArgs& a, int examples_per_block, CnnStepLaunch& l) {
  const bool factored = examples_per_block == 1;
  l.slice_floats = l.factor_floats = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    l.factor_offset[i] = -1;
    if (L.op == CnnLayerOp::linear && factored) {
      l.factor_offset[i] = l.factor_floats;
      l.factor_floats += L.out_c + L.in_c * L.in_h * L.in_w;
    }
  }
  for (int t = 0; t < kCnnStepMaxTensors; ++t) l.slice_offset[t] = -1;
  for (int t = 0; t < a.tensors && t < kCnnStepMaxTensors; ++t)
    for (int i = 0; i < a.layers; ++i) {
      const CnnLayer& L = a.layer[i];
      if ((L.weight == t || L.bias == t) && (L.op == CnnLayerOp::conv2d || !factored)) {
        l.slice_offset[t] = l.slice_floats;
        l.slice_floats += int(a.param_offset[t + 1] - a.param_offset[t]);
      }
    }
}

}  // namespace cnn_step_parts

using cnn_step_parts::plan_gradients;
using cnn_step_parts::shared_layout;

std::vector<int2> cnn_step_index_tables(const CnnStepArgs& a, const CnnStepLaunch& l) {
  std::vector<int2> tables(std::size_t(l.tables_floats / 2), no_patch_index());
  const auto fill = [&](int offset, int count, auto of) {
    for (int i = 0; i < count; ++i) tables[std::size_t((offset - l.tables_offset) / 2 + i)] = of(i);
  };
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (L.op != CnnLayerOp::conv2d) continue;
    fill(l.windows_offset[li], L.out_h * L.out_w, [&](int p) { return window_index(L, p); });
    fill(l.taps_offset[li], L.in_c * L.kernel_h * L.kernel_w, [&](int k) { return tap_index(L, k); });
    if (!L.input_gradient) continue;
    const int kk = L.kernel_h * L.kernel_w, width = L.in_w + L.kernel_w - 1;
    const int bplane = (L.in_h + L.kernel_h - 1) * width;
    fill(l.data_rows_offset[li], L.in_h * L.in_w, [&](int m) { return make_int2((m / L.in_w) * width + m % L.in_w, 0); });
    fill(l.data_columns_offset[li], L.out_c * kk, [&](int k) {  // (co, ky, kx) -> its flipped offset
      const int co = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
      return make_int2(co * bplane + flipped_tap(ky, L.kernel_h) * width + flipped_tap(kx, L.kernel_w), 0);
    });
  }
  return tables;
}

CnnStepLaunch cnn_step_layout(const CnnStepArgs& a, int examples_per_block) {
  CnnStepLaunch launch = shared_layout(a).launch;
  plan_gradients(a, examples_per_block, launch);
  return launch;
}

std::size_t cnn_step_shared_bytes(const CnnStepArgs& a) { return shared_layout(a).bytes + sizeof(SharedArguments); }

std::vector<std::string> cnn_step_phase_names(const CnnStepArgs& a) {
  static constexpr const char* kOps[] = {"conv2d", "max_pool2d", "relu", "dropout2d", "dropout", "view", "linear"};
  std::vector<std::string> names{
      "arguments, the first example's pixels and the image's first part into shared memory"};
  const auto op_text = [&](int i) {
    const CnnLayer& L = a.layer[i];
    const std::string op =
        L.op == CnnLayerOp::activation ? std::string(activation_op_name(L.activation)) : kOps[int(L.op)];
    return relu_fused_into(a, i) ? op + "+relu" : op;
  };
  for (int i = 0; i < a.layers; ++i)
    if (a.layer[i].op != CnnLayerOp::view && !fused_relu(a, i))
      names.push_back(fmt::format("forward layer {} {}", i, op_text(i)));
  names.push_back("softmax cross-entropy");
  for (int i = a.layers; i-- > 0;) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::view || fused_relu(a, i)) continue;
    if (L.op == CnnLayerOp::conv2d && L.input_gradient) {
      names.push_back(fmt::format("backward layer {} conv2d: weight and bias gradients", i));
      names.push_back(fmt::format("backward layer {} conv2d: input gradient", i));
      continue;
    }
    names.push_back(fmt::format("backward layer {} {}", i, op_text(i)));
    if ((L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) && !L.input_gradient) break;
  }
  names.push_back("other blocks and examples, then the update kernel's start");
  names.push_back("update kernel (its block 0)");
  return names;
}

std::size_t cnn_step_workspace_bytes(const CnnStepArgs& a, const CnnStepLaunch& l) {
  return (std::size_t(l.blocks) * std::size_t(l.slice_floats) +
          std::size_t(a.batch) * (std::size_t(l.factor_floats) + 1) + 1) * sizeof(float);
}

std::size_t cnn_step_image_bytes(const CnnStepLaunch& l) { return std::size_t(l.image_floats) * sizeof(float); }

}  // namespace sg::cuda
