#pragma once
// A fast path (issue 35): lowerings of our own that beat the core lowerings
// on some graphs, declared as ONE record: its name and doc line, the backend
// options it owns (rows of runtime/backend_option_table.hpp, by key), a
// factory giving its lowerings with the slot of the priority order each goes
// in (cuda_lowerings(), registry.cpp), and why_not: why it would not take a
// graph. The core lowerings (runtime/cuda/lowerings/) cover every graph on
// their own; with BackendOptions::core_only no record contributes anything.
// One file per record under runtime/cuda/fast_paths/<name>/; adding one is
// docs/design.md's "How to add a fast path".
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {

// Where in the core priority order a fast path's lowering is inserted
// (registry.cpp lists the core lowerings between these slots).
enum class FastPathSlot {
  whole_step,         // first: one launch takes the whole step
  backward_patterns,  // the output layer's backward and one-pass dgrad+update (several units at once)
  dgrad_forward,      // small-K dgrad and small-N forwards, before cuBLASLt decides the ReLU masks
  hidden_forward,     // small-batch hidden forwards
  weight_update,      // a weight gradient fused with its update, before cuBLASLt takes the matmul
  bias_update,        // bias gradients fused with their update rule's step, after the core bias_grad_sgd
  cnn_bias_update,    // conv bias channel sums fused with SGD, before the plain channel_sum
  convolution,        // our convolutions where they beat cuDNN, before cuDNN
};

struct SlottedLowering {
  FastPathSlot slot;
  std::unique_ptr<CudaLowering> lowering;
};

struct FastPath {
  std::string name;  // "whole_step"
  std::string doc;   // one line: what it runs and where it pays
  std::vector<std::string> option_keys;  // the backend option table rows it owns
  // Its lowerings under `options` (none where its own options turn it off).
  std::vector<SlottedLowering> (*lowerings)(const BackendOptions& options) = nullptr;
  // "" when it would take (part of) `graph` under `options`, else one line why not
  // ("optimizer adamw: the kernel applies plain SGD"). May ask the device only
  // when `device_present`.
  std::string (*why_not)(const sg::Graph& graph, const BackendOptions& options, bool device_present) = nullptr;
  // Whether `launch` is one of this record's, where a core lowering has the
  // same name (our_conv's conv_implicit_gemm, also the core's fallback); null:
  // by its lowerings' names.
  bool (*took)(const sg::Graph& graph, const Launch& launch, const BackendOptions& options) = nullptr;
};

// Every record, in the order their slots come (docs and reports list them so).
const std::vector<FastPath>& fast_paths();

// The record named `name` (throws std::out_of_range for an unknown one).
const FastPath& fast_path_named(std::string_view name);

// Per launch of `schedule` (built under `options`): whether it is one of
// `record`'s (its `took`, else one of its lowerings' names).
std::vector<bool> record_launches(const FastPath& record, const sg::Graph& graph, const Schedule& schedule,
                                  const BackendOptions& options);

struct DeclinedFastPath {
  std::string name;
  std::string reason;
};

// The records with no launch in `schedule`, each with why_not's line, or
// "not chosen: a higher-priority lowering took its nodes" where why_not has
// none. Under core_only every record, "backend.core_only is set". CPU-side:
// `inspect` calls it on a machine without a GPU (device_present false).
std::vector<DeclinedFastPath> declined_fast_paths(const sg::Graph& graph, const Schedule& schedule,
                                                  const BackendOptions& options, bool device_present);

}  // namespace sg::cuda
