#include "runtime/cuda/lowerings/lowering_support.hpp"

#include <algorithm>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/philox.hpp"

namespace sg::cuda {

std::optional<ElemType> elem_type(DType dtype) {
  if (dtype == DType::f16) return ElemType::f16;
  if (dtype == DType::bf16) return ElemType::bf16;
  if (dtype == DType::f32) return ElemType::f32;
  return std::nullopt;
}

MatmulShape operand_shape(const sg::Graph& g, const Node& mm) {
  const Value& a = g.value(mm.inputs[0]);
  const Value& b = g.value(mm.inputs[1]);
  const auto& attrs = mm.attr<MatmulAttrs>();
  MatmulShape s;
  s.trans_a = attrs.trans_a;
  s.trans_b = attrs.trans_b;
  s.m = s.trans_a ? a.shape[1] : a.shape[0];
  s.k = s.trans_a ? a.shape[0] : a.shape[1];
  s.n = s.trans_b ? b.shape[0] : b.shape[1];
  const auto type = elem_type(a.dtype);
  if (!type) throw CudaError(fmt::format("cuda backend: matmul operand of dtype {}", dtype_name(a.dtype)));
  s.ab_type = *type;
  return s;
}

MatmulShape forward_shape(const sg::Graph& g, NodeId matmul, Epilogue epilogue, DType out) {
  MatmulShape s = operand_shape(g, g.node(matmul));
  s.cd_type = elem_type(out).value_or(ElemType::f32);
  s.accumulate = Accumulate::f32;
  s.epilogue = epilogue;
  return s;
}

std::int64_t inner_dim(const sg::Graph& g, const Node& mm) {
  const Value& a = g.value(mm.inputs[0]);
  return mm.attr<MatmulAttrs>().trans_a ? a.shape[0] : a.shape[1];
}

NodeId node_of(const sg::Graph& g, const CoverUnit& unit, OpKind op) {
  for (NodeId id : unit.nodes)
    if (g.node(id).op == op) return id;
  return -1;
}

bool plain_sgd(const Node& sgd) {
  return sgd.op == OpKind::sgd_update && sgd.inputs.size() == 2;
}

const CoverUnit* free_plain_bias_update_of(const Cover& cover, ValueId grad) {
  const sg::Graph& g = cover.graph();
  for (NodeId reader : g.consumers(grad)) {
    const CoverUnit* u = cover.free_group_with(reader, FusionKind::bgrad_sgd);
    if (!u || u->nodes.size() != 2) continue;
    const Node& reduce = g.node(node_of(g, *u, OpKind::reduce_rows));
    const NodeId sgd = node_of(g, *u, OpKind::sgd_update);
    if (reduce.inputs[0] == grad && sgd >= 0 && g.node(sgd).inputs.size() == 2) return u;
  }
  return nullptr;
}

const CoverUnit* free_weight_update(const Cover& cover, ValueId dy, ValueId weight, bool plain) {
  const sg::Graph& g = cover.graph();
  for (NodeId reader : g.consumers(dy)) {
    const CoverUnit* u = cover.free_group_with(reader, FusionKind::wgrad_sgd);
    if (!u) continue;
    const Node& mm = g.node(node_of(g, *u, OpKind::matmul));
    const Node& sgd = g.node(node_of(g, *u, OpKind::sgd_update));
    if (mm.inputs[0] != dy || sgd.inputs[0] != weight) continue;
    if (plain && (sgd.inputs.size() != 2 || u->nodes.size() != 2)) continue;
    return u;
  }
  return nullptr;
}

Match single_unit(const CoverUnit& unit) {
  Match m;
  m.units = {unit.id};
  return m;
}

std::optional<DType> param_cast_to(const sg::Graph& g, const Node& n) {
  if (n.op != OpKind::cast) return std::nullopt;
  const Value& in = g.value(n.inputs[0]);
  const DType to = g.value(n.outputs[0]).dtype;
  if (in.role != Role::param || in.dtype != DType::f32 || (to != DType::f16 && to != DType::bf16)) return std::nullopt;
  return to;
}

DropoutParams dropout_params_of(const DropoutAttrs& a) {
  return {a.seed, a.stream, philox::dropout_threshold(a.p), static_cast<float>(1.0 / (1.0 - a.p))};
}

std::vector<std::pair<std::string, double>> median_phase_times(
    const std::vector<std::string>& names, int repeats, cudaStream_t stream,
    const std::function<void(unsigned long long* clock)>& step) {
  DeviceBuffer clock((names.size() + 1) * sizeof(unsigned long long));
  std::vector<std::vector<double>> us(names.size());
  std::vector<unsigned long long> ns(names.size() + 1);
  for (int r = 0; r < repeats; ++r) {
    step(clock.as<unsigned long long>());
    SG_CUDA_CHECK(cudaStreamSynchronize(stream));
    clock.download(ns.data(), ns.size() * sizeof(unsigned long long));
    for (std::size_t i = 0; i < names.size(); ++i) us[i].push_back(double(ns[i + 1] - ns[i]) / 1e3);
  }
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::sort(us[i].begin(), us[i].end());
    out.emplace_back(names[i], us[i][us[i].size() / 2]);
  }
  return out;
}

}  // namespace sg::cuda
