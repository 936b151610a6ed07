// The update launches reading a convolution's weight gradient as a
// channels-last weight gradient wrote it, [O,KH,KW,C], through
// ops/cuda/gradient_order.hpp (the to_channels_first folded in:
// runtime/cuda/lowerings/gradient_order_fold.hpp): multi-tensor Adam/AdamW
// and SGD (momentum, Nesterov) on several tensors of odd sizes, some read
// permuted and some as they are, must end bit for bit where the same launch
// ends on the [O,C,KH,KW] gradients (f32 and f16 weights, f16 gradients).
#include <doctest/doctest.h>

#include <cstring>

#include "ops/cuda/sgd_multi_tensor.hpp"
#include "ops/cuda/update_rules/multi_tensor_update.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/filter_layouts.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

struct Filter {
  std::int64_t o, c, taps;
  std::int64_t n() const { return o * c * taps; }
};

std::vector<Filter> random_filters(std::mt19937_64& rng) {
  const std::int64_t taps[] = {1, 4, 9, 25};
  std::vector<Filter> out;
  // The first of 2x2 taps, read permuted: a multiple of 4 elements, which the update reads in 16-byte pieces
  // (but for the gathered gradient).
  for (int i = 0; i < 5; ++i)
    out.push_back({1 + std::int64_t(rng() % 40), 1 + std::int64_t(rng() % 70), i == 0 ? 4 : taps[rng() % 4]});
  return out;
}

std::vector<float> uniform(std::size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::vector<float> v(n);
  sg::test::fill_uniform(v, rng, lo, hi);
  return v;
}

// Per filter: its gradient [O,C,KH,KW] and the same values [O,KH,KW,C], rounded to f16.
struct Gradients {
  std::vector<std::vector<float>> kcrs, krsc;
};
Gradients gradients(const std::vector<Filter>& filters, std::mt19937_64& rng) {
  Gradients g;
  for (const Filter& f : filters) {
    g.kcrs.push_back(sg::test::representable<__half>(uniform(std::size_t(f.n()), rng, -2, 2)));
    g.krsc.push_back(sg::test::filter_to_krsc(g.kcrs.back(), f.o, f.c, f.taps));
  }
  return g;
}

// Every other filter read [O,KH,KW,C] (the rest as they are) when `permuted`.
cuda::GradientOrder order_of(const Filter& f, std::size_t i, bool permuted) {
  if (!permuted || i % 2 == 1) return {};
  return {static_cast<std::int32_t>(f.c), static_cast<std::int32_t>(f.taps)};
}

template <typename W>
void check_adam(std::mt19937_64& rng, bool decoupled) {
  const std::vector<Filter> filters = random_filters(rng);
  const Gradients grads = gradients(filters, rng);
  std::vector<std::vector<float>> w0, m0, v0;
  for (const Filter& f : filters) {
    w0.push_back(sg::test::representable<W>(uniform(std::size_t(f.n()), rng, -1, 1)));
    m0.push_back(uniform(std::size_t(f.n()), rng, -0.1, 0.1));
    v0.push_back(uniform(std::size_t(f.n()), rng, 0, 0.1));
  }
  const cuda::AdamHyper hyper{0.9f, 0.99f, 1e-6f, 0.02f, decoupled};
  auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(0.003f, 0.f, hyper.weight_decay)});
  const std::int32_t step0 = 7;
  DeviceArray<float> step_cell(1);
  SG_CUDA_CHECK(cudaMemcpy(step_cell.get(), &step0, 4, cudaMemcpyHostToDevice));
  const auto* step = reinterpret_cast<const std::int32_t*>(step_cell.get());
  std::vector<std::vector<float>> ends[2];  // per reading: every filter's w, m, v
  for (const bool permuted : {false, true}) {
    std::vector<std::unique_ptr<DeviceArray<W>>> w;
    std::vector<std::unique_ptr<DeviceArray<__half>>> g;
    std::vector<std::unique_ptr<DeviceArray<float>>> m, v;
    std::vector<cuda::UpdateTensor<W, __half>> tensors;
    for (std::size_t i = 0; i < filters.size(); ++i) {
      const cuda::GradientOrder order = order_of(filters[i], i, permuted);
      w.push_back(std::make_unique<DeviceArray<W>>(w0[i]));
      g.push_back(std::make_unique<DeviceArray<__half>>(order.permuted() ? grads.krsc[i] : grads.kcrs[i]));
      m.push_back(std::make_unique<DeviceArray<float>>(m0[i]));
      v.push_back(std::make_unique<DeviceArray<float>>(v0[i]));
      tensors.push_back({w.back()->get(), g.back()->get(), {m.back()->get(), v.back()->get()}, filters[i].n(), order});
    }
    cuda::MultiTensorUpdate<cuda::AdamRule, W, __half> adam(tensors, hyper);
    adam.launch(scalars.as<cuda::UpdateScalars>(), step, nullptr, nullptr, nullptr);
    for (std::size_t i = 0; i < filters.size(); ++i)
      for (const auto& out : {w[i]->download(), m[i]->download(), v[i]->download()}) ends[permuted].push_back(out);
  }
  for (std::size_t k = 0; k < ends[0].size(); ++k) {
    INFO("filter " << k / 3 << " (" << filters[k / 3].o << "x" << filters[k / 3].c << "x" << filters[k / 3].taps
                   << "), " << "wmv"[k % 3]);
    CHECK(ends[1][k] == ends[0][k]);
  }
}

