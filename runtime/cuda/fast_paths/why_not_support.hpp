#pragma once
// Facts about a graph that several fast paths' why_not lines share: which
// optimizer it applies, whether its weights are fp16, the options that turn
// our fp32-accumulating kernels off.
#include <string>

#include "graph/graph.hpp"
#include "runtime/backend_options.hpp"

namespace sg::cuda {

// "" when every update is SGD (momentum allowed), else one line naming the
// optimizer the graph applies: "optimizer adamw: the kernels apply SGD in-kernel".
std::string not_sgd(const sg::Graph& graph);
// "" when every update is plain SGD (no momentum, no Nesterov), else one line
// naming what the graph applies: "optimizer adam: the kernels apply plain SGD".
std::string not_plain_sgd(const sg::Graph& graph);
// "" when a matmul weight is fp16, else "weights are <dtype>: the kernels are fp16 only".
std::string no_fp16_weights(const sg::Graph& graph);
// "" unless precision.accumulate is fp16 (cuBLASLt's compute type; our kernels accumulate in fp32).
std::string accumulates_f16(const BackendOptions& options);

}  // namespace sg::cuda
