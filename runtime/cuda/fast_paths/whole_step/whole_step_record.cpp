// Fast path whole_step: a graph that is exactly a small model's training
// step as one launch per step: an MLP as one kernel (a cooperative grid or
// one cluster: whole_step; the weights resident in one cluster's shared
// memory across steps: resident_step), a small sequential CNN as two
// (cnn_step). The MLP kernels (fp16) apply plain SGD in-kernel, or store
// every gradient for the update stage's launch after them (any update rule);
// the CNN step (fp16 or bf16) applies SGD (momentum, Nesterov) or any update
// rule to its summed partial gradients in its update kernel.
#include <algorithm>
#include <stdexcept>

#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/fast_paths/whole_step/cnn_step.hpp"
#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_cnn_step_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_resident_step_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_whole_step_lowering(const BackendOptions&);

namespace {

std::vector<SlottedLowering> whole_step_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  if (!o.whole_step) return l;
  l.push_back({FastPathSlot::whole_step, make_cnn_step_lowering(o)});  // a small CNN's whole step (issue 22)
  l.push_back({FastPathSlot::whole_step, make_resident_step_lowering(o)});
  l.push_back({FastPathSlot::whole_step, make_whole_step_lowering(o)});
  return l;
}

std::string whole_step_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (!o.whole_step) return "turned off (backend.whole_step: false)";
  const bool convolutional =
      std::any_of(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return n.op == OpKind::conv2d; });
  // The blockers ask the device only once every structural check passed.
  if (convolutional) return cnn_step_blocker(g, o);
  return whole_step_blocker(g, o, /*resident=*/false);
}

}  // namespace

FastPath whole_step_fast_path() {
  return {"whole_step",
          "a small MLP's whole training step as one launch (grid, cluster or resident weights; an update rule's updates in one launch after it); a sequential CNN's as two",
          {"whole_step", "whole_step_mode", "resident_cluster"},
          whole_step_lowerings,
          whole_step_why_not};
}

}  // namespace sg::cuda