template <typename W>
void check_sgd(std::mt19937_64& rng, bool nesterov) {
  const std::vector<Filter> filters = random_filters(rng);
  const Gradients grads = gradients(filters, rng);
  std::vector<std::vector<float>> w0, vel0;
  for (const Filter& f : filters) {
    w0.push_back(sg::test::representable<W>(uniform(std::size_t(f.n()), rng, -1, 1)));
    vel0.push_back(sg::test::representable<W>(uniform(std::size_t(f.n()), rng, -0.1, 0.1)));
  }
  auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(0.05f, 0.9f, 5e-4f)});
  std::vector<std::vector<float>> ends[2];
  for (const bool permuted : {false, true}) {
    std::vector<std::unique_ptr<DeviceArray<W>>> w, vel;
    std::vector<std::unique_ptr<DeviceArray<__half>>> g;
    std::vector<cuda::SgdTensor<W, __half>> tensors;
    for (std::size_t i = 0; i < filters.size(); ++i) {
      const cuda::GradientOrder order = order_of(filters[i], i, permuted);
      w.push_back(std::make_unique<DeviceArray<W>>(w0[i]));
      vel.push_back(std::make_unique<DeviceArray<W>>(vel0[i]));
      g.push_back(std::make_unique<DeviceArray<__half>>(order.permuted() ? grads.krsc[i] : grads.kcrs[i]));
      tensors.push_back({w.back()->get(), g.back()->get(), vel.back()->get(), filters[i].n(),
                         scalars.as<cuda::UpdateScalars>(), nesterov, order});
    }
    const cuda::SgdMultiTensor<W, __half> sgd(tensors);
    sgd.launch(nullptr);
    for (std::size_t i = 0; i < filters.size(); ++i)
      for (const auto& out : {w[i]->download(), vel[i]->download()}) ends[permuted].push_back(out);
  }
  for (std::size_t k = 0; k < ends[0].size(); ++k) {
    INFO("filter " << k / 2 << (k % 2 == 0 ? " w" : " velocity"));
    CHECK(ends[1][k] == ends[0][k]);
  }
}

}  // namespace

TEST_CASE("multi-tensor Adam/AdamW and SGD read [O,KH,KW,C] gradients in the parameter's order, bit for bit") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const bool flag : {false, true}) {
    INFO((flag ? "AdamW / Nesterov" : "Adam / momentum"));
    check_adam<float>(rng, flag);
    check_adam<__half>(rng, flag);
    check_sgd<float>(rng, flag);
    check_sgd<__half>(rng, flag);
  }
}
