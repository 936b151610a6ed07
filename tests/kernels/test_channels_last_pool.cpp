// The channels-last (NHWC) max-pooling kernels (ops/cuda/channels_last.hpp)
// called directly on device buffers, against the CPU reference applied to
// the same values permuted to NCHW on the host (ref::max_pool2d,
// ref::max_pool2d_backward, ref::relu_backward). Pooling only selects and
// adds in the reference's order, so it must match bit for bit in f32, f16
// and bf16, every intermediate rounded to T as the graph stores it: on c =
// 1, 3, 8, 32, 64, 13 channels, 28/14/7/5 planes, 2x2 and 3x3 windows that
// tile and 3x3 at stride 2 and 2x2 at stride 1 that overlap, with random values, ties, constant
// planes and NaNs, with pointers off their 16-byte alignment (the
// element-by-element path), and with the pooled-sized tensors channels-first
// (a region's exit fused into the pooling), and an activation before the
// pooling applied in its pass. Outputs are poisoned with NaN first, so an
// element left unwritten shows.
#include "tests/kernels/channels_last_test_support.hpp"
#include "tests/support/activation_reference.hpp"

using namespace sg;
using namespace sg::test::channels_last;
using sg::test::pick;

namespace {

struct PoolCase {
  std::int64_t n, hw, c, kernel, stride;
  bool pooled_first = false;  // the pooled-sized tensors channels-first (ChannelsLastPool::pooled_channels_first)
  std::string describe() const {
    return fmt::format("n {} {}x{} c {} kernel {} stride {}{}", n, hw, hw, c, kernel, stride,
                       pooled_first ? " pooled NCHW" : "");
  }
  cuda::ChannelsLastPool geometry() const { return {n, hw, hw, c, kernel, stride, pooled_first}; }
  // A pooled-sized tensor given in NHWC order, in the order the launch reads and writes it.
  std::vector<float> pooled_layout(const std::vector<float>& nhwc) const {
    const cuda::ChannelsLastPool g = geometry();
    return pooled_first ? to_nchw(nhwc, n, g.oh() * g.ow(), c) : nhwc;
  }
  std::int64_t in() const { return n * hw * hw * c; }
  std::int64_t out() const {
    const cuda::ChannelsLastPool g = geometry();
    return n * g.oh() * g.ow() * c;
  }
};

// ref::max_pool2d of NHWC x, per (n, c) plane, in NHWC order.
std::vector<float> reference_pool(const std::vector<float>& x, const PoolCase& p) {
  const cuda::ChannelsLastPool g = p.geometry();
  std::vector<float> y(static_cast<std::size_t>(p.out()));
  ref::max_pool2d(to_nchw(x, p.n, p.hw * p.hw, p.c).data(), p.n * p.c, p.hw, p.hw, p.kernel, p.stride, y.data());
  return to_nhwc(y, p.n, g.oh() * g.ow(), p.c);
}

// The forward with both outputs, with pooled alone and with activated alone.
template <typename T>
void check_forward(const PoolCase& p, Values values, std::size_t offset, std::mt19937_64& rng) {
  CAPTURE(fmt::format("{} {} {} offset {}", type_name<T>(), p.describe(), values_name(values), offset));
  const std::vector<float> x = draw<T>(static_cast<std::size_t>(p.in()), values, rng);
  const std::vector<float> pooled = p.pooled_layout(reference_pool(x, p));
  std::vector<float> activated(pooled.size());
  ref::relu(pooled.data(), static_cast<std::int64_t>(pooled.size()), activated.data());
  const Tensor<T> d_x(x, offset);
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    const Tensor<T> out_pooled(pooled.size(), offset), out_activated(pooled.size(), offset);
    cuda::launch_max_pool2d_nhwc_forward(d_x.get(), p.geometry(), variant == 2 ? nullptr : out_pooled.get(),
                                         variant == 1 ? nullptr : out_activated.get(), nullptr);
    if (variant != 2) CHECK(bit_difference(out_pooled.download(), pooled) == "");
    if (variant != 1) CHECK(bit_difference(out_activated.download(), activated) == "");
  }
}

