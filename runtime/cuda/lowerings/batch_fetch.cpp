// Lowering: the batch fetch (batch_indices + one image and one label gather)
// as one kernel reading u8 tables (ops/cuda/batch_fetch.cu).
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct FetchNodes {
  NodeId indices = -1, images = -1, labels = -1;
};

class BatchFetchLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "batch_fetch"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::batch_fetch) || unit.nodes.size() != 3) return std::nullopt;
    FetchNodes f;
    for (NodeId id : unit.nodes) {
      const Node& n = g.node(id);
      if (n.op == OpKind::batch_indices) f.indices = id;
      else if (g.value(n.outputs[0]).dtype == DType::i32) f.labels = id;
      else f.images = id;
    }
    if (f.indices < 0 || f.images < 0 || f.labels < 0) return std::nullopt;
    if (g.value(g.node(f.images).inputs[0]).dtype != DType::u8 || g.value(g.node(f.labels).inputs[0]).dtype != DType::u8)
      return std::nullopt;
    Match m = single_unit(unit);
    m.detail = f;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& f = detail_of<FetchNodes>(l);
    const Node& indices = g.node(f.indices);
    const Node& images = g.node(f.images);
    const Node& labels = g.node(f.labels);
    const Value& perm = g.value(indices.inputs[0]);
    const Value& table = g.value(images.inputs[0]);
    const auto& gather = images.attr<GatherRowsAttrs>();
    const auto* perm_p = static_cast<const std::int32_t*>(c.ptr(perm.id));
    const auto* step = static_cast<const std::int32_t*>(c.ptr(indices.inputs[1]));
    const auto* table_p = static_cast<const std::uint8_t*>(c.ptr(table.id));
    const auto* labels_p = static_cast<const std::uint8_t*>(c.ptr(labels.inputs[0]));
    auto* labels_out = static_cast<std::int32_t*>(c.ptr(labels.outputs[0]));
    void* x_out = c.ptr(images.outputs[0]);
    const auto& shard = indices.attr<BatchIndicesAttrs>();
    const auto rows = perm.shape[0], batch = shard.batch, cols = table.shape[1], rank = shard.rank, ranks = shard.ranks;
    const float scale = float(gather.scale), shift = float(gather.shift);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(images.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_batch_fetch(perm_p, rows, step, batch, table_p, cols, scale, shift, static_cast<T*>(x_out), labels_p,
                           labels_out, s, rank, ranks);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_batch_fetch_lowering() { return std::make_unique<BatchFetchLowering>(); }

}  // namespace sg::cuda
