#include "runtime/cpu/cpu_executor.hpp"

#include <cmath>
#include <type_traits>

#include <fmt/format.h>

#include "runtime/half_width_floats.hpp"

namespace sg {

template <typename T>
CpuExecutor<T>::CpuExecutor(Graph graph)
    : CpuExecutor(std::move(graph), std::is_same_v<T, float> ? HalfWidthValues::rounded : HalfWidthValues::exact) {}

template <typename T>
CpuExecutor<T>::CpuExecutor(Graph graph, HalfWidthValues half_width)
    : graph_(std::move(graph)), half_width_(half_width) {
  tensors_.reserve(graph_.values().size());
  for (const Value& v : graph_.values()) {
    HostTensor<T> t;
    t.shape = v.shape;
    t.dtype = v.dtype;
    const auto n = static_cast<std::size_t>(element_count(v.shape));
    if (is_floating(v.dtype)) t.real.assign(n, T(0));
    if (v.dtype == DType::i32) t.i32.assign(n, 0);
    if (v.dtype == DType::u8) t.u8.assign(n, 0);
    tensors_.push_back(std::move(t));
  }
}

template <typename T>
HostTensor<T>& CpuExecutor<T>::tensor(ValueId id) {
  graph_.value(id);  // throws on a bad id
  return tensors_[static_cast<std::size_t>(id)];
}

template <typename T>
void CpuExecutor<T>::set_learning_rate(double lr) {
  if (!(lr > 0.0) || !std::isfinite(lr)) throw GraphError(fmt::format("learning rate {} must be > 0", lr));
  learning_rate_ = lr;
}

template <typename T>
void CpuExecutor<T>::run() {
  for (const Node& n : graph_.nodes()) run_node(n);
}

// A view of the tensor as it is now (callers may have replaced its vectors).
template <typename T>
CpuTensor<T> CpuExecutor<T>::view(ValueId id) {
  HostTensor<T>& t = tensors_[static_cast<std::size_t>(id)];
  return {t.dtype, t.size(), t.rows(), t.cols(), t.real.data(), t.i32.data(), t.u8.data(), t.shape};
}

template <typename T>
void CpuExecutor<T>::run_node(const Node& n) {
  const CpuKernel<T> kernel = op_def(n.op).template cpu<T>();
  if (!kernel) throw GraphError(fmt::format("cpu backend: op {} not implemented", op_name(n.op)));
  in_views_.clear();
  out_views_.clear();
  for (ValueId id : n.inputs) in_views_.push_back(view(id));
  for (ValueId id : n.outputs) out_views_.push_back(view(id));
  kernel(CpuCall<T>{n, in_views_, out_views_, learning_rate_});
  if (half_width_ != HalfWidthValues::rounded) return;
  for (ValueId id : n.outputs) round_to_dtype(id);
  for (int slot : in_place_inputs(n))
    round_to_dtype(n.inputs[static_cast<std::size_t>(slot)]);
}

template <typename T>
void CpuExecutor<T>::round_to_dtype(ValueId id) {
  if (half_width_ != HalfWidthValues::rounded) return;
  HostTensor<T>& t = tensor(id);
  if (!is_half_width_float(t.dtype)) return;
  for (T& x : t.real) x = sg::round_to_dtype(x, t.dtype);
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace sg
