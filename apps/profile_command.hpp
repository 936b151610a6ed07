#pragma once
// `stepgraph profile`: where a training step's time goes, for any config the
// trainer accepts. On the CUDA backend one row per launch of the step (named
// by its lowering), timed with CUDA events; on the CPU backend one row per
// fused unit (fusion group or lone node) of the reference executor, timed
// with std::chrono. Prints a table and writes profile.{txt,csv,json,svg} and
// a Chrome/Perfetto trace (docs/profiling.md).
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "apps/report/profile_table.hpp"
#include "apps/report/run_timing.hpp"
#include "apps/report/trace_json.hpp"

namespace CLI {
class App;
}

namespace sg::app {

struct ProfileRequest {
  int steps = 50;       // profiled steps (each row's median and min are over these)
  int warmup = 20;      // untimed steps first
  std::string trace;    // trace path ("" = <out-dir>/trace.json)
  std::string out_dir;  // "" = <run.out_dir>/profile
  bool floors = true;   // CUDA: measure the bench's floors for the rates
};

void add_profile_options(CLI::App& cmd, ProfileRequest& r);

struct ProfileResult {
  report::ProfileReport report;
  std::vector<report::TraceEvent> events;
  std::vector<report::TraceTrack> tracks;
};

// Profiles `config` (data loaded as configured); `timing` receives the run's
// phases (data load, backend construction, ...). No files written.
ProfileResult profile_config(const TrainConfig& config, const ProfileRequest& request, report::RunTiming& timing);

// profile_config, then prints the table and writes the files; returns the exit code.
int run_profile(const TrainConfig& config, const ProfileRequest& request);

}  // namespace sg::app
