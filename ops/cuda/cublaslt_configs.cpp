#include "ops/cuda/cublaslt_configs.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <set>

#include <fmt/format.h>

namespace sg::cuda {
namespace {

// Cluster shapes tried: cuBLASLt's own choice, 1x1, 2x1, 4x1, 1x2, 2x2 (the
// winners of an exhaustive search over all shapes were among these).
constexpr std::array<std::uint16_t, 6> kClusterShapes = {
    CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
    CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
constexpr std::uint32_t kMaxCustomOption = 3;

template <typename T>
T config_of(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T value{};
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS)
    return T{};
  return value;
}

// A capability that is a list of uint32 ids (tiles, stages); {0} (undefined:
// cuBLASLt's default) when the algorithm lists none.
std::vector<std::uint32_t> capability_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  std::size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0)
    return {0};
  std::vector<std::uint32_t> ids(bytes / sizeof(std::uint32_t));
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {0};
  return ids;
}

std::uint32_t capability_u32(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  std::int32_t value = 0;
  std::size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, &value, sizeof value, &written) != CUBLAS_STATUS_SUCCESS) return 0;
  return static_cast<std::uint32_t>(std::max(value, 0));
}

struct Config {
  std::uint32_t tile, stages, swizzle, custom;
  std::uint16_t cluster;
};

// Returns false where cuBLASLt rejects a value (an attribute this algorithm
// does not have).
bool apply(cublasLtMatmulAlgo_t& algo, const Config& c) {
  // (split-K adds a reduction pass over the output: split_k_configs, for the shapes it can pay for)
  const std::uint32_t split_k = 1;
  return cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster,
                                              sizeof c.cluster) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle,
                                              sizeof c.swizzle) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom,
                                              sizeof c.custom) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k) ==
             CUBLAS_STATUS_SUCCESS;
}

bool same_algo(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}

}  // namespace

std::vector<cublasLtMatmulAlgo_t> candidate_configs(cublasLtHandle_t handle, const LtDescriptors& desc,
                                                    const std::vector<cublasLtMatmulAlgo_t>& heuristic,
                                                    std::size_t workspace_bytes) {
  std::vector<cublasLtMatmulAlgo_t> out = heuristic;
  auto known = [&](const cublasLtMatmulAlgo_t& a) {
    return std::any_of(out.begin(), out.end(), [&](const auto& o) { return same_algo(o, a); });
  };
  std::set<std::int32_t> ids_done;
  for (const cublasLtMatmulAlgo_t& base : heuristic) {
    if (!ids_done.insert(config_of<std::int32_t>(base, CUBLASLT_ALGO_CONFIG_ID)).second) continue;
    const auto tiles = capability_ids(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    const auto stages = capability_ids(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    const std::uint32_t swizzle_max = capability_u32(base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) ? 1 : 0;
    const std::uint32_t custom_max = std::min(capability_u32(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), kMaxCustomOption);
    for (std::uint32_t tile : tiles)
      for (std::uint32_t stage : stages)
        for (std::uint16_t cluster : kClusterShapes)
          for (std::uint32_t swizzle = 0; swizzle <= swizzle_max; ++swizzle)
            for (std::uint32_t custom = 0; custom <= custom_max; ++custom) {
              cublasLtMatmulAlgo_t algo = base;
              if (!apply(algo, {tile, stage, swizzle, custom, cluster})) continue;
              cublasLtMatmulHeuristicResult_t check{};
              if (cublasLtMatmulAlgoCheck(handle, desc.op, desc.a, desc.b, desc.c, desc.c, &algo, &check) !=
                  CUBLAS_STATUS_SUCCESS)
                continue;
              if (check.workspaceSize > workspace_bytes || known(algo)) continue;
              out.push_back(algo);
            }
  }
  return out;
}

std::string describe_config(const cublasLtMatmulAlgo_t& algo) {
  const auto splits = config_of<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  return fmt::format("algorithm {}, tile {}, stages {}{}", config_of<std::int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
                     config_of<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     config_of<std::uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                     splits > 1 ? fmt::format(", split-K {}", splits) : "");
}

std::vector<cublasLtMatmulAlgo_t> split_k_configs(cublasLtHandle_t handle, const LtDescriptors& desc,
                                                  const std::vector<cublasLtMatmulAlgo_t>& heuristic,
                                                  std::size_t workspace_bytes) {
  constexpr std::array<std::uint32_t, 4> kSplits = {2, 4, 8, 16};
  // The partial sums go to the workspace in the compute type and one pass adds them up in a fixed order: the
  // same bits every run, fp32 partials for an fp16/bf16 output (CUBLASLT_REDUCTION_SCHEME_INPLACE would add
  // them in the output's type).
  const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  std::vector<cublasLtMatmulAlgo_t> out;
  for (const cublasLtMatmulAlgo_t& base : heuristic) {
    if (capability_u32(base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) == 0) continue;
    if ((capability_u32(base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK) & scheme) == 0) continue;
    for (const std::uint32_t splits : kSplits) {
      cublasLtMatmulAlgo_t algo = base;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) !=
              CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(handle, desc.op, desc.a, desc.b, desc.c, desc.c, &algo, &check) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      const auto same = [&](const cublasLtMatmulAlgo_t& o) { return same_algo(o, algo); };
      const bool known =
          std::any_of(out.begin(), out.end(), same) || std::any_of(heuristic.begin(), heuristic.end(), same);
      if (check.workspaceSize > workspace_bytes || known) continue;
      out.push_back(algo);
    }
  }
  return out;
}

}  // namespace sg::cuda
