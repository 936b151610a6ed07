#include "graph/ops/op_common.hpp"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg::ops {

using nlohmann::json;

void fail(OpKind op, const std::string& what) { throw GraphError(fmt::format("{}: {}", op_name(op), what)); }

std::string describe(const Value& v) { return fmt::format("'{}' {} {}", v.name, shape_string(v.shape), dtype_name(v.dtype)); }

void expect_arity(OpKind op, const Inputs& in, std::size_t lo, std::size_t hi) {
  if (in.size() < lo || in.size() > hi)
    fail(op, fmt::format("expects {} inputs, got {}", lo == hi ? fmt::format("{}", lo) : fmt::format("{}..{}", lo, hi),
                         in.size()));
}

void expect_rank(OpKind op, const Value& v, std::size_t rank) {
  if (v.shape.size() != rank) fail(op, fmt::format("{} must have rank {}", describe(v), rank));
}

void expect_floating(OpKind op, const Value& v) {
  if (!is_floating(v.dtype)) fail(op, fmt::format("{} must be f32, f16 or bf16", describe(v)));
}

void expect_same_dtype(OpKind op, const Value& a, const Value& b) {
  if (a.dtype != b.dtype) fail(op, fmt::format("dtype mismatch: {} vs {}", describe(a), describe(b)));
}

void expect_same_shape(OpKind op, const Value& a, const Value& b) {
  if (a.shape != b.shape) fail(op, fmt::format("shape mismatch: {} vs {}", describe(a), describe(b)));
}

void expect_gradient_scale(OpKind op, double scale) {
  if (!(std::isfinite(scale) && scale > 0.0))
    fail(op, fmt::format("gradient scale {} must be finite and > 0", scale));
}

void expect_labels_for(OpKind op, const Value& logits, const Value& labels) {
  expect_rank(op, logits, 2);
  expect_floating(op, logits);
  expect_rank(op, labels, 1);
  if (labels.dtype != DType::i32) fail(op, fmt::format("labels {} must be i32", describe(labels)));
  if (labels.shape[0] != logits.shape[0])
    fail(op, fmt::format("batch mismatch: logits {} vs labels {}", describe(logits), describe(labels)));
}

std::vector<OutputSpec> infer_binary_same(OpKind op, const Inputs& in) {
  expect_arity(op, in, 2, 2);
  expect_floating(op, *in[0]);
  expect_same_shape(op, *in[0], *in[1]);
  expect_same_dtype(op, *in[0], *in[1]);
  return {{in[0]->shape, in[0]->dtype}};
}

std::vector<OutputSpec> infer_unary_same(OpKind op, const Inputs& in) {
  expect_arity(op, in, 1, 1);
  expect_floating(op, *in[0]);
  return {{in[0]->shape, in[0]->dtype}};
}

void normalisation_gradient(const GradientContext& c, OpKind backward) {
  if (!c.needs_grad(0) && !c.needs_grad(1) && !c.needs_grad(2)) return;
  const auto grads = c.emit(backward, {*c.output_grad(0), c.input(0), c.input(1)}, c.node().attrs, c.input(0));
  for (int slot = 0; slot < 3; ++slot)
    if (c.needs_grad(slot)) c.contribute(slot, grads[static_cast<std::size_t>(slot)]);
}

