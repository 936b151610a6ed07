#include "apps/config/validate_config.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/config/sequential_layers.hpp"
#include "runtime/backend_option_table.hpp"
#include "runtime/data/dataset_files.hpp"

namespace sg::app {
namespace {

// The keys of one data format are refused with another rather than ignored. Not data.dir: the
// resolved config.yaml writes every key, its default data.dir included, and must read back.
template <typename Require>
void check_format_keys(const Require& require, const DataConfig& d) {
  std::string format, is;
  data::DatasetFiles files;
  files.format = d.format;
  files.train_x = d.train_x;
  try {
    format = data::dataset_format(files);
  } catch (const data::DataFileError&) {
    return;  // an extension it cannot guess from: the data loader says so, naming data.format
  }
  if (!d.format.empty()) is = fmt::format("data.format is {}", format);
  else if (format == "idx") is = "the data is idx (there is no data.train_x)";
  else is = fmt::format("the data is {} (guessed from data.train_x's extension)", format);
  require(d.label_column.empty() || format == "csv", "data.label_column",
          fmt::format("applies to data.format csv only, and {}: {}", is,
                      format == "npy" ? "the labels come from data.train_y (or the .npz's y_train)"
                                      : "the labels are the IDX label files in data.dir"));
  for (const auto& [key, value] : {std::pair{"data.train_y", d.train_y}, {"data.test_y", d.test_y}})
    require(value.empty() || format == "npy", key,
            fmt::format("applies to data.format npy only, and {}: {}", is,
                        format == "csv" ? "a CSV table's labels are its data.label_column column(s)"
                                        : "the labels are the IDX label files in data.dir"));
  if (format != "idx") return;
  const std::string idx_test = fmt::format("applies to data.format npy or csv, and {}: its test split is the t10k files "
                                           "in data.dir", is);
  require(d.test_x.empty(), "data.test_x", idx_test);
  require(d.test_fraction == 0, "data.test_fraction", idx_test);
  require(d.split_seed == 0, "data.split_seed", idx_test);
}

}  // namespace

void validate(const ConfigReader& r, const YAML::Node& root, TrainConfig& c) {
  auto require = [&](bool ok, const std::string& key, const std::string& problem) {
    if (!ok) r.fail(node_at(root, key), key, problem);
  };
  auto one_of = [&](const std::string& value, std::vector<std::string> allowed, const std::string& key) {
    require(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), key,
            fmt::format("'{}' is not one of {}", value, fmt::join(allowed, ", ")));
  };
  auto& m = c.model;
  const bool width_form = m.hidden_width > 0 || m.hidden_depth > 0;
  const YAML::Node model_node = section_of(root, "model");
  const auto given = [&](const char* key) { return model_node && model_node.IsMap() && model_node[key]; };
  if (given("sequential") && m.sequential.empty()) require(false, "model.sequential", "needs at least one layer");
  if (m.is_sequential()) {
    require(m.layers.empty() && !width_form, "model.sequential",
            "give either model.sequential or model.layers / model.hidden_width, not both");
    require(given("input"), "model.input",
            "model.sequential needs the per-example input shape: model.input: [C, H, W] (e.g. [1, 28, 28]) or [features]");
    require(!given("classes"), "model.classes", "is the last layer's out with model.sequential: leave it out");
    require(!given("activation"), "model.activation",
            "applies to model.layers; model.sequential lists its activation layers (- relu: {})");
    require(!given("dropout"), "model.dropout", "applies to model.layers; model.sequential lists its dropout layers (- dropout: {p: 0.5})");
    if (m.input_shape.empty()) m.input_shape = {m.input};
    const YAML::Node list = model_node["sequential"];
    const ExpandedLayers layers = expand_layers(m.sequential);
    try {
      m.classes = sequential_outputs(m.input_shape, layers.specs);
    } catch (const SequentialShapeError& e) {
      if (e.index < 0) r.fail(model_node["input"], "model.input", e.what());
      const auto i = static_cast<std::size_t>(e.index);  // a layer of the expanded list: its entry's line, its own path
      r.fail(list[layers.entries[i]], layers.paths[i], fmt::format("{} (model.input {})", e.problem, shape_string(m.input_shape)));
    }
    m.input = element_count(m.input_shape);
    require(m.classes > 1 || m.loss != "softmax_xent", "model.sequential",
            fmt::format("the last layer gives {} output(s); softmax_xent needs > 1 classes", m.classes));
  } else {
    require(m.input_shape.empty(), "model.input", "a shape list [C, H, W] is for model.sequential; model.layers' input is its first entry");
    require(!(width_form && !m.layers.empty()), "model.layers", "give either model.layers or model.hidden_width/hidden_depth, not both");
    if (width_form) {
      require(m.hidden_width > 0, "model.hidden_width", "must be > 0");
      require(m.hidden_depth > 0, "model.hidden_depth", "must be > 0");
      require(m.input > 0, "model.input", "must be > 0");
      require(m.classes > 1 || m.loss != "softmax_xent", "model.classes", "must be > 1");
      m.layers = {m.input};
      for (std::int64_t i = 0; i < m.hidden_depth; ++i) m.layers.push_back(m.hidden_width);
      m.layers.push_back(m.classes);
      m.hidden_width = m.hidden_depth = 0;
    }
    require(m.layers.size() >= 2, "model.layers", "needs at least an input and an output size");
    for (auto s : m.layers) require(s > 0, "model.layers", fmt::format("size {} must be > 0", s));
    m.input = m.layers.front();
    m.classes = m.layers.back();
  }
  one_of(m.activation, {"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "identity"}, "model.activation");
  one_of(m.loss, {"softmax_xent", "mse", "l1"}, "model.loss");
  require(m.label_smoothing >= 0.0 && m.label_smoothing <= 1.0, "model.label_smoothing", "must be in [0, 1]");
  require(m.label_smoothing == 0.0 || m.loss == "softmax_xent", "model.label_smoothing",
          fmt::format("applies to model.loss softmax_xent, not {}", m.loss));
  require(m.dropout >= 0.0 && m.dropout < 1.0, "model.dropout", "must be in [0, 1)");

  for (const auto& [key, value] : {std::pair{"data.mean", c.data.mean}, {"data.std", c.data.std}, {"optim.lr", c.optim.lr},
                                   {"optim.momentum", c.optim.momentum}, {"optim.weight_decay", c.optim.weight_decay},
                                   {"optim.schedule.gamma", c.optim.schedule.gamma},
                                   {"optim.schedule.min_lr", c.optim.schedule.min_lr}, {"optim.betas", c.optim.beta1},
                                   {"optim.betas", c.optim.beta2}, {"optim.eps", c.optim.eps},
                                   {"optim.alpha", c.optim.alpha}, {"optim.clip_grad_norm", c.optim.clip_grad_norm}})
    require(std::isfinite(value), key, fmt::format("must be a finite number (got {})", value));
  require(c.data.batch_size > 0, "data.batch_size", fmt::format("must be > 0 (got {})", c.data.batch_size));
  require(c.data.eval_batch_size > 0, "data.eval_batch_size", "must be > 0");
  require(c.data.std > 0, "data.std", "must be > 0");

  require(c.data.train_limit >= 0, "data.train_limit", "must be >= 0");
  require(c.data.test_limit >= 0, "data.test_limit", "must be >= 0");
  require(!c.data.dir.empty(), "data.dir", "must not be empty");
  if (!c.data.format.empty()) one_of(c.data.format, {"idx", "npy", "csv"}, "data.format");
  require(c.data.format != "idx" || c.data.train_x.empty(), "data.train_x",
          "is for data.format npy or csv (idx reads the four files in data.dir)");
  require((c.data.format != "npy" && c.data.format != "csv") || !c.data.train_x.empty(), "data.train_x",
          fmt::format("data.format {} needs data.train_x (the training file)", c.data.format));
  require(std::isfinite(c.data.test_fraction) && c.data.test_fraction >= 0 && c.data.test_fraction < 1,
          "data.test_fraction", fmt::format("must be in (0, 1), or 0 for test files (got {})", c.data.test_fraction));
  check_format_keys(require, c.data);
  if (c.data.augment_translate != 0 || c.data.augment_flip) {
    const auto& shape = m.input_shape;
    const std::string key = c.data.augment_translate != 0 ? "data.augment.translate" : "data.augment.flip";
    require(m.is_sequential() && shape.size() == 3, key,
            "augments images: it needs model.sequential with model.input [C, H, W]");
    require(c.data.augment_translate >= 0 && c.data.augment_translate < std::min(shape[1], shape[2]),
            "data.augment.translate",
            fmt::format("must be in [0, {}) for {} images (got {})", std::min(shape[1], shape[2]),
                        shape_string(shape), c.data.augment_translate));
  }

  one_of(c.optim.name, {"sgd", "adam", "adamw", "rmsprop"}, "optim.name");
  require(c.optim.lr > 0, "optim.lr", fmt::format("must be > 0 (got {})", c.optim.lr));
  require(c.optim.momentum >= 0 && c.optim.momentum < 1, "optim.momentum", fmt::format("must be in [0, 1) (got {})", c.optim.momentum));
  require(c.optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  require(!c.optim.nesterov || c.optim.name == "sgd", "optim.nesterov", "applies to optim.name: sgd only");
  require(!c.optim.nesterov || c.optim.momentum > 0, "optim.nesterov", "needs optim.momentum > 0 (as in PyTorch)");
  require(c.optim.momentum == 0 || c.optim.name == "sgd" || c.optim.name == "rmsprop", "optim.momentum",
          fmt::format("applies to optim.name: sgd or rmsprop only ({} uses optim.betas)", c.optim.name));
  require(c.optim.alpha >= 0 && c.optim.alpha < 1, "optim.alpha", fmt::format("must be in [0, 1) (got {})", c.optim.alpha));
  require(c.optim.alpha == OptimConfig{}.alpha || c.optim.name == "rmsprop", "optim.alpha",
          "applies to optim.name: rmsprop only");
  require(!c.optim.centered || c.optim.name == "rmsprop", "optim.centered", "applies to optim.name: rmsprop only");
  require(c.optim.beta1 >= 0 && c.optim.beta1 < 1 && c.optim.beta2 >= 0 && c.optim.beta2 < 1, "optim.betas",
          fmt::format("both must be in [0, 1) (got [{}, {}])", c.optim.beta1, c.optim.beta2));
  require(c.optim.eps > 0, "optim.eps", fmt::format("must be > 0 (got {})", c.optim.eps));
  require(c.optim.clip_grad_norm >= 0, "optim.clip_grad_norm", "must be >= 0 (0 = off)");
  one_of(c.optim.schedule.kind, {"constant", "step", "cosine"}, "optim.schedule.kind");
  require(c.optim.schedule.warmup_steps >= 0, "optim.schedule.warmup_steps", "must be >= 0");
  require(c.optim.schedule.step_size > 0, "optim.schedule.step_size", "must be > 0");
  require(c.optim.schedule.gamma > 0 && c.optim.schedule.gamma <= 1, "optim.schedule.gamma", "must be in (0, 1]");
  require(c.optim.schedule.min_lr >= 0 && c.optim.schedule.min_lr <= c.optim.lr, "optim.schedule.min_lr", "must be in [0, optim.lr]");

  one_of(c.precision.weights, {"fp16", "bf16", "fp32"}, "precision.weights");
  one_of(c.precision.accumulate, {"fp16", "fp32"}, "precision.accumulate");
  one_of(c.precision.compute, {"fp16", "bf16"}, "precision.compute");
  one_of(c.precision.all_reduce, {"fp32", "compute"}, "precision.all_reduce");
  require(c.data_parallel.bucket_mb >= 0 && c.data_parallel.bucket_mb <= 1e6, "data_parallel.bucket_mb",
          "must be in [0, 1e6] MiB (0: one bucket per layer)");
  require(c.data_parallel.nccl_ctas >= 0 && c.data_parallel.nccl_ctas <= 64, "data_parallel.nccl_ctas",
          "must be in [0, 64] (0: NCCL's own choice)");
  one_of(c.data_parallel.weight_gradients, {"reduce", "gather", "auto"}, "data_parallel.weight_gradients");
  require(c.data_parallel.zero1_min_mb >= 0 && c.data_parallel.zero1_min_mb <= 1e6, "data_parallel.zero1_min_mb",
          "must be in [0, 1e6] MiB");
  require(!(c.data_parallel.zero1 && c.optim.clip_grad_norm > 0), "data_parallel.zero1",
          "sharded updates cannot clip gradients (optim.clip_grad_norm): the global norm needs every rank's share");
  require(c.precision.weights == "fp32" || c.precision.weights == c.precision.compute, "precision.weights",
          "low-precision weights are stored in the compute dtype (precision.compute: " + c.precision.compute +
              "): use weights: " + c.precision.compute + " or fp32");
  require(!(c.precision.accumulate == "fp16" && c.precision.weights == "fp32"), "precision.accumulate",
          "cuBLASLt has no fp16 accumulation into fp32 master weights: use accumulate: fp32 or weights: fp16");
  require(!(c.precision.accumulate == "fp16" && c.precision.compute == "bf16"), "precision.accumulate",
          "cuBLASLt accumulates bf16 matmuls in fp32 only: use accumulate: fp32 with compute: bf16");

  require((c.run.steps > 0) != (c.run.epochs > 0), "run.steps", "set exactly one of run.steps and run.epochs to a positive number");
  require(c.run.steps >= 0, "run.steps", "must be >= 0");
  require(c.run.epochs >= 0, "run.epochs", "must be >= 0");
  require(c.run.log_every > 0, "run.log_every", "must be > 0");
  require(c.run.eval_every >= 0, "run.eval_every", "must be >= 0");
  require(c.run.checkpoint_every >= 0, "run.checkpoint_every", "must be >= 0");
  require(!c.run.out_dir.empty(), "run.out_dir", "must not be empty");
  one_of(c.run.loss_plot_scale, {"linear", "log", "auto"}, "run.loss_plot_scale");

  one_of(c.backend.kind, {"auto", "cuda", "cpu"}, "backend.kind");
  for (const auto& row : backend_option_table()) {  // a config built in code; a file's values were checked on reading
    const std::string problem = row.problem(row.get(c.backend.options));
    require(problem.empty(), "backend." + row.key, problem);
  }
}

}  // namespace sg::app
