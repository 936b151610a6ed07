#pragma once
// The dataset a TrainConfig names, read for training, profiling and
// benchmarking alike.
#include "apps/config/train_config.hpp"
#include "runtime/data/dataset_files.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

// Both splits of the configured dataset (data.dir's IDX files), the test
// split on a second thread: inflating them is most of a short run's I/O.
Dataset load_dataset(const TrainConfig& config);
// The data.* keys as the dataset loader takes them (format, files, split,
// limits, and the model's target width).
data::DatasetFiles dataset_files(const TrainConfig& config);

}  // namespace sg::app
