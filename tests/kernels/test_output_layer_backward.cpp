// The fused output-layer backward against the CPU reference, and bit for bit
// against the five launches it replaces.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <functional>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/fast_paths/one_pass_backward/output_layer_backward.hpp"
#include "ops/cuda/small_linear.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/activation_reference.hpp"
#include "tests/support/late_producer.hpp"
#include "tests/support/device_array.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

struct Problem {
  std::int64_t batch, classes, hidden;
  std::vector<float> logits, h, w, out_bias, hidden_bias;
  std::vector<std::int32_t> labels;
};

Problem random_problem(std::int64_t batch, std::int64_t classes, std::int64_t hidden, std::mt19937_64& rng) {
  Problem p{batch, classes, hidden, {}, {}, {}, {}, {}, {}};
  p.logits = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * classes), rng, -4.f, 4.f));
  p.h = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * hidden), rng));
  for (auto& v : p.h) v = v < 0 ? 0.f : v;  // a ReLU output
  p.w = sg::test::representable<__half>(sg::test::uniform(std::size_t(classes * hidden), rng));
  p.out_bias = sg::test::representable<__half>(sg::test::uniform(std::size_t(classes), rng));
  p.hidden_bias = sg::test::representable<__half>(sg::test::uniform(std::size_t(hidden), rng));
  std::uniform_int_distribution<std::int32_t> label(0, std::int32_t(classes) - 1);
  for (std::int64_t r = 0; r < batch; ++r) p.labels.push_back(label(rng));
  return p;
}

// Device copies of a problem's inputs and every output, poisoned.
struct OnDevice {
  explicit OnDevice(const Problem& p)
      : logits(p.logits), h(p.h), w(p.w), out_bias(p.out_bias), hidden_bias(p.hidden_bias),
        dh(std::size_t(p.batch * p.hidden)), dlogits(std::size_t(p.batch * p.classes)), loss(1),
        labels(p.labels.size() * sizeof(std::int32_t)), step(sizeof(std::int32_t)) {
    labels.upload(p.labels.data(), p.labels.size() * sizeof(std::int32_t));
    const std::int32_t seven = 7;
    step.upload(&seven, sizeof seven);
  }
  std::int32_t step_value() const {
    std::int32_t s = 0;
    step.download(&s, sizeof s);
    return s;
  }
  DeviceArray<__half> logits, h, w, out_bias, hidden_bias, dh, dlogits;
  DeviceArray<float> loss;
  cuda::DeviceBuffer labels, step;
};

cuda::OutputLayerBackward fused_args(const Problem& p, OnDevice& d, const cuda::UpdateScalars* s) {
  cuda::OutputLayerBackward a;
  a.logits = d.logits.get();
  a.labels = d.labels.as<std::int32_t>();
  a.h = d.h.get();
  a.w = d.w.get();
  a.out_bias = d.out_bias.get();
  a.hidden_bias = d.hidden_bias.get();
  a.dh = d.dh.get();
  a.loss = d.loss.get();
  a.dlogits = d.dlogits.get();
  a.step = d.step.as<std::int32_t>();
  a.w_sgd = s;
  a.out_bias_sgd = s + 1;
  a.hidden_bias_sgd = s + 2;
  a.batch = p.batch;
  a.classes = p.classes;
  a.hidden = p.hidden;
  return a;
}

// Every output but dlogits (which the kernel writes only for other readers), bit for bit; the
// loss (reported only; the fused kernel adds its rows as a warp tree) bit for bit or to float rounding.
void check_same_outputs(OnDevice& a, OnDevice& b, bool loss_bits = true) {
  if (loss_bits) CHECK(a.loss.download() == b.loss.download());
  else CHECK(a.loss.download()[0] == doctest::Approx(b.loss.download()[0]).epsilon(1e-6));
  CHECK(a.dh.download() == b.dh.download());
  CHECK(a.w.download() == b.w.download());
  CHECK(a.out_bias.download() == b.out_bias.download());
  CHECK(a.hidden_bias.download() == b.hidden_bias.download());
  CHECK(a.step_value() == b.step_value());
}

// Three parameter groups with different learning rates and weight decays.
cuda::DeviceBuffer three_scalars() {
  return sg::test::device_update_scalars({cuda::make_update_scalars(0.5f, 0.f, 0.01f), cuda::make_update_scalars(0.25f, 0.f, 0.f),
                                       cuda::make_update_scalars(0.75f, 0.f, 0.02f)});
}

