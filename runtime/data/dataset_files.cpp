#include "runtime/data/dataset_files.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/data/csv_table.hpp"
#include "runtime/data/data_file_checks.hpp"
#include "runtime/data/npy_array.hpp"
#include "runtime/data/npz_archive.hpp"

namespace sg::data {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fail(const std::string& key, const std::string& where, const std::string& what) {
  throw DataFileError(fmt::format("{} {}: {}", key, where, what));
}

// "file.npz:name" -> {file.npz, name}; "file.npz" -> {file.npz, ""}; else {path, ""}.
struct ArrayRef {
  std::string file, name;
  bool npz() const { return ends_with(file, ".npz"); }
};

ArrayRef parse_ref(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon != std::string::npos && ends_with(text.substr(0, colon), ".npz"))
    return {text.substr(0, colon), text.substr(colon + 1)};
  return {text, ""};
}

// Reads each .npz once however many arrays come from it.
class ArrayLoader {
 public:
  NpyArray load(const std::string& key, const ArrayRef& ref, const std::string& default_name) {
    try {
      if (!ref.npz()) {
        if (!ends_with(ref.file, ".npy"))
          fail(key, ref.file, "expected a .npy file or an .npz archive (file.npz or file.npz:array)");
        return read_npy(ref.file);
      }
      return archive(ref.file).array(ref.name.empty() ? default_name : ref.name);
    } catch (const DataFileError& e) {
      if (std::string_view(e.what()).substr(0, key.size()) == key) throw;
      throw DataFileError(fmt::format("{} {}", key, e.what()));
    }
  }

  bool has(const ArrayRef& ref, const std::string& name) {
    try {
      return archive(ref.file).contains(name);
    } catch (const DataFileError&) {
      return false;  // the load of train_x from it reports the problem
    }
  }

 private:
  NpzArchive& archive(const std::string& file) {
    auto& slot = open_[file];
    if (!slot) slot = std::make_unique<NpzArchive>(file);
    return *slot;
  }
  std::map<std::string, std::unique_ptr<NpzArchive>> open_;
};

// The first bad (NaN or infinite) value among n floats, or -1.
template <typename F>
std::int64_t first_nonfinite(std::int64_t n, F&& value) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(value(i))) return i;
  return -1;
}

ImageSet features_from_array(const std::string& key, const NpyArray& a) {
  if (a.shape.size() < 2)
    fail(key, a.source,
         fmt::format("features must have shape N x D or N x C x H x W, got {} (use x.reshape(len(x), -1))",
                     a.shape_text()));
  ImageSet set;
  set.count = a.shape[0];
  set.rows = 1;
  for (std::size_t i = 1; i + 1 < a.shape.size(); ++i) set.rows *= a.shape[i];
  set.cols = a.shape.back();
  if (set.count == 0 || set.rows * set.cols == 0) fail(key, a.source, fmt::format("empty array {}", a.shape_text()));
  const std::int64_t n = a.element_count();
  auto check_finite = [&](auto value) {
    const auto bad = first_nonfinite(n, value);
    if (bad >= 0)
      fail(key, a.source,
           fmt::format("feature value {} at row {}, feature {}: features must be finite", value(bad),
                       bad / (set.rows * set.cols), bad % (set.rows * set.cols)));
  };
  if (a.kind == 'u' && a.item_size == 1) {
    set.dtype = DType::u8;
    set.pixels.assign(a.bytes.begin(), a.bytes.end());
  } else if (a.kind == 'f' && a.item_size == 2) {
    set.dtype = DType::f16;
    check_finite([&](std::int64_t i) { return npy_element(a, i); });
    set.pixels.assign(a.bytes.begin(), a.bytes.end());
  } else if (a.kind == 'f' && a.item_size == 4) {
    set.dtype = DType::f32;
    check_finite([&](std::int64_t i) { return npy_element(a, i); });
    set.pixels.assign(a.bytes.begin(), a.bytes.end());
  } else if (a.kind == 'f' && a.item_size == 8) {
    // float64 (NumPy's default) is narrowed to float32; values beyond its range are refused as infinite.
    set.dtype = DType::f32;
    std::vector<float> narrowed(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) narrowed[i] = static_cast<float>(npy_element(a, i));
    check_finite([&](std::int64_t i) { return static_cast<double>(narrowed[i]); });
    set.pixels.resize(narrowed.size() * sizeof(float));
    std::memcpy(set.pixels.data(), narrowed.data(), set.pixels.size());
  } else {
    fail(key, a.source,
         fmt::format("features are {}, expected uint8, float16 or float32 (or float64, read as float32): convert "
                     "with x.astype(np.float32)",
                     a.dtype_name()));
  }
  return set;
}

