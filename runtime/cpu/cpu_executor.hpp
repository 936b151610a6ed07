#pragma once
// The CPU reference backend: runs any graph node by node with the plain loops
// of ops/cpu/reference_ops.hpp, in float (training fallback) or double
// (gradient checks). Fusion groups are ignored: they never change results.
#include <string_view>
#include <vector>

#include "graph/graph.hpp"
#include "runtime/cpu/host_tensor.hpp"

namespace sg {

template <typename T>
class CpuExecutor {
 public:
  explicit CpuExecutor(Graph graph);  // allocates every value, zero-filled

  const Graph& graph() const { return graph_; }
  Graph& graph() { return graph_; }  // e.g. to change the learning rate between runs
  HostTensor<T>& tensor(ValueId id);
  HostTensor<T>& tensor(std::string_view name) { return tensor(graph_.value_named(name)); }

  void run();                    // every node once, in graph order
  void run_node(const Node& n);  // one node

 private:
  Graph graph_;
  std::vector<HostTensor<T>> tensors_;
};

extern template class CpuExecutor<float>;
extern template class CpuExecutor<double>;

}  // namespace sg
