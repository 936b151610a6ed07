#pragma once
// What the two whole-step lowerings (whole_step: a cooperative grid or one
// cluster per step; resident_step: the weights resident in one cluster's
// shared memory across steps) share: when a graph may run as one kernel,
// and its arguments bound to the program's buffers.
#include <string>

#include "ops/cuda/fast_paths/whole_step/whole_step.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/plan/mlp_step_pattern.hpp"

namespace sg::cuda {

// Why `graph` should not run as one whole-step kernel under `options` ("" when
// it should). `resident`: asked for the resident-weights variant.
std::string whole_step_blocker(const sg::Graph& graph, const BackendOptions& options, bool resident);

// The lowering named `name`: the grid/cluster kernel, or the resident one.
std::unique_ptr<CudaLowering> make_whole_graph_lowering(std::string_view name, const BackendOptions& options,
                                                        bool resident);

}  // namespace sg::cuda
