// Issue 37's concat and slice_channels on the GPU against the CPU reference
// backend (TwinRun): concats of 2 and 3 inputs of images and of vectors,
// channel counts that do and do not allow 16-byte copies, and every input's
// slice of a gradient, in f32, f16 and bf16. They only move elements: the
// same bits.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;

TEST_CASE("concat and slice_channels move exactly the CPU reference's elements") {
  auto rng = sg::test::fresh_rng();
  const std::vector<std::vector<std::int64_t>> channel_lists = {{1, 1}, {3, 5, 2}, {8, 16}, {4, 7}};
  for (const auto& channels : channel_lists)
    for (const Shape& rest : {Shape{}, Shape{5, 5}, Shape{2, 4}})
      for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        const std::int64_t n = pick(rng, 1, 9);
        CAPTURE(sg::test::last_seed());
        CAPTURE(fmt::format("{} n {} channels {} rest {}", dtype_name(dtype), n, fmt::join(channels, ","),
                            fmt::join(rest, "x")));
        Graph g;
        std::vector<ValueId> parts;
        std::int64_t total = 0;
        for (std::size_t i = 0; i < channels.size(); ++i) {
          Shape s{n, channels[i]};
          s.insert(s.end(), rest.begin(), rest.end());
          parts.push_back(g.input(fmt::format("x{}", i), s, dtype));
          total += channels[i];
        }
        Shape out{n, total};
        out.insert(out.end(), rest.begin(), rest.end());
        const ValueId y = g.append_node(OpKind::concat, parts, NoAttrs{}).front();
        const ValueId dy = g.input("dy", out, dtype);
        g.mark_output(y);
        std::vector<ValueId> slices;
        std::int64_t begin = 0;
        for (std::int64_t c : channels) {
          slices.push_back(g.append_node(OpKind::slice_channels, {dy}, SliceAttrs{begin, c}).front());
          g.mark_output(slices.back());
          begin += c;
        }
        TwinRun run(std::move(g), rng, Fill{});
        CHECK(run.lowerings() == std::vector<std::string>(1 + channels.size(), "concat"));
        CHECK(run.error(y) == 0.0);
        for (ValueId s : slices) CHECK(run.error(s) == 0.0);
      }
}
