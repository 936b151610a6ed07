#pragma once
// Training progress: on a terminal one line updated in place (at most ~10
// times a second); when piped, plain lines every `log_every` steps.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace sg::report {

struct ProgressSample {
  std::int64_t step = 0;         // steps done
  std::int64_t total_steps = 0;
  double loss = 0;
  double samples_per_s = 0;
  double us_per_step = 0;
  double eta_s = 0;
};

std::string format_progress(const ProgressSample& s);  // "step 1200/5000 loss 0.3121 ..."

class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool interactive, std::int64_t log_every);
  // Called after every launch; prints when due. `force` prints regardless.
  void update(const ProgressSample& s, bool force = false);
  void finish();  // ends an in-place line with a newline

 private:
  std::FILE* out_;
  bool interactive_;
  std::int64_t log_every_;
  std::int64_t last_logged_step_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
  bool line_open_ = false;
};

}  // namespace sg::report
