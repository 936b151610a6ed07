#pragma once
// A numeric CSV table: a header row of column names, then one row of numbers
// per example, comma-separated (surrounding spaces and double quotes around a
// field are ignored; quoted fields may not hold commas). Every value is read
// as a number (strtod: "1", "0.5", "-3e2", "nan", "inf"); an empty field, a
// word or a row of the wrong length is a DataFileError naming file, line and
// column.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/data_file_error.hpp"

namespace sg::data {

struct CsvTable {
  std::vector<std::string> columns;
  std::vector<double> values;  // rows() * columns.size(), row-major
  std::vector<std::int64_t> lines;  // each row's line in the file (from 1), for messages
  std::string source;

  std::int64_t rows() const {
    return columns.empty() ? 0 : static_cast<std::int64_t>(values.size() / columns.size());
  }
  // Index of `name`, or -1.
  std::int64_t column(const std::string& name) const;
};

CsvTable parse_csv(std::string_view text, const std::string& source);
CsvTable read_csv(const std::filesystem::path& file);

}  // namespace sg::data
