#pragma once
// Reader for IDX files (MNIST, Fashion-MNIST and any dataset of the same
// form), gzip-compressed or raw. Magic numbers, dimensions and sizes are
// checked; a wrong or truncated file is an IdxError naming the file.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph/dtype.hpp"

namespace sg::data {

struct IdxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The feature table of a split: `count` rows of rows * cols features (an
// image of rows x cols pixels for IDX; npy/csv tables flatten each example's
// dimensions into rows x cols as described in runtime/data/dataset_files.hpp).
struct ImageSet {
  std::int64_t count = 0, rows = 0, cols = 0;
  // count * rows * cols elements of `dtype`, row-major, as raw host bytes
  // (one byte per pixel for u8, IDX's only type).
  std::vector<std::uint8_t> pixels;
  DType dtype = DType::u8;  // u8, f16 or f32
  std::int64_t pixels_per_image() const { return rows * cols; }
};

// What the model learns to predict: class labels (target_width 0, IDX's only
// form) or float regression targets (target_width > 0).
struct LabelSet {
  std::vector<std::uint8_t> labels;  // one class per example (target_width == 0)
  std::vector<float> targets;        // count * target_width, row-major (target_width > 0)
  std::int64_t target_width = 0;
};

// Magic 0x00000803 (u8, 3 dims).
ImageSet read_idx_images(const std::filesystem::path& file);
// Magic 0x00000801 (u8, 1 dim).
LabelSet read_idx_labels(const std::filesystem::path& file);

struct Split {
  ImageSet images;
  LabelSet labels;
  std::int64_t classes = 0;  // max label + 1 (0 for float targets)
};

// Loads "<dir>/<prefix>-images-idx3-ubyte[.gz]" and "...-labels-idx1-ubyte[.gz]"
// where prefix is "train" or "t10k"; checks that the counts agree. `limit` > 0
// keeps the first `limit` examples.
Split load_split(const std::filesystem::path& dir, const std::string& prefix, std::int64_t limit = 0);

}  // namespace sg::data
