#pragma once
// The table `stepgraph profile` prints and writes: one row per launch (CUDA)
// or per fused unit (CPU reference executor), with median/min time, share of
// the step, the gap before it, bytes moved, FLOPs and achieved rates, then
// totals (sum of the rows vs the step timed whole) and the whole-run phases.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sg::report {

struct ProfileRow {
  int index = 0;
  std::string name;     // lowering name (CUDA) or fusion kind / op (CPU)
  std::string label;    // longer description (launch_label on CUDA)
  std::vector<int> nodes;
  std::string ops;      // "matmul+bias_add+relu"
  std::string shapes;   // output shapes of its nodes
  double median_us = 0, min_us = 0;
  double share = 0;     // median / sum of the rows' medians
  double gap_us = 0;    // median idle time before it (from the previous row's end)
  double start_us = 0;  // median start from the step's first row
  double bytes = 0, flops = 0;
  double gbs() const { return median_us > 0 ? bytes / (median_us * 1e3) : 0; }
  double tflops() const { return median_us > 0 ? flops / (median_us * 1e6) : 0; }
};

struct ProfileTotal {
  std::string name;
  double us = 0;
  std::string note;
};

struct ProfileReport {
  std::string config, backend, device, method;
  int repeats = 0;
  std::vector<ProfileRow> rows;
  std::vector<ProfileTotal> totals;
  double peak_gbs = 0, peak_tflops = 0;  // what GB/s and TFLOP/s are read against
  std::string peak_source;
  nlohmann::json phases;                 // RunTiming::to_json()
  std::string phases_text;               // RunTiming::format()
  nlohmann::json extra = nlohmann::json::object();  // SM clock, floors
  double sum_median_us() const;
};

std::string format_table(const ProfileReport& r);  // terminal
std::string to_csv(const ProfileReport& r);
nlohmann::json to_json(const ProfileReport& r);
std::string to_svg(const ProfileReport& r);       // horizontal bar chart of the rows' medians

double median(std::vector<double> v);  // 0 for an empty vector

}  // namespace sg::report
