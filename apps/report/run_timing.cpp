#include "apps/report/run_timing.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace sg::report {
namespace {
const RunTiming::Clock::time_point g_program_start = RunTiming::Clock::now();
}

double seconds_since_program_start() {
  return std::chrono::duration<double>(RunTiming::Clock::now() - g_program_start).count();
}

void RunTiming::add(const std::string& phase, double seconds) {
  auto it = std::find_if(phases_.begin(), phases_.end(), [&](const auto& p) { return p.first == phase; });
  if (it == phases_.end()) phases_.emplace_back(phase, seconds);
  else it->second += seconds;
}

void RunTiming::add_part(const std::string& phase, const std::string& part, double seconds) {
  parts_.push_back({phase, part, seconds});
}

std::vector<std::pair<std::string, double>> RunTiming::parts_of(const std::string& phase) const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& p : parts_)
    if (p.phase == phase) out.emplace_back(p.part, p.seconds);
  return out;
}

double RunTiming::sum() const {
  double s = 0;
  for (const auto& [_, v] : phases_) s += v;
  return s;
}

std::string RunTiming::format(const std::string& title) const {
  const double wall = seconds_since_program_start();
  std::string out = title + " (wall time, std::chrono::steady_clock):\n";
  for (const auto& [name, s] : phases_) {
    out += fmt::format("  {:<72} {:>8.3f} s {:>6.1f}%\n", name, s, wall > 0 ? 100 * s / wall : 0.0);
    for (const auto& [part, ps] : parts_of(name)) out += fmt::format("      {:<68} {:>8.3f} s\n", part, ps);
  }
  out += fmt::format("  {:<72} {:>8.3f} s {:>6.1f}%\n", "sum of the phases above", sum(), wall > 0 ? 100 * sum() / wall : 0.0);
  out += fmt::format("  {:<72} {:>8.3f} s\n", "since program start (the rest: start-up, config, logging)", wall);
  return out;
}

nlohmann::json RunTiming::to_json() const {
  nlohmann::json phases = nlohmann::json::array();
  for (const auto& [name, s] : phases_) {
    nlohmann::json phase{{"phase", name}, {"seconds", s}};
    for (const auto& [part, ps] : parts_of(name)) phase["parts"].push_back({{"part", part}, {"seconds", ps}});
    phases.push_back(std::move(phase));
  }
  return {{"phases", phases}, {"sum_seconds", sum()}, {"since_program_start_seconds", seconds_since_program_start()}};
}

}  // namespace sg::report
