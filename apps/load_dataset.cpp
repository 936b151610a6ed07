#include "apps/load_dataset.hpp"

#include <future>

#include "apps/backend_choice.hpp"
#include "runtime/data/idx_reader.hpp"

namespace sg::app {

data::DatasetFiles dataset_files(const TrainConfig& config) {
  const auto& d = config.data;
  data::DatasetFiles f;
  f.format = d.format;
  f.dir = d.dir;
  f.train_x = d.train_x;
  f.train_y = d.train_y;
  f.test_x = d.test_x;
  f.test_y = d.test_y;
  f.label_column = d.label_column;
  f.test_fraction = d.test_fraction;
  f.split_seed = d.split_seed;
  f.train_limit = d.train_limit;
  f.test_limit = d.test_limit;
  f.target_width = target_width(config);
  return f;
}

Dataset load_dataset(const TrainConfig& config) {
  const auto& d = config.data;
  // Own data (npy/npz/csv, issue 23): runtime/data/dataset_files.hpp.
  const auto files = dataset_files(config);
  if (data::dataset_format(files) != "idx") {
    auto splits = data::load_dataset_files(files);
    return Dataset{std::move(splits.train), std::move(splits.test)};
  }
  auto test = std::async(std::launch::async, [&] { return data::load_split(d.dir, "t10k", d.test_limit); });
  auto train = data::load_split(d.dir, "train", d.train_limit);
  return Dataset{std::move(train), test.get()};
}

}  // namespace sg::app
