#include "apps/memory_estimate.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/backend_choice.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sg::app {
namespace {

struct RunGraphs {
  Graph train;
  Graph eval;
};

// The graphs build_mlp_program / build_sequential_program hand the trainer,
// built the same way but without the initial values (the allocation this
// estimate is made to avoid).
RunGraphs run_graphs(const TrainConfig& c, const DataShape& d, ProgramTarget target) {
  RunGraphs g;
  if (c.model.is_sequential()) {
    const SequentialTraining t = sequential_training(c, d.feature_dtype);
    SequentialSpec train = sequential_for_target(t.model, target);
    train.dataset_rows = d.train_rows;
    g.train = build_sequential_training_stages(train, t.optimizer, t.fusion).fused;
    SequentialSpec eval = sequential_for_target(t.model, target);
    eval.dataset_rows = d.test_rows;
    eval.batch = eval_batch_for(d.test_rows, t.eval_batch);
    g.eval = build_sequential_eval(eval);
  } else {
    const MlpTraining t = mlp_training(c, d.feature_dtype);
    MlpSpec train = mlp_for_target(t.mlp, target);
    train.dataset_rows = d.train_rows;
    g.train = build_training_stages(train, t.optimizer, t.fusion).fused;
    MlpSpec eval = mlp_for_target(t.mlp, target);
    eval.dataset_rows = d.test_rows;
    eval.batch = eval_batch_for(d.test_rows, t.eval_batch);
    g.eval = build_mlp_eval(eval);
  }
  return g;
}

double elements(const Shape& shape) {  // in floating point: no overflow for any shape
  double n = 1;
  for (auto d : shape) n *= static_cast<double>(d);
  return n;
}

// `floats_as_f32`: the CPU backend holds every floating value as a float.
void add_values(MemoryParts& parts, const Graph& g, bool floats_as_f32, bool with_parameters) {
  for (const Value& v : g.values()) {
    const double size = floats_as_f32 && is_floating(v.dtype) ? 4.0 : static_cast<double>(dtype_size(v.dtype));
    const double bytes = elements(v.shape) * size;
    switch (v.role) {
      case Role::param:
        if (with_parameters) parts.parameters += bytes;
        break;
      case Role::grad: parts.gradients += bytes; break;
      case Role::state: parts.optimizer_state += bytes; break;
      case Role::activation: parts.activations += bytes; break;
      case Role::input:
      case Role::label: parts.dataset += bytes; break;
    }
  }
}

std::string gb(double bytes) {
  const double g = bytes / 1e9;
  if (g >= 10) return fmt::format("{:.0f} GB", g);
  return g >= 0.1 ? fmt::format("{:.1f} GB", g) : fmt::format("{:.2f} GB", g);
}

// "model.layers [784, 4096, ..., 10] (12 entries)" or "model.sequential (9 layers, input [1, 28, 28])".
std::string model_text(const ModelConfig& m) {
  if (m.is_sequential())
    return fmt::format("model.sequential ({} layers, input [{}])", m.sequential.size(), fmt::join(m.input_shape, ", "));
  if (m.layers.size() <= 8) return fmt::format("model.layers [{}]", fmt::join(m.layers, ", "));
  return fmt::format("model.layers [{}, ..., {}] ({} entries)", fmt::join(m.layers.begin(), m.layers.begin() + 4, ", "),
                     m.layers.back(), m.layers.size());
}

// What to change, by the largest part of the need.
std::string advice(const MemoryParts& p) {
  const double model = p.parameters + p.gradients + p.optimizer_state + p.initial_parameters;
  if (p.activations >= model && p.activations >= p.dataset) return "lower data.batch_size or data.eval_batch_size";
  if (p.dataset >= model) return "use fewer rows (data.train_limit, data.test_limit)";
  return "use a smaller model";
}

std::optional<double> number_in(const std::filesystem::path& file) {
  std::ifstream in(file);
  double value = 0;
  if (in >> value) return value;
  return std::nullopt;  // unreadable, or "max"
}

}  // namespace

double MemoryParts::total() const {
  return parameters + gradients + optimizer_state + activations + dataset + initial_parameters;
}

