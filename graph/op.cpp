#include "graph/op.hpp"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "graph/op_registry.hpp"

namespace sg {
namespace {

constexpr std::array kFusionNames = {
    std::pair{FusionKind::batch_fetch, "batch_fetch"},
    std::pair{FusionKind::linear_forward, "linear_forward"},
    std::pair{FusionKind::dgrad_drelu, "dgrad_drelu"},
    std::pair{FusionKind::wgrad_sgd, "wgrad_sgd"},
    std::pair{FusionKind::bgrad_sgd, "bgrad_sgd"},
    std::pair{FusionKind::xent_fused, "xent_fused"},
    std::pair{FusionKind::dgrad_dgelu, "dgrad_dgelu"},
};

constexpr std::array<const char*, std::variant_size_v<OpAttrs>> kAttrsKindNames = {
    "none", "batch_indices", "gather_rows", "matmul", "cast", "sgd_update", "label_smoothing", "dropout", "adam_update",
    "clip_grad", "conv2d", "pool2d", "reshape", "rmsprop_update", "layer_norm", "slice", "augment", "batch_norm",
    "loss_gradient", "all_reduce"};
static_assert(attrs_index<NoAttrs>() == 0 && attrs_index<BatchIndicesAttrs>() == 1 &&
              attrs_index<GatherRowsAttrs>() == 2 && attrs_index<MatmulAttrs>() == 3 &&
              attrs_index<CastAttrs>() == 4 && attrs_index<SgdUpdateAttrs>() == 5 &&
              attrs_index<LabelSmoothingAttrs>() == 6 && attrs_index<DropoutAttrs>() == 7 &&
              attrs_index<AdamUpdateAttrs>() == 8 && attrs_index<ClipGradAttrs>() == 9 &&
              attrs_index<Conv2dAttrs>() == 10 && attrs_index<Pool2dAttrs>() == 11 &&
              attrs_index<ReshapeAttrs>() == 12);

}  // namespace

std::string_view op_name(OpKind op) {
  const auto defs = all_op_defs();
  const auto i = static_cast<std::size_t>(op);
  return i < defs.size() ? defs[i]->name : std::string_view("?");
}

OpKind op_from_name(std::string_view name) {
  for (const OpDef* def : all_op_defs())
    if (def->name == name) return def->kind;
  throw std::invalid_argument("unknown op '" + std::string(name) + "'");
}

std::string_view fusion_name(FusionKind kind) {
  for (const auto& [k, name] : kFusionNames)
    if (k == kind) return name;
  return "?";
}

FusionKind fusion_from_name(std::string_view name) {
  for (const auto& [k, n] : kFusionNames)
    if (name == n) return k;
  throw std::invalid_argument("unknown fusion kind '" + std::string(name) + "'");
}

bool op_updates_in_place(OpKind op) { return op_def(op).in_place != nullptr; }

std::vector<int> in_place_inputs(const Node& node) {
  const OpDef& def = op_def(node.op);
  return def.in_place ? def.in_place(node.attrs, static_cast<int>(node.inputs.size())) : std::vector<int>{};
}

std::string_view attrs_kind_name(std::size_t index) {
  return index < kAttrsKindNames.size() ? kAttrsKindNames[index] : "?";
}

void throw_wrong_attrs(const Node& node, std::size_t wanted_index) {
  throw GraphError(fmt::format("node {} ({}): attributes are not {}", node.id, op_name(node.op),
                               attrs_kind_name(wanted_index)));
}

BatchNormLayout batch_norm_layout(std::span<const std::int64_t> shape, const BatchNormAttrs& attrs) {
  const auto product = [&](std::size_t from, std::size_t to) {
    std::int64_t n = 1;
    for (std::size_t d = from; d < to; ++d) n *= shape[d];
    return n;
  };
  if (attrs.channels_last) return {product(0, shape.size() - 1), shape.back(), 1};
  return {shape[0], shape[1], product(2, shape.size())};
}

}  // namespace sg
