#include "apps/bench_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/backend_flags.hpp"
#include "apps/bench_torch.hpp"
#include "apps/config/train_config.hpp"
#include "apps/load_dataset.hpp"
#include "apps/report/sm_clock.hpp"
#include "apps/report/svg_plot.hpp"
#include "models/mlp_program.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/trainer.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/floors.hpp"
#endif

namespace sg::app {

namespace {

using nlohmann::json;

struct Record {
  std::string mode;
  std::int64_t width = 0, batch = 0;
  double us_per_step = NAN;
  std::vector<double> all_us;
  double clock_before = NAN, clock_after = NAN;
  double final_loss = NAN;
  std::string error;
};

// Bytes of fp16/fp32 weights one step must move: forward read, dX read
// (every layer but the first) and the update's read + write.
double weight_bytes_per_step(const std::vector<std::int64_t>& layers, std::size_t elem) {
  double bytes = 0;
  for (std::size_t l = 1; l < layers.size(); ++l) {
    const double params = double(layers[l - 1] * layers[l] + layers[l]);
    bytes += params * double(elem) * (l == 1 ? 3.0 : 4.0);
  }
  return bytes;
}

double flops_per_step(const std::vector<std::int64_t>& layers, std::int64_t batch) {
  double f = 0;
  for (std::size_t l = 1; l < layers.size(); ++l) f += 2.0 * double(batch * layers[l - 1] * layers[l]) * (l == 1 ? 2.0 : 3.0);
  return f;
}

// 784-H x depth-10 (--depth, 3 by default).
std::vector<std::int64_t> mlp_layers(std::int64_t width, int depth) {
  std::vector<std::int64_t> layers{784};
  for (int i = 0; i < depth; ++i) layers.push_back(width);
  layers.push_back(10);
  return layers;
}

std::vector<Record> read_torch_file(const std::string& path) {
  std::vector<Record> out;
  const json doc = json::parse(io::read_file(path));
  const json& list = doc.is_array() ? doc : doc.at("records");
  for (const json& j : list) {
    Record r;
    r.mode = j.at("mode").get<std::string>();
    r.width = j.at("width").get<std::int64_t>();
    r.batch = j.at("batch").get<std::int64_t>();
    if (j.contains("error") && !j["error"].is_null()) r.error = j["error"].dump();
    else r.us_per_step = j.at("us_per_step").get<double>();
    out.push_back(r);
  }
  return out;
}

#ifdef STEPGRAPH_HAVE_CUDA
std::vector<std::int64_t> parse_list(const std::string& text, const char* what) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      out.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("--{}: '{}' is not a number", what, item));
    }
    if (out.back() <= 0) throw std::invalid_argument(fmt::format("--{}: {} must be > 0", what, out.back()));
  }
  if (out.empty()) throw std::invalid_argument(fmt::format("--{} is empty", what));
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

json record_json(const Record& r) {
  json j = {{"mode", r.mode}, {"width", r.width}, {"batch", r.batch}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j["us_per_step"] = r.us_per_step;
  j["samples_per_s"] = double(r.batch) * 1e6 / r.us_per_step;
  j["all_us_per_step"] = r.all_us;
  j["sm_clock_mhz_before"] = r.clock_before;
  j["sm_clock_mhz_after"] = r.clock_after;
  j["final_loss"] = r.final_loss;
  return j;
}

// Records of one or more bench/torch_bench.py outputs (comma-separated paths).
std::vector<Record> read_torch(const std::string& paths) {
  std::vector<Record> out;
  std::stringstream list(paths);
  for (std::string path; std::getline(list, path, ',');) {
    if (path.empty()) continue;
    for (auto& r : read_torch_file(path)) out.push_back(std::move(r));
  }
  return out;
}

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
};

DeviceInfo device_info() {
  cudaDeviceProp prop{};
  SG_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return {prop.name, prop.multiProcessorCount};
}

