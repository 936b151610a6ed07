#pragma once
// The CPU reference backend: runs any graph node by node with each op's CPU
// reference from the op registry (graph/op_registry.hpp, plain loops of
// ops/cpu/reference_ops.hpp), in float (training fallback) or double
// (gradient checks). Fusion groups are ignored: they never change results.
#include <optional>
#include <string_view>
#include <vector>

#include "graph/graph.hpp"
#include "graph/op_registry.hpp"
#include "runtime/cpu/host_tensor.hpp"

namespace sg {

template <typename T>
class CpuExecutor {
 public:
  explicit CpuExecutor(Graph graph);  // allocates every value, zero-filled

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

 private:
  CpuTensor<T> view(ValueId id);

  Graph graph_;
  std::vector<HostTensor<T>> tensors_;
  std::optional<double> learning_rate_;
  std::vector<CpuTensor<T>> in_views_, out_views_;  // scratch of run_node
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace sg