std::int64_t elements_from(std::span<const std::int64_t> shape, std::size_t first) {
  std::int64_t n = 1;
  for (std::size_t i = first; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// ---- attribute codecs

json write_attrs(const NoAttrs&) { return json::object(); }
void read_attrs(const json&, NoAttrs&) {}
std::string attrs_text(const NoAttrs&) { return ""; }

// rank/ranks only for a data-parallel shard, so single-process dumps keep their form.
json write_attrs(const BatchIndicesAttrs& a) {
  json j = {{"batch", a.batch}};
  if (a.ranks != 1) j.update({{"rank", a.rank}, {"ranks", a.ranks}});
  return j;
}
void read_attrs(const json& j, BatchIndicesAttrs& a) {
  a.batch = j.at("batch").get<std::int64_t>();
  a.rank = j.value("rank", std::int64_t{0});
  a.ranks = j.value("ranks", std::int64_t{1});
}
std::string attrs_text(const BatchIndicesAttrs& a) {
  if (a.ranks != 1) return fmt::format(" {{batch={},rank={}/{}}}", a.batch, a.rank, a.ranks);
  return fmt::format(" {{batch={}}}", a.batch);
}

json write_attrs(const GatherRowsAttrs& a) {
  return {{"out_dtype", dtype_name(a.out_dtype)}, {"scale", a.scale}, {"shift", a.shift}};
}
void read_attrs(const json& j, GatherRowsAttrs& a) {
  a.out_dtype = dtype_from_name(j.at("out_dtype").get<std::string>());
  a.scale = j.at("scale").get<double>();
  a.shift = j.at("shift").get<double>();
}
std::string attrs_text(const GatherRowsAttrs& a) {  // out_dtype is the output's type
  return fmt::format(" {{scale={:.6g},shift={:.6g}}}", a.scale, a.shift);
}

json write_attrs(const MatmulAttrs& a) { return {{"trans_a", a.trans_a}, {"trans_b", a.trans_b}}; }
void read_attrs(const json& j, MatmulAttrs& a) {
  a.trans_a = j.at("trans_a").get<bool>();
  a.trans_b = j.at("trans_b").get<bool>();
}
std::string attrs_text(const MatmulAttrs& a) { return fmt::format(" {{trans_a={},trans_b={}}}", a.trans_a, a.trans_b); }

json write_attrs(const CastAttrs& a) { return {{"out_dtype", dtype_name(a.out_dtype)}}; }
void read_attrs(const json& j, CastAttrs& a) { a.out_dtype = dtype_from_name(j.at("out_dtype").get<std::string>()); }
std::string attrs_text(const CastAttrs&) { return ""; }  // out_dtype is the output's type

// nesterov is written only when set, so graphs without it dump as before.
json write_attrs(const SgdUpdateAttrs& a) {
  json j = {{"momentum", a.momentum}, {"weight_decay", a.weight_decay}};
  if (a.nesterov) j["nesterov"] = true;
  return j;
}
void read_attrs(const json& j, SgdUpdateAttrs& a) {
  a.momentum = j.at("momentum").get<double>();
  a.weight_decay = j.at("weight_decay").get<double>();
  a.nesterov = j.value("nesterov", false);
}
std::string attrs_text(const SgdUpdateAttrs& a) {
  return fmt::format(" {{momentum={:.6g},weight_decay={:.6g}{}}}", a.momentum, a.weight_decay,
                     a.nesterov ? ",nesterov" : "");
}

json write_attrs(const LabelSmoothingAttrs& a) { return {{"eps", a.eps}, {"gradient_scale", a.gradient_scale}}; }
void read_attrs(const json& j, LabelSmoothingAttrs& a) {  // gradient_scale defaults to 1 (graphs dumped before it)
  a.eps = j.at("eps").get<double>();
  a.gradient_scale = j.value("gradient_scale", 1.0);
}
std::string attrs_text(const LabelSmoothingAttrs& a) {
  return a.gradient_scale == 1.0 ? fmt::format(" {{eps={:.6g}}}", a.eps)
                                 : fmt::format(" {{eps={:.6g},gradient_scale={:.6g}}}", a.eps, a.gradient_scale);
}

json write_attrs(const DropoutAttrs& a) {
  return {{"p", a.p}, {"seed", a.seed}, {"stream", a.stream}, {"channels_last", a.channels_last}};
}
void read_attrs(const json& j, DropoutAttrs& a) {  // channels_last defaults to false (graphs dumped before it)
  a.p = j.at("p").get<double>();
  a.seed = j.at("seed").get<std::uint64_t>();
  a.stream = j.at("stream").get<std::int64_t>();
  a.channels_last = j.value("channels_last", false);
}
std::string attrs_text(const DropoutAttrs& a) {
  return fmt::format(" {{p={:.6g},seed={},stream={}{}}}", a.p, a.seed, a.stream,
                     a.channels_last ? ",channels_last" : "");
}

json write_attrs(const AdamUpdateAttrs& a) {
  return {{"beta1", a.beta1}, {"beta2", a.beta2}, {"eps", a.eps}, {"weight_decay", a.weight_decay},
          {"decoupled", a.decoupled}};
}
void read_attrs(const json& j, AdamUpdateAttrs& a) {
  a.beta1 = j.at("beta1").get<double>();
  a.beta2 = j.at("beta2").get<double>();
  a.eps = j.at("eps").get<double>();
  a.weight_decay = j.at("weight_decay").get<double>();
  a.decoupled = j.at("decoupled").get<bool>();
}
std::string attrs_text(const AdamUpdateAttrs& a) {
  return fmt::format(" {{beta1={:.6g},beta2={:.6g},eps={:.6g},weight_decay={:.6g}{}}}", a.beta1, a.beta2, a.eps,
                     a.weight_decay, a.decoupled ? ",decoupled" : "");
}

json write_attrs(const RmspropUpdateAttrs& a) {
  return {{"alpha", a.alpha}, {"eps", a.eps}, {"weight_decay", a.weight_decay}, {"momentum", a.momentum},
          {"centered", a.centered}};
}
void read_attrs(const json& j, RmspropUpdateAttrs& a) {
  a.alpha = j.at("alpha").get<double>();
  a.eps = j.at("eps").get<double>();
  a.weight_decay = j.at("weight_decay").get<double>();
  a.momentum = j.at("momentum").get<double>();
  a.centered = j.at("centered").get<bool>();
}
std::string attrs_text(const RmspropUpdateAttrs& a) {
  return fmt::format(" {{alpha={:.6g},eps={:.6g},weight_decay={:.6g},momentum={:.6g}{}}}", a.alpha, a.eps,
                     a.weight_decay, a.momentum, a.centered ? ",centered" : "");
}

json write_attrs(const ClipGradAttrs& a) { return {{"max_norm", a.max_norm}}; }
void read_attrs(const json& j, ClipGradAttrs& a) { a.max_norm = j.at("max_norm").get<double>(); }
std::string attrs_text(const ClipGradAttrs& a) { return fmt::format(" {{max_norm={:.6g}}}", a.max_norm); }

json write_attrs(const Conv2dAttrs& a) {
  return {{"stride", a.stride},
          {"padding", a.padding},
          {"grad_h", a.grad_h},
          {"grad_w", a.grad_w},
          {"channels_last", a.channels_last},
          {"filter_channels_last", a.filter_channels_last}};
}
// channels_last and filter_channels_last default to false: graphs dumped before them had none.
void read_attrs(const json& j, Conv2dAttrs& a) {
  a.stride = j.at("stride").get<std::int64_t>();
  a.padding = j.at("padding").get<std::int64_t>();
  a.grad_h = j.at("grad_h").get<std::int64_t>();
  a.grad_w = j.at("grad_w").get<std::int64_t>();
  a.channels_last = j.value("channels_last", false);
  a.filter_channels_last = j.value("filter_channels_last", false);
}
// grad_h/grad_w show in the output type of the backward ops already.
std::string attrs_text(const Conv2dAttrs& a) {
  return fmt::format(" {{stride={},padding={}{}{}}}", a.stride, a.padding, a.channels_last ? ",channels_last" : "",
                     a.filter_channels_last ? ",filter_channels_last" : "");
}

json write_attrs(const Pool2dAttrs& a) {
  return {{"kernel", a.kernel}, {"stride", a.stride},           {"grad_h", a.grad_h},
          {"grad_w", a.grad_w}, {"channels_last", a.channels_last}};
}
// grad_h / grad_w default to 0: graphs dumped before avg_pool2d had none;
// channels_last to false.
void read_attrs(const json& j, Pool2dAttrs& a) {
  a.kernel = j.at("kernel").get<std::int64_t>();
  a.stride = j.at("stride").get<std::int64_t>();
  a.grad_h = j.value("grad_h", std::int64_t{0});
  a.grad_w = j.value("grad_w", std::int64_t{0});
  a.channels_last = j.value("channels_last", false);
}
std::string attrs_text(const Pool2dAttrs& a) {
  return fmt::format(" {{kernel={},stride={}{}}}", a.kernel, a.stride, a.channels_last ? ",channels_last" : "");
}

// The shape shows in the output type.
json write_attrs(const ReshapeAttrs& a) { return {{"shape", a.shape}}; }
void read_attrs(const json& j, ReshapeAttrs& a) { a.shape = j.at("shape").get<Shape>(); }
std::string attrs_text(const ReshapeAttrs&) { return ""; }

json write_attrs(const LayerNormAttrs& a) { return {{"eps", a.eps}}; }
void read_attrs(const json& j, LayerNormAttrs& a) { a.eps = j.at("eps").get<double>(); }
std::string attrs_text(const LayerNormAttrs& a) { return fmt::format(" {{eps={}}}", a.eps); }

json write_attrs(const SliceAttrs& a) { return {{"begin", a.begin}, {"count", a.count}}; }
void read_attrs(const json& j, SliceAttrs& a) {
  a.begin = j.at("begin").get<std::int64_t>();
  a.count = j.at("count").get<std::int64_t>();
}
std::string attrs_text(const SliceAttrs& a) { return fmt::format(" {{begin={}}}", a.begin); }

json write_attrs(const AugmentAttrs& a) {
  return {{"translate", a.translate}, {"flip", a.flip}, {"fill", a.fill}, {"seed", a.seed},
          {"example_offset", a.example_offset}};
}
void read_attrs(const json& j, AugmentAttrs& a) {
  a.translate = j.at("translate").get<std::int64_t>();
  a.flip = j.at("flip").get<bool>();
  a.fill = j.at("fill").get<double>();
  a.seed = j.at("seed").get<std::uint64_t>();
  a.example_offset = j.at("example_offset").get<std::int64_t>();
}
std::string attrs_text(const AugmentAttrs& a) {
  return fmt::format(" {{translate={},flip={}}}", a.translate, a.flip ? "true" : "false");
}

json write_attrs(const BatchNormAttrs& a) {
  return {{"eps", a.eps}, {"momentum", a.momentum}, {"channels_last", a.channels_last}};
}
void read_attrs(const json& j, BatchNormAttrs& a) {  // channels_last defaults to false (graphs dumped before it)
  a.eps = j.at("eps").get<double>();
  a.momentum = j.at("momentum").get<double>();
  a.channels_last = j.value("channels_last", false);
}
std::string attrs_text(const BatchNormAttrs& a) {
  return fmt::format(" {{eps={},momentum={}{}}}", a.eps, a.momentum, a.channels_last ? ",channels_last" : "");
}

json write_attrs(const LossGradientAttrs& a) { return {{"scale", a.scale}}; }
void read_attrs(const json& j, LossGradientAttrs& a) { a.scale = j.at("scale").get<double>(); }
std::string attrs_text(const LossGradientAttrs& a) {
  return a.scale == 1.0 ? "" : fmt::format(" {{scale={:.6g}}}", a.scale);
}

json write_attrs(const AllReduceAttrs& a) { return {{"pre_scaled", a.pre_scaled}, {"shards", a.shards}}; }
void read_attrs(const json& j, AllReduceAttrs& a) {
  a.pre_scaled = j.at("pre_scaled").get<bool>();
  a.shards = j.value("shards", std::int64_t{0});
}
std::string attrs_text(const AllReduceAttrs& a) {
  std::vector<std::string> parts;
  if (a.pre_scaled) parts.emplace_back("pre_scaled");
  if (a.shards > 1) parts.push_back(fmt::format("{} shards", a.shards));
  return parts.empty() ? "" : fmt::format(" {{{}}}", fmt::join(parts, ", "));
}

}  // namespace sg::ops