// The backward chain with and without each relu, the intermediates written
// or not (`intermediates`), against the reference's steps each rounded to T.
template <typename T>
void check_backward(const PoolCase& p, Values values, std::size_t offset, bool intermediates, std::mt19937_64& rng) {
  const std::size_t in = static_cast<std::size_t>(p.in()), out = static_cast<std::size_t>(p.out());
  const std::vector<float> x = draw<T>(in, values, rng), dy = draw<T>(out, Values::uniform, rng);
  const std::vector<float> relu_before = draw_relu_output<T>(out, rng), relu_after = draw_relu_output<T>(in, rng);
  const Tensor<T> d_x(x, offset), d_dy(p.pooled_layout(dy), offset), d_before(p.pooled_layout(relu_before), offset),
      d_after(relu_after, offset);
  for (int relus = 0; relus < 4; ++relus) {
    const bool before = relus & 1, after = relus & 2;
    CAPTURE(fmt::format("{} {} {} offset {} relu_before {} relu_after {} intermediates {}", type_name<T>(),
                        p.describe(), values_name(values), offset, before, after, intermediates));
    // The reference chain in NHWC order.
    std::vector<float> grad = dy, pool_grad(in), after_grad(in);
    if (before) ref::relu_backward(dy.data(), relu_before.data(), std::int64_t(out), grad.data());
    const cuda::ChannelsLastPool g = p.geometry();
    std::vector<float> nchw(in);
    ref::max_pool2d_backward(to_nchw(grad, p.n, g.oh() * g.ow(), p.c).data(), to_nchw(x, p.n, p.hw * p.hw, p.c).data(),
                             p.n * p.c, p.hw, p.hw, p.kernel, p.stride, nchw.data());
    pool_grad = to_nhwc(nchw, p.n, p.hw * p.hw, p.c);
    for (float& v : pool_grad) v = round_to<T>(v);  // stored as T
    after_grad = pool_grad;
    if (after) ref::relu_backward(pool_grad.data(), relu_after.data(), std::int64_t(in), after_grad.data());

    const Tensor<T> out_before(out, offset), out_pool(in, offset), out_after(in, offset);
    cuda::ChannelsLastPoolBackward<T> t;
    t.dy = d_dy.get();
    t.x = d_x.get();
    if (before) t.relu_before = d_before.get();
    if (after) t.relu_after = d_after.get();
    t.dx = after ? out_after.get() : out_pool.get();
    t.relu_after_grad = after ? t.dx : nullptr;
    t.pool_grad = after ? nullptr : t.dx;
    if (intermediates) {
      if (before) t.relu_before_grad = out_before.get();
      t.pool_grad = out_pool.get();
    }
    cuda::launch_max_pool2d_nhwc_backward(t, g, nullptr);
    CHECK(bit_difference(after ? out_after.download() : out_pool.download(), after ? after_grad : pool_grad) == "");
    if (intermediates && after) CHECK(bit_difference(out_pool.download(), pool_grad) == "");
    if (intermediates && before) CHECK(bit_difference(out_before.download(), p.pooled_layout(grad)) == "");
  }
}

const std::vector<std::int64_t> kChannels = {1, 3, 8, 32, 64, 13};
const std::vector<std::int64_t> kPlanes = {28, 14, 7, 5};
// kernel / stride: tiling 2x2 and 3x3 (with rows and columns left over on
// odd planes), and 3x3 at stride 2 and 2x2 at stride 1, overlapping (2x2
// windows take the kernels' compiled-in window).
const std::vector<std::pair<std::int64_t, std::int64_t>> kWindows = {{2, 2}, {3, 3}, {3, 2}, {2, 1}};
const std::vector<Values> kValues = {Values::uniform, Values::ties, Values::constant, Values::nan};

// f(case, values) over every shape, window and value kind.
template <typename F>
void for_each_pool_case(std::mt19937_64& rng, F&& f) {
  for (const std::int64_t c : kChannels)
    for (const std::int64_t hw : kPlanes)
      for (const auto& [kernel, stride] : kWindows)
        for (const Values values : kValues) f(PoolCase{pick(rng, 1, 2), hw, c, kernel, stride}, values);
}

