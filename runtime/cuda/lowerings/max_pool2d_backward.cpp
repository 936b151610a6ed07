// Lowering: a max_pool2d_backward node by our gather kernel
// (ops/cuda/pooling.hpp), with its lone element-wise neighbours folded into
// the launch: the relu_backward producing its incoming gradient (forward
// "pool, relu"), the relu_backward reading its result (forward "relu,
// pool"; channels-last: any activation's backward there) and the
// dropout2d_backward after that (forward "dropout2d, [relu,] pool"). The
// CNN's backward of "dropout2d, max-pool, ReLU" is then one launch from the
// relu's gradient to the conv's. The argmax is recomputed
// from the pooling's input (the op takes X, not an index buffer), the
// dropout2d mask from Philox; intermediates are written only where a node
// outside the launch reads them.
#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/pooling.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct PoolBackwardNodes {
  NodeId relu_before = -1, pool = -1, relu_after = -1, dropout = -1;
  NodeId to_last = -1;  // channels-last: the to_channels_last giving dY, read here from its NCHW input
};

// The lone free reader of `v` that takes `v` as its first input, keeps its
// dtype and that `accepts`, if any.
template <typename Accepts>
const CoverUnit* free_gradient_reader(const Cover& cover, ValueId v, Accepts&& accepts) {
  const sg::Graph& g = cover.graph();
  for (NodeId reader : g.consumers(v)) {
    const Node& n = g.node(reader);
    if (n.inputs[0] != v || g.value(n.outputs[0]).dtype != g.value(v).dtype || !accepts(n)) continue;
    if (const CoverUnit* u = free_lone_unit(cover, reader)) return u;
  }
  return nullptr;
}

