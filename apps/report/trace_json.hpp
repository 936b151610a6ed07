#pragma once
// Chrome trace-event JSON (the format chrome://tracing and ui.perfetto.dev
// open): complete events ("ph":"X", microsecond ts/dur) on named tracks
// (one thread per stream), with process/thread names as "M" metadata events.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sg::report {

struct TraceEvent {
  std::string name, cat;
  double ts_us = 0, dur_us = 0;
  int pid = 1, tid = 1;
  nlohmann::json args = nlohmann::json::object();
};

struct TraceTrack {
  int pid = 1, tid = 1;
  std::string process_name, thread_name;
};

// {"traceEvents":[...], "displayTimeUnit":"ns", "otherData":{...}}
nlohmann::json trace_json(const std::vector<TraceEvent>& events, const std::vector<TraceTrack>& tracks,
                          const nlohmann::json& other_data = nlohmann::json::object());

}  // namespace sg::report
