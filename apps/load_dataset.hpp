#pragma once
// The dataset a TrainConfig names, read for training, profiling and
// benchmarking alike.
#include <future>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "apps/report/run_timing.hpp"
#include "runtime/data/dataset_files.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

// Both splits of the configured dataset (data.dir's IDX files, the test
// split on a second thread: inflating them is most of a short run's I/O; or
// the data.* files of a npy/npz/csv dataset).
Dataset load_dataset(const TrainConfig& config);
// load_dataset while the CUDA context starts on a worker thread
// (start_device_warmup), both recorded in `timing`: the data load with the
// worker's parts under it, then the start-up left after it. Without a worker
// (backend.kind: cpu, or a build without CUDA) only the data load.
Dataset load_dataset_while_device_starts(const TrainConfig& config, report::RunTiming& timing);
// The same with a warm-up the caller started earlier (start_device_warmup).
Dataset load_dataset_while_device_starts(const TrainConfig& config, std::future<DeviceWarmup> device_ready,
                                         report::RunTiming& timing);
// The data.* keys as the dataset loader takes them (format, files, split,
// limits, and the model's target width).
data::DatasetFiles dataset_files(const TrainConfig& config);

}  // namespace sg::app