std::string MemoryParts::describe() const {
  std::vector<std::string> texts;
  for (const auto& [name, bytes] : std::array<std::pair<const char*, double>, 6>{
           {{"parameters", parameters}, {"gradients", gradients}, {"optimizer state", optimizer_state},
            {"activations", activations}, {"dataset", dataset}, {"f32 initial parameters", initial_parameters}}})
    if (bytes > 0.01 * total()) texts.push_back(fmt::format("{} {}", name, gb(bytes)));
  return fmt::format("{}", fmt::join(texts, ", "));
}

DataShape data_shape_before_loading(const TrainConfig& config) {
  return {config.data.batch_size, config.data.eval_batch_size, DType::u8, 0};
}

DataShape data_shape_of(const Dataset& data) {
  double bytes = 0;
  for (const auto* split : {&data.train, &data.test})
    bytes += static_cast<double>(split->images.pixels.size() + split->labels.labels.size() +
                                 split->labels.targets.size() * sizeof(float));
  return {data.train.images.count, data.test.images.count, data.train.images.dtype, bytes};
}

MemoryNeed estimate_run_memory(const TrainConfig& config, const DataShape& data, bool on_cuda) {
  const RunGraphs g = run_graphs(config, data, on_cuda ? ProgramTarget::cuda : ProgramTarget::cpu);
  double initial = 0;
  for (ValueId p : g.train.values_with_role(Role::param)) initial += elements(g.train.value(p).shape) * sizeof(float);
  MemoryNeed need;
  if (on_cuda) {
    add_values(need.device, g.train, false, true);
    add_values(need.device, g.eval, false, false);  // the eval program reads the training program's parameters
    need.host.dataset = data.loaded_bytes;
    need.host.initial_parameters = 2 * initial;
  } else {
    add_values(need.host, g.train, true, true);
    add_values(need.host, g.eval, true, true);
    need.host.dataset += data.loaded_bytes;
    need.host.initial_parameters = initial;
  }
  return need;
}

MemoryAvailable available_memory(bool on_cuda) {
  MemoryAvailable a;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kb = 0;
    if (!(meminfo >> kb)) break;
    if (key == "MemAvailable:") {
      a.host = kb * 1024;
      a.host_source = "MemAvailable";
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
  if (!a.host) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      a.host = static_cast<double>(pages) * static_cast<double>(page);
      a.host_source = "available pages";
    }
  }
  // A container's limit: what the cgroup has left (v2, then v1; v1 reports no limit as a huge number).
  for (const auto& [limit_file, usage_file] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto limit = number_in(limit_file), usage = number_in(usage_file);
    if (!limit || !usage || *limit > 1e18) continue;
    const double left = std::max(0.0, *limit - *usage);
    if (!a.host || left < *a.host) {
      a.host = left;
      a.host_source = fmt::format("the cgroup's limit {} less its usage", limit_file);
    }
    break;
  }
#ifdef STEPGRAPH_HAVE_CUDA
  std::size_t free = 0, total = 0;
  if (on_cuda) {
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) a.device = static_cast<double>(free);
    else (void)cudaGetLastError();  // no device here: not checked
  }
#else
  (void)on_cuda;
#endif
  return a;
}

std::vector<std::string> check_memory_fits(const TrainConfig& config, const MemoryNeed& need,
                                           const MemoryAvailable& available, double already_held) {
  std::vector<std::string> warnings;
  const auto check = [&](const char* memory, const MemoryParts& parts, std::optional<double> free, double held,
                         const std::string& source) {
    const double needed = parts.total();
    if (!free || needed <= 0) return;
    const double usable = *free + held;
    if (needed > usable)
      throw ConfigError(fmt::format("{}: {}: the run needs about {} of {} memory ({}) but {} is available ({}): {}",
                                    config.source, model_text(config.model), gb(needed), memory, parts.describe(),
                                    gb(usable), source, advice(parts)));
    if (needed > usable / 2)
      warnings.push_back(fmt::format("{}: {}: the run needs about {} of {} memory ({}), more than half of the {} "
                                     "available ({})",
                                     config.source, model_text(config.model), gb(needed), memory, parts.describe(),
                                     gb(usable), source));
  };
  check("host", need.host, available.host, already_held, available.host_source);
  check("GPU", need.device, available.device, 0, "free on the GPU, cudaMemGetInfo");
  return warnings;
}

}  // namespace sg::app