// Where value (row, column) of a label array is, as messages name it: "y.npy: label 7 at row 3" for an
// array, "t.csv:5: column 'label' (data.label_column): label 7" for a CSV table (named by file line, as its
// other errors are).
using ValueLocator = std::function<std::string(std::int64_t row, std::int64_t column, const std::string& value)>;

// Class labels (target_width 0) or float targets of `target_width` values.
LabelSet labels_from_array(const std::string& key, const NpyArray& a, std::int64_t target_width, std::int64_t& classes,
                           ValueLocator locate = {}) {
  if (!locate)
    locate = [&a](std::int64_t row, std::int64_t, const std::string& value) {
      return fmt::format("{}: {} at row {}", a.source, value, row);
    };
  LabelSet set;
  const std::int64_t n = a.shape.empty() ? 0 : a.shape[0];
  if (target_width == 0) {
    if (!(a.shape.size() == 1 || (a.shape.size() == 2 && a.shape[1] == 1)))
      fail(key, a.source, fmt::format("class labels must have shape N or N x 1, got {}", a.shape_text()));
    set.labels.resize(static_cast<std::size_t>(n));
    double top = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double v = npy_element(a, i);
      if (!(v >= 0 && v <= 255 && v == std::floor(v)))
        throw DataFileError(fmt::format("{} {} is not a class index in 0..255 (class labels must be whole numbers; "
                                        "for float targets use a regression loss, model.loss: mse or l1)",
                                        key, locate(i, 0, fmt::format("label {}", v))));
      set.labels[i] = static_cast<std::uint8_t>(v);
      top = std::max(top, v);
    }
    classes = static_cast<std::int64_t>(top) + 1;
    return set;
  }
  const std::int64_t width = a.shape.size() == 1 ? 1 : a.shape.size() == 2 ? a.shape[1] : -1;
  if (width != target_width)
    fail(key, a.source,
         fmt::format("targets have shape {} but the model predicts {} value(s) per example (model.layers' last "
                     "entry): expected shape ({}, {})",
                     a.shape_text(), target_width, n, target_width));
  set.target_width = target_width;
  set.targets.resize(static_cast<std::size_t>(n * width));
  for (std::int64_t i = 0; i < n * width; ++i) {
    const double v = npy_element(a, i);
    const float f = static_cast<float>(v);
    if (!std::isfinite(f))
      throw DataFileError(fmt::format("{} {}: targets must be finite float32 values", key,
                                      locate(i / width, i % width, fmt::format("target value {}", v))));
    set.targets[i] = f;
  }
  classes = 0;
  return set;
}

std::int64_t label_rows(const LabelSet& l) {
  return l.target_width > 0 ? static_cast<std::int64_t>(l.targets.size()) / l.target_width
                            : static_cast<std::int64_t>(l.labels.size());
}