// The backward of another activation before the pooling (after_activation:
// relu_after holds what its backward reads) against the reference chain;
// the kernels' f32 math against the reference's f64 may round apart, so by
// relative error, not bits.
template <typename T>
void check_backward_activation(const PoolCase& p, cuda::Activation a, std::mt19937_64& rng) {
  CAPTURE(fmt::format("{} {} {}", type_name<T>(), p.describe(), cuda::activation_op_name(a)));
  const std::size_t in = static_cast<std::size_t>(p.in()), out = static_cast<std::size_t>(p.out());
  const std::vector<float> x = draw<T>(in, Values::ties, rng), dy = draw<T>(out, Values::uniform, rng);
  std::vector<float> saved = draw<T>(in, Values::uniform, rng);
  for (float& v : saved) v = round_to<T>(2.f * v);
  const cuda::ChannelsLastPool g = p.geometry();
  std::vector<float> nchw(in), want;
  ref::max_pool2d_backward(to_nchw(dy, p.n, g.oh() * g.ow(), p.c).data(), to_nchw(x, p.n, p.hw * p.hw, p.c).data(),
                           p.n * p.c, p.hw, p.hw, p.kernel, p.stride, nchw.data());
  std::vector<float> pool_grad = to_nhwc(nchw, p.n, p.hw * p.hw, p.c);
  for (float& v : pool_grad) v = round_to<T>(v);
  const std::vector<double> through =
      sg::test::activation_backward(a, {pool_grad.begin(), pool_grad.end()}, {saved.begin(), saved.end()});
  for (const double v : through) want.push_back(round_to<T>(float(v)));
  const Tensor<T> d_x(x, 0), d_dy(p.pooled_layout(dy), 0), d_saved(saved, 0), out_pool(in, 0), out_after(in, 0);
  cuda::ChannelsLastPoolBackward<T> t;
  t.dy = d_dy.get();
  t.x = d_x.get();
  t.relu_after = d_saved.get();
  t.after_activation = a;
  t.pool_grad = out_pool.get();
  t.relu_after_grad = t.dx = out_after.get();
  cuda::launch_max_pool2d_nhwc_backward(t, g, nullptr);
  CHECK(bit_difference(out_pool.download(), pool_grad) == "");
  const double tolerance = sizeof(T) == 4 ? 1e-5 : std::is_same_v<T, __half> ? 2e-3 : 1e-2;
  CHECK(sg::test::relative_error(out_after.download(), want) < tolerance);
}

// The activation before the pooling in the same pass: its output against
// the reference activation (by relative error: f32 math on either side),
// the pooled values bit for bit against ref::max_pool2d of that very output,
// and the pooled values alone (no activation output written) the same.
template <typename T>
void check_activation_forward(const PoolCase& p, cuda::Activation a, std::mt19937_64& rng) {
  CAPTURE(fmt::format("{} {} {}", type_name<T>(), p.describe(), cuda::activation_op_name(a)));
  const std::vector<float> z = draw<T>(static_cast<std::size_t>(p.in()), Values::uniform, rng);
  std::vector<float> want;
  for (const double v : sg::test::activation_forward(a, {z.begin(), z.end()})) want.push_back(round_to<T>(float(v)));
  const Tensor<T> d_z(z, 0), out_x(z.size(), 0), out_pooled(static_cast<std::size_t>(p.out()), 0),
      pooled_alone(static_cast<std::size_t>(p.out()), 0);
  REQUIRE(cuda::activation_pool_tiles(p.geometry()));
  cuda::launch_activation_max_pool2d_nhwc_forward(d_z.get(), a, p.geometry(), out_x.get(), out_pooled.get(),
                                                  static_cast<T*>(nullptr), nullptr);
  const std::vector<float> x = out_x.download();
  const double tolerance = sizeof(T) == 4 ? 1e-5 : std::is_same_v<T, __half> ? 2e-3 : 1e-2;
  CHECK(sg::test::relative_error(x, want) < tolerance);
  CHECK(bit_difference(out_pooled.download(), p.pooled_layout(reference_pool(x, p))) == "");
  cuda::launch_activation_max_pool2d_nhwc_forward(d_z.get(), a, p.geometry(), static_cast<T*>(nullptr),
                                                  pooled_alone.get(), static_cast<T*>(nullptr), nullptr);
  CHECK(bit_difference(pooled_alone.download(), out_pooled.download()) == "");
}

}  // namespace

TEST_CASE("max_pool2d_nhwc backward through each activation before the pooling matches the reference chain") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (const PoolCase& p : {PoolCase{2, 14, 32, 2, 2}, PoolCase{1, 7, 13, 3, 3}, PoolCase{2, 5, 8, 3, 2},
                              PoolCase{1, 14, 64, 2, 2, true}})
      for (const cuda::Activation a : sg::test::kActivations) check_backward_activation<T>(p, a, rng);
  });
}

