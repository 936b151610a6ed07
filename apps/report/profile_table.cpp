#include "apps/report/profile_table.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace sg::report {
namespace {

std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string short_text(const std::string& s, std::size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

// `text` in lines of at most `width` characters, broken at spaces (a longer word gets a line of its own).
std::vector<std::string> wrap_words(const std::string& text, std::size_t width) {
  std::vector<std::string> lines(1);
  std::size_t start = 0;
  while (start < text.size()) {
    const auto space = text.find(' ', start);
    const std::string word = text.substr(start, space == std::string::npos ? std::string::npos : space - start);
    start = space == std::string::npos ? text.size() : space + 1;
    if (!lines.back().empty() && lines.back().size() + 1 + word.size() > width) lines.emplace_back();
    lines.back() += (lines.back().empty() ? "" : " ") + word;
  }
  return lines;
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} KB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ProfileReport::sum_median_us() const {
  double s = 0;
  for (const auto& r : rows) s += r.median_us;
  return s;
}

std::string format_table(const ProfileReport& r) {
  std::string out = fmt::format("stepgraph profile: {}\nbackend: {}\ndevice: {}\nmethod: {} ({} repeats)\n", r.config,
                                r.backend, r.device, r.method, r.repeats);
  if (r.extra.contains("sm_clock_mhz")) out += fmt::format("SM clock: {} MHz\n", r.extra["sm_clock_mhz"].dump());
  if (r.peak_gbs > 0 || r.peak_tflops > 0)
    out += fmt::format("rates against: {:.0f} GB/s, {:.1f} TFLOP/s ({})\n", r.peak_gbs, r.peak_tflops, r.peak_source);
  else
    out += fmt::format("rates: {}\n", r.peak_source);
  out += "bytes: reads + writes + 2 x in-place updates (a gather counts the rows it fetches); FLOP: matmuls only\n\n";
  out += fmt::format("{:>3} {:<24} {:<40} {:>9} {:>9} {:>6} {:>8} {:>10} {:>10} {:>8} {:>7} {:>7}\n", "#", "lowering", "nodes (ops)",
                     "median us", "min us", "share", "gap us", "bytes", "FLOP", "GB/s", "TFLOP/s", "%peak");
  for (const auto& row : r.rows) {
    const double pct = std::max(r.peak_gbs > 0 ? row.gbs() / r.peak_gbs : 0.0, r.peak_tflops > 0 ? row.tflops() / r.peak_tflops : 0.0);
    const std::string peak = r.peak_gbs > 0 || r.peak_tflops > 0 ? fmt::format("{:.1f}%", 100 * pct) : "-";
    out += fmt::format("{:>3} {:<24} {:<40} {:>9.2f} {:>9.2f} {:>5.1f}% {:>8.2f} {:>10} {:>10.3g} {:>8.1f} {:>7.2f} {:>7}\n", row.index,
                       short_text(row.name, 24), short_text(row.ops, 40), row.median_us, row.min_us, 100 * row.share,
                       row.gap_us, human_bytes(row.bytes), row.flops, row.gbs(), row.tflops(), peak);
  }
  out += "\n";
  for (const auto& t : r.totals) out += fmt::format("  {:<44} {:>10.2f} us  {}\n", t.name, t.us, t.note);
  if (!r.phases_text.empty()) out += "\n" + r.phases_text;
  return out;
}

std::string to_csv(const ProfileReport& r) {
  std::string out = "index,lowering,nodes,ops,shapes,median_us,min_us,share,gap_us,start_us,bytes,flops,gbs,tflops\n";
  for (const auto& row : r.rows) {
    std::vector<std::string> nodes;
    for (int n : row.nodes) nodes.push_back(std::to_string(n));
    out += fmt::format("{},{},{},{},{},{:.3f},{:.3f},{:.4f},{:.3f},{:.3f},{:.0f},{:.0f},{:.2f},{:.4f}\n", row.index,
                       csv_quote(row.name), csv_quote(fmt::format("{}", fmt::join(nodes, " "))), csv_quote(row.ops),
                       csv_quote(row.shapes), row.median_us, row.min_us, row.share, row.gap_us, row.start_us, row.bytes,
                       row.flops, row.gbs(), row.tflops());
  }
  for (const auto& t : r.totals) out += fmt::format(",{},,,,{:.3f},,,,,,,,\n", csv_quote("total: " + t.name), t.us);
  return out;
}

nlohmann::json to_json(const ProfileReport& r) {
  using nlohmann::json;
  json rows = json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"index", row.index}, {"lowering", row.name}, {"label", row.label}, {"nodes", row.nodes},
                    {"ops", row.ops}, {"shapes", row.shapes}, {"median_us", row.median_us}, {"min_us", row.min_us},
                    {"share", row.share}, {"gap_us", row.gap_us}, {"start_us", row.start_us}, {"bytes", row.bytes},
                    {"flops", row.flops}, {"gbs", row.gbs()}, {"tflops", row.tflops()}});
  json totals = json::array();
  for (const auto& t : r.totals) totals.push_back({{"name", t.name}, {"us", t.us}, {"note", t.note}});
  return {{"config", r.config}, {"backend", r.backend}, {"device", r.device}, {"method", r.method},
          {"repeats", r.repeats}, {"rows", rows}, {"totals", totals}, {"sum_median_us", r.sum_median_us()},
          {"peak_gbs", r.peak_gbs}, {"peak_tflops", r.peak_tflops}, {"peak_source", r.peak_source},
          {"phases", r.phases}, {"extra", r.extra}};
}

