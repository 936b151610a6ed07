#include "apps/report/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace sg::report {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Maps data values to pixels along one axis (linear or log10).
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double t(double v) const { return log ? std::log10(v) : v; }
  double frac(double v) const { return (t(v) - t(lo)) / (t(hi) - t(lo)); }

  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      for (double d = std::floor(std::log10(lo)); d <= std::ceil(std::log10(hi)); d += 1) {
        const double v = std::pow(10.0, d);
        if (v >= lo * 0.999 && v <= hi * 1.001) out.push_back(v);
      }
      if (out.size() < 3) {  // less than two decades: ticks at powers of two read better
        out.clear();
        for (double v = std::exp2(std::ceil(std::log2(lo))); v <= hi * 1.001; v *= 2) out.push_back(v);
      }
      return out;
    }
    const double raw = (hi - lo) / 5.0;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
    // k * step, not a running sum (no drift); "+ 0.0" and the snap make the zero tick "0", never "-0".
    for (double k = std::ceil(lo / step); k * step <= hi + step * 1e-9; k += 1) {
      const double v = k * step + 0.0;
      out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
    }
    return out;
  }
};

Axis fit_axis(const std::vector<Series>& series, bool use_x, bool log) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : series)
    for (double v : use_x ? s.x : s.y)
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  if (!std::isfinite(lo)) lo = hi = 1;
  if (lo == hi) {
    lo = log ? lo / 2 : lo - 1;
    hi = log ? hi * 2 : hi + 1;
  } else if (!log) {
    const double pad = 0.05 * (hi - lo);
    lo -= pad;
    hi += pad;
  }
  return {lo, hi, log};
}

std::string tick_label(double v) { return fmt::format("{:.4g}", v); }

}  // namespace

std::string render_svg(const PlotSpec& spec, const std::vector<Series>& series) {
  for (const auto& s : series) {
    if (s.x.size() != s.y.size())
      throw std::invalid_argument(fmt::format("plot series '{}': {} x values but {} y values", s.name, s.x.size(), s.y.size()));
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if ((spec.log_x && s.x[i] <= 0) || (spec.log_y && s.y[i] <= 0))
        throw std::invalid_argument(fmt::format("plot series '{}': non-positive value on a log axis", s.name));
  }
  const Axis xa = fit_axis(series, true, spec.log_x), ya = fit_axis(series, false, spec.log_y);
  const double left = 80, right = 200, top = 40, bottom = 60;
  const double pw = spec.width - left - right, ph = spec.height - top - bottom;
  auto px = [&](double v) { return left + xa.frac(v) * pw; };
  auto py = [&](double v) { return top + (1 - ya.frac(v)) * ph; };

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
      "width=\"{}\" height=\"{}\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
      spec.width, spec.height, left + pw / 2, escape_xml(spec.title));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", left, top, pw, ph);
  for (double v : xa.ticks())
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
                       px(v), top, top + ph, top + ph + 16, tick_label(v));
  for (double v : ya.ticks())
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                       "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
                       left, py(v), left + pw, left - 6, py(v) + 4, tick_label(v));
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2, spec.height - 18,
                     escape_xml(spec.x_label));
  svg += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                     top + ph / 2, escape_xml(spec.y_label));
  for (std::size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const char* color = kColors[i % std::size(kColors)];
    std::string points;
    std::string markers;
    for (std::size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k])) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(s.x[k]), py(s.y[k]));
      if (s.x.size() <= 64) markers += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", px(s.x[k]), py(s.y[k]), color);
    }
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>{}\n", color, points, markers);
    const double ly = top + 16 + 20 * double(i);
    svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
                       "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
                       left + pw + 12, ly, left + pw + 36, color, left + pw + 42, ly + 4, escape_xml(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sg::report
