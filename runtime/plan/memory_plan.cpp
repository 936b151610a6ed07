#include "runtime/plan/memory_plan.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace sg {

namespace {

bool lifetimes_overlap(const BufferLifetime& a, const BufferLifetime& b) { return a.first <= b.last && b.first <= a.last; }

}  // namespace

MemoryPlan plan_memory(std::vector<BufferLifetime> buffers, std::size_t alignment) {
  MemoryPlan plan;
  plan.slots.resize(buffers.size());
  std::vector<std::size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return buffers[a].bytes > buffers[b].bytes; });

  std::vector<std::size_t> placed;
  for (std::size_t i : order) {
    const std::size_t size = align_up(std::max<std::size_t>(buffers[i].bytes, 1), alignment);
    // Conflicting placed buffers, by offset; take the first gap that fits.
    std::vector<ArenaSlot> busy;
    for (std::size_t j : placed)
      if (lifetimes_overlap(buffers[i], buffers[j])) busy.push_back(plan.slots[j]);
    std::sort(busy.begin(), busy.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
    std::size_t offset = 0;
    for (const ArenaSlot& s : busy) {
      if (offset + size <= s.offset) break;
      offset = std::max(offset, align_up(s.offset + s.bytes, alignment));
    }
    plan.slots[i] = {offset, size};
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    plan.unshared_bytes += size;
    placed.push_back(i);
  }
  plan.buffers = std::move(buffers);
  return plan;
}

ArenaRequest arena_request(const Graph& g, const Schedule& s, const std::vector<std::size_t>& value_bytes,
                           const std::vector<std::size_t>& mask_bytes) {
  ArenaRequest req;
  req.buffer_of_value.assign(g.values().size(), -1);
  req.offset_in_buffer.assign(g.values().size(), 0);
  req.buffer_of_mask.assign(s.aux.size(), -1);
  const int end = static_cast<int>(s.launches.size()) - 1;
  // A view's output shares its input's buffer (chains resolve to the first).
  std::vector<ValueId> root(g.values().size());
  for (std::size_t i = 0; i < root.size(); ++i) root[i] = static_cast<ValueId>(i);
  for (const Launch& l : s.launches)
    for (const auto& [out, in] : l.aliases) root[static_cast<std::size_t>(out)] = root[static_cast<std::size_t>(in)];
  auto touch = [&](int& slot, std::string name, std::size_t bytes, int launch) {
    if (slot < 0) {
      slot = static_cast<int>(req.buffers.size());
      req.buffers.push_back({std::move(name), bytes, launch, launch});
    }
    auto& b = req.buffers[static_cast<std::size_t>(slot)];
    b.first = std::min(b.first, launch);
    b.last = std::max(b.last, launch);
  };
  for (int i = 0; i <= end; ++i) {
    const Launch& l = s.launches[static_cast<std::size_t>(i)];
    for (const auto* ids : {&l.writes, &l.reads, &l.scratch})
      for (ValueId id : *ids) {
        const ValueId owner = root[static_cast<std::size_t>(id)];
        const Value& v = g.value(owner);
        if (is_graph_owned(v.role)) continue;
        touch(req.buffer_of_value[static_cast<std::size_t>(owner)], v.name, value_bytes[static_cast<std::size_t>(owner)], i);
      }
    // A value carried to the next step keeps its bytes through the whole step.
    for (ValueId id : l.carries) {
      const ValueId owner = root[static_cast<std::size_t>(id)];
      int& slot = req.buffer_of_value[static_cast<std::size_t>(owner)];
      touch(slot, g.value(owner).name, value_bytes[static_cast<std::size_t>(owner)], 0);
      touch(slot, g.value(owner).name, value_bytes[static_cast<std::size_t>(owner)], end);
    }
    for (int mask : {l.aux_write, l.aux_read})
      if (mask >= 0)
        touch(req.buffer_of_mask[static_cast<std::size_t>(mask)], fmt::format("relu_mask{}", mask),
              mask_bytes[static_cast<std::size_t>(mask)], i);
  }
  for (ValueId out : g.outputs())
    if (int slot = req.buffer_of_value[static_cast<std::size_t>(root[static_cast<std::size_t>(out)])]; slot >= 0)
      req.buffers[static_cast<std::size_t>(slot)].last = end;
  for (std::size_t id = 0; id < root.size(); ++id)
    if (root[id] != static_cast<ValueId>(id))
      req.buffer_of_value[id] = req.buffer_of_value[static_cast<std::size_t>(root[id])];
  return req;
}

bool join_buffers(ArenaRequest& req, const std::vector<ValueId>& values, std::size_t alignment) {
  std::vector<int> members;
  for (ValueId v : values) {
    const int slot = req.buffer_of_value.at(static_cast<std::size_t>(v));
    if (slot < 0 || std::find(members.begin(), members.end(), slot) != members.end()) return false;
    members.push_back(slot);
  }
  if (members.size() < 2) return members.size() == 1;
  // The joined buffer takes the first member's index; the others leave the list.
  BufferLifetime joined{req.buffers[static_cast<std::size_t>(members.front())].name + "+joined", 0, 0, 0};
  joined.first = req.buffers[static_cast<std::size_t>(members.front())].first;
  joined.last = req.buffers[static_cast<std::size_t>(members.front())].last;
  std::vector<std::size_t> start(members.size());
  for (std::size_t m = 0; m < members.size(); ++m) {
    const BufferLifetime& b = req.buffers[static_cast<std::size_t>(members[m])];
    start[m] = align_up(joined.bytes, alignment);
    joined.bytes = start[m] + b.bytes;
    joined.first = std::min(joined.first, b.first);
    joined.last = std::max(joined.last, b.last);
  }
  std::vector<int> renumber(req.buffers.size(), -1);
  std::vector<BufferLifetime> kept;
  for (std::size_t b = 0; b < req.buffers.size(); ++b) {
    const auto m = std::find(members.begin(), members.end(), static_cast<int>(b));
    if (m != members.begin() && m != members.end()) continue;
    renumber[b] = static_cast<int>(kept.size());
    kept.push_back(b == static_cast<std::size_t>(members.front()) ? joined : req.buffers[b]);
  }
  for (std::size_t v = 0; v < req.buffer_of_value.size(); ++v) {
    int& slot = req.buffer_of_value[v];
    if (slot < 0) continue;
    if (const auto m = std::find(members.begin(), members.end(), slot); m != members.end()) {
      req.offset_in_buffer[v] += start[static_cast<std::size_t>(m - members.begin())];
      slot = renumber[static_cast<std::size_t>(members.front())];
    } else {
      slot = renumber[static_cast<std::size_t>(slot)];
    }
  }
  for (int& slot : req.buffer_of_mask)
    if (slot >= 0) slot = renumber[static_cast<std::size_t>(slot)];
  req.buffers = std::move(kept);
  return true;
}

std::string dump_memory_plan(const MemoryPlan& plan) {
  std::string out = fmt::format("# arena {} bytes for {} buffers totalling {} bytes ({:.1f}% saved by reuse)\n",
                                plan.arena_bytes, plan.buffers.size(), plan.unshared_bytes,
                                plan.unshared_bytes ? 100.0 * (1.0 - double(plan.arena_bytes) / double(plan.unshared_bytes)) : 0.0);
  for (std::size_t i = 0; i < plan.buffers.size(); ++i)
    out += fmt::format("{:<24} offset {:>10} bytes {:>10} live L{}..L{}\n", plan.buffers[i].name, plan.slots[i].offset,
                       plan.buffers[i].bytes, plan.buffers[i].first, plan.buffers[i].last);
  return out;
}

}  // namespace sg