std::string to_svg(const ProfileReport& r) {
  // Sized from the text (a fixed label column clipped long launch names on the left and the subtitle on
  // the right): about 7 px per character at 12 px sans-serif, 8 px at 14 px, generous rather than clipped.
  constexpr double char_px = 7.0, title_char_px = 8.0;
  const int bar_h = 22, bars = 500, right = 170;
  std::vector<std::string> labels;
  for (const auto& row : r.rows) labels.push_back(short_text(fmt::format("{} {} ({})", row.index, row.name, row.ops), 100));
  for (const auto& t : r.totals) labels.push_back(short_text(t.name, 100));
  std::size_t longest = 0;
  for (const auto& l : labels) longest = std::max(longest, l.size());
  const int left = 16 + static_cast<int>(std::ceil(double(longest) * char_px));
  const int width = std::max(1000, left + bars + right);
  const auto title = wrap_words("stepgraph profile: " + r.config, static_cast<std::size_t>((width - 20) / title_char_px));
  const auto subtitle =
      wrap_words(r.backend + " — median us per launch, " + r.method, static_cast<std::size_t>((width - 20) / char_px));
  const int top = 16 + 18 * int(title.size()) + 16 * int(subtitle.size());
  const int height = top + bar_h * int(labels.size()) + 40;
  double max_us = 0;
  for (const auto& row : r.rows) max_us = std::max(max_us, row.median_us);
  for (const auto& t : r.totals) max_us = std::max(max_us, t.us);
  if (max_us <= 0) max_us = 1;
  const double scale = double(width - left - right) / max_us;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  int text_y = 20;
  for (const auto& line : title) {
    out += fmt::format("<text x=\"10\" y=\"{}\" font-size=\"14\">{}</text>\n", text_y, xml_escape(line));
    text_y += 18;
  }
  for (const auto& line : subtitle) {
    out += fmt::format("<text x=\"10\" y=\"{}\">{}</text>\n", text_y, xml_escape(line));
    text_y += 16;
  }
  int y = top;
  std::size_t label = 0;
  const auto bar = [&](double us, double min_us, const char* color) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", left - 6, y + 15, xml_escape(labels[label++]));
    out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>\n", left, y + 3, std::max(0.5, us * scale), bar_h - 6, color);
    if (min_us > 0)
      out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", left + min_us * scale,
                         left + min_us * scale, y + 2, y + bar_h - 2);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{:.2f} us</text>\n", left + us * scale + 5, y + 15, us);
    y += bar_h;
  };
  for (const auto& row : r.rows) bar(row.median_us, row.min_us, "#4878cf");
  for (const auto& t : r.totals) bar(t.us, 0, "#d65f5f");
  out += fmt::format("<text x=\"10\" y=\"{}\">blue: rows (median; tick: min); red: totals</text>\n</svg>\n", y + 20);
  return out;
}

}  // namespace sg::report
