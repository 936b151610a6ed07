#include "apps/report/progress.hpp"

#include <fmt/format.h>

namespace sg::report {

std::string format_progress(const ProgressSample& s) {
  return fmt::format("step {}/{} | loss {:.4f} | {:.0f} samples/s | {:.1f} us/step | ETA {:.1f} s", s.step, s.total_steps,
                     s.loss, s.samples_per_s, s.us_per_step, s.eta_s);
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool interactive, std::int64_t log_every)
    : out_(out), interactive_(interactive), log_every_(log_every) {}

void ProgressPrinter::update(const ProgressSample& s, bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (interactive_) {
    if (!force && line_open_ && now - last_draw_ < std::chrono::milliseconds(100) && s.step < s.total_steps) return;
    std::fprintf(out_, "\r%s\x1b[K", format_progress(s).c_str());
    line_open_ = true;
  } else {
    if (!force && last_logged_step_ >= 0 && s.step - last_logged_step_ < log_every_ && s.step < s.total_steps) return;
    std::fprintf(out_, "%s\n", format_progress(s).c_str());
  }
  std::fflush(out_);
  last_draw_ = now;
  last_logged_step_ = s.step;
}

void ProgressPrinter::finish() {
  if (interactive_ && line_open_) std::fprintf(out_, "\n");
  line_open_ = false;
}

}  // namespace sg::report
