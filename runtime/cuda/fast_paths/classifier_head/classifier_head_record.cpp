// Fast path classifier_head: a CNN's classifier after a global average pool
// (the pool with its layout conversion, the linear layer, softmax
// cross-entropy, the data gradient and the pool's backward) as one launch
// (ops/cuda/fast_paths/classifier_head/). The weight and bias gradients stay
// with their own launches (the update stage, the gradient stream), which read
// the dlogits and the features this launch writes.
#include <fmt/format.h>

#include "runtime/cuda/fast_paths/classifier_head/classifier_head_pattern.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class ClassifierHeadLowering final : public CudaLowering {
 public:
  explicit ClassifierHeadLowering(const BackendOptions& o) : options_(o) {}
  std::string_view name() const override { return "classifier_head"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (options_.accumulate_f16) return std::nullopt;  // (cuBLASLt's fp16 accumulation rounds elsewhere)
    std::optional<HeadNodes> h = find_classifier_head(cover, unit, nullptr);
    if (!h || !classifier_head_why_not(h->shape).empty()) return std::nullopt;
    Match m;
    m.units = h->units;
    // At the linear layer: the pool before it has no other reader, and the weights' casts come later in the graph.
    m.runs_at_unit = cover.unit_of(h->matmul).id;
    std::vector<NodeId> nodes;
    for (int u : h->units)
      for (NodeId n : cover.units()[static_cast<std::size_t>(u)].nodes) nodes.push_back(n);
    const sg::Graph& g = cover.graph();
    // The kernel writes the logits (its loss pass reads every block's back) and the dlogits: both need memory
    // even where nothing outside reads them.
    for (ValueId v : {g.node(h->xent).inputs[0], g.node(h->xent_backward).outputs[0]})
      if (!read_outside(g, v, nodes)) m.scratch.push_back(v);
    m.detail = *h;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const auto& h = detail_of<HeadNodes>(l);
    std::string what = fmt::format("{} global pool -> {} classes", h.to_first >= 0 ? "channels-last" : "NCHW",
                                   h.shape.classes);
    if (h.pool_backward >= 0) what += ", dX through the pool's backward";
    else if (h.dgrad >= 0) what += ", dX";
    return what;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& h = detail_of<HeadNodes>(l);
    const Node& mm = g.node(h.matmul);
    const auto out_ptr = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    ClassifierHeadTensors<void> p;  // (typed below)
    const ValueId features = mm.inputs[0];  // the flatten of the pool
    p.x = c.ptr(h.to_first >= 0 ? g.node(h.to_first).inputs[0] : g.node(h.pool).inputs[0]);
    p.pooled = out_ptr(features);
    p.w = c.ptr(mm.inputs[1]);
    if (h.bias_add >= 0) p.bias = c.ptr(g.node(h.bias_add).inputs[1]);
    p.labels = static_cast<const std::int32_t*>(c.ptr(g.node(h.xent).inputs[1]));
    p.logits = c.ptr(g.node(h.xent).inputs[0]);
    p.loss = static_cast<float*>(c.ptr(g.node(h.xent).outputs[0]));
    p.dlogits = c.ptr(g.node(h.xent_backward).outputs[0]);
    if (h.dgrad >= 0) p.dx = out_ptr(g.node(h.dgrad).outputs[0]);
    if (h.pool_backward >= 0) p.pool_grad = c.ptr(g.node(h.to_last >= 0 ? h.to_last : h.pool_backward).outputs[0]);
    const int multiprocessors = current_device_attribute(cudaDevAttrMultiProcessorCount);
    auto head = std::make_shared<const ClassifierHead>(h.shape, multiprocessors);
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(features).dtype, [&](auto tag) {
      using T = decltype(tag);
      ClassifierHeadTensors<T> t;
      t.x = static_cast<const T*>(p.x);
      t.pooled = static_cast<T*>(p.pooled);
      t.w = static_cast<const T*>(p.w);
      t.bias = static_cast<const T*>(p.bias);
      t.labels = p.labels;
      t.logits = static_cast<T*>(p.logits);
      t.loss = p.loss;
      t.dlogits = static_cast<T*>(p.dlogits);
      t.dx = static_cast<T*>(p.dx);
      t.pool_grad = static_cast<T*>(p.pool_grad);
      run = [head, t, dependent](cudaStream_t s) { head->run(t, s, dependent); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), head->describe());
  }

 private:
  BackendOptions options_;
};

std::vector<SlottedLowering> classifier_head_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  l.push_back({FastPathSlot::backward_patterns, std::make_unique<ClassifierHeadLowering>(o)});
  return l;
}

std::string classifier_head_fast_path_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (o.accumulate_f16) return "precision.accumulate is fp16 (the kernel accumulates in fp32)";
  const Cover cover(g);
  std::string first;
  for (const CoverUnit& u : cover.units()) {
    if (node_of(g, u, OpKind::softmax_xent) < 0) continue;
    std::string why;
    const std::optional<HeadNodes> h = find_classifier_head(cover, u, &why);
    if (h) why = classifier_head_why_not(h->shape);
    if (why.empty()) return "";
    if (first.empty()) first = why;
  }
  return first.empty() ? "the graph has no softmax_xent loss" : first;
}

}  // namespace

FastPath classifier_head_fast_path() {
  return {"classifier_head",
          "a CNN's classifier after a global average pool (the pool, the linear layer, softmax cross-entropy, the data "
          "gradient and the pool's backward, with their layout conversions) as one launch",
          {},
          classifier_head_lowerings,
          classifier_head_fast_path_why_not,
          nullptr};
}

}  // namespace sg::cuda
