#include "apps/report/trace_json.hpp"

namespace sg::report {

nlohmann::json trace_json(const std::vector<TraceEvent>& events, const std::vector<TraceTrack>& tracks,
                          const nlohmann::json& other_data) {
  using nlohmann::json;
  json list = json::array();
  for (const auto& t : tracks) {
    list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", t.pid}, {"tid", t.tid}, {"args", {{"name", t.process_name}}}});
    list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", t.pid}, {"tid", t.tid}, {"args", {{"name", t.thread_name}}}});
  }
  for (const auto& e : events)
    list.push_back({{"name", e.name}, {"cat", e.cat}, {"ph", "X"}, {"ts", e.ts_us}, {"dur", e.dur_us},
                    {"pid", e.pid}, {"tid", e.tid}, {"args", e.args}});
  return {{"traceEvents", list}, {"displayTimeUnit", "ns"}, {"otherData", other_data}};
}

}  // namespace sg::report
