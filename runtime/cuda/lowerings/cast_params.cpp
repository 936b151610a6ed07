// Lowering: every lone cast of an fp32 parameter to its f16/bf16 working copy
// in ONE launch (ops/cuda/cast_params.cu), placed where the first of them
// sits: before any forward reads a copy and before any update writes a
// parameter. It ranks below every lowering that folds a cast into its own
// kernel, so it takes only casts that would otherwise be a launch each.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/cast_params.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct CastNodes {
  std::vector<NodeId> casts;
};

class CastParamsLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "cast_params"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const auto to = param_cast_to(g, g.node(unit.nodes.front()));
    if (!to) return std::nullopt;
    Match m;
    CastNodes nodes;
    for (const CoverUnit& u : cover.units()) {
      if (cover.taken(u.id) || u.fusion_group >= 0) continue;
      if (param_cast_to(g, g.node(u.nodes.front())) != to) continue;
      m.units.push_back(u.id);
      nodes.casts.push_back(u.nodes.front());
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    return fmt::format("{} tensors", detail_of<CastNodes>(l).casts.size());
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& casts = detail_of<CastNodes>(l).casts;
    std::function<void(cudaStream_t)> run;
    auto bind = [&](auto tag) {
      using T = decltype(tag);
      std::vector<CastTensor<T>> tensors;
      for (NodeId id : casts) {
        const Node& n = g.node(id);
        tensors.push_back({static_cast<const float*>(c.ptr(n.inputs[0])), static_cast<T*>(c.ptr(n.outputs[0])),
                           element_count(g.value(n.inputs[0]).shape)});
      }
      run = [tensors](cudaStream_t s) { launch_cast_params(tensors, s); };
    };
    if (g.value(g.node(casts.front()).outputs[0]).dtype == DType::f16) bind(__half{});
    else bind(__nv_bfloat16{});
    return std::make_unique<BoundLaunch>(std::move(run), "multi-tensor");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_cast_params_lowering() { return std::make_unique<CastParamsLowering>(); }

}  // namespace sg::cuda
