// Lowering: the column sums of a tall [rows, C] gradient (reduce_rows), a
// channels-last convolution's bias gradient (dY [N,H,W,C] seen as
// [N*H*W, C]: graph/ops/conv2d.cpp), by a kernel that spreads the rows over
// the GPU (ops/cuda/channels_last.hpp's ChannelsLastSum), with the cast of
// the f16/bf16 sums to an fp32 master bias folded in, or as the bias's SGD
// update when the fusion pass grouped it with one (bgrad_sgd, not Nesterov).
// A cast that an update rule reads is left to update_multi_tensor, which
// takes it with the weights' casts. A linear layer's bias gradient (rows = the batch) stays with the
// bias_grad_* lowerings, whose one-block-per-column sums suit few rows.
#include "ops/cuda/channels_last.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

// From this many rows the column sums are cut into slices over many blocks.
constexpr std::int64_t kTallRows = 2048;

struct ColumnSumNodes {
  NodeId reduce = -1, cast = -1, sgd = -1;
};

class ColumnSumLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "column_sum"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    ColumnSumNodes nodes;
    if (cover.is_group(unit, FusionKind::bgrad_sgd)) {
      nodes.reduce = node_of(g, unit, OpKind::reduce_rows);
      nodes.sgd = node_of(g, unit, OpKind::sgd_update);
      if (g.node(nodes.sgd).attr<SgdUpdateAttrs>().nesterov) return std::nullopt;
    } else {
      if (unit.fusion_group >= 0 || g.node(unit.nodes.front()).op != OpKind::reduce_rows) return std::nullopt;
      nodes.reduce = unit.nodes.front();
    }
    const Node& reduce = g.node(nodes.reduce);
    const Value& dy = g.value(reduce.inputs[0]);
    // (ChannelsLastSum takes up to 65535 groups of 32 channels.)
    if (dy.shape[0] < kTallRows || dy.shape[1] > 65535 * 32 || !is_floating(dy.dtype)) return std::nullopt;
    Match m = single_unit(unit);
    if (nodes.sgd >= 0) {
      const DType bias = g.value(g.node(nodes.sgd).inputs[0]).dtype;
      if (!(bias == dy.dtype || (bias == DType::f32 && is_half_width_float(dy.dtype)))) return std::nullopt;
    } else if (const CoverUnit* cast = free_widening_cast(cover, reduce.outputs[0])) {
      nodes.cast = cast->nodes.front();
      m.units.push_back(cast->id);
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const auto& nodes = detail_of<ColumnSumNodes>(l);
    return nodes.sgd >= 0 ? "+sgd_update" : nodes.cast >= 0 ? "+cast" : "";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ColumnSumNodes>(l);
    const Node& reduce = g.node(nodes.reduce);
    const Value& dy = g.value(reduce.inputs[0]);
    auto kernel = std::make_shared<const ChannelsLastSum>(dy.shape[0], dy.shape[1]);
    const void* x = c.ptr(dy.id);
    std::function<void(cudaStream_t)> run;
    if (nodes.sgd >= 0) {
      const Node& sgd = g.node(nodes.sgd);
      const bool master = g.value(sgd.inputs[0]).dtype != dy.dtype;
      void* b = c.ptr(sgd.inputs[0]);
      void* velocity = sgd.inputs.size() == 3 ? c.ptr(sgd.inputs[2]) : nullptr;
      const UpdateScalars* scalars = c.update_scalars(sgd.id);
      with_float_type(dy.dtype, [&](auto tag) {
        using G = decltype(tag);
        if (master)
          run = [=](cudaStream_t s) {
            kernel->sum_sgd(static_cast<const G*>(x), static_cast<float*>(b), static_cast<float*>(velocity), scalars,
                            s);
          };
        else
          run = [=](cudaStream_t s) {
            kernel->sum_sgd(static_cast<const G*>(x), static_cast<G*>(b), static_cast<G*>(velocity), scalars, s);
          };
      });
    } else {
      void* out = c.ptr(nodes.cast >= 0 ? g.node(nodes.cast).outputs[0] : reduce.outputs[0]);
      const bool widened = nodes.cast >= 0;
      with_float_type(dy.dtype, [&](auto tag) {
        using G = decltype(tag);
        if (widened)
          run = [=](cudaStream_t s) { kernel->sum(static_cast<const G*>(x), static_cast<float*>(out), s); };
        else
          run = [=](cudaStream_t s) { kernel->sum(static_cast<const G*>(x), static_cast<G*>(out), s); };
      });
    }
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} row slices", kernel->slices()));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_column_sum_lowering() { return std::make_unique<ColumnSumLowering>(); }

}  // namespace sg::cuda
