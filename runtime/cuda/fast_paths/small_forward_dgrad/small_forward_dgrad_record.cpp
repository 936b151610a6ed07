// Fast path small_forward_dgrad: the small matmuls cuBLASLt runs slowly: the
// classifier's forward with N <= 32 outputs (tensor cores at batch
// 256/1024) and a dgrad with K <= 32 summed terms fused with its activation's
// backward, by our dependent-launch kernels (ops/cuda/small_linear.hpp).
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/fast_paths/why_not_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_small_k_dgrad_relu_lowering();
std::unique_ptr<CudaLowering> make_small_n_forward_lowering(const BackendOptions&);

namespace {

std::vector<SlottedLowering> small_forward_dgrad_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  // Before the forwards, so a forward knows whether a cuBLASLt dgrad still needs its ReLU mask.
  l.push_back({FastPathSlot::dgrad_forward, make_small_k_dgrad_relu_lowering()});
  l.push_back({FastPathSlot::dgrad_forward, make_small_n_forward_lowering(o)});
  return l;
}

std::string small_forward_dgrad_why_not(const sg::Graph& g, const BackendOptions& /*o*/, bool /*device_present*/) {
  bool matmul = false;
  for (const Node& n : g.nodes()) matmul = matmul || n.op == OpKind::matmul;
  if (!matmul) return "the graph has no matmul";
  return {};  // the shapes decide: declined_fast_paths says when none fits
}

}  // namespace

FastPath small_forward_dgrad_fast_path() {
  return {"small_forward_dgrad",
          "the classifier's forward (N <= 32 outputs) and small-K dgrads with their activation backward, by our kernels",
          {"classifier_mma"},
          small_forward_dgrad_lowerings,
          small_forward_dgrad_why_not};
}

}  // namespace sg::cuda
