#pragma once
// The CPU reference backend: runs any graph node by node with each op's CPU
// reference from the op registry (graph/op_registry.hpp, plain loops of
// ops/cpu/reference_ops.hpp), in float (training fallback) or double
// (gradient checks). Fusion groups are ignored: they never change results.
//
// Values whose graph dtype is f16 or bf16 are stored as the GPU stores them:
// after every node, each value it writes (outputs and in-place targets) is
// rounded to its format (round to nearest even), once here rather than in
// every op, so the f32 backend stays the oracle of the CUDA one. Gradient
// checks (f64) differentiate the exact math and keep full precision.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "graph/graph.hpp"
#include "graph/op_registry.hpp"
#include "runtime/cpu/host_tensor.hpp"

namespace sg {

enum class HalfWidthValues : std::uint8_t {
  rounded,  // f16 / bf16 values rounded to their format after each node
  exact,    // kept in T (finite-difference gradient checks)
};

template <typename T>
class CpuExecutor {
 public:
  // Allocates every value, zero-filled. Default: rounded in float, exact in
  // double.
  explicit CpuExecutor(Graph graph);
  CpuExecutor(Graph graph, HalfWidthValues half_width);

  const Graph& graph() const { return graph_; }
  HostTensor<T>& tensor(ValueId id);
  HostTensor<T>& tensor(std::string_view name) { return tensor(graph_.value_named(name)); }

  // The optimizer's learning rate (run state, not IR): every sgd_update reads
  // it. Throws GraphError unless lr > 0; running an sgd_update before the
  // first call throws.
  void set_learning_rate(double lr);
  std::optional<double> learning_rate() const { return learning_rate_; }

  void run();                    // every node once, in graph order
  void run_node(const Node& n);  // one node

  // Rounds a value written from outside (initial parameters, a loaded
  // checkpoint) to its graph dtype, as the node writes are; nothing unless
  // half-width values are rounded.
  void round_to_dtype(ValueId id);

 private:
  CpuTensor<T> view(ValueId id);

  Graph graph_;
  HalfWidthValues half_width_;
  std::vector<HostTensor<T>> tensors_;
  std::optional<double> learning_rate_;
  std::vector<CpuTensor<T>> in_views_, out_views_;  // scratch of run_node
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace sg
