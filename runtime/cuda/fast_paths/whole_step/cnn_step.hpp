#pragma once
// The cnn_step lowering (a small sequential CNN's whole training step as two
// kernels, ops/cuda/fast_paths/cnn_step/cnn_step.hpp): when a graph runs that way.
#include <string>

#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {

// Why `graph` does not run as the fused CNN step under `options` ("" when it
// does). Only a graph that passes every structural check asks the device
// (its shared memory).
std::string cnn_step_blocker(const sg::Graph& graph, const BackendOptions& options);
// The structural checks alone (no device query): "" when only the device's
// shared memory can still refuse the graph. `bf16` tells which kernel instance
// (the compute dtype) would run it.
std::string cnn_step_structural_blocker(const sg::Graph& graph, const BackendOptions& options, bool* bf16 = nullptr);

}  // namespace sg::cuda