class MaxPool2dBackwardLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "max_pool2d_backward"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& pool = g.node(unit.nodes.front());
    if (pool.op != OpKind::max_pool2d_backward) return std::nullopt;
    const DType t = g.value(pool.inputs[1]).dtype;
    if (!is_floating(t) || g.value(pool.inputs[0]).dtype != t || g.value(pool.outputs[0]).dtype != t)
      return std::nullopt;
    PoolBackwardNodes nodes;
    nodes.pool = pool.id;
    Match m = single_unit(unit);
    NodeId position = pool.id;  // where the launch runs: its first node
    const NodeId producer = g.value(pool.inputs[0]).producer;
    // The start of a channels-last region's backward: dY converted from NCHW, read here in that layout.
    if (const CoverUnit* u = free_lone_unit(cover, producer);
        u && g.node(producer).op == OpKind::to_channels_last && pool.attr<Pool2dAttrs>().channels_last &&
        g.consumers(pool.inputs[0]).size() == 1 && !is_graph_output(g, pool.inputs[0])) {
      nodes.to_last = producer;
      position = producer;
      m.units.push_back(u->id);
    }
    if (const CoverUnit* u = free_lone_unit(cover, producer);
        u && nodes.to_last < 0 && g.node(producer).op == OpKind::relu_backward) {
      const Node& relu = g.node(producer);
      if (g.value(relu.inputs[0]).dtype == t && g.value(relu.inputs[1]).dtype == t) {
        nodes.relu_before = producer;
        position = producer;
        m.units.push_back(u->id);
      }
    }
    ValueId result = pool.outputs[0];
    // A relu_backward after it (channels-last: any activation's backward,
    // activation_nodes.hpp) reads the activation's saved value, which must
    // exist where the launch runs.
    const bool channels_last = pool.attr<Pool2dAttrs>().channels_last;
    const auto activation_backward = [&](const Node& n) {
      const auto a = backward_activation(n.op);
      return a && (*a == Activation::relu || channels_last) && g.value(n.inputs[1]).dtype == t &&
             g.value(n.inputs[1]).producer < position;
    };
    if (const CoverUnit* u = free_gradient_reader(cover, result, activation_backward)) {
      nodes.relu_after = u->nodes.front();
      result = g.node(nodes.relu_after).outputs[0];
      m.units.push_back(u->id);
    }
    const auto dropout_backward = [](const Node& n) { return n.op == OpKind::dropout2d_backward; };
    if (const CoverUnit* u = free_gradient_reader(cover, result, dropout_backward); u && !channels_last) {
      nodes.dropout = u->nodes.front();
      m.units.push_back(u->id);
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<PoolBackwardNodes>(l);
    const auto& a = g.node(nodes.pool).attr<Pool2dAttrs>();
    return fmt::format("{}{}k={},s={}{}{}{}", nodes.to_last >= 0 ? "to_channels_last+" : "",
                       nodes.relu_before >= 0 ? "relu_backward+" : "", a.kernel, a.stride,
                       nodes.relu_after >= 0 ? fmt::format("+{}", op_name(g.node(nodes.relu_after).op)) : "",
                       nodes.dropout >= 0 ? "+dropout2d_backward" : "", a.channels_last ? ",channels_last" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<PoolBackwardNodes>(l);
    const Node& pool = g.node(nodes.pool);
    const auto& a = pool.attr<Pool2dAttrs>();
    const Value& in = g.value(pool.inputs[1]);
    // [N,C,H,W] planes, or [N,H,W,C] (channels_last) rows of channels.
    const PoolGeometry geometry{in.shape[0] * in.shape[1], in.shape[2], in.shape[3], a.kernel, a.stride};
    const ChannelsLastPool last{in.shape[0], in.shape[1], in.shape[2],   in.shape[3],
                                a.kernel,    a.stride,    nodes.to_last >= 0};
    const bool channels_last = a.channels_last;
    // Intermediates get a buffer only when read after the launch (c.ptr throws for the others).
    auto out_ptr = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    PoolBackwardTensors<void> p;  // type-erased here, cast once the element type is known
    p.x = c.ptr(in.id);
    if (nodes.relu_before >= 0) {
      const Node& r = g.node(nodes.relu_before);
      p.dy = c.ptr(r.inputs[0]);
      p.relu_before = c.ptr(r.inputs[1]);
      p.relu_before_grad = out_ptr(r.outputs[0]);
    } else {
      p.dy = c.ptr(nodes.to_last >= 0 ? g.node(nodes.to_last).inputs[0] : pool.inputs[0]);
    }
    ValueId result = pool.outputs[0];
    p.pool_grad = out_ptr(result);
    if (nodes.relu_after >= 0) {
      const Node& r = g.node(nodes.relu_after);
      p.relu_after = c.ptr(r.inputs[1]);
      result = r.outputs[0];
      p.relu_after_grad = out_ptr(result);
    }
    PlaneDropout dropout;
    const std::int32_t* step = nullptr;
    if (nodes.dropout >= 0) {
      const Node& d = g.node(nodes.dropout);
      const auto& da = d.attr<DropoutAttrs>();
      dropout = {true, dropout_params_of(da)};
      step = static_cast<const std::int32_t*>(c.ptr(d.inputs[1]));
      result = d.outputs[0];
    }
    p.dx = c.ptr(result);
    // Without dropout the result is the last gradient of the chain: written through its own slot.
    if (nodes.dropout < 0) (nodes.relu_after >= 0 ? p.relu_after_grad : p.pool_grad) = p.dx;
    std::function<void(cudaStream_t)> run;
    with_float_type(in.dtype, [&](auto tag) {
      using T = decltype(tag);
      const PoolBackwardTensors<T> typed{static_cast<const T*>(p.dy),         static_cast<const T*>(p.relu_before),
                                         static_cast<const T*>(p.x),          static_cast<const T*>(p.relu_after),
                                         static_cast<T*>(p.relu_before_grad), static_cast<T*>(p.pool_grad),
                                         static_cast<T*>(p.relu_after_grad),  static_cast<T*>(p.dx)};
      if (channels_last) {
        ChannelsLastPoolBackward<T> t{typed.dy,         typed.relu_before, typed.x,
                                      typed.relu_after, typed.relu_before_grad, typed.pool_grad,
                                      typed.relu_after_grad, typed.dx};
        if (nodes.relu_after >= 0) t.after_activation = *backward_activation(g.node(nodes.relu_after).op);
        run = [=](cudaStream_t s) { launch_max_pool2d_nhwc_backward(t, last, s); };
      } else {
        run = [=](cudaStream_t s) { launch_max_pool2d_backward(typed, step, geometry, dropout, s); };
      }
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_max_pool2d_backward_lowering() {
  return std::make_unique<MaxPool2dBackwardLowering>();
}

}  // namespace sg::cuda