// Rows [0, keep) in the order of `rows` (indices into `split`).
Split select_rows(const Split& split, const std::vector<std::int64_t>& rows) {
  Split out;
  out.images.rows = split.images.rows;
  out.images.cols = split.images.cols;
  out.images.dtype = split.images.dtype;
  out.images.count = static_cast<std::int64_t>(rows.size());
  const auto row_bytes = static_cast<std::size_t>(split.images.pixels_per_image()) * dtype_size(split.images.dtype);
  out.images.pixels.resize(rows.size() * row_bytes);
  out.labels.target_width = split.labels.target_width;
  const auto w = static_cast<std::size_t>(split.labels.target_width);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    std::memcpy(out.images.pixels.data() + i * row_bytes, split.images.pixels.data() + r * row_bytes, row_bytes);
    if (w == 0) out.labels.labels.push_back(split.labels.labels[r]);
    else out.labels.targets.insert(out.labels.targets.end(), split.labels.targets.begin() + r * w,
                                   split.labels.targets.begin() + (r + 1) * w);
  }
  if (w == 0 && !out.labels.labels.empty())
    out.classes = *std::max_element(out.labels.labels.begin(), out.labels.labels.end()) + 1;
  return out;
}

Split first_rows(const Split& split, std::int64_t limit) {
  if (limit <= 0 || limit >= split.images.count) return split;
  std::vector<std::int64_t> rows(static_cast<std::size_t>(limit));
  for (std::int64_t i = 0; i < limit; ++i) rows[i] = i;
  return select_rows(split, rows);
}

// splitmix64: a fixed, portable sequence (std::shuffle's is not specified).
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A seeded random test_fraction of the rows become the test split; both keep file order.
std::pair<Split, Split> split_off_test(const Split& all, double fraction, std::uint64_t seed, const std::string& source) {
  const std::int64_t n = all.images.count;
  const auto test_rows = static_cast<std::int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (test_rows < 1 || test_rows >= n)
    throw DataFileError(fmt::format("data.test_fraction {} of the {} rows of {} leaves {} test and {} training rows: "
                                    "both need at least one",
                                    fraction, n, source, test_rows, n - test_rows));
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[i] = i;
  std::uint64_t state = seed;
  for (std::int64_t i = n - 1; i > 0; --i)
    std::swap(order[i], order[splitmix64(state) % static_cast<std::uint64_t>(i + 1)]);
  std::vector<std::int64_t> test(order.begin(), order.begin() + test_rows), train(order.begin() + test_rows, order.end());
  std::sort(test.begin(), test.end());
  std::sort(train.begin(), train.end());
  return {select_rows(all, train), select_rows(all, test)};
}

void check_rows(const std::string& x_key, const std::string& x_source, const std::string& y_key,
                const std::string& y_source, const Split& s) {
  if (label_rows(s.labels) != s.images.count)
    throw DataFileError(fmt::format("{} {} holds {} examples but {} {} holds {} labels", x_key, x_source,
                                    s.images.count, y_key, y_source, label_rows(s.labels)));
}

struct LoadedSplit {
  Split split;
  std::string source;  // for messages
};

