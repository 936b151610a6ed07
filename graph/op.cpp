#include "graph/op.hpp"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

namespace sg {
namespace {

constexpr std::array kOpNames = {
    std::pair{OpKind::batch_indices, "batch_indices"},
    std::pair{OpKind::gather_rows, "gather_rows"},
    std::pair{OpKind::matmul, "matmul"},
    std::pair{OpKind::bias_add, "bias_add"},
    std::pair{OpKind::relu, "relu"},
    std::pair{OpKind::relu_backward, "relu_backward"},
    std::pair{OpKind::softmax_xent, "softmax_xent"},
    std::pair{OpKind::softmax_xent_backward, "softmax_xent_backward"},
    std::pair{OpKind::reduce_rows, "reduce_rows"},
    std::pair{OpKind::add, "add"},
    std::pair{OpKind::cast, "cast"},
    std::pair{OpKind::sgd_update, "sgd_update"},
    std::pair{OpKind::advance_step, "advance_step"},
    std::pair{OpKind::count_correct, "count_correct"},
};

constexpr std::array kFusionNames = {
    std::pair{FusionKind::batch_fetch, "batch_fetch"},
    std::pair{FusionKind::linear_forward, "linear_forward"},
    std::pair{FusionKind::dgrad_drelu, "dgrad_drelu"},
    std::pair{FusionKind::wgrad_sgd, "wgrad_sgd"},
    std::pair{FusionKind::bgrad_sgd, "bgrad_sgd"},
    std::pair{FusionKind::xent_fused, "xent_fused"},
};

template <typename Table, typename Key>
std::string_view name_of(const Table& table, Key key) {
  for (const auto& [k, name] : table)
    if (k == key) return name;
  return "?";
}

template <typename Table>
auto key_of(const Table& table, std::string_view name, const char* what) {
  for (const auto& [k, n] : table)
    if (name == n) return k;
  throw std::invalid_argument(std::string("unknown ") + what + " '" + std::string(name) + "'");
}

}  // namespace

std::string_view op_name(OpKind op) { return name_of(kOpNames, op); }
OpKind op_from_name(std::string_view name) { return key_of(kOpNames, name, "op"); }
std::string_view fusion_name(FusionKind kind) { return name_of(kFusionNames, kind); }
FusionKind fusion_from_name(std::string_view name) { return key_of(kFusionNames, name, "fusion kind"); }

bool op_updates_in_place(OpKind op) { return op == OpKind::sgd_update || op == OpKind::advance_step; }

std::vector<int> in_place_inputs(OpKind op, int input_count) {
  if (op == OpKind::advance_step) return {0};
  if (op == OpKind::sgd_update) return input_count == 3 ? std::vector<int>{0, 2} : std::vector<int>{0};
  return {};
}

}  // namespace sg
