// Lowering: the classifier's weight gradient fused with plain SGD, W[M,K] -=
// lr * dY^T X with M <= 32 rows and a batch of at most 64, by our kernel
// (ops/cuda/small_linear.cu): a thread per column of W sums over the batch.
#include "ops/cuda/small_linear.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

constexpr std::int64_t kMaxBatch = 64;  // each thread sums over the batch

struct UpdateNodes {
  NodeId matmul = -1, sgd = -1;
};

class SmallMWgradSgdLowering final : public CudaLowering {
 public:
  explicit SmallMWgradSgdLowering(const BackendOptions& options) : options_(options) {}
  std::string_view name() const override { return "small_m_wgrad_sgd"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::wgrad_sgd)) return std::nullopt;
    UpdateNodes u{node_of(g, unit, OpKind::matmul), node_of(g, unit, OpKind::sgd_update)};
    const Node& sgd = g.node(u.sgd);
    if (!plain_sgd(sgd)) return std::nullopt;
    const DType w = g.value(sgd.inputs[0]).dtype;
    if (w == DType::f16 && options_.accumulate_f16) return std::nullopt;  // cuBLASLt's fp16 accumulation
    const MatmulShape s = operand_shape(g, g.node(u.matmul));
    if (!is_floating(w) || s.ab_type != ElemType::f16 || !s.trans_a || s.trans_b || s.m > kSmallLinearMaxDim ||
        s.k > kMaxBatch)
      return std::nullopt;
    Match m = single_unit(unit);
    m.detail = u;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch&) const override { return "into=param(alpha=-lr,beta=1-lr*wd)"; }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& u = detail_of<UpdateNodes>(l);
    const Node& mm = g.node(u.matmul);
    const Node& sgd = g.node(u.sgd);
    const MatmulShape s = operand_shape(g, mm);  // m: rows of W, k: the batch, n: columns of W
    const auto* dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* x = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    void* w = c.ptr(sgd.inputs[0]);
    const UpdateScalars* scalars = c.update_scalars(sgd.id);
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    if (g.value(sgd.inputs[0]).dtype == DType::f16)
      run = [=](cudaStream_t st) {
        launch_wgrad_sgd_small_m(dy, x, s.k, s.m, s.n, static_cast<__half*>(w), scalars, st, dependent);
      };
    else
      run = [=](cudaStream_t st) {
        launch_wgrad_sgd_small_m(dy, x, s.k, s.m, s.n, static_cast<float*>(w), scalars, st, dependent);
      };
    return std::make_unique<BoundLaunch>(std::move(run), "small-dim kernel");
  }

 private:
  BackendOptions options_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_small_m_wgrad_sgd_lowering(const BackendOptions& options) {
  return std::make_unique<SmallMWgradSgdLowering>(options);
}

}  // namespace sg::cuda
