#pragma once
// Where a whole run's wall time goes: named phases (data load, backend
// construction, training, evaluation, writing outputs) timed with
// std::chrono::steady_clock, against the time since the program started
// (static initialisation, i.e. after the dynamic loader).
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace sg::report {

class RunTiming {
 public:
  using Clock = std::chrono::steady_clock;
  // Adds `seconds` to `phase` (phases keep the order they first appear in).
  void add(const std::string& phase, double seconds);
  // Times f() as `phase` and returns what it returns.
  template <typename F>
  auto time(const std::string& phase, F&& f) {
    struct Stop {
      RunTiming& t;
      const std::string& phase;
      Clock::time_point start = Clock::now();
      ~Stop() { t.add(phase, std::chrono::duration<double>(Clock::now() - start).count()); }
    } stop{*this, phase};
    return f();
  }
  // A named part of `phase` (already added), shown indented under it and not
  // counted again in sum().
  void add_part(const std::string& phase, const std::string& part, double seconds);
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }
  // The parts of `phase`, in the order added.
  std::vector<std::pair<std::string, double>> parts_of(const std::string& phase) const;
  double sum() const;
  // Lines "  phase  1.234 s  56.7%", then the phases' sum and the wall time
  // since the program started (the rest: process start-up, config, logging).
  std::string format(const std::string& title) const;
  nlohmann::json to_json() const;

 private:
  struct Part {
    std::string phase, part;
    double seconds = 0;
  };
  std::vector<std::pair<std::string, double>> phases_;
  std::vector<Part> parts_;
};

double seconds_since_program_start();

}  // namespace sg::report
