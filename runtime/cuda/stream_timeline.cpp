#include "runtime/cuda/stream_timeline.hpp"

#include <stdexcept>

namespace sg::cuda {
namespace {

// When a stream may run its next launch, and the launch that set that time.
struct Ready {
  double at = 0;
  long by = -1;
  void wait(double t, long launch) {
    if (t > at) {
      at = t;
      by = launch;
    }
  }
};

}  // namespace

StreamTimeline model_stream_timeline(const StreamPlan& plan, const std::vector<double>& durations) {
  const std::size_t n = durations.size();
  if (plan.on_communication.size() != n || plan.on_gradient_stream.size() != n)
    throw std::invalid_argument("model_stream_timeline: one duration per launch of the plan");
  StreamTimeline t;
  t.start.assign(n, 0);
  t.end.assign(n, 0);
  t.stream.assign(n, TimelineStream::step);
  t.after.assign(n, -1);
  Ready step, gradient[2], communication;
  // Launch k on `stream`, after `ready` (the stream's own state and what it waits for).
  const auto run = [&](std::size_t k, Ready ready, Ready& stream, TimelineStream which) {
    t.start[k] = ready.at;
    t.after[k] = ready.by;
    t.end[k] = ready.at + durations[k];
    t.stream[k] = which;
    stream = {t.end[k], static_cast<long>(k)};
  };
  const auto join = [&](std::size_t index) {
    for (std::size_t c : plan.joined_before(index)) step.wait(t.end[c], static_cast<long>(c));
  };
  for (std::size_t i = 0; i < n; ++i) {
    join(i);
    for (std::size_t g : plan.forked_before(i)) {
      const int lane = plan.gradient_lane[g];
      Ready ready = gradient[lane];
      ready.wait(step.at, step.by);  // the fork: after what the step's stream has run so far
      for (std::size_t c : plan.waits_for[g]) ready.wait(t.end[c], static_cast<long>(c));
      run(g, ready, gradient[lane], lane == 0 ? TimelineStream::gradient_1 : TimelineStream::gradient_2);
    }
    if (plan.on_communication[i]) {
      Ready ready = communication;
      ready.wait(step.at, step.by);
      for (std::size_t g : plan.waits_for[i]) ready.wait(t.end[g], static_cast<long>(g));
      run(i, ready, communication, TimelineStream::communication);
    } else if (plan.on_step_stream(i)) {
      run(i, step, step, TimelineStream::step);
    }
  }
  join(n);
  long last = step.by;
  for (std::size_t k = 0; k < n; ++k)
    if (last < 0 || t.end[k] > t.end[static_cast<std::size_t>(last)]) last = static_cast<long>(k);
  t.step = last < 0 ? 0 : t.end[static_cast<std::size_t>(last)];
  for (long k = last; k >= 0; k = t.after[static_cast<std::size_t>(k)])
    t.critical_path.insert(t.critical_path.begin(), static_cast<std::size_t>(k));
  return t;
}

}  // namespace sg::cuda