// The five launches the fused kernel replaces, on `stream`.
void launch_five(const Problem& p, OnDevice& d, const cuda::UpdateScalars* s, cudaStream_t stream) {
  const std::int64_t b = p.batch, c = p.classes, n = p.hidden;
  cuda::launch_softmax_xent(d.logits.get(), d.labels.as<std::int32_t>(), b, c, d.loss.get(), d.dlogits.get(), stream,
                            true);
  cuda::launch_bias_grad_sgd(d.dlogits.get(), b, c, d.out_bias.get(), static_cast<__half*>(nullptr), s + 1, stream,
                             true, nullptr);
  cuda::launch_dgrad_relu_small_k(d.dlogits.get(), d.w.get(), d.h.get(), b, n, c, d.dh.get(), stream, true);
  cuda::launch_wgrad_sgd_small_m(d.dlogits.get(), d.h.get(), b, c, n, d.w.get(), s, stream, true);
  cuda::launch_bias_grad_sgd(d.dh.get(), b, n, d.hidden_bias.get(), static_cast<__half*>(nullptr), s + 2, stream,
                             true, d.step.as<std::int32_t>());
}

}  // namespace

TEST_CASE("the fused output-layer backward matches softmax-xent, dgrad, and three SGD updates on the CPU") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = three_scalars();
  for (auto [batch, classes, hidden] : std::vector<std::array<std::int64_t, 3>>{
           {{32, 10, 128}}, {{31, 11, 129}}, {{32, 32, 1000}}, {{1, 1, 1}}, {{16, 10, 8192}}}) {
    INFO(batch << " x " << classes << " x " << hidden);
    const Problem p = random_problem(batch, classes, hidden, rng);
    OnDevice d(p);
    cuda::launch_output_layer_backward(fused_args(p, d, scalars.as<cuda::UpdateScalars>()), nullptr, true);

    auto dbl = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    const auto logits = dbl(p.logits), h = dbl(p.h), w0 = dbl(p.w);
    const double loss = ref::softmax_xent(logits.data(), p.labels.data(), batch, classes);
    std::vector<double> dlogits(logits.size()), pre(h.size()), dh(h.size()), g(w0.size());
    ref::softmax_xent_backward(logits.data(), p.labels.data(), batch, classes, dlogits.data());
    ref::matmul(dlogits.data(), w0.data(), pre.data(), batch, hidden, classes, false, false);
    ref::relu_backward(pre.data(), h.data(), std::int64_t(h.size()), dh.data());
    ref::matmul(dlogits.data(), h.data(), g.data(), classes, hidden, batch, true, false);
    std::vector<double> w = w0, out_bias = dbl(p.out_bias), hidden_bias = dbl(p.hidden_bias);
    std::vector<double> out_grad(static_cast<std::size_t>(classes)), hidden_grad(static_cast<std::size_t>(hidden));
    ref::reduce_rows(dlogits.data(), batch, classes, out_grad.data());
    ref::reduce_rows(dh.data(), batch, hidden, hidden_grad.data());
    ref::sgd_update(w.data(), g.data(), static_cast<double*>(nullptr), std::int64_t(w.size()), 0.5, 0.0, 0.01);
    ref::sgd_update(out_bias.data(), out_grad.data(), static_cast<double*>(nullptr), classes, 0.25, 0.0, 0.0);
    ref::sgd_update(hidden_bias.data(), hidden_grad.data(), static_cast<double*>(nullptr), hidden, 0.75, 0.0, 0.02);

    CHECK(std::abs(d.loss.download()[0] - loss) < 1e-3 * std::max(1.0, loss));
    CHECK(sg::test::relative_error(d.dlogits.download(), dlogits) < 2e-3);
    CHECK(sg::test::relative_error(d.dh.download(), dh) < 5e-3);
    CHECK(sg::test::relative_error(d.w.download(), w) < 2e-3);
    CHECK(sg::test::relative_error(d.out_bias.download(), out_bias) < 2e-3);
    CHECK(sg::test::relative_error(d.hidden_bias.download(), hidden_bias) < 5e-3);
    CHECK(d.step_value() == 8);
  }
}

