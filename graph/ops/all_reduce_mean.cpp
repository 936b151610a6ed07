// all_reduce_mean: (grad, grad, ...) -> (mean over the data-parallel ranks of
// each input, ...), one output like each input. One node is one bucket: the
// gradients of one layer, reduced by one collective launch (issue 25,
// docs/data_parallel.md). The ranks are the run's process group, not an
// attribute: the graph is the same on every rank.
//
// AllReduceAttrs::pre_scaled: each rank's inputs are already its share of
// the mean (the loss gradient scaled by 1/N, issue 38), so the backends sum
// them; the result is the same mean.
//
// The CPU reference computes what one rank alone sees: the mean over a group
// of one, i.e. a copy. Simulations of several ranks (tests/runtime/
// test_data_parallel.cpp) run every other node with the CPU executor and do
// this node's reduction on the host across their executors. Like the
// optimizer updates it sits after autodiff and has no gradient rule.
#include <algorithm>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::all_reduce_mean;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  if (in.empty()) fail(kOp, "expects at least one gradient");
  std::vector<OutputSpec> out;
  for (const Value* v : in) {
    expect_floating(kOp, *v);
    out.push_back({v->shape, v->dtype});
  }
  return out;
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  for (std::size_t i = 0; i < c.in.size(); ++i)
    std::copy(c.in[i].real, c.in[i].real + c.in[i].size, c.out[i].real);
}

}  // namespace

const OpDef& all_reduce_mean_def() {
  static const OpDef def = with_attrs<AllReduceAttrs>(
      {.kind = kOp, .name = "all_reduce_mean", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
