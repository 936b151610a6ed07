// Lowering: the batch fetch from tables of any dataset element type (issue
// 23): batch_indices plus one gather for the features (u8, f16 or f32 table,
// scaled into the compute dtype) and, in training and eval graphs, one for
// the labels (u8 -> i32 class labels, or f32 targets -> f32). Takes every
// batch-fetch group that batch_fetch.cpp's fused u8-images + u8-labels
// kernel does not: float features, float targets, and the prediction graph's
// features-only fetch. Two launches of ops/cuda/table_fetch.cu, one per table.
#include "ops/cuda/table_fetch.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct TableFetchNodes {
  NodeId indices = -1, features = -1, labels = -1;  // labels -1: a features-only fetch
};

// The launch for one gather node: its table dtype picks the input type, its output dtype the output type.
std::function<void(cudaStream_t)> gather_launch(const BindContext& c, const Node& indices, const Node& gather) {
  const sg::Graph& g = c.graph();
  const Value& perm = g.value(indices.inputs[0]);
  const Value& table = g.value(gather.inputs[0]);
  const Value& out = g.value(gather.outputs[0]);
  const auto* perm_p = static_cast<const std::int32_t*>(c.ptr(perm.id));
  const auto* step = static_cast<const std::int32_t*>(c.ptr(indices.inputs[1]));
  const void* table_p = c.ptr(table.id);
  void* out_p = c.ptr(out.id);
  const auto& shard = indices.attr<BatchIndicesAttrs>();
  const auto rows = perm.shape[0], batch = shard.batch, rank = shard.rank, ranks = shard.ranks;
  const auto cols = table.shape.size() == 2 ? table.shape[1] : 1;
  const auto& a = gather.attr<GatherRowsAttrs>();
  const float scale = float(a.scale), shift = float(a.shift);
  std::function<void(cudaStream_t)> run;
  auto with_input = [&](auto out_tag) {
    using Out = decltype(out_tag);
    auto bind = [&](auto in_tag) {
      using In = decltype(in_tag);
      run = [=](cudaStream_t s) {
        launch_table_fetch(perm_p, rows, step, batch, static_cast<const In*>(table_p), cols, scale, shift,
                           static_cast<Out*>(out_p), s, rank, ranks);
      };
    };
    if (table.dtype == DType::u8) bind(std::uint8_t{});
    else if constexpr (!std::is_same_v<Out, std::int32_t>) {
      if (table.dtype == DType::f16) bind(__half{});
      else if (table.dtype == DType::f32) bind(float{});
    }
  };
  if (out.dtype == DType::i32) with_input(std::int32_t{});
  else with_float_type(out.dtype, with_input);
  if (!run)
    throw CudaError(fmt::format("table_fetch: cannot gather a {} table into {}", dtype_name(table.dtype),
                                dtype_name(out.dtype)));
  return run;
}

class TableFetchLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "table_fetch"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::batch_fetch) || unit.nodes.size() < 2 || unit.nodes.size() > 3)
      return std::nullopt;
    TableFetchNodes f;
    for (NodeId id : unit.nodes) {
      const Node& n = g.node(id);
      if (n.op == OpKind::batch_indices) f.indices = id;
      else if (n.op != OpKind::gather_rows) return std::nullopt;
      else if (g.value(n.inputs[0]).role == Role::label) f.labels = id;
      else f.features = id;
    }
    if (f.indices < 0 || f.features < 0) return std::nullopt;
    if (unit.nodes.size() == 3 && f.labels < 0) return std::nullopt;
    const auto table_ok = [&](NodeId n, bool labels) {
      const DType in = g.value(g.node(n).inputs[0]).dtype, out = g.value(g.node(n).outputs[0]).dtype;
      if (in == DType::u8) return labels ? out == DType::i32 : is_floating(out);
      return (in == DType::f16 || in == DType::f32) && is_floating(out);
    };
    if (!table_ok(f.features, false) || (f.labels >= 0 && !table_ok(f.labels, true))) return std::nullopt;
    // u8 images with u8 labels: batch_fetch.cpp's fused kernel.
    const bool fused_case = f.labels >= 0 && g.value(g.node(f.features).inputs[0]).dtype == DType::u8 &&
                            g.value(g.node(f.labels).inputs[0]).dtype == DType::u8;
    if (fused_case) return std::nullopt;
    Match m = single_unit(unit);
    m.detail = f;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& f = detail_of<TableFetchNodes>(l);
    const Node& indices = g.node(f.indices);
    auto features = gather_launch(c, indices, g.node(f.features));
    std::function<void(cudaStream_t)> labels;
    if (f.labels >= 0) labels = gather_launch(c, indices, g.node(f.labels));
    return std::make_unique<BoundLaunch>([features, labels](cudaStream_t s) {
      features(s);
      if (labels) labels(s);
    });
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_table_fetch_lowering() { return std::make_unique<TableFetchLowering>(); }

}  // namespace sg::cuda
