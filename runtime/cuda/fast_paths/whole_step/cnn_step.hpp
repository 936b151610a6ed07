#pragma once
// The cnn_step lowering (a small sequential CNN's whole training step as two
// kernels, ops/cuda/fast_paths/cnn_step/cnn_step.hpp): when a graph runs that way.
#include <cstddef>
#include <string>

#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {

// Why `graph` does not run as the fused CNN step under `options` ("" when it
// does). Only a graph that passes every structural check asks the device
// (its shared memory).
std::string cnn_step_blocker(const sg::Graph& graph, const BackendOptions& options);
// What the kernels would need for a graph that passes the structural checks.
struct CnnStepFit {
  bool bf16 = false;          // which instance of kernel 1 (the compute dtype) runs it
  std::size_t shared_bytes = 0;  // a block's shared memory, its arguments' copy included
};
// The structural checks alone (no device query): "" when only the device's
// shared memory can still refuse the graph (compare `fit`'s shared_bytes with
// the GPU's per-block limit: 227 KB on Hopper).
std::string cnn_step_structural_blocker(const sg::Graph& graph, const BackendOptions& options,
                                        CnnStepFit* fit = nullptr);

}  // namespace sg::cuda
