#pragma once
// What a StreamPlan guarantees about the order of a step's launches, worked
// out the way CudaProgram::record enqueues them (a hand-written model of the
// streams and their events, not the plan's own helpers): each launch
// gets the set of launches certain to have finished before it starts. The
// checks: two launches that touch the same value (one reads or writes what
// the other writes or updates) run in schedule order, and every launch has
// finished at the step's end (the next replay starts from a clean state).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "runtime/cuda/stream_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::test {

// Two launches that may not run at the same time: one reads or writes what the other writes, updates or carries.
inline bool conflict(const Launch& a, const Launch& b) {
  const auto meets = [](const std::vector<ValueId>& x, const std::vector<ValueId>& y) {
    return std::any_of(x.begin(), x.end(), [&](ValueId v) { return std::find(y.begin(), y.end(), v) != y.end(); });
  };
  std::vector<ValueId> ca = a.writes, cb = b.writes;
  ca.insert(ca.end(), a.updates.begin(), a.updates.end());
  cb.insert(cb.end(), b.updates.begin(), b.updates.end());
  ca.insert(ca.end(), a.carries.begin(), a.carries.end());  // written for the next step, after this one's reads
  cb.insert(cb.end(), b.carries.begin(), b.carries.end());
  return meets(a.reads, cb) || meets(ca, b.reads) || meets(ca, cb);
}

// finished_before[i][j]: launch j has finished when launch i starts; the last
// row (index n) is the step's end.
inline std::vector<std::vector<bool>> finished_before(const Schedule& s, const cuda::StreamPlan& plan) {
  const std::size_t n = s.launches.size();
  using Set = std::vector<bool>;
  const auto add = [](Set& into, const Set& from) {
    for (std::size_t k = 0; k < into.size(); ++k) into[k] = into[k] || from[k];
  };
  std::vector<Set> before(n + 1, Set(n, false));
  Set step(n, false), communication(n, false);  // what a stream's next launch waits for
  Set gradient[2] = {Set(n, false), Set(n, false)};  // per gradient lane
  const auto done = [&](std::size_t k) {
    Set d = before[k];
    d[k] = true;
    return d;
  };
  const auto run_on = [&](Set& stream, std::size_t k) {
    before[k] = stream;
    stream[k] = true;
  };
  for (std::size_t i = 0; i <= n; ++i) {
    for (std::size_t c : plan.joined_before(i)) add(step, done(c));
    if (i == n) break;
    for (std::size_t g : plan.forked_before(i)) {
      Set& lane = gradient[plan.gradient_lane[g]];
      add(lane, step);
      for (std::size_t c : plan.waits_for[g]) add(lane, done(c));
      run_on(lane, g);
    }
    if (plan.on_communication[i]) {
      add(communication, step);
      for (std::size_t g : plan.waits_for[i]) add(communication, done(g));
      run_on(communication, i);
    } else if (plan.on_step_stream(i)) {
      run_on(step, i);
    }
  }
  before[n] = step;
  return before;
}

inline void check_stream_order(const Schedule& s, const cuda::StreamPlan& plan) {
  const std::size_t n = s.launches.size();
  REQUIRE(plan.waits_for.size() == n);
  const auto before = finished_before(s, plan);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (conflict(s.launches[i], s.launches[j])) {
        INFO("L" << i << " " << s.launches[i].lowering->name() << " after L" << j << " "
                 << s.launches[j].lowering->name());
        CHECK(before[i][j]);
      }
  for (std::size_t j = 0; j < n; ++j) {
    INFO("L" << j << " finished at the step's end");
    CHECK(before[n][j]);
  }
}

}  // namespace sg::test