TrainerSpec bench_spec(const BenchRequest& r, std::int64_t width, std::int64_t batch, const Dataset& data) {
  MlpTraining model;
  model.mlp.layers = mlp_layers(width, r.depth);
  model.mlp.batch = batch;
  model.mlp.activation = activation_from_name(r.activation);
  model.mlp.compute_dtype = r.compute == "bf16" ? DType::bf16 : DType::f16;
  model.mlp.weight_dtype = r.weights == "fp32" ? DType::f32 : model.mlp.compute_dtype;
  model.optimizer = {0.01, 0.0, 0.0};
  model.optimizer.kind = optimizer_from_name(r.optim);
  if (model.optimizer.kind != OptimizerKind::sgd) model.optimizer.lr = 1e-3;
  if (model.optimizer.kind == OptimizerKind::adamw) model.optimizer.weight_decay = 0.01;
  TrainerSpec s;
  s.program = build_mlp_program(model, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  s.backend = r.backend;
  s.backend.accumulate_f16 = r.accumulate == "fp16";
  return s;
}

// The config's model at batch `batch`, as `stepgraph train` would build it.
TrainerSpec config_bench_spec(const BenchRequest& r, TrainConfig config, std::int64_t batch, const Dataset& data) {
  config.data.batch_size = batch;
  TrainerSpec spec = trainer_spec(config, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  spec.backend.autotune = r.backend.autotune;  // bench's --autotune (default on), as for the MLP sweep
  copy_backend_options(r.backend, r.backend_given, spec.backend);  // the backend flags given override the config's
  return spec;
}

// Median microseconds per step of `run(steps)` over the repeats, timed with events.
template <typename Run>
Record time_mode(const std::string& mode, cuda::CudaTrainer& t, const BenchRequest& r, std::int64_t width,
                 std::int64_t batch, Run&& run) {
  Record rec;
  rec.mode = mode;
  rec.width = width;
  rec.batch = batch;
  const auto stream = static_cast<cudaStream_t>(t.stream_handle());
  run(r.warmup);
  t.synchronize();
  rec.clock_before = report::sm_clock_mhz();
  cuda::Event start, stop;
  for (int i = 0; i < r.repeats; ++i) {
    start.record(stream);
    run(r.steps);
    stop.record(stream);
    stop.synchronize();
    rec.all_us.push_back(1e3 * double(cuda::Event::elapsed_ms(start, stop)) / double(r.steps));
  }
  rec.clock_after = report::sm_clock_mhz();
  rec.us_per_step = median(rec.all_us);
  rec.final_loss = t.last_loss();
  return rec;
}
#endif

struct Table {
  std::map<std::tuple<std::int64_t, std::int64_t>, std::map<std::string, double>> us;  // (width, batch) -> mode -> us
  std::vector<std::string> modes;
  void add(const Record& r) {
    if (std::find(modes.begin(), modes.end(), r.mode) == modes.end()) modes.push_back(r.mode);
    us[{r.width, r.batch}][r.mode] = r.error.empty() ? r.us_per_step : NAN;
  }
  double best_torch(std::int64_t w, std::int64_t b) const {
    double best = NAN;
    for (const auto& [mode, v] : us.at({w, b}))
      if (mode.rfind("torch", 0) == 0 && std::isfinite(v)) best = std::isfinite(best) ? std::min(best, v) : v;
    return best;
  }
};

std::string fmt_us(double v) { return std::isfinite(v) ? fmt::format("{:.1f}", v) : "-"; }

std::string markdown_table(const Table& t, const std::map<std::tuple<std::int64_t, std::int64_t>, std::pair<double, double>>& floors) {
  std::string md = "| width | batch |";
  for (const auto& m : t.modes) md += fmt::format(" {} us |", m);
  md += " best torch / graph | weight floor us | graph TFLOP/s |\n|---|---|";
  for (std::size_t i = 0; i < t.modes.size() + 3; ++i) md += "---|";
  md += "\n";
  for (const auto& [key, modes] : t.us) {
    const auto [w, b] = key;
    md += fmt::format("| {} | {} |", w == 0 ? std::string("config") : std::to_string(w), b);  // width 0: --config
    for (const auto& m : t.modes) md += fmt::format(" {} |", fmt_us(modes.count(m) ? modes.at(m) : NAN));
    const double replay = modes.count("graph_replay") ? modes.at("graph_replay") : NAN;
    const double ratio = t.best_torch(w, b) / replay;
    const auto fl = floors.count(key) ? floors.at(key) : std::pair<double, double>{NAN, NAN};
    md += fmt::format(" {} | {} | {} |\n", std::isfinite(ratio) ? fmt::format("{:.2f}x", ratio) : "-", fmt_us(fl.first),
                      std::isfinite(fl.second / replay) ? fmt::format("{:.1f}", fl.second / replay / 1e6) : "-");
  }
  return md;
}

void write_plots(const Table& t, const std::filesystem::path& dir) {
  // The plots are over the MLP's hidden width; a config's model (width 0) has none.
  if (std::all_of(t.us.begin(), t.us.end(), [](const auto& row) { return std::get<0>(row.first) == 0; })) return;
  std::vector<report::Series> speed;
  for (const auto& m : t.modes) {
    report::Series s{m + " (batch 32)", {}, {}};
    for (const auto& [key, modes] : t.us)
      if (std::get<1>(key) == 32 && modes.count(m) && std::isfinite(modes.at(m))) {
        s.x.push_back(double(std::get<0>(key)));
        s.y.push_back(modes.at(m));
      }
    if (!s.x.empty()) speed.push_back(s);
  }
  if (!speed.empty())
    io::write_file_atomically(dir / "speed.svg", report::render_svg({"Training step time, 784-H-H-H-10, batch 32",
                                                                      "hidden width H", "us per step", true, true},
                                                                     speed));
  std::map<std::int64_t, report::Series> speedup;
  for (const auto& [key, modes] : t.us) {
    const auto [w, b] = key;
    const double replay = modes.count("graph_replay") ? modes.at("graph_replay") : NAN;
    const double ratio = t.best_torch(w, b) / replay;
    if (!std::isfinite(ratio)) continue;
    auto& s = speedup[b];
    s.name = fmt::format("batch {}", b);
    s.x.push_back(double(w));
    s.y.push_back(ratio);
  }
  std::vector<report::Series> ratios;
  for (auto& [b, s] : speedup) ratios.push_back(s);
  if (!ratios.empty())
    io::write_file_atomically(dir / "speedup.svg", report::render_svg({"Speed-up of graph replay over the best PyTorch mode",
                                                                        "hidden width H", "best PyTorch time / graph replay time",
                                                                        true, false},
                                                                       ratios));
}

// Re-renders bench.md and the plots of an earlier bench.json (no GPU needed).
int replot(const BenchRequest& r) {
  const json doc = json::parse(io::read_file(r.replot));
  Table table;
  for (const auto& rec : read_torch_file(r.replot)) table.add(rec);
  const double bandwidth = doc.at("floors").at("copy_bandwidth_gbs").get<double>();
  const std::size_t elem = doc.at("settings").at("weights").get<std::string>() == "fp32" ? 4 : 2;
  std::map<std::tuple<std::int64_t, std::int64_t>, std::pair<double, double>> floor_and_flops;
  const int depth = doc.at("settings").value("depth", 3);  // bench.json files before --depth: 3
  for (const auto& [key, modes] : table.us)
    floor_and_flops[key] = {weight_bytes_per_step(mlp_layers(std::get<0>(key), depth), elem) / (bandwidth * 1e3),
                            flops_per_step(mlp_layers(std::get<0>(key), depth), std::get<1>(key))};
  const std::filesystem::path dir = r.out_dir;
  const std::string md = markdown_table(table, floor_and_flops);
  io::write_file_atomically(dir / "bench.md", md);
  write_plots(table, dir);
  std::printf("%s", md.c_str());
  return 0;
}

}  // namespace

int run_bench(const BenchRequest& r) {
  if (!r.replot.empty()) {
    try {
      return replot(r);
    } catch (const json::exception& e) {  // parse errors and missing keys: name the file
      throw std::runtime_error(fmt::format("{}: not a bench.json this build can replot: {}", r.replot, e.what()));
    }
  }
  if (r.weights != "fp32" && r.weights != r.compute)
    throw std::invalid_argument(fmt::format("bench: --weights {} with --compute {}: low-precision weights are stored in "
                                            "the compute dtype (use --weights {} or fp32)",
                                            r.weights, r.compute, r.compute));
  if (r.accumulate == "fp16" && r.compute == "bf16")
    throw std::invalid_argument("bench: --accumulate fp16 with --compute bf16: cuBLASLt accumulates bf16 in fp32 only");
#ifndef STEPGRAPH_HAVE_CUDA
  (void)r;
  throw std::runtime_error("bench needs a build with CUDA");
#else
  if (!cuda::device_available()) throw std::runtime_error("bench needs a CUDA GPU; none is available");
  if (r.steps <= 0 || r.repeats <= 0 || r.warmup < 0) throw std::invalid_argument("bench: steps and repeats must be > 0");
  std::optional<TrainConfig> config;
  if (!r.config.empty()) {
    config = load_config(r.config, {"data.dir=" + r.data_dir});
    check_cuda_can_run(*config);
  }
  if (r.torch) check_torch_twin(r);
  const auto widths = config ? std::vector<std::int64_t>{0} : parse_list(r.widths, "widths");
  const auto batches = parse_list(!r.batches.empty() ? r.batches
                                   : config       ? std::to_string(config->data.batch_size)
                                                  : std::string("32,256,1024"),
                                   "batches");
  const DeviceInfo device = device_info();
  const Dataset data = config ? load_dataset(*config)
                              : Dataset{data::load_split(r.data_dir, "train"), data::load_split(r.data_dir, "t10k", 1000)};
  auto spec_for = [&](std::int64_t w, std::int64_t b) {
    return config ? config_bench_spec(r, *config, b, data) : bench_spec(r, w, b, data);
  };

  const cuda::Floors floors = cuda::measure_floors();
  spdlog::info("device {} ({} SMs): empty stream launch {:.2f} us, graph node {:.2f} us, D2D copy {:.0f} GB/s, "
               "fp16 matmul {:.0f} TFLOP/s",
               device.name, device.sm_count, floors.empty_launch_us, floors.graph_node_us, floors.copy_bandwidth_gbs,
               floors.matmul_tflops);

  std::vector<Record> records;
  json profiles = json::object();
  json declined_fast_paths = json::object();  // by config (H<width>_B<batch>): fast path -> why not
  std::map<std::tuple<std::int64_t, std::int64_t>, std::pair<double, double>> floor_and_flops;
  const std::size_t elem = r.weights == "fp32" ? 4 : 2;
  for (auto w : widths)
    for (auto b : batches) {
      cuda::CudaTrainer t(spec_for(w, b), data);
      records.push_back(time_mode("graph_replay", t, r, w, b, [&](std::int64_t n) { t.replay_steps(n); }));
      records.push_back(time_mode("stream_launch", t, r, w, b, [&](std::int64_t n) { t.launch_steps(n); }));
      if (r.multi_step > 1) {
        // The same schedule, K steps captured per graph: the graph launch's
        // overhead is shared, and each step's first kernel may gather its
        // batch while the step before finishes.
        TrainerSpec spec = spec_for(w, b);
        spec.backend.steps_per_launch = r.multi_step;
        cuda::CudaTrainer many(spec, data);
        records.push_back(time_mode(fmt::format("graph_replay_x{}", r.multi_step), many, r, w, b,
                                    [&](std::int64_t n) { many.replay_steps(n); }));
      }
      if (t.training_program().uses_whole_step()) {
        // The same step as the per-group schedule (cuBLASLt + our kernels),
        // replayed: what the whole-step kernel is measured against.
        TrainerSpec spec = spec_for(w, b);
        spec.backend.whole_step = false;
        cuda::CudaTrainer lt(spec, data);
        records.push_back(time_mode("lt_schedule_replay", lt, r, w, b, [&](std::int64_t n) { lt.replay_steps(n); }));
      }
      if (!config)
        floor_and_flops[{w, b}] = {weight_bytes_per_step(mlp_layers(w, r.depth), elem) / (floors.copy_bandwidth_gbs * 1e3),
                                 flops_per_step(mlp_layers(w, r.depth), b)};
      spdlog::info("H={} B={}: {}", w, b, t.description());
      json declined = json::object();  // the fast paths this config's schedule does without, and why
      for (const auto& [fast_path, why] : t.declined_fast_paths()) {
        spdlog::info("  fast path {} declined: {}", fast_path, why);
        declined[fast_path] = why;
      }
      declined_fast_paths[fmt::format("H{}_B{}", w, b)] = declined;
      for (std::size_t i = records.size(); i-- > 0 && records[i].width == w && records[i].batch == b;)
        spdlog::info("  {:<20} {:>9.1f} us/step", records[i].mode, records[i].us_per_step);
      if (r.profile && b == batches.front()) {
        json rows = json::array();
        const auto timings = t.profile_step();
        double total = 0;
        for (const auto& l : timings) total += l.ms;
        for (const auto& l : timings) rows.push_back({{"launch", l.label}, {"us", 1e3 * l.ms}, {"share", l.ms / total}});
        profiles[fmt::format("H{}_B{}", w, b)] = rows;
      }
    }
  std::string torch_json = r.torch_json;
  if (r.torch)
    for (const auto& out : run_torch_twin(r, *config, data.train.images.dtype, batches)) torch_json += "," + out;
  const auto torch = read_torch(torch_json);
  records.insert(records.end(), torch.begin(), torch.end());

  Table table;
  for (const auto& rec : records) table.add(rec);
  const std::filesystem::path dir = r.out_dir;
  json out = {{"device", device.name},
              {"date", today()},
              {"floors", {{"empty_launch_us", floors.empty_launch_us}, {"graph_node_us", floors.graph_node_us},
                          {"copy_bandwidth_gbs", floors.copy_bandwidth_gbs}, {"matmul_tflops", floors.matmul_tflops}}},
              {"settings", {{"config", r.config}, {"steps", r.steps}, {"repeats", r.repeats}, {"warmup", r.warmup}, {"weights", r.weights},
                            {"accumulate", r.accumulate}, {"compute", r.compute},
                            {"optim", r.optim}, {"activation", r.activation}, {"depth", r.depth},
                            {"multi_step", r.multi_step}}},
              {"backend", backend_options_json(r.backend)},
              {"declined_fast_paths", declined_fast_paths},
              {"records", json::array()},
              {"profiles", profiles}};
  for (auto& [key, value] : out["backend"].items()) out["settings"][key] = value;  // the keys settings always had
  if (!r.backend_given.count("conv_kernels")) out["settings"]["conv_kernels"] = "config";  // as before: not overridden
  std::string csv = "mode,width,batch,us_per_step,samples_per_s,sm_clock_mhz_before,sm_clock_mhz_after,error\n";
  for (const auto& rec : records) {
    out["records"].push_back(record_json(rec));
    csv += fmt::format("{},{},{},{},{},{},{},{}\n", rec.mode, rec.width, rec.batch, rec.us_per_step,
                       double(rec.batch) * 1e6 / rec.us_per_step, rec.clock_before, rec.clock_after,
                       rec.error.empty() ? "" : "\"" + rec.error + "\"");
  }
  io::write_file_atomically(dir / "bench.json", out.dump(2) + "\n");
  io::write_file_atomically(dir / "bench.csv", csv);
  const std::string md = markdown_table(table, floor_and_flops);
  io::write_file_atomically(dir / "bench.md", md);
  write_plots(table, dir);
  std::string profile_md;
  for (const auto& [key, rows] : profiles.items()) {
    profile_md += fmt::format("\nper-launch profile {} (GPU time per launch: stream mode, CUDA events around each launch, queued behind a busy-wait so host gaps do not count; median of 5 steps):\n", key);
    for (const auto& row : rows)
      profile_md += fmt::format("  {:<60} {:>9.2f} us {:>6.1f}%\n", row["launch"].get<std::string>(), row["us"].get<double>(),
                                100 * row["share"].get<double>());
  }
  io::write_file_atomically(dir / "profile.txt", profile_md);
  std::printf("%s\n%s", profile_md.c_str(), md.c_str());
  std::printf("floors: empty stream launch %.2f us, graph node %.2f us, D2D copy %.0f GB/s, fp16 matmul %.0f TFLOP/s; "
              "device %s; %s\n",
              floors.empty_launch_us, floors.graph_node_us, floors.copy_bandwidth_gbs, floors.matmul_tflops,
              device.name.c_str(), today().c_str());
  return 0;
#endif
}

}  // namespace sg::app
