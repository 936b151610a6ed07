#include "apps/config/config_schema.hpp"

#include <algorithm>

#include "runtime/backend_option_table.hpp"

namespace sg::app {
namespace {

// backend: kind and cuda_graph (how the trainer runs), then every row of the backend option table.
std::vector<std::string> backend_keys() {
  std::vector<std::string> keys = {"kind", "cuda_graph"};
  for (const auto& row : backend_option_table()) keys.push_back(row.key);
  return keys;
}

}  // namespace

const std::vector<ConfigSection>& config_schema() {
  static const std::vector<ConfigSection> schema = {
      {"", {}, {"model", "data", "optim", "precision", "data_parallel", "run", "backend"}},
      {"model", {"layers", "input", "hidden_width", "hidden_depth", "classes", "activation", "loss",
                 "label_smoothing", "dropout", "sequential"}, {}},
      {"data", {"dir", "batch_size", "shuffle_seed", "normalize", "mean", "std", "train_limit", "test_limit", "eval_batch_size",
        "format", "train_x", "train_y", "test_x", "test_y", "label_column", "test_fraction", "split_seed"}, {"augment"}},
      {"data.augment", {"translate", "flip"}, {}},
      {"optim", {"name", "lr", "momentum", "weight_decay", "nesterov", "betas", "eps", "alpha", "centered",
                 "clip_grad_norm"}, {"schedule"}},
      {"optim.schedule", {"kind", "warmup_steps", "step_size", "gamma", "min_lr"}, {}},
      {"precision", {"weights", "accumulate", "compute", "all_reduce"}, {}},
      {"data_parallel", {"bucket_mb", "nccl_ctas", "symmetric_memory", "zero1", "zero1_min_mb", "weight_gradients"}, {}},
      {"run", {"steps", "epochs", "seed", "eval_every", "log_every", "out_dir", "checkpoint", "checkpoint_every", "resume",
               "loss_plot_scale"}, {}},
      {"backend", backend_keys(), {}},
  };
  return schema;
}

const ConfigSection* find_section(const std::string& path) {
  for (const auto& s : config_schema())
    if (s.path == path) return &s;
  return nullptr;
}

bool is_known_key(const std::string& dotted) {
  const auto dot = dotted.rfind('.');
  const std::string parent = dot == std::string::npos ? "" : dotted.substr(0, dot);
  const std::string key = dot == std::string::npos ? dotted : dotted.substr(dot + 1);
  const ConfigSection* s = find_section(parent);
  return s && std::find(s->keys.begin(), s->keys.end(), key) != s->keys.end();
}

}  // namespace sg::app