LoadedSplit load_npy_split(ArrayLoader& loader, const std::string& x_key, const std::string& x_text,
                           const std::string& y_key, const std::string& y_text, const std::string& x_default,
                           const std::string& y_default, std::int64_t target_width) {
  const ArrayRef x_ref = parse_ref(x_text);
  ArrayRef y_ref = parse_ref(y_text);
  if (y_text.empty()) {
    if (!x_ref.npz())
      throw DataFileError(fmt::format("{}: missing: {} is a .npy file, so the labels need their own file", y_key, x_key));
    y_ref = {x_ref.file, y_default};
  }
  LoadedSplit out;
  const NpyArray x = loader.load(x_key, x_ref, x_default);
  out.split.images = features_from_array(x_key, x);
  const NpyArray y = loader.load(y_key, y_ref, y_default);
  out.split.labels = labels_from_array(y_key, y, target_width, out.split.classes);
  out.source = x.source;
  check_rows(x_key, x.source, y_key, y.source, out.split);
  return out;
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto a = item.find_first_not_of(' '), b = item.find_last_not_of(' ');
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

LoadedSplit load_csv_split(const std::string& key, const std::string& file, const DatasetFiles& f) {
  CsvTable table;
  try {
    table = read_csv(file);
  } catch (const DataFileError& e) {
    throw DataFileError(fmt::format("{} {}", key, e.what()));
  }
  const auto targets = split_names(f.label_column);
  if (targets.empty()) throw DataFileError(fmt::format("data.label_column: must name the label column of {} {}", key, file));
  std::vector<std::int64_t> target_cols;
  for (const auto& name : targets) {
    const auto c = table.column(name);
    if (c < 0)
      throw DataFileError(fmt::format("{} {}: no column '{}' (data.label_column); the header has: {}", key, file, name,
                                      fmt::join(table.columns, ", ")));
    if (std::find(target_cols.begin(), target_cols.end(), c) != target_cols.end())
      throw DataFileError(fmt::format("data.label_column: names column '{}' twice", name));
    target_cols.push_back(c);
  }
  const auto width = static_cast<std::int64_t>(table.columns.size());
  const auto feature_count = width - static_cast<std::int64_t>(target_cols.size());
  if (feature_count < 1) throw DataFileError(fmt::format("{} {}: no feature columns besides the label column(s)", key, file));
  if (f.target_width == 0 && target_cols.size() != 1)
    throw DataFileError(fmt::format("data.label_column: names {} columns, but class labels are one column", targets.size()));
  if (f.target_width > 0 && static_cast<std::int64_t>(target_cols.size()) != f.target_width)
    throw DataFileError(fmt::format("data.label_column: names {} column(s) but the model predicts {} value(s) per "
                                    "example (model.layers' last entry)",
                                    target_cols.size(), f.target_width));
  const std::int64_t n = table.rows();
  std::vector<float> features;
  features.reserve(static_cast<std::size_t>(n * feature_count));
  std::vector<bool> is_target(static_cast<std::size_t>(width), false);
  for (auto c : target_cols) is_target[c] = true;
  // The targets as a float array, so the npy checks (whole class numbers, finite targets) apply unchanged.
  NpyArray y;
  y.kind = 'f';
  y.item_size = 4;
  y.shape = {n, static_cast<std::int64_t>(target_cols.size())};
  y.source = fmt::format("{} (column {})", file, f.label_column);
  std::vector<float> ys;
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < width; ++c) {
      const double v = table.values[r * width + c];
      if (is_target[c]) continue;
      const float x = static_cast<float>(v);
      if (!std::isfinite(x))
        throw DataFileError(fmt::format("{} {}:{}: column '{}': feature value {} is not a finite float32", key, file,
                                        table.lines[r], table.columns[c], v));
      features.push_back(x);
    }
    for (auto c : target_cols) ys.push_back(static_cast<float>(table.values[r * width + c]));
  }
  y.bytes.assign(reinterpret_cast<const char*>(ys.data()), ys.size() * sizeof(float));
  LoadedSplit out;
  out.source = file;
  out.split.images.count = n;
  out.split.images.rows = 1;
  out.split.images.cols = feature_count;
  out.split.images.dtype = DType::f32;
  out.split.images.pixels.resize(features.size() * sizeof(float));
  std::memcpy(out.split.images.pixels.data(), features.data(), out.split.images.pixels.size());
  // A bad label is named by its file line, as the table's other errors are.
  out.split.labels = labels_from_array(
      key, y, f.target_width, out.split.classes, [&](std::int64_t row, std::int64_t column, const std::string& value) {
        return fmt::format("{}:{}: column '{}' (data.label_column): {}", file, table.lines[row],
                           table.columns[target_cols[column]], value);
      });
  return out;
}

}  // namespace

std::string referenced_file(const std::string& text) { return parse_ref(text).file; }

std::string dataset_format(const DatasetFiles& f) {
  if (!f.format.empty()) return f.format;
  if (f.train_x.empty()) return "idx";
  const ArrayRef ref = parse_ref(f.train_x);
  if (ref.npz() || ends_with(ref.file, ".npy")) return "npy";
  if (ends_with(ref.file, ".csv")) return "csv";
  throw DataFileError(fmt::format("data.format: cannot guess the format of data.train_x '{}' from its extension "
                                  "(.npy, .npz or .csv): set data.format: npy or csv",
                                  f.train_x));
}

