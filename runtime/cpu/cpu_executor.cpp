#include "runtime/cpu/cpu_executor.hpp"

#include <fmt/format.h>

#include "ops/cpu/reference_ops.hpp"

namespace sg {

template <typename T>
CpuExecutor<T>::CpuExecutor(Graph graph) : graph_(std::move(graph)) {
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
void CpuExecutor<T>::run() {
  for (const Node& n : graph_.nodes()) run_node(n);
}

template <typename T>
void CpuExecutor<T>::run_node(const Node& n) {
  auto in = [&](std::size_t slot) -> HostTensor<T>& { return tensors_[static_cast<std::size_t>(n.inputs[slot])]; };
  auto out = [&]() -> HostTensor<T>& { return tensors_[static_cast<std::size_t>(n.outputs[0])]; };
  const OpAttrs& a = n.attrs;
  switch (n.op) {
    case OpKind::batch_indices:
      ref::batch_indices(in(0).i32.data(), in(0).size(), in(1).i32[0], a.batch, out().i32.data());
      return;
    case OpKind::gather_rows: {
      HostTensor<T>& table = in(0);
      const auto cols = table.cols();
      const auto rows = in(1).size();
      const std::int32_t* idx = in(1).i32.data();
      for (std::int64_t i = 0; i < rows; ++i)
        if (idx[i] < 0 || idx[i] >= table.rows())
          throw GraphError(fmt::format("gather_rows: index {} outside table of {} rows", idx[i], table.rows()));
      if (out().dtype == DType::i32) {
        if (table.dtype == DType::u8) ref::gather_rows_int(table.u8.data(), idx, rows, cols, out().i32.data());
        else ref::gather_rows_int(table.i32.data(), idx, rows, cols, out().i32.data());
      } else if (table.dtype == DType::u8) {
        ref::gather_rows(table.u8.data(), idx, rows, cols, T(a.scale), T(a.shift), out().real.data());
      } else if (table.dtype == DType::i32) {
        ref::gather_rows(table.i32.data(), idx, rows, cols, T(a.scale), T(a.shift), out().real.data());
      } else {
        ref::gather_rows(table.real.data(), idx, rows, cols, T(a.scale), T(a.shift), out().real.data());
      }
      return;
    }
    case OpKind::matmul: {
      const auto m = out().rows(), cols = out().cols();
      const auto k = a.trans_a ? in(0).rows() : in(0).cols();
      ref::matmul(in(0).real.data(), in(1).real.data(), out().real.data(), m, cols, k, a.trans_a, a.trans_b);
      return;
    }
    case OpKind::bias_add:
      ref::bias_add(in(0).real.data(), in(1).real.data(), in(0).rows(), in(0).cols(), out().real.data());
      return;
    case OpKind::relu:
      ref::relu(in(0).real.data(), in(0).size(), out().real.data());
      return;
    case OpKind::relu_backward:
      ref::relu_backward(in(0).real.data(), in(1).real.data(), in(0).size(), out().real.data());
      return;
    case OpKind::softmax_xent:
      out().real[0] = ref::softmax_xent(in(0).real.data(), in(1).i32.data(), in(0).rows(), in(0).cols());
      return;
    case OpKind::softmax_xent_backward:
      ref::softmax_xent_backward(in(0).real.data(), in(1).i32.data(), in(0).rows(), in(0).cols(), out().real.data());
      return;
    case OpKind::count_correct:
      out().i32[0] = ref::count_correct(in(0).real.data(), in(1).i32.data(), in(0).rows(), in(0).cols());
      return;
    case OpKind::reduce_rows:
      ref::reduce_rows(in(0).real.data(), in(0).rows(), in(0).cols(), out().real.data());
      return;
    case OpKind::add:
      ref::add(in(0).real.data(), in(1).real.data(), in(0).size(), out().real.data());
      return;
    case OpKind::cast:
      out().real = in(0).real;  // the CPU backend computes every floating dtype in T
      return;
    case OpKind::sgd_update: {
      T* velocity = n.inputs.size() == 3 ? in(2).real.data() : nullptr;
      ref::sgd_update(in(0).real.data(), in(1).real.data(), velocity, in(0).size(), T(a.lr), T(a.momentum),
                      T(a.weight_decay));
      return;
    }
    case OpKind::advance_step:
      in(0).i32[0] += 1;
      return;
  }
  throw GraphError(fmt::format("cpu backend: op {} not implemented", op_name(n.op)));
}

template class CpuExecutor<float>;
template class CpuExecutor<double>;

}  // namespace sg
