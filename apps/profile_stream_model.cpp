#include "apps/profile_stream_model.hpp"

#include <string>

#include <fmt/format.h>

#include "runtime/cuda/stream_timeline.hpp"

namespace sg::app {

// Were the side streams' launches to overlap perfectly, how long the step
// would be and which launches set its end.
report::ProfileTotal stream_model_total(const cuda::StreamPlan& plan, const std::vector<report::ProfileRow>& rows,
                                        double stream_step_us, nlohmann::json& extra) {
  double sum = 0;
  for (const auto& row : rows) sum += row.median_us;
  const double scale = sum > 0 && stream_step_us > 0 ? stream_step_us / sum : 1.0;
  std::vector<double> durations;
  for (const auto& row : rows) durations.push_back(row.median_us * scale);
  const cuda::StreamTimeline t = cuda::model_stream_timeline(plan, durations);
  static constexpr const char* kStreamNames[] = {"step", "gradient 1", "gradient 2", "communication"};
  const auto name = [&](std::size_t k) { return kStreamNames[static_cast<int>(t.stream[k])]; };
  std::string path;
  nlohmann::json launches = nlohmann::json::array();
  for (std::size_t k : t.critical_path)
    path += t.stream[k] == cuda::TimelineStream::step ? fmt::format(" L{}", k) : fmt::format(" L{}({})", k, name(k));
  for (std::size_t k = 0; k < durations.size(); ++k)
    launches.push_back({{"index", k}, {"stream", name(k)}, {"start_us", t.start[k]}, {"end_us", t.end[k]}});
  extra["stream_model"] = {{"scale", scale}, {"step_us", t.step}, {"critical_path", t.critical_path},
                           {"launches", launches}};
  const std::string last = t.critical_path.empty() ? "nothing" : name(t.critical_path.back());
  return {"modeled step on the streams (no slowdown from overlap)", t.step,
          fmt::format("launch times x {:.2f}; the end waits on the {} stream; critical path:{}", scale, last, path)};
}

}  // namespace sg::app
