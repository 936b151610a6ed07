#include "apps/load_dataset.hpp"

#include <chrono>
#include <future>

#include "apps/backend_choice.hpp"
#include "runtime/data/data_file_checks.hpp"
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

Dataset load_dataset_while_device_starts(const TrainConfig& config, report::RunTiming& timing) {
  return load_dataset_while_device_starts(config, start_device_warmup(config), timing);
}

Dataset load_dataset_while_device_starts(const TrainConfig& config, std::future<DeviceWarmup> device_ready,
                                         report::RunTiming& timing) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto start = Clock::now();
  Dataset data = load_dataset(config);
  const double load_seconds = since(start);
  start = Clock::now();
  const DeviceWarmup warmup = device_ready.get();
  const double wait_seconds = since(start);
  if (warmup.parts.empty()) {
    timing.add("data load (read + inflate)", load_seconds);
    return data;
  }
  const std::string phase = "data load (read + inflate; CUDA context starting meanwhile)";
  timing.add(phase, load_seconds);
  for (const auto& [part, seconds] : warmup.parts) timing.add_part(phase, part, seconds);
  timing.add("CUDA context start-up left after the data load", wait_seconds);
  return data;
}

Dataset load_dataset(const TrainConfig& config) {
  const auto& d = config.data;
  // Own data (npy/npz/csv, issue 23): runtime/data/dataset_files.hpp.
  const auto files = dataset_files(config);
  if (data::dataset_format(files) != "idx") {
    auto splits = data::load_dataset_files(files);
    return Dataset{std::move(splits.train), std::move(splits.test)};
  }
  data::check_data_paths(files, "idx");  // data.dir named in one line, before the readers' threads start
  auto test = std::async(std::launch::async, [&] { return data::load_split(d.dir, "t10k", d.test_limit); });
  auto train = data::load_split(d.dir, "train", d.train_limit);
  return Dataset{std::move(train), test.get()};
}

}  // namespace sg::app
