// Fast path small_batch_forward: a hidden layer's forward at batch 16/32 by
// our dependent-launch kernel (the first layer's also gathers the batch),
// up to measured::kSmallBatchForwardMaxColumns output columns.
#include <fmt/format.h>

#include "ops/cuda/fast_paths/small_batch_forward/small_batch_forward.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/fast_paths/why_not_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_small_batch_forward_lowering();

namespace {

std::vector<SlottedLowering> small_batch_forward_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  // With the one-pass backward only: that schedule is the one it was measured in.
  if (o.small_batch_forward && o.one_pass_backward && !o.accumulate_f16)
    l.push_back({FastPathSlot::hidden_forward, make_small_batch_forward_lowering()});
  return l;
}

std::string small_batch_forward_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (!o.small_batch_forward) return "turned off (backend.small_batch_forward: false)";
  if (!o.one_pass_backward) return "backend.one_pass_backward: false turns it off too (measured only beside it)";
  if (std::string why = accumulates_f16(o); !why.empty()) return why;
  for (const Node& n : g.nodes()) {  // the first forward matmul, x W^T: its batch and shape
    if (n.op != OpKind::matmul || n.attr<MatmulAttrs>().trans_a || !n.attr<MatmulAttrs>().trans_b) continue;
    const auto& x = g.value(n.inputs[0]).shape;
    const auto& w = g.value(n.inputs[1]).shape;
    if (std::string why = small_batch_linear_unsupported(x[0], w[0], w[1]); !why.empty())
      return fmt::format("first layer {}x{} at batch {}: {}", w[1], w[0], x[0], why);
    break;
  }
  return {};
}

}  // namespace

FastPath small_batch_forward_fast_path() {
  return {"small_batch_forward",
          "hidden-layer forwards at batch 16/32 by our dependent-launch kernel, the batch fetch folded into the first",
          {"small_batch_forward"},
          small_batch_forward_lowerings,
          small_batch_forward_why_not};
}

}  // namespace sg::cuda
