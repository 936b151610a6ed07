// all_gather_batch: X [N, ...] -> [R*N, ...], every rank's rows of X, rank
// r's at rows r*N .. (r+1)*N (R = AllReduceAttrs::shards ranks; issue 38,
// graph/gathered_gradients.hpp). A weight gradient that sums over the batch
// (dW = X^T dY, a bias's column sums, a convolution's filter gradient) reads
// the gathered X and dY instead of this rank's: it is then the gradient of
// the global batch on every rank, with no all-reduce of the gradient itself,
// which pays where a layer's gradient has more elements than its rows do.
//
// The CPU reference is a group of R ranks that all had this rank's rows (its
// input repeated R times): a lone executor has no other rank. Simulations of
// several ranks (tests/runtime/simulated_ranks.hpp) fill block r from rank r.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::all_gather_batch;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  if (in.size() != 1) fail(kOp, "expects one value");
  expect_floating(kOp, *in[0]);
  const auto ranks = std::get<AllReduceAttrs>(attrs).shards;
  if (ranks < 2) fail(kOp, fmt::format("needs 2 or more ranks (shards {})", ranks));
  if (in[0]->shape.empty()) fail(kOp, fmt::format("needs a value with a batch dimension, got {}", describe(*in[0])));
  Shape out = in[0]->shape;
  out[0] *= ranks;
  return {{out, in[0]->dtype}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  for (std::int64_t at = 0; at + c.in[0].size <= c.out[0].size; at += c.in[0].size)
    std::copy(c.in[0].real, c.in[0].real + c.in[0].size, c.out[0].real + at);
}

}  // namespace

const OpDef& all_gather_batch_def() {
  static const OpDef def = with_attrs<AllReduceAttrs>(
      {.kind = kOp, .name = "all_gather_batch", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
