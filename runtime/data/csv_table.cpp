#include "runtime/data/csv_table.hpp"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace sg::data {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0;;) {
    const auto comma = line.find(',', start);
    out.push_back(trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

bool blank(std::string_view line) { return trim(line).empty(); }

}  // namespace

std::int64_t CsvTable::column(const std::string& name) const {
  for (std::size_t i = 0; i < columns.size(); ++i)
    if (columns[i] == name) return static_cast<std::int64_t>(i);
  return -1;
}

CsvTable parse_csv(std::string_view text, const std::string& source) {
  CsvTable t;
  t.source = source;
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 byte-order mark
  if (text.find('\0') != std::string_view::npos)
    throw DataFileError(fmt::format("{}: not a text CSV file (it holds NUL bytes)", source));
  std::size_t pos = 0;
  std::int64_t line_no = 0;
  auto next_line = [&](std::string_view& line) {
    if (pos >= text.size()) return false;
    const auto nl = text.find('\n', pos);
    line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    return true;
  };
  std::string_view line;
  bool have_header = false;
  while (next_line(line))
    if (!blank(line)) {
      have_header = true;
      break;
    }
  if (!have_header) throw DataFileError(fmt::format("{}: empty CSV file (expected a header row)", source));
  for (auto f : split_fields(line)) {
    if (f.empty()) throw DataFileError(fmt::format("{}:{}: empty column name in the header row", source, line_no));
    t.columns.emplace_back(f);
  }
  for (std::size_t i = 0; i < t.columns.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (t.columns[i] == t.columns[j])
        throw DataFileError(fmt::format("{}:{}: column '{}' appears twice in the header row", source, line_no,
                                        t.columns[i]));
  std::string scratch;
  while (next_line(line)) {
    if (blank(line)) continue;
    const auto fields = split_fields(line);
    if (fields.size() != t.columns.size())
      throw DataFileError(fmt::format("{}:{}: {} fields, but the header has {} columns", source, line_no,
                                      fields.size(), t.columns.size()));
    for (std::size_t c = 0; c < fields.size(); ++c) {
      scratch.assign(fields[c]);
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(scratch.c_str(), &end);
      if (scratch.empty() || end != scratch.c_str() + scratch.size())
        throw DataFileError(fmt::format("{}:{}: column '{}': '{}' is not a number", source, line_no, t.columns[c],
                                        scratch));
      t.values.push_back(v);
    }
    t.lines.push_back(line_no);
  }
  if (t.values.empty()) throw DataFileError(fmt::format("{}: no data rows after the header row", source));
  return t;
}

CsvTable read_csv(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataFileError(fmt::format("{}: cannot open", file.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_csv(ss.str(), file.string());
}

}  // namespace sg::data
