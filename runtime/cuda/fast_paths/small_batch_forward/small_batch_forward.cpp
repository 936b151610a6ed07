// Lowering: a hidden layer's forward at batch 16/32, y = [act](x W^T + b),
// by our dependent-launch kernel (ops/cuda/fast_paths/small_batch_forward/small_batch_forward.cu), which
// loads its weights while the previous kernel finishes. The first layer's
// also takes the batch fetch (the gather rides in the same kernel). The
// activation is any of ops/cuda/activation.hpp's: a linear_forward group
// ending in relu or gelu_tanh, or a bias-only group with the lone activation
// node after it (gelu, silu, tanh, sigmoid: activation_nodes.hpp); where a
// backward reads the pre-activation, the launch writes it too. It writes no
// cuBLASLt ReLU mask, so it takes a ReLU layer only when no dgrad left for
// cuBLASLt needs that mask.
#include <algorithm>

#include "ops/cuda/fast_paths/small_batch_forward/small_batch_forward.hpp"
#include "ops/cuda/fast_paths/measured_costs.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/fetch_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

using measured::kSmallBatchForwardMaxColumns;  // measured_costs.hpp

struct ForwardNodes {
  NodeId matmul = -1;
  ValueId bias = -1, output = -1;
  bool relu = false;
  std::optional<Activation> activation;  // (relu: Activation::relu)
  ValueId pre_activation = -1;            // the bias_add's output, when an activation follows
  NodeId indices = -1, images = -1, labels = -1;  // the folded batch fetch, when taken
};

class SmallBatchForwardLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "small_batch_forward"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::linear_forward)) return std::nullopt;
    const Node& last = g.node(unit.nodes.back());
    // The kernel's epilogue is bias [+ an activation of activation.hpp].
    if (last.op != OpKind::bias_add && !forward_activation(last.op)) return std::nullopt;
    ForwardNodes f;
    f.matmul = node_of(g, unit, OpKind::matmul);
    const Node& bias_add = g.node(node_of(g, unit, OpKind::bias_add));
    f.bias = bias_add.inputs[1];
    f.output = last.outputs[0];
    f.relu = last.op == OpKind::relu;
    f.activation = forward_activation(last.op);
    if (!fits(forward_shape(g, f.matmul, f.relu ? Epilogue::relu_bias : Epilogue::bias, g.value(f.output).dtype)))
      return std::nullopt;
    // A bias-only group followed by a lone activation node: the launch runs that node too.
    const CoverUnit* activation = f.activation ? nullptr : free_lone_activation_of(cover, f.output);
    if (activation) {
      const Node& act = g.node(activation->nodes[0]);
      if (g.value(act.outputs[0]).dtype != DType::f16) activation = nullptr;
      else {
        f.activation = forward_activation(act.op);
        f.output = act.outputs[0];
      }
    }
    if (f.activation && !f.relu) f.pre_activation = bias_add.outputs[0];
    // A dgrad still free goes to cuBLASLt, which reads a mask this kernel does not write.
    if (f.relu)
      for (NodeId reader : g.consumers(f.output))
        if (g.node(reader).op == OpKind::relu_backward && !cover.taken_node(reader)) return std::nullopt;
    Match m = single_unit(unit);
    if (activation) m.units.push_back(activation->id);
    if (const CoverUnit* fetch = foldable_fetch(cover, g.node(f.matmul), f)) m.units.push_back(fetch->id);
    m.detail = f;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const auto& f = detail_of<ForwardNodes>(l);
    std::string epilogue = f.relu ? "epilogue=relu_bias" : "epilogue=bias";
    if (f.activation && !f.relu) {
      epilogue += fmt::format("+{}", activation_op_name(*f.activation));
      if (writes_pre_activation(f, l)) epilogue += ",writes pre-activation";
    }
    return epilogue + (f.indices >= 0 ? ",+batch fetch" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t index, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ForwardNodes>(l);
    const Node& mm = g.node(nodes.matmul);
    const MatmulShape s = operand_shape(g, mm);
    SmallBatchLinear f;
    f.w = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    f.bias = static_cast<const __half*>(c.ptr(nodes.bias));
    f.y = static_cast<__half*>(c.ptr(nodes.output));
    f.batch = int(s.m);
    f.n = int(s.n);
    f.k = int(s.k);
    f.activation = nodes.activation;
    if (writes_pre_activation(nodes, l)) f.pre_activation = static_cast<__half*>(c.ptr(nodes.pre_activation));
    // The first launch of a step follows the previous step's last one, which
    // may update this weight (see SmallBatchLinear::load_weight_early).
    f.load_weight_early = index > 0;
    if (nodes.indices < 0) {
      f.x = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    } else {
      const BoundFetch b = bind_fetch({nodes.indices, nodes.images, nodes.labels}, c);
      f.fetch.perm = b.perm;
      f.fetch.rows = b.rows;
      f.fetch.step = b.step;
      f.fetch.images = b.images;
      f.fetch.scale = b.scale;
      f.fetch.shift = b.shift;
      f.fetch.labels = b.labels;
      f.fetch.labels_out = b.labels_out;
      // x has a buffer only where a later launch reads it (the first layer's weight
      // gradient); an eval graph's x lives only inside this launch.
      const ValueId x = g.node(nodes.images).outputs[0];
      if (std::find(l.writes.begin(), l.writes.end(), x) != l.writes.end()) f.fetch.x_out = static_cast<__half*>(c.ptr(x));
      // When the step's last launch lets the next kernel start only after
      // its own wait (the one-pass column-strip kernel, which then also
      // updates the first layer), the step counter's writer has completed by
      // the time this launch starts: the gather may run before the wait.
      const Launch& last = c.schedule().launches.back();
      const ValueId w = mm.inputs[1];
      f.fetch.gather_before_wait = last.lowering->name() == "one_pass_strips" &&
                                   std::any_of(last.nodes.begin(), last.nodes.end(), [&](NodeId n) {
                                     return g.node(n).op == OpKind::sgd_update && g.node(n).inputs[0] == w;
                                   });
    }
    const bool dependent = c.options().dependent_launch;
    return std::make_unique<BoundLaunch>([f, dependent](cudaStream_t st) { launch_small_batch_linear(f, st, dependent); },
                                         "small-batch dependent-launch kernel");
  }

 private:
  // Whether a later launch reads the pre-activation (a gelu, gelu_tanh or silu backward).
  static bool writes_pre_activation(const ForwardNodes& f, const Launch& l) {
    return f.pre_activation >= 0 && std::find(l.writes.begin(), l.writes.end(), f.pre_activation) != l.writes.end();
  }

  static bool fits(const MatmulShape& s) {
    return s.n <= kSmallBatchForwardMaxColumns && s.ab_type == ElemType::f16 && s.cd_type == ElemType::f16 && !s.trans_a && s.trans_b &&
           small_batch_linear_unsupported(s.m, s.n, s.k).empty();
  }

  // The free batch-fetch unit gathering this matmul's input from u8 tables, with its labels.
  static const CoverUnit* foldable_fetch(const Cover& cover, const Node& mm, ForwardNodes& f) {
    const sg::Graph& g = cover.graph();
    const NodeId gather = g.value(mm.inputs[0]).producer;
    const CoverUnit* fetch = gather >= 0 ? cover.free_group_with(gather, FusionKind::batch_fetch) : nullptr;
    const auto nodes = fetch ? u8_fetch_nodes(g, *fetch) : std::nullopt;
    if (!nodes || nodes->images != gather) return nullptr;
    // The launch runs where the fetch sits: the weight and bias must exist by then
    // (not so for fp32 master weights, whose fp16 casts come after the fetch).
    for (ValueId v : {mm.inputs[1], f.bias})
      if (g.value(v).producer >= fetch->anchor) return nullptr;
    const auto& shard = g.node(nodes->indices).attr<BatchIndicesAttrs>();
    if (shard.batch != g.value(mm.inputs[0]).shape[0] || shard.ranks != 1)  // a data-parallel shard: batch_fetch's
      return nullptr;
    f.indices = nodes->indices;
    f.images = nodes->images;
    f.labels = nodes->labels;
    return fetch;
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_small_batch_forward_lowering() { return std::make_unique<SmallBatchForwardLowering>(); }

}  // namespace sg::cuda
