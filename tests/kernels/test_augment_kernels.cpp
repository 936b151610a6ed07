// Issue 37's augment_images on the GPU against the CPU reference backend
// (TwinRun): random image batches, translations 0..3, with and without flip,
// several steps and example offsets, in f32, f16 and bf16. The kernel only
// selects pixels (or the fill): the same bits, and the same bits again on a
// second run of the recorded launch.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;

TEST_CASE("augment_images selects exactly the CPU reference's pixels") {
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 12; ++trial)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      const Shape shape{pick(rng, 1, 40), pick(rng, 1, 3), pick(rng, 4, 30), pick(rng, 4, 30)};
      const AugmentAttrs a{pick(rng, 0, 3), trial % 2 == 0, -0.424, 0x1234ull + static_cast<std::uint64_t>(trial),
                           pick(rng, 0, 1000)};
      const auto step = static_cast<std::int32_t>(pick(rng, 0, 100000));
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {} translate {} flip {} offset {} step {}", dtype_name(dtype), fmt::join(shape, "x"),
                          a.translate, a.flip, a.example_offset, step));
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId s = g.state("step", {1}, DType::i32);
      const ValueId y = g.append_node(OpKind::augment_images, {x, s}, a).front();
      g.mark_output(y);
      TwinRun run(std::move(g), rng, Fill{}, step);
      CHECK(run.lowerings() == std::vector<std::string>{"augment_images"});
      CHECK(run.error(y) == 0.0);
      const auto first = run.gpu(y);
      run.rerun();
      CHECK(run.gpu(y) == first);
    }
}
