// Lowering: a max_pool2d node by our kernel (ops/cuda/pooling.hpp), with a
// dropout2d that produces its input and a relu that reads its output folded
// into the launch when they are lone nodes (the CNN's "dropout2d, max-pool,
// ReLU"); channels-last, the lone activation (not a ReLU) producing its
// input instead, applied as the windows load (windows that tile the input:
// each element written once). The launch still writes every value a node
// outside it reads: the dropout2d output (the pooling's backward takes its
// argmax from it), the activation's and the relu's outputs, and the pooled
// values only where something reads them.
#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/pooling.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct PoolForwardNodes {
  NodeId activation = -1;  // channels-last: the lone activation before the pooling, applied on its input's load
  NodeId dropout = -1, pool = -1, relu = -1;
  NodeId to_first = -1;  // channels-last: the to_channels_first of the pooled values, written by this launch
};

// A channels-last pooling's geometry: its input [N,H,W,C].
ChannelsLastPool channels_last_geometry(const sg::Graph& g, const Node& pool, bool to_first) {
  const Shape& in = g.value(pool.inputs[0]).shape;
  const auto& a = pool.attr<Pool2dAttrs>();
  return {in[0], in[1], in[2], in[3], a.kernel, a.stride, to_first};
}

class MaxPool2dLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "max_pool2d"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& pool = g.node(unit.nodes.front());
    if (pool.op != OpKind::max_pool2d) return std::nullopt;
    const DType t = g.value(pool.inputs[0]).dtype;
    if (!is_floating(t) || g.value(pool.outputs[0]).dtype != t) return std::nullopt;
    PoolForwardNodes nodes;
    nodes.pool = pool.id;
    Match m = single_unit(unit);
    const NodeId producer = g.value(pool.inputs[0]).producer;
    // The activation before a channels-last pooling whose windows tile its
    // input: applied as the window is loaded, its output written there. Not
    // a ReLU: the convolution's and batch norm's epilogues take those (this
    // lowering comes first; taking it would cost them their epilogue).
    const auto act = producer >= 0 ? forward_activation(g.node(producer).op) : std::nullopt;
    const CoverUnit* act_unit = free_lone_unit(cover, producer);
    const bool tiles =
        pool.attr<Pool2dAttrs>().channels_last && activation_pool_tiles(channels_last_geometry(g, pool, false));
    if (act_unit && act && *act != Activation::relu && tiles && g.value(g.node(producer).inputs[0]).dtype == t) {
      nodes.activation = producer;
      m.units.push_back(act_unit->id);
    }
    // (Only an NCHW dropout2d: the channels-last one has its own launch.)
    if (const CoverUnit* u = free_lone_unit(cover, producer); u && g.node(producer).op == OpKind::dropout2d &&
                                                               !pool.attr<Pool2dAttrs>().channels_last) {
      nodes.dropout = producer;
      m.units.push_back(u->id);
    }
    for (NodeId reader : g.consumers(pool.outputs[0]))
      if (const CoverUnit* u = free_lone_unit(cover, reader);
          u && g.node(reader).op == OpKind::relu && g.value(g.node(reader).outputs[0]).dtype == t) {
        nodes.relu = reader;
        m.units.push_back(u->id);
        break;
      }
    // The end of a channels-last region: the pooled values' conversion back
    // to NCHW (their only reader) written by this launch in that layout.
    if (const CoverUnit* u = free_sole_reader(cover, pool.outputs[0], OpKind::to_channels_first);
        u && nodes.relu < 0 && pool.attr<Pool2dAttrs>().channels_last && !is_graph_output(g, pool.outputs[0])) {
      nodes.to_first = u->nodes.front();
      m.units.push_back(u->id);
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<PoolForwardNodes>(l);
    const auto& a = g.node(nodes.pool).attr<Pool2dAttrs>();
    return fmt::format("{}{}k={},s={}{}{}{}",
                       nodes.activation >= 0 ? fmt::format("{}+", op_name(g.node(nodes.activation).op)) : "",
                       nodes.dropout >= 0 ? "dropout2d+" : "", a.kernel, a.stride,
                       nodes.relu >= 0 ? "+relu" : "", a.channels_last ? ",channels_last" : "",
                       nodes.to_first >= 0 ? "+to_channels_first" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<PoolForwardNodes>(l);
    const Node& pool = g.node(nodes.pool);
    const auto& a = pool.attr<Pool2dAttrs>();
    const Value& in = g.value(pool.inputs[0]);
    // Only values read after the launch get a buffer (c.ptr throws for the others).
    auto out_ptr = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    if (a.channels_last) return record_channels_last(g, nodes, in, out_ptr, c);
    const PoolGeometry geometry{in.shape[0] * in.shape[1], in.shape[2], in.shape[3], a.kernel, a.stride};
    PlaneDropout dropout;
    const void* x = nullptr;
    const std::int32_t* step = nullptr;
    void* dropped = nullptr;
    if (nodes.dropout >= 0) {
      const Node& d = g.node(nodes.dropout);
      const auto& da = d.attr<DropoutAttrs>();
      dropout = {true, dropout_params_of(da)};
      x = c.ptr(d.inputs[0]);
      step = static_cast<const std::int32_t*>(c.ptr(d.inputs[1]));
      dropped = out_ptr(d.outputs[0]);
    } else {
      x = c.ptr(pool.inputs[0]);
    }
    void* pooled = out_ptr(pool.outputs[0]);
    void* activated = nodes.relu >= 0 ? out_ptr(g.node(nodes.relu).outputs[0]) : nullptr;
    std::function<void(cudaStream_t)> run;
    with_float_type(in.dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_max_pool2d_forward(static_cast<const T*>(x), step, geometry, dropout, static_cast<T*>(dropped),
                                  static_cast<T*>(pooled), static_cast<T*>(activated), s);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }

 private:
  // x [N,H,W,C] (no dropout2d: it is channels-first).
  template <typename OutPtr>
  static std::unique_ptr<RecordedLaunch> record_channels_last(const sg::Graph& g, const PoolForwardNodes& nodes,
                                                              const Value& in, OutPtr&& out_ptr,
                                                              const BindContext& c) {
    const bool to_first = nodes.to_first >= 0;
    const ChannelsLastPool geometry = channels_last_geometry(g, g.node(nodes.pool), to_first);
    void* pooled = out_ptr(g.node(to_first ? nodes.to_first : nodes.pool).outputs[0]);
    void* activated = nodes.relu >= 0 ? out_ptr(g.node(nodes.relu).outputs[0]) : nullptr;
    std::function<void(cudaStream_t)> run;
    if (nodes.activation >= 0) {
      // x = act(z): read z, write x where a node outside (the pooling's backward) reads it.
      const Node& act = g.node(nodes.activation);
      const void* z = c.ptr(act.inputs[0]);
      void* x = out_ptr(in.id);
      const Activation a = *forward_activation(act.op);
      with_float_type(in.dtype, [&](auto tag) {
        using T = decltype(tag);
        run = [=](cudaStream_t s) {
          launch_activation_max_pool2d_nhwc_forward(static_cast<const T*>(z), a, geometry, static_cast<T*>(x),
                                                    static_cast<T*>(pooled), static_cast<T*>(activated), s);
        };
      });
      return std::make_unique<BoundLaunch>(std::move(run));
    }
    const void* x = c.ptr(in.id);
    with_float_type(in.dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_max_pool2d_nhwc_forward(static_cast<const T*>(x), geometry, static_cast<T*>(pooled),
                                       static_cast<T*>(activated), s);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_max_pool2d_lowering() { return std::make_unique<MaxPool2dLowering>(); }

}  // namespace sg::cuda
