#pragma once
// The elements of a parameter an update launch updates: all of them, or with
// a sharded gradient (ZeRO-1, issue 38: its bucket's AllReduceAttrs::shards)
// this rank's range, the only one its reduce-scatter left the mean in.
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/graph_queries.hpp"

namespace sg::cuda {

struct ElementRange {
  std::int64_t begin = 0, count = 0;
};

// Throws CudaError unless a graph's `shards` are the process group's `ranks`
// (`what`: the sharded tensor or bucket, for the message).
inline void check_shard_count(std::int64_t shards, std::int64_t ranks, const std::string& what) {
  if (shards != ranks)
    throw CudaError(fmt::format("{} is sharded {} ways in a process group of {} ranks: the graph was built for another "
                                "world size", what, shards, ranks));
}

// `grad` as the update reads it (before or after a widening cast); `count`
// the parameter's elements. Throws CudaError when the graph's shards are not
// this process group's ranks.
inline ElementRange update_range(const BindContext& c, ValueId grad, std::int64_t count) {
  const std::int64_t shards = gradient_shards(c.graph(), grad);
  if (shards <= 1) return {0, count};
  const auto group = c.group_rank();
  check_shard_count(shards, group.ranks, "an updated parameter");
  return {group.rank * (count / shards), count / shards};
}

// A device pointer `range.begin` elements of `dtype` into `base`.
template <typename T>
T* advanced(void* base, DType dtype, const ElementRange& range) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + range.begin * static_cast<std::int64_t>(dtype_size(dtype)));
}

}  // namespace sg::cuda
