#pragma once
// Per-run metrics: one row per logged step, written as CSV and JSON
// (atomically) into the run's output folder.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace sg::report {

struct MetricsRow {
  std::int64_t step = 0;
  double train_loss = std::numeric_limits<double>::quiet_NaN();
  double test_loss = std::numeric_limits<double>::quiet_NaN();     // NaN when not evaluated
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();  // fraction in [0,1]
  double lr = 0;
  double elapsed_s = 0;
};

// loss.svg's y axis (run.loss_plot_scale): automatic is log when every plotted value is > 0 and
// they span more than two decades (a regression run's late losses are otherwise a flat line at 0).
enum class LossPlotScale { linear, log, automatic };
// "linear" | "log" | "auto"; throws std::invalid_argument for another name.
LossPlotScale loss_plot_scale(const std::string& name);

class MetricsLog {
 public:
  void add(const MetricsRow& row) { rows_.push_back(row); }
  // The rows of a metrics.csv that write() produced (empty fields -> NaN).
  // Throws io::IoError naming the file on a malformed one.
  static std::vector<MetricsRow> read_csv(const std::filesystem::path& csv);
  const std::vector<MetricsRow>& rows() const { return rows_; }
  // Writes <dir>/metrics.csv and <dir>/metrics.json (NaN -> empty / null).
  void write(const std::filesystem::path& dir) const;
  // Writes <dir>/loss.svg: train loss and test loss over steps, test accuracy if any.
  void write_loss_plot(const std::filesystem::path& dir, const std::string& title,
                       LossPlotScale scale = LossPlotScale::automatic) const;
  // That plot's SVG text.
  std::string loss_plot_svg(const std::string& title, LossPlotScale scale = LossPlotScale::automatic) const;

 private:
  std::vector<MetricsRow> rows_;
};

}  // namespace sg::report
