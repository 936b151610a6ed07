#include "apps/report/metrics_log.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "apps/report/svg_plot.hpp"
#include "runtime/io/atomic_file.hpp"

namespace sg::report {
namespace {

std::string csv_number(double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : ""; }
nlohmann::json json_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

double csv_field(const std::string& text) {
  if (text.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::size_t used = 0;
  const double v = std::stod(text, &used);
  if (used != text.size()) throw std::invalid_argument(text);
  return v;
}

}  // namespace

std::vector<MetricsRow> MetricsLog::read_csv(const std::filesystem::path& csv) {
  std::istringstream in(io::read_file(csv));
  std::string line;
  std::vector<MetricsRow> rows;
  std::getline(in, line);  // header
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string field; std::getline(ss, field, ',');) f.push_back(field);
    if (!line.empty() && line.back() == ',') f.emplace_back();
    try {
      if (f.size() != 6) throw std::invalid_argument("field count");
      rows.push_back({std::stoll(f[0]), csv_field(f[1]), csv_field(f[2]), csv_field(f[3]), csv_field(f[4]), csv_field(f[5])});
    } catch (const std::exception&) {
      throw io::IoError(fmt::format("{}:{}: not a metrics row (step,train_loss,test_loss,test_accuracy,lr,elapsed_s): '{}'",
                                    csv.string(), number, line));
    }
  }
  return rows;
}

void MetricsLog::write(const std::filesystem::path& dir) const {
  std::string csv = "step,train_loss,test_loss,test_accuracy,lr,elapsed_s\n";
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : rows_) {
    csv += fmt::format("{},{},{},{},{},{}\n", r.step, csv_number(r.train_loss), csv_number(r.test_loss),
                       csv_number(r.test_accuracy), csv_number(r.lr), csv_number(r.elapsed_s));
    rows.push_back({{"step", r.step}, {"train_loss", json_number(r.train_loss)}, {"test_loss", json_number(r.test_loss)},
                    {"test_accuracy", json_number(r.test_accuracy)}, {"lr", json_number(r.lr)},
                    {"elapsed_s", json_number(r.elapsed_s)}});
  }
  io::write_file_atomically(dir / "metrics.csv", csv);
  io::write_file_atomically(dir / "metrics.json", nlohmann::json{{"rows", rows}}.dump(2) + "\n");
}

LossPlotScale loss_plot_scale(const std::string& name) {
  if (name == "linear") return LossPlotScale::linear;
  if (name == "log") return LossPlotScale::log;
  if (name == "auto") return LossPlotScale::automatic;
  throw std::invalid_argument(fmt::format("loss plot scale '{}' is not one of linear, log, auto", name));
}

void MetricsLog::write_loss_plot(const std::filesystem::path& dir, const std::string& title, LossPlotScale scale) const {
  io::write_file_atomically(dir / "loss.svg", loss_plot_svg(title, scale));
}

std::string MetricsLog::loss_plot_svg(const std::string& title, LossPlotScale scale) const {
  Series train{"train loss", {}, {}}, test{"test loss", {}, {}}, acc{"test error (1 - accuracy)", {}, {}};
  for (const auto& r : rows_) {
    if (std::isfinite(r.train_loss)) {
      train.x.push_back(double(r.step));
      train.y.push_back(r.train_loss);
    }
    if (std::isfinite(r.test_loss)) {
      test.x.push_back(double(r.step));
      test.y.push_back(r.test_loss);
    }
    if (std::isfinite(r.test_accuracy)) {  // a regression run measures none
      acc.x.push_back(double(r.step));
      acc.y.push_back(1.0 - r.test_accuracy);
    }
  }
  std::vector<Series> series;
  for (auto* s : {&train, &test, &acc})
    if (!s->x.empty()) series.push_back(*s);
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  for (const auto& s : series)
    for (double y : s.y) {
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
  const bool log = scale == LossPlotScale::log || (scale == LossPlotScale::automatic && lo > 0 && hi > 100 * lo);
  if (log)  // a log axis has no place for 0 (a test error of 0 at 100% accuracy): those points are left out
    for (auto& s : series)
      for (std::size_t i = s.y.size(); i-- > 0;)
        if (!(s.y[i] > 0)) {
          s.x.erase(s.x.begin() + static_cast<std::ptrdiff_t>(i));
          s.y.erase(s.y.begin() + static_cast<std::ptrdiff_t>(i));
        }
  return render_svg({title, "step", log ? "loss / error (log scale)" : "loss / error", false, log}, series);
}

}  // namespace sg::report
