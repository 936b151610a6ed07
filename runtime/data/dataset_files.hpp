#pragma once
// The dataset loader behind data.format: IDX folders (idx_reader.hpp), NumPy
// .npy/.npz arrays (npy_array.hpp, npz_archive.hpp) and CSV tables
// (csv_table.hpp), each turned into the same pair of Splits.
//
// Features (x): uint8, float16 or float32 arrays of shape N x D or
// N x d1 x ... x dk (e.g. N x C x H x W), flattened per example to D =
// d1*...*dk (an example's dims become rows = d1*...*d(k-1), cols = dk, so
// N x 28 x 28 reads as 28x28 images); float64 is converted to float32. CSV
// features are float32. NaN or infinite features are refused.
// Labels (y): target_width 0: integer class labels, shape N or N x 1, any
// integer dtype (or floats holding whole numbers) in 0..255; target_width
// K > 0: float targets, shape N (K = 1) or N x K.
// Without test files, test_fraction (0 < f < 1) of the training rows,
// picked by split_seed, become the test split.
// Every problem is one DataFileError line naming the config key, the file
// (or file.npz:array) and what is wrong.
#include <cstdint>
#include <string>

#include "runtime/data/data_file_error.hpp"
#include "runtime/data/idx_reader.hpp"

namespace sg::data {

struct DatasetFiles {
  std::string format;      // "idx", "npy", "csv", or "" (guess: idx without train_x, else from its extension)
  std::string dir;         // idx: the folder of the four IDX files
  std::string train_x;     // npy: x.npy | data.npz | data.npz:array; csv: the table
  std::string train_y;     // npy: y.npy | data.npz:array ("" with an .npz train_x: its y_train)
  std::string test_x;      // "" with an .npz train_x holding x_test: that; else "" = split off test_fraction
  std::string test_y;
  std::string label_column;  // csv: the label/target column(s), comma-separated names for several targets
  double test_fraction = 0;  // used when there are no test files
  std::uint64_t split_seed = 0;
  std::int64_t train_limit = 0;  // keep the first N rows (0: all)
  std::int64_t test_limit = 0;
  std::int64_t target_width = 0;  // 0: class labels; K > 0: float targets of K values per example
};

// "idx", "npy" or "csv": `files.format`, or the guess from train_x's
// extension (.npy/.npz -> npy, .csv -> csv; no train_x -> idx).
std::string dataset_format(const DatasetFiles& files);

// The file a data.train_x-style text names: "d.npz:x_train" -> "d.npz"; any other text as it is.
std::string referenced_file(const std::string& text);

struct TrainTestSplits {
  Split train, test;
  std::string description;  // "npy: 1000 training and 200 test rows of 20 float32 features from x.npy"
};

TrainTestSplits load_dataset_files(const DatasetFiles& files);

// A feature table read from `path` (x.npy, or file.npz:array; a bare .npz
// needs `npz_default` in it), checked and converted as data.train_x is;
// `key` names it in errors (e.g. "--input").
ImageSet read_feature_table(const std::string& key, const std::string& path, const std::string& npz_default);

}  // namespace sg::data