TEST_CASE("the fused output-layer backward through every activation matches the CPU and the five launches' bits") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = three_scalars();
  const auto* s = scalars.as<cuda::UpdateScalars>();
  for (const cuda::Activation act : sg::test::kActivations) {
    INFO(cuda::activation_op_name(act));
    for (auto [batch, classes, hidden] : std::vector<std::array<std::int64_t, 3>>{
             {{32, 10, 128}}, {{31, 11, 129}}, {{16, 32, 1000}}}) {
      INFO(batch << " x " << classes << " x " << hidden);
      Problem p = random_problem(batch, classes, hidden, rng);
      // h = act(z), z in [-3, 3]; the kernel reads z too where the backward needs it.
      auto z_values = sg::test::uniform(std::size_t(batch * hidden), rng);
      for (auto& v : z_values) v *= 3.f;
      const auto in = sg::test::activation_inputs<__half>(act, z_values);
      p.h = in.h;
      DeviceArray<__half> z(in.z);
      const cuda::OutputLayerActivation activation{act, cuda::backward_reads_input(act) ? z.get() : nullptr};
      OnDevice fused(p), five(p);
      cuda::launch_output_layer_backward(fused_args(p, fused, s), nullptr, true, activation);

      auto dbl = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
      const auto logits = dbl(p.logits), h = dbl(p.h), w0 = dbl(p.w);
      std::vector<double> dlogits(logits.size()), pre(h.size()), g(w0.size());
      ref::softmax_xent_backward(logits.data(), p.labels.data(), batch, classes, dlogits.data());
      ref::matmul(dlogits.data(), w0.data(), pre.data(), batch, hidden, classes, false, false);
      const std::vector<double> dh = sg::test::activation_backward(act, pre, dbl(in.saved));
      ref::matmul(dlogits.data(), h.data(), g.data(), classes, hidden, batch, true, false);
      std::vector<double> w = w0, hidden_bias = dbl(p.hidden_bias), hidden_grad(static_cast<std::size_t>(hidden));
      ref::reduce_rows(dh.data(), batch, hidden, hidden_grad.data());
      ref::sgd_update(w.data(), g.data(), static_cast<double*>(nullptr), std::int64_t(w.size()), 0.5, 0.0, 0.01);
      ref::sgd_update(hidden_bias.data(), hidden_grad.data(), static_cast<double*>(nullptr), hidden, 0.75, 0.0, 0.02);
      CHECK(sg::test::relative_error(fused.dh.download(), dh) < 5e-3);
      CHECK(sg::test::relative_error(fused.w.download(), w) < 2e-3);
      CHECK(sg::test::relative_error(fused.hidden_bias.download(), hidden_bias) < 5e-3);

      // The five launches, the dgrad through the same activation: the same bits.
      const std::int64_t b = p.batch, c = p.classes, n = p.hidden;
      cuda::launch_softmax_xent(five.logits.get(), five.labels.as<std::int32_t>(), b, c, five.loss.get(),
                                five.dlogits.get(), nullptr, true);
      cuda::launch_bias_grad_sgd(five.dlogits.get(), b, c, five.out_bias.get(), static_cast<__half*>(nullptr), s + 1,
                                 nullptr, true, nullptr);
      cuda::launch_dgrad_activation_small_k(act, five.dlogits.get(), five.w.get(),
                                            cuda::backward_reads_input(act) ? z.get() : five.h.get(), b, n, c,
                                            five.dh.get(), nullptr, true);
      cuda::launch_wgrad_sgd_small_m(five.dlogits.get(), five.h.get(), b, c, n, five.w.get(), s, nullptr, true);
      cuda::launch_bias_grad_sgd(five.dh.get(), b, n, five.hidden_bias.get(), static_cast<__half*>(nullptr), s + 2,
                                 nullptr, true, five.step.as<std::int32_t>());
      check_same_outputs(fused, five, /*loss_bits=*/false);
    }
  }
  // gelu, gelu_tanh and silu need the pre-activation.
  const Problem p = random_problem(32, 10, 128, rng);
  OnDevice d(p);
  CHECK_THROWS_AS(cuda::launch_output_layer_backward(fused_args(p, d, s), nullptr, true, {cuda::Activation::silu, nullptr}),
                  cuda::CudaError);
}

TEST_CASE("the fused output-layer backward gives the same bits as the five launches it replaces (the loss to rounding)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = three_scalars();
  const auto* s = scalars.as<cuda::UpdateScalars>();
  const Problem p = random_problem(32, 10, 1024, rng);
  OnDevice fused(p), separate(p);
  cuda::launch_output_layer_backward(fused_args(p, fused, s), nullptr, true);
  launch_five(p, separate, s, nullptr);
  CHECK(fused.dlogits.download() == separate.dlogits.download());
  check_same_outputs(fused, separate, false);
}

