#pragma once
// Reader for IDX files (MNIST, Fashion-MNIST and any dataset of the same
// form), gzip-compressed or raw. Magic numbers, dimensions and sizes are
// checked; a wrong or truncated file is an IdxError naming the file.
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace sg::data {

struct IdxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ImageSet {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols, row-major
  std::int64_t pixels_per_image() const { return rows * cols; }
};

struct LabelSet {
  std::vector<std::uint8_t> labels;
};

// Magic 0x00000803 (u8, 3 dims).
ImageSet read_idx_images(const std::filesystem::path& file);
// Magic 0x00000801 (u8, 1 dim).
LabelSet read_idx_labels(const std::filesystem::path& file);

struct Split {
  ImageSet images;
  LabelSet labels;
  std::int64_t classes = 0;  // max label + 1
};

// Loads "<dir>/<prefix>-images-idx3-ubyte[.gz]" and "...-labels-idx1-ubyte[.gz]"
// where prefix is "train" or "t10k"; checks that the counts agree. `limit` > 0
// keeps the first `limit` examples.
Split load_split(const std::filesystem::path& dir, const std::string& prefix, std::int64_t limit = 0);

}  // namespace sg::data
