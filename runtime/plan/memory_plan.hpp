#pragma once
// Assigns every activation/gradient buffer (and ReLU mask) of a schedule an
// offset in one arena by liveness: buffers whose lifetimes do not overlap
// share bytes. Backend-neutral; sizes come from the caller.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/plan/schedule.hpp"

namespace sg {

struct BufferLifetime {
  std::string name;
  std::size_t bytes = 0;
  int first = 0, last = 0;  // launch indices, inclusive
};

struct ArenaSlot {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

struct MemoryPlan {
  std::vector<BufferLifetime> buffers;  // activations/gradients first (by value id), then masks
  std::vector<ArenaSlot> slots;         // one per buffer
  std::size_t arena_bytes = 0;          // what is allocated
  std::size_t unshared_bytes = 0;       // sum of all buffers: what no reuse would cost
};

// Where arena buffers start, and where join_buffers places each value of a
// joined buffer (a collective checks that layout: nccl_all_reduce.cpp).
inline constexpr std::size_t kArenaAlignment = 256;
constexpr std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

// Greedy: largest buffers first, each at the lowest aligned offset that does
// not overlap a placed buffer with an overlapping lifetime.
MemoryPlan plan_memory(std::vector<BufferLifetime> buffers, std::size_t alignment = kArenaAlignment);

// Lifetimes of the activation/grad values a schedule writes and of its ReLU
// masks. A value lives from the launch writing it to the last launch reading
// it; graph outputs live to the end so the host can read them after the step.
// value_bytes[id] and mask_bytes[k] give sizes. Also returns, per value id,
// the index into MemoryPlan::buffers (-1 when the value has no arena slot).
struct ArenaRequest {
  std::vector<BufferLifetime> buffers;
  std::vector<int> buffer_of_value;
  std::vector<std::size_t> offset_in_buffer;  // per value id: where in its buffer it starts (0 but for joined ones)
  std::vector<int> buffer_of_mask;
};
ArenaRequest arena_request(const Graph& graph, const Schedule& schedule, const std::vector<std::size_t>& value_bytes,
                           const std::vector<std::size_t>& mask_bytes);

// Joins the buffers of `values` into ONE buffer, each value at the next
// `alignment` boundary after the previous one, in this order, live over the
// union of their lifetimes, so a collective can take them as one span (a
// data-parallel bucket on NCCL's symmetric kernels,
// runtime/cuda/lowerings/nccl_all_reduce.cpp). Values viewing a joined
// buffer move with it. Returns false and changes nothing when a value has no
// arena buffer or two of them share one.
bool join_buffers(ArenaRequest& request, const std::vector<ValueId>& values,
                  std::size_t alignment = kArenaAlignment);

std::string dump_memory_plan(const MemoryPlan& plan);

}  // namespace sg