TEST_CASE("the fused output-layer backward waits for the kernel that writes the logits (stream and graph)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = three_scalars();
  const auto* s = scalars.as<cuda::UpdateScalars>();
  const Problem p = random_problem(32, 10, 1024, rng);
  OnDevice expected(p);
  cuda::launch_output_layer_backward(fused_args(p, expected, s), nullptr, true);
  for (const bool as_graph : {false, true}) {
    INFO((as_graph ? "graph" : "stream"));
    OnDevice late(p);
    late.logits.poison();  // until the late copy lands
    DeviceArray<__half> logits(p.logits);
    sg::test::run_behind_late_copy(
        late.logits.get(), logits.get(), p.logits.size() * sizeof(__half),
        [&](cudaStream_t stream) { cuda::launch_output_layer_backward(fused_args(p, late, s), stream, true); },
        as_graph);
    check_same_outputs(late, expected);
  }
}

TEST_CASE("the five separate launches each wait for the kernel that writes their input (stream and graph)") {
  // They are dependent launches (dependent_launch.cuh): each runs right behind
  // a late copy of its input into a poisoned buffer and must give the bits of
  // the plain sequence. Batch 256: where the step runs them.
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = three_scalars();
  const auto* s = scalars.as<cuda::UpdateScalars>();
  const Problem p = random_problem(256, 10, 1024, rng);
  const std::int64_t b = p.batch, c = p.classes, n = p.hidden;
  OnDevice expected(p);
  launch_five(p, expected, s, nullptr);
  for (const bool as_graph : {false, true}) {
    INFO((as_graph ? "graph" : "stream"));
    OnDevice late(p);
    DeviceArray<__half> logits(p.logits), dlogits(std::size_t(b * c)), dh(std::size_t(b * n));
    const auto behind_late_copy = [&](DeviceArray<__half>& input, DeviceArray<__half>& source,
                                      const std::function<void(cudaStream_t)>& launch) {
      input.poison();  // until the late copy lands
      sg::test::run_behind_late_copy(input.get(), source.get(), input.size() * sizeof(__half), launch, as_graph);
    };
    behind_late_copy(late.logits, logits, [&](cudaStream_t st) {
      cuda::launch_softmax_xent(late.logits.get(), late.labels.as<std::int32_t>(), b, c, late.loss.get(),
                                late.dlogits.get(), st, true);
    });
    CHECK(late.loss.download() == expected.loss.download());
    CHECK(late.dlogits.download() == expected.dlogits.download());
    behind_late_copy(dlogits, expected.dlogits, [&](cudaStream_t st) {
      cuda::launch_bias_grad_sgd(dlogits.get(), b, c, late.out_bias.get(), static_cast<__half*>(nullptr), s + 1, st,
                                 true, nullptr);
    });
    CHECK(late.out_bias.download() == expected.out_bias.download());
    behind_late_copy(dlogits, expected.dlogits, [&](cudaStream_t st) {
      cuda::launch_dgrad_relu_small_k(dlogits.get(), late.w.get(), late.h.get(), b, n, c, late.dh.get(), st, true);
    });
    CHECK(late.dh.download() == expected.dh.download());
    behind_late_copy(dlogits, expected.dlogits, [&](cudaStream_t st) {
      cuda::launch_wgrad_sgd_small_m(dlogits.get(), late.h.get(), b, c, n, late.w.get(), s, st, true);
    });
    CHECK(late.w.download() == expected.w.download());
    behind_late_copy(dh, expected.dh, [&](cudaStream_t st) {
      cuda::launch_bias_grad_sgd(dh.get(), b, n, late.hidden_bias.get(), static_cast<__half*>(nullptr), s + 2, st,
                                 true, late.step.as<std::int32_t>());
    });
    CHECK(late.hidden_bias.download() == expected.hidden_bias.download());
    CHECK(late.step_value() == expected.step_value());
  }
}

TEST_CASE("sizes the fused output-layer backward does not take are refused with a reason") {
  CHECK(cuda::output_layer_backward_unsupported(33, 10, 128).find("batch") != std::string::npos);
  CHECK(cuda::output_layer_backward_unsupported(32, 33, 128).find("classes") != std::string::npos);
  CHECK(cuda::output_layer_backward_unsupported(32, 10, 128).empty());
}
