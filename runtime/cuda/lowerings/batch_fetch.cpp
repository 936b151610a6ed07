// Lowering: the batch fetch (batch_indices + one image and one label gather)
// as one kernel reading u8 tables (ops/cuda/batch_fetch.cu).
#include "runtime/cuda/lowerings/fetch_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class BatchFetchLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "batch_fetch"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (!cover.is_group(unit, FusionKind::batch_fetch)) return std::nullopt;
    const auto f = u8_fetch_nodes(cover.graph(), unit);
    if (!f) return std::nullopt;
    Match m = single_unit(unit);
    m.detail = *f;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& f = detail_of<FetchNodes>(l);
    const BoundFetch b = bind_fetch(f, c);
    const ValueId x = g.node(f.images).outputs[0];
    void* x_out = c.ptr(x);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(x).dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_batch_fetch(b.perm, b.rows, b.step, b.batch, b.images, b.cols, b.scale, b.shift, static_cast<T*>(x_out),
                           b.labels, b.labels_out, s, b.rank, b.ranks);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_batch_fetch_lowering() { return std::make_unique<BatchFetchLowering>(); }

}  // namespace sg::cuda
