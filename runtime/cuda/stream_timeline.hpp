#pragma once
// A model of one step's launches on the streams of its plan
// (stream_plan.hpp), for `stepgraph profile`: each launch takes the time it
// is given, no launch slows another, and a launch starts when its stream is
// free and everything the plan makes it wait for has ended, the way
// CudaProgram::record enqueues a step inside a capture (forks after what the
// step's stream has enqueued so far, joins, waits on the other side
// streams). What it tells: how long the step would be were the overlap
// perfect, and the chain of launches that sets that length (its critical
// path), so a profile can say which stream the step's end waits on. Where
// the measured step is longer, the launches slow each other when they
// overlap.
#include <cstddef>
#include <vector>

#include "runtime/cuda/stream_plan.hpp"

namespace sg::cuda {

enum class TimelineStream : int { step, gradient_1, gradient_2, communication };

struct StreamTimeline {
  std::vector<double> start, end;       // per launch, from the step's start
  std::vector<TimelineStream> stream;   // per launch
  // Per launch: the launch whose end its start waited for last (its
  // stream's previous launch, or one the plan makes it wait for); -1 when it
  // starts with the step.
  std::vector<long> after;
  double step = 0;                          // when the last launch ends
  std::vector<std::size_t> critical_path;   // first launch to the one that ends the step
};

// durations: per launch of the plan's schedule (microseconds or any unit).
StreamTimeline model_stream_timeline(const StreamPlan& plan, const std::vector<double>& durations);

}  // namespace sg::cuda
