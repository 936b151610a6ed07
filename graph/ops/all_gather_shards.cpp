// all_gather_shards: (param) -> the parameter whole again after a sharded
// update (ZeRO-1, issue 38, graph/optimizer_pass.hpp). Each rank updated
// only its range of the parameter's flattened elements (AllReduceAttrs::
// shards equal ranges, rank r owning range r); this node reads the
// parameter, where this rank's range is current, and its output holds every
// rank's range, each from the rank that owns it. It sits at the step's start,
// before the forward's first read, so that its collective overlaps the
// forward of the layers before.
//
// The CPU reference is a group of one (a copy): a single rank owns every
// range. Simulations of several ranks (tests/runtime/simulated_ranks.hpp)
// fill each range of every rank's output from the rank that owns it.
#include <algorithm>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::all_gather_shards;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  if (in.size() != 1) fail(kOp, "expects one parameter");
  expect_floating(kOp, *in[0]);
  const auto shards = std::get<AllReduceAttrs>(attrs).shards;
  if (shards < 2 || element_count(in[0]->shape) % shards != 0)
    fail(kOp, fmt::format("needs 2 or more shards that divide the parameter's {} elements (shards {})",
                          element_count(in[0]->shape), shards));
  return {{in[0]->shape, in[0]->dtype}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  std::copy(c.in[0].real, c.in[0].real + c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& all_gather_shards_def() {
  static const OpDef def = with_attrs<AllReduceAttrs>(
      {.kind = kOp, .name = "all_gather_shards", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
