// The classifier_head fast path (issue 37): a global average pool of an NCHW
// or channels-last activation, the linear layer after it, softmax
// cross-entropy, the data gradient and the pool's backward (with the layout
// conversions) as ONE launch, against the CPU reference in f64 on random
// shapes, dtypes and gradient scales, with the arena poisoned first; and a
// classifier over a flatten, which the fast path leaves to the per-op kernels.
#include <doctest/doctest.h>

#include <fmt/format.h>


#include "runtime/cuda/cuda_program.hpp"
#include "tests/cuda_backend/gpu_reference_check.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;

namespace {

enum class Features { flatten, pool_nchw, pool_channels_last };

struct HeadCase {
  Features features = Features::pool_channels_last;
  DType dtype = DType::f16;
  std::int64_t n = 1, k = 1, classes = 2, h = 1, w = 1;
  bool bias = true, dgrad = true;
  double scale = 1.0;
};

// features -> linear -> loss and dlogits -> dX [-> the pool's backward]; every result an output.
Graph head_graph(const HeadCase& c) {
  Graph g;
  ValueId x = -1;
  if (c.features == Features::flatten) {
    // (through a relu: a flatten of the graph's own input has no arena buffer to view)
    x = g.flatten(g.relu(g.input("a", {c.n, c.k / (c.h * c.w), c.h, c.w}, c.dtype)));
  } else {
    const bool last = c.features == Features::pool_channels_last;
    const ValueId a = g.input("a", last ? Shape{c.n, c.h, c.w, c.k} : Shape{c.n, c.k, c.h, c.w}, c.dtype);
    const ValueId nchw = last ? g.append_node(OpKind::to_channels_first, {a}, NoAttrs{}).front() : a;
    x = g.flatten(g.append_node(OpKind::global_avg_pool2d, {nchw}, NoAttrs{}).front());
    g.mark_output(x);
  }
  const ValueId w = g.input("w", {c.classes, c.k}, c.dtype);
  ValueId logits = g.matmul(x, w, false, true);
  if (c.bias) logits = g.bias_add(logits, g.input("b", {c.classes}, c.dtype));
  const ValueId labels = g.label("labels", {c.n}, DType::i32);
  g.mark_output(g.softmax_xent(logits, labels));
  const ValueId dlogits =
      g.append_node(OpKind::softmax_xent_backward, {logits, labels}, LossGradientAttrs{c.scale}).front();
  g.mark_output(dlogits);
  if (!c.dgrad) return g;
  ValueId dx = g.matmul(dlogits, w);
  if (c.features != Features::flatten) {
    const Shape nchw{c.n, c.k, c.h, c.w};
    dx = g.append_node(OpKind::global_avg_pool2d_backward, {g.reshape(dx, {c.n, c.k, 1, 1})}, ReshapeAttrs{nchw})
             .front();
    if (c.features == Features::pool_channels_last)
      dx = g.append_node(OpKind::to_channels_last, {dx}, NoAttrs{}).front();
  }
  g.mark_output(dx);
  return g;
}

std::string describe(const HeadCase& c) {
  static constexpr const char* kFeatures[] = {"flatten", "pool NCHW", "pool channels-last"};
  return fmt::format("{} {} N={} K={} classes={} plane {}x{}{}{} scale {}", kFeatures[int(c.features)],
                     dtype_name(c.dtype), c.n, c.k, c.classes, c.h, c.w, c.bias ? " +bias" : "", c.dgrad ? " +dX" : "",
                     c.scale);
}

void check_head(const HeadCase& c, std::mt19937_64& rng) {
  INFO(describe(c) << ", seed " << sg::test::last_seed());
  const double tolerance = c.dtype == DType::f32 ? 1e-5 : c.dtype == DType::f16 ? 4e-3 : 2e-2;
  sg::test::check_gpu_matches_cpu(head_graph(c), rng, tolerance, -1.0, 1.0, c.classes, 0,
                                  [&](const cuda::CudaProgram& p) {
                                    if (core_only_forced_for_tests()) return;  // (the core lowerings' launches)
                                    int heads = 0;
                                    for (const Launch& l : p.schedule().launches)
                                      heads += l.lowering->name() == "classifier_head";
                                    if (c.features == Features::flatten) {
                                      CHECK(heads == 0);  // the per-op kernels
                                      return;
                                    }
                                    // Everything, pooling and layout conversions included, in the one launch.
                                    CHECK(p.schedule().launches.size() == 1);
                                    CHECK(heads == 1);
                                  });
}

}  // namespace

TEST_CASE("the classifier head over a global average pool follows the CPU reference: both layouts") {
  auto rng = sg::test::fresh_rng();
  for (const Features f : {Features::pool_nchw, Features::pool_channels_last})
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (const bool wide : {false, true}) {
        HeadCase c;
        c.features = f;
        c.dtype = dtype;
        // Channels a multiple of 8 (16-byte vectors) and odd ones; planes from 1x1 to 9x9.
        c.k = wide ? 8 * (1 + std::int64_t(rng() % 32)) : 1 + std::int64_t(rng() % 70);
        c.n = 1 + std::int64_t(rng() % 200), c.classes = 2 + std::int64_t(rng() % 20);
        c.h = 1 + std::int64_t(rng() % 9), c.w = 1 + std::int64_t(rng() % 9);
        c.scale = wide ? 1.0 : 0.25;
        check_head(c, rng);
      }
}

TEST_CASE("the classifier head without a data gradient and over a flatten follows the CPU reference") {
  auto rng = sg::test::fresh_rng();
  HeadCase first;  // a global pool of the input images: no layer before it needs dX
  first.features = Features::pool_nchw, first.n = 128, first.k = 3, first.h = first.w = 28, first.classes = 10;
  first.dgrad = false;
  check_head(first, rng);
  HeadCase flat;  // flatten, not a pool: not the fast path's
  flat.features = Features::flatten, flat.n = 64, flat.k = 64 * 7 * 7, flat.h = flat.w = 7, flat.classes = 10;
  check_head(flat, rng);
}

TEST_CASE("the classifier head runs mnist_resnet's shapes") {
  SG_SKIP_IF_CORE_ONLY("classifier_head");
  auto rng = sg::test::fresh_rng();
  HeadCase resnet;  // 128 channels of 7x7, channels-last, batch 128; and batch 1024 (several examples a block)
  resnet.features = Features::pool_channels_last, resnet.k = 128, resnet.classes = 10, resnet.h = resnet.w = 7;
  for (const std::int64_t batch : {128, 1024}) {
    resnet.n = batch;
    check_head(resnet, rng);
  }
}
