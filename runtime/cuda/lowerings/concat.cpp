// Lowering: a concat node (each input's rows copied into its block of the
// output's channels) and a slice_channels node (concat's gradient: one
// block copied out), by our column-block copy (ops/cuda/block_copy.hpp),
// issue 37. A concat of k inputs is k copy kernels in one launch.
#include "ops/cuda/block_copy.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

// A [N, C, ...] value: its rows and the elements of one channel.
std::int64_t inner_of(const Shape& s) {
  std::int64_t inner = 1;
  for (std::size_t i = 2; i < s.size(); ++i) inner *= s[i];
  return inner;
}

class ConcatLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "concat"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::concat && n.op != OpKind::slice_channels) return std::nullopt;
    if (!is_floating(g.value(n.outputs[0]).dtype)) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const Node& n = g.node(l.nodes.front());
    if (n.op == OpKind::slice_channels) return fmt::format("slice begin={}", n.attr<SliceAttrs>().begin);
    return fmt::format("{} inputs", n.inputs.size());
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const Shape& out = g.value(n.outputs[0]).shape;
    const std::int64_t inner = inner_of(out);
    // (source, copy) pairs into the output.
    std::vector<std::pair<const void*, BlockCopy>> copies;
    if (n.op == OpKind::concat) {
      std::int64_t offset = 0;
      for (ValueId v : n.inputs) {
        const std::int64_t width = g.value(v).shape[1] * inner;
        copies.push_back({c.ptr(v), BlockCopy{out[0], width, width, 0, out[1] * inner, offset}});
        offset += width;
      }
    } else {
      const Shape& in = g.value(n.inputs[0]).shape;
      const auto& a = n.attr<SliceAttrs>();
      const std::int64_t width = a.count * inner;
      copies.push_back({c.ptr(n.inputs[0]), BlockCopy{in[0], width, in[1] * inner, a.begin * inner, width, 0}});
    }
    void* dst = c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        for (const auto& [src, copy] : copies) launch_block_copy(static_cast<const T*>(src), static_cast<T*>(dst), copy, s);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_concat_lowering() { return std::make_unique<ConcatLowering>(); }

}  // namespace sg::cuda
