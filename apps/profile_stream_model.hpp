#pragma once
// `stepgraph profile`'s modeled step: the launches' measured times laid on
// the program's streams (runtime/cuda/stream_timeline.hpp) with the overlap
// its plan allows, as one total row, and the whole timeline in the report's
// JSON ("stream_model"). CUDA builds only.
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/report/profile_table.hpp"
#include "runtime/cuda/stream_plan.hpp"

namespace sg::app {

// rows: one per launch of the plan's schedule, in order (median_us each);
// stream_step_us: the same step launched on one stream without per-launch
// events, to which the medians are scaled (the event pairs inflate each).
report::ProfileTotal stream_model_total(const cuda::StreamPlan& plan, const std::vector<report::ProfileRow>& rows,
                                        double stream_step_us, nlohmann::json& extra);

}  // namespace sg::app