TEST_CASE("an activation and the max pooling after it in one pass match the reference") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (const PoolCase& p : {PoolCase{2, 14, 32, 2, 2}, PoolCase{1, 6, 13, 3, 3}, PoolCase{2, 28, 8, 2, 2, true},
                              PoolCase{1, 4, 3, 2, 2}})
      for (const cuda::Activation a : sg::test::kActivations) check_activation_forward<T>(p, a, rng);
  });
  // Windows that do not tile the input are refused.
  const Tensor<float> z(std::size_t(2 * 7 * 7 * 8), 0), out(std::size_t(2 * 3 * 3 * 8), 0);
  CHECK_THROWS(cuda::launch_activation_max_pool2d_nhwc_forward(z.get(), cuda::Activation::gelu, {2, 7, 7, 8, 2, 2},
                                                               static_cast<float*>(nullptr), out.get(),
                                                               static_cast<float*>(nullptr), nullptr));
}

TEST_CASE("max_pool2d_nhwc forward [+ relu] matches ref::max_pool2d per plane bit for bit") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for_each_pool_case(rng, [&](const PoolCase& p, Values values) { check_forward<T>(p, values, 0, rng); });
  });
}

TEST_CASE("max_pool2d_nhwc with channels-first pooled tensors (the region's exit fused) gives the same bits") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for_each_pool_case(rng, [&](PoolCase p, Values values) {
      p.pooled_first = true;
      check_forward<T>(p, values, 0, rng);
      check_backward<T>(p, values, 0, true, rng);
      check_backward<T>(p, values, 0, false, rng);
    });
  });
}

TEST_CASE("max_pool2d_nhwc backward with and without its relus matches the reference chain bit for bit") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    int k = 0;
    for_each_pool_case(rng, [&](const PoolCase& p, Values values) { check_backward<T>(p, values, 0, ++k % 2, rng); });
  });
}

TEST_CASE("max_pool2d_nhwc on pointers off their alignment (element by element) gives the same bits") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (const std::int64_t c : {8, 32, 64})
      for (const auto& [kernel, stride] : kWindows)
        for (const Values values : {Values::uniform, Values::nan}) {
          const PoolCase p{2, 14, c, kernel, stride};
          check_forward<T>(p, values, 1, rng);
          check_backward<T>(p, values, 1, true, rng);
        }
  });
}

TEST_CASE("max_pool2d_nhwc backward on windows that tile writes its result over x (in place) correctly") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (const PoolCase& p : {PoolCase{2, 14, 64, 2, 2}, PoolCase{1, 7, 13, 3, 3}}) {
      CAPTURE(fmt::format("{} {}", type_name<T>(), p.describe()));
      const std::vector<float> x = draw<T>(static_cast<std::size_t>(p.in()), Values::ties, rng);
      const std::vector<float> dy = draw<T>(static_cast<std::size_t>(p.out()), Values::uniform, rng);
      std::vector<float> want(x.size());
      const cuda::ChannelsLastPool g = p.geometry();
      ref::max_pool2d_backward(to_nchw(dy, p.n, g.oh() * g.ow(), p.c).data(), to_nchw(x, p.n, p.hw * p.hw, p.c).data(),
                               p.n * p.c, p.hw, p.hw, p.kernel, p.stride, want.data());
      want = to_nhwc(want, p.n, p.hw * p.hw, p.c);
      for (float& v : want) v = round_to<T>(v);
      const Tensor<T> d_x(x, 0), d_dy(dy, 0);
      cuda::ChannelsLastPoolBackward<T> t;
      t.dy = d_dy.get();
      t.x = d_x.get();
      t.pool_grad = t.dx = d_x.get();
      cuda::launch_max_pool2d_nhwc_backward(t, g, nullptr);
      CHECK(bit_difference(d_x.download(), want) == "");
    }
  });
}

TEST_CASE("max_pool2d_nhwc launchers refuse a backward whose dx is not the chain's result") {
  auto rng = sg::test::fresh_rng();
  const PoolCase p{1, 4, 8, 2, 2};
  const Tensor<float> x(draw<float>(16 * 8, Values::uniform, rng), 0), dy(32, 0), grad(128, 0);
  cuda::ChannelsLastPoolBackward<float> t;
  t.dy = dy.get();
  t.x = x.get();
  t.pool_grad = grad.get();
  CHECK_THROWS_AS(cuda::launch_max_pool2d_nhwc_backward(t, p.geometry(), nullptr), cuda::CudaError);
  t.relu_after = x.get();
  t.dx = grad.get();
  CHECK_THROWS_AS(cuda::launch_max_pool2d_nhwc_backward(t, p.geometry(), nullptr), cuda::CudaError);
  CHECK_THROWS_AS(cuda::launch_max_pool2d_nhwc_forward(x.get(), p.geometry(), static_cast<float*>(nullptr),
                                                       static_cast<float*>(nullptr), nullptr),
                  cuda::CudaError);
}
