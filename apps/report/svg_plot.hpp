#pragma once
// A small SVG line-plot writer (no Python, no gnuplot): axes with ticks,
// one polyline per series, a legend; optional log scales.
#include <string>
#include <vector>

namespace sg::report {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct PlotSpec {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 800, height = 500;
};

// Throws std::invalid_argument for series with mismatched lengths or for
// non-positive values on a log axis. Non-finite points are skipped.
std::string render_svg(const PlotSpec& spec, const std::vector<Series>& series);

}  // namespace sg::report