TrainTestSplits load_dataset_files(const DatasetFiles& f) {
  const std::string format = dataset_format(f);
  check_data_paths(f, format);
  TrainTestSplits out;
  if (format == "idx") {
    out.train = load_split(f.dir, "train", f.train_limit);
    out.test = load_split(f.dir, "t10k", f.test_limit);
    out.description = fmt::format("idx: {} training and {} test images of {}x{} from {}", out.train.images.count,
                                  out.test.images.count, out.train.images.rows, out.train.images.cols, f.dir);
    return out;
  }
  if (f.train_x.empty()) throw DataFileError(fmt::format("data.train_x: missing: data.format {} needs the training file", format));
  if (f.test_fraction < 0 || f.test_fraction >= 1)
    throw DataFileError(fmt::format("data.test_fraction: {} is outside (0, 1)", f.test_fraction));
  LoadedSplit train, test;
  bool have_test = false;
  if (format == "npy") {
    ArrayLoader loader;
    const ArrayRef x_ref = parse_ref(f.train_x);
    train = load_npy_split(loader, "data.train_x", f.train_x, "data.train_y", f.train_y, "x_train", "y_train",
                           f.target_width);
    std::string test_x = f.test_x, test_y = f.test_y;
    if (test_x.empty() && x_ref.npz() && f.test_fraction == 0 && loader.has(x_ref, "x_test"))
      test_x = x_ref.file + ":x_test";
    if (!test_x.empty()) {
      test = load_npy_split(loader, "data.test_x", test_x, "data.test_y", test_y, "x_test", "y_test", f.target_width);
      have_test = true;
    } else if (!test_y.empty()) {
      throw DataFileError("data.test_y: set, but data.test_x is not");
    }
  } else if (format == "csv") {
    if (!f.train_y.empty() || !f.test_y.empty())
      throw DataFileError(fmt::format("data.{}: not used with data.format csv (the labels are the data.label_column "
                                      "column of the table)",
                                      f.train_y.empty() ? "test_y" : "train_y"));
    train = load_csv_split("data.train_x", f.train_x, f);
    if (!f.test_x.empty()) {
      test = load_csv_split("data.test_x", f.test_x, f);
      have_test = true;
    }
  } else {
    throw DataFileError(fmt::format("data.format: '{}' is not one of idx, npy, csv", format));
  }
  if (have_test && f.test_fraction > 0)
    throw DataFileError("data.test_fraction: set, but there are test files (data.test_x): use one or the other");
  if (!have_test) {
    if (f.test_fraction == 0)
      throw DataFileError(fmt::format("data.test_x: missing: give test files or a data.test_fraction to split off {}",
                                      train.source));
    auto [tr, te] = split_off_test(train.split, f.test_fraction, f.split_seed, train.source);
    test.split = std::move(te);
    test.source = fmt::format("{} (data.test_fraction {})", train.source, f.test_fraction);
    train.split = std::move(tr);
  }
  const Split& a = train.split;
  const Split& b = test.split;
  if (a.images.dtype != b.images.dtype || a.images.pixels_per_image() != b.images.pixels_per_image())
    throw DataFileError(fmt::format("data.test_x {}: {} features per example of {}, but the training data {} has {} of {}",
                                    test.source, b.images.pixels_per_image(), dtype_name(b.images.dtype), train.source,
                                    a.images.pixels_per_image(), dtype_name(a.images.dtype)));
  out.train = first_rows(train.split, f.train_limit);
  out.test = first_rows(test.split, f.test_limit);
  out.description =
      fmt::format("{}: {} training and {} test rows of {} {} features from {}{}", format, out.train.images.count,
                  out.test.images.count, out.train.images.pixels_per_image(), dtype_name(out.train.images.dtype),
                  train.source,
                  f.target_width > 0 ? fmt::format(", {} float target(s) each", f.target_width) : std::string());
  return out;
}

ImageSet read_feature_table(const std::string& key, const std::string& path, const std::string& npz_default) {
  ArrayLoader loader;
  return features_from_array(key, loader.load(key, parse_ref(path), npz_default));
}

}  // namespace sg::data
