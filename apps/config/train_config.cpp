#include "apps/config/train_config.hpp"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/config/config_schema.hpp"
#include "apps/config/sequential_layers.hpp"
#include "runtime/backend_options.hpp"

namespace sg::app {
namespace {

std::string join_path(const std::string& parent, const std::string& key) { return parent.empty() ? key : parent + "." + key; }

// Reads typed values out of the YAML tree; every error names file, line, key.
class ConfigReader {
 public:
  // `overrides`: the --set texts by key, which messages about those keys name instead of a line.
  ConfigReader(std::string source, std::map<std::string, std::string> overrides = {})
      : source_(std::move(source)), overrides_(std::move(overrides)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& key, const std::string& problem) const {
    const int line = node.Mark().line;
    std::string where = line >= 0 ? fmt::format("{}:{}", source_, line + 1) : fmt::format("{} (--set)", source_);
    for (const auto& [k, text] : overrides_)
      if (key == k || key.rfind(k + ".", 0) == 0) where = fmt::format("--set '{}' (over {})", text, source_);
    throw ConfigError(fmt::format("{}: {}: {}", where, key, problem));
  }

  // Rejects keys the schema does not list, recursively.
  void check_keys(const YAML::Node& map, const std::string& path) const {
    const ConfigSection* section = find_section(path);
    if (!map.IsMap()) fail(map, path.empty() ? "(top level)" : path, "must be a mapping of keys");
    std::set<std::string> seen;
    for (const auto& kv : map) {
      if (!kv.first.IsScalar())  // "? [a]: 1", "?  layers: ..." (a complex key)
        fail(kv.first, path.empty() ? "(top level)" : path, "keys must be plain names, not a list or mapping");
      const auto key = kv.first.as<std::string>();
      const auto full = join_path(path, key);
      if (!seen.insert(key).second) fail(kv.first, full, "duplicate key (each key may appear once)");
      const bool is_sub = std::find(section->subsections.begin(), section->subsections.end(), key) != section->subsections.end();
      const bool is_key = std::find(section->keys.begin(), section->keys.end(), key) != section->keys.end();
      if (is_sub) check_keys(kv.second, full);
      else if (!is_key) {
        std::vector<std::string> known = section->keys;
        known.insert(known.end(), section->subsections.begin(), section->subsections.end());
        fail(kv.first, full, fmt::format("unknown key (known here: {})", fmt::join(known, ", ")));
      }
    }
  }

  template <typename T>
  void read(const YAML::Node& section, const std::string& path, const char* key, T& out) const {
    if (!section || !section.IsMap()) return;
    const YAML::Node node = section[key];
    if (!node || node.IsNull()) return;  // "key:" with no value keeps the default
    const auto full = join_path(path, key);
    if (!node.IsScalar()) fail(node, full, fmt::format("expected {}, got a {}", type_name<T>(), node.IsSequence() ? "list" : "mapping"));
    try {
      out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, full, fmt::format("expected {}, got '{}'", type_name<T>(), node.Scalar()));
    }
  }

  // `key: [a, b]`: exactly two numbers (optim.betas).
  void read_pair(const YAML::Node& section, const std::string& path, const char* key, double& first, double& second) const {
    if (!section || !section.IsMap()) return;
    const YAML::Node node = section[key];
    if (!node) return;
    const auto full = join_path(path, key);
    if (!node.IsSequence() || node.size() != 2) fail(node, full, "expected a list of two numbers, e.g. [0.9, 0.999]");
    try {
      first = node[0].as<double>();
      second = node[1].as<double>();
    } catch (const YAML::Exception&) {
      fail(node, full, "expected a list of two numbers, e.g. [0.9, 0.999]");
    }
  }

  void read_list(const YAML::Node& section, const std::string& path, const char* key, std::vector<std::int64_t>& out) const {
    if (!section || !section.IsMap()) return;
    const YAML::Node node = section[key];
    if (!node) return;
    const auto full = join_path(path, key);
    if (!node.IsSequence()) fail(node, full, "expected a list of integers, e.g. [784, 128, 10]");
    out.clear();
    for (const auto& item : node) {
      try {
        out.push_back(item.as<std::int64_t>());
      } catch (const YAML::Exception&) {
        fail(item, full, fmt::format("expected an integer, got '{}'", item.IsScalar() ? item.Scalar() : "a collection"));
      }
    }
  }

 private:
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "a string";
  }

  std::string source_;
  std::map<std::string, std::string> overrides_;
};

YAML::Node section_of(const YAML::Node& root, const char* name) { return root.IsMap() ? root[name] : YAML::Node(); }

// The option keys each model.sequential layer kind takes ("" kinds: none).
const std::vector<std::pair<std::string, std::vector<std::string>>>& layer_kinds() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kinds = {
      {"linear", {"out"}},
      {"conv2d", {"out", "kernel", "stride", "padding"}},
      {"max_pool2d", {"kernel", "stride"}},
      {"flatten", {}},
      {"dropout", {"p"}},
      {"dropout2d", {"p"}},
      {"relu", {}}, {"gelu", {}}, {"gelu_tanh", {}}, {"silu", {}}, {"tanh", {}}, {"sigmoid", {}}, {"identity", {}},
  };
  return kinds;
}

// model.sequential: a list of `- kind: {options}` (or `- kind`) entries.
void read_layers(const ConfigReader& r, const YAML::Node& model, std::vector<LayerConfig>& out) {
  if (!model || !model.IsMap()) return;
  const YAML::Node list = model["sequential"];
  if (!list || list.IsNull()) return;
  if (!list.IsSequence())
    r.fail(list, "model.sequential", "expected a list of layers, e.g. [{linear: {out: 10}}] (one `- kind: {...}` per line)");
  out.clear();
  for (std::size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    const std::string at = fmt::format("model.sequential[{}]", i);
    YAML::Node options;
    LayerConfig layer;
    if (item.IsScalar()) {
      layer.kind = item.Scalar();
    } else if (item.IsMap() && item.size() == 1 && item.begin()->first.IsScalar()) {
      layer.kind = item.begin()->first.Scalar();
      options = item.begin()->second;
    } else {
      r.fail(item, at, "expected one layer as `kind: {options}` (e.g. `conv2d: {out: 10, kernel: 5}`) or `kind`");
    }
    const auto kind = std::find_if(layer_kinds().begin(), layer_kinds().end(), [&](const auto& k) { return k.first == layer.kind; });
    if (kind == layer_kinds().end()) {
      std::vector<std::string> names;
      for (const auto& k : layer_kinds()) names.push_back(k.first);
      r.fail(item, at, fmt::format("unknown layer '{}' (known: {})", layer.kind, fmt::join(names, ", ")));
    }
    const std::string path = at + "." + layer.kind;
    if (options && !options.IsNull()) {
      if (!options.IsMap()) r.fail(options, path, "expected a mapping of options, e.g. {out: 10} ({} for none)");
      for (const auto& kv : options) {
        const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
        if (std::find(kind->second.begin(), kind->second.end(), key) == kind->second.end())
          r.fail(kv.first, path + "." + key,
                 kind->second.empty() ? fmt::format("unknown option ({} takes none)", layer.kind)
                                      : fmt::format("unknown option (known here: {})", fmt::join(kind->second, ", ")));
      }
      r.read(options, path, "out", layer.out);
      r.read(options, path, "kernel", layer.kernel);
      r.read(options, path, "stride", layer.stride);
      r.read(options, path, "padding", layer.padding);
      r.read(options, path, "p", layer.p);
    }
    const auto has = [&](const char* key) { return options && options.IsMap() && options[key]; };
    for (const auto& key : kind->second)
      if ((key == "out" || key == "kernel") && !has(key.c_str()))
        r.fail(options ? options : item, path + "." + key, fmt::format("is required for {}", layer.kind));
    if (has("stride") && layer.stride <= 0) r.fail(options["stride"], path + ".stride", "must be > 0");
    if (layer.kind == "conv2d" && layer.stride == 0) layer.stride = 1;
    if (layer.kind == "max_pool2d" && layer.stride == 0) layer.stride = layer.kernel;
    if (layer.kind != "dropout" && layer.kind != "dropout2d") layer.p = LayerConfig{}.p;
    if (has("out") && layer.out <= 0) r.fail(options["out"], path + ".out", "must be > 0");
    if (has("kernel") && layer.kernel <= 0) r.fail(options["kernel"], path + ".kernel", "must be > 0");
    if (layer.padding < 0) r.fail(options["padding"], path + ".padding", "must be >= 0");
    if (has("p") && !(layer.p >= 0.0 && layer.p < 1.0)) r.fail(options["p"], path + ".p", "must be in [0, 1)");
    out.push_back(layer);
  }
}

void read_all(const ConfigReader& r, const YAML::Node& root, TrainConfig& c) {
  const auto model = section_of(root, "model");
  r.read_list(model, "model", "layers", c.model.layers);
  if (model && model.IsMap() && model["input"] && model["input"].IsSequence())
    r.read_list(model, "model", "input", c.model.input_shape);
  else
    r.read(model, "model", "input", c.model.input);
  read_layers(r, model, c.model.sequential);
  r.read(model, "model", "hidden_width", c.model.hidden_width);
  r.read(model, "model", "hidden_depth", c.model.hidden_depth);
  r.read(model, "model", "classes", c.model.classes);
  r.read(model, "model", "activation", c.model.activation);
  r.read(model, "model", "loss", c.model.loss);
  r.read(model, "model", "label_smoothing", c.model.label_smoothing);
  r.read(model, "model", "dropout", c.model.dropout);

  const auto data = section_of(root, "data");
  r.read(data, "data", "dir", c.data.dir);
  r.read(data, "data", "batch_size", c.data.batch_size);
  r.read(data, "data", "shuffle_seed", c.data.shuffle_seed);
  r.read(data, "data", "normalize", c.data.normalize);
  r.read(data, "data", "mean", c.data.mean);
  r.read(data, "data", "std", c.data.std);
  r.read(data, "data", "train_limit", c.data.train_limit);
  r.read(data, "data", "test_limit", c.data.test_limit);
  r.read(data, "data", "eval_batch_size", c.data.eval_batch_size);
  r.read(data, "data", "format", c.data.format);
  r.read(data, "data", "train_x", c.data.train_x);
  r.read(data, "data", "train_y", c.data.train_y);
  r.read(data, "data", "test_x", c.data.test_x);
  r.read(data, "data", "test_y", c.data.test_y);
  r.read(data, "data", "label_column", c.data.label_column);
  r.read(data, "data", "test_fraction", c.data.test_fraction);
  r.read(data, "data", "split_seed", c.data.split_seed);

  const auto optim = section_of(root, "optim");
  r.read(optim, "optim", "name", c.optim.name);
  r.read(optim, "optim", "lr", c.optim.lr);
  r.read(optim, "optim", "momentum", c.optim.momentum);
  r.read(optim, "optim", "weight_decay", c.optim.weight_decay);
  r.read(optim, "optim", "nesterov", c.optim.nesterov);
  r.read_pair(optim, "optim", "betas", c.optim.beta1, c.optim.beta2);
  r.read(optim, "optim", "eps", c.optim.eps);
  r.read(optim, "optim", "clip_grad_norm", c.optim.clip_grad_norm);
  const auto sched = optim && optim.IsMap() ? optim["schedule"] : YAML::Node();
  r.read(sched, "optim.schedule", "kind", c.optim.schedule.kind);
  r.read(sched, "optim.schedule", "warmup_steps", c.optim.schedule.warmup_steps);
  r.read(sched, "optim.schedule", "step_size", c.optim.schedule.step_size);
  r.read(sched, "optim.schedule", "gamma", c.optim.schedule.gamma);
  r.read(sched, "optim.schedule", "min_lr", c.optim.schedule.min_lr);

  const auto prec = section_of(root, "precision");
  r.read(prec, "precision", "weights", c.precision.weights);
  r.read(prec, "precision", "accumulate", c.precision.accumulate);
  r.read(prec, "precision", "compute", c.precision.compute);

  const auto run = section_of(root, "run");
  r.read(run, "run", "steps", c.run.steps);
  r.read(run, "run", "epochs", c.run.epochs);
  r.read(run, "run", "seed", c.run.seed);
  r.read(run, "run", "eval_every", c.run.eval_every);
  r.read(run, "run", "log_every", c.run.log_every);
  r.read(run, "run", "out_dir", c.run.out_dir);
  r.read(run, "run", "checkpoint", c.run.checkpoint);
  r.read(run, "run", "checkpoint_every", c.run.checkpoint_every);
  r.read(run, "run", "resume", c.run.resume);

  const auto backend = section_of(root, "backend");
  r.read(backend, "backend", "kind", c.backend.kind);
  r.read(backend, "backend", "cuda_graph", c.backend.cuda_graph);
  r.read(backend, "backend", "autotune", c.backend.autotune);
  r.read(backend, "backend", "whole_step", c.backend.whole_step);
  r.read(backend, "backend", "one_pass_backward", c.backend.one_pass_backward);
  r.read(backend, "backend", "steps_per_launch", c.backend.steps_per_launch);
  r.read(backend, "backend", "whole_step_mode", c.backend.whole_step_mode);
  r.read(backend, "backend", "small_batch_forward", c.backend.small_batch_forward);
  r.read(backend, "backend", "conv_kernels", c.backend.conv_kernels);
  r.read(backend, "backend", "fold_input_update", c.backend.fold_input_update);
  r.read(backend, "backend", "dependent_launch", c.backend.dependent_launch);
  r.read(backend, "backend", "classifier_mma", c.backend.classifier_mma);
  r.read(backend, "backend", "one_pass_multicast", c.backend.one_pass_multicast);
  r.read(backend, "backend", "strip_splits", c.backend.strip_splits);
  r.read(backend, "backend", "resident_cluster", c.backend.resident_cluster);
}

// The node of a key, for the line number in a validation error.
YAML::Node node_at(const YAML::Node& root, const std::string& dotted) {
  YAML::Node node = root;
  std::stringstream ss(dotted);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!node.IsMap() || !node[part]) return root;
    node = node[part];
  }
  return node;
}

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
    try {
      m.classes = sequential_outputs(m.input_shape, layer_specs(m.sequential));
    } catch (const SequentialShapeError& e) {
      if (e.index < 0) r.fail(model_node["input"], "model.input", e.what());
      r.fail(list[static_cast<std::size_t>(e.index)],
             fmt::format("model.sequential[{}].{}", e.index, m.sequential[static_cast<std::size_t>(e.index)].kind),
             fmt::format("{} (model.input {})", e.problem, shape_string(m.input_shape)));
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
                                   {"optim.clip_grad_norm", c.optim.clip_grad_norm}})
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

  one_of(c.optim.name, {"sgd", "adam", "adamw"}, "optim.name");
  require(c.optim.lr > 0, "optim.lr", fmt::format("must be > 0 (got {})", c.optim.lr));
  require(c.optim.momentum >= 0 && c.optim.momentum < 1, "optim.momentum", fmt::format("must be in [0, 1) (got {})", c.optim.momentum));
  require(c.optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  require(!c.optim.nesterov || c.optim.name == "sgd", "optim.nesterov", "applies to optim.name: sgd only");
  require(!c.optim.nesterov || c.optim.momentum > 0, "optim.nesterov", "needs optim.momentum > 0 (as in PyTorch)");
  require(c.optim.momentum == 0 || c.optim.name == "sgd", "optim.momentum",
          fmt::format("applies to optim.name: sgd only ({} uses optim.betas)", c.optim.name));
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

  one_of(c.backend.kind, {"auto", "cuda", "cpu"}, "backend.kind");
  require(c.backend.steps_per_launch >= 1, "backend.steps_per_launch", "must be >= 1");
  one_of(c.backend.whole_step_mode, {"auto", "grid", "cluster", "resident"}, "backend.whole_step_mode");
  one_of(c.backend.conv_kernels, {"auto", "cudnn", "implicit_gemm"}, "backend.conv_kernels");
  const std::string splits = strip_splits_problem(c.backend.strip_splits);
  require(splits.empty(), "backend.strip_splits", splits);
  const std::string cluster = resident_cluster_problem(c.backend.resident_cluster);
  require(cluster.empty(), "backend.resident_cluster", cluster);
}

void apply_override(YAML::Node& root, const std::string& source, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("{}: --set '{}': expected key.path=value", source, text));
  const std::string key = text.substr(0, eq);
  if (!is_known_key(key)) throw ConfigError(fmt::format("{}: --set '{}': unknown key '{}'", source, text, key));
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: --set '{}': value is not valid YAML: {}", source, text, e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // yaml-cpp nodes are handles: walk by reassignment, creating sections as needed.
  std::vector<YAML::Node> chain{root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}: invalid YAML: {}", source, e.mark.line + 1, e.msg));
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap())
    throw ConfigError(fmt::format("{}:{}: the top level must be a mapping of sections (model:, data:, optim:, ...), not {}",
                                  source, root.Mark().line + 1, root.IsSequence() ? "a list" : "a single value"));
  std::map<std::string, std::string> by_key;
  for (const auto& o : overrides) {
    apply_override(root, source, o);
    by_key[o.substr(0, o.find('='))] = o;
  }
  ConfigReader reader(source, by_key);
  TrainConfig c;
  c.source = source;
  try {
    reader.check_keys(root, "");
    read_all(reader, root, c);
    validate(reader, root, c);
  } catch (const YAML::Exception& e) {  // anything the checks above did not foresee: still a ConfigError
    throw ConfigError(fmt::format("{}:{}: {}", source, e.mark.line + 1, e.msg));
  }
  return c;
}

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: cannot open config file", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path.string(), overrides);
}

// The shortest decimal that parses back to the same double (0.05, not 0.050000000000000003).
static std::string num(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // keep it a float to the eye
  return text;
}

std::string layer_text(const LayerConfig& l) {
  std::vector<std::string> keys;
  if (l.kind == "linear" || l.kind == "conv2d") keys.push_back(fmt::format("out: {}", l.out));
  if (l.kind == "conv2d" || l.kind == "max_pool2d") {
    keys.push_back(fmt::format("kernel: {}", l.kernel));
    keys.push_back(fmt::format("stride: {}", l.stride));
  }
  if (l.kind == "conv2d") keys.push_back(fmt::format("padding: {}", l.padding));
  if (l.kind == "dropout" || l.kind == "dropout2d") keys.push_back(fmt::format("p: {}", num(l.p)));
  return fmt::format("{}{{{}}}", l.kind, fmt::join(keys, ", "));
}

std::string to_yaml(const TrainConfig& c) {
  YAML::Emitter e;
  e.SetDoublePrecision(17);  // unused below: doubles go through num(), the shortest text that reads back exactly
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (c.model.is_sequential()) {
    e << YAML::Key << "input" << YAML::Value << YAML::Flow << c.model.input_shape;
    e << YAML::Key << "sequential" << YAML::Value << YAML::BeginSeq;
    for (const auto& layer : c.model.sequential) {
      e << YAML::BeginMap << YAML::Key << layer.kind << YAML::Value << YAML::Flow << YAML::BeginMap;
      if (layer.kind == "linear" || layer.kind == "conv2d") e << YAML::Key << "out" << YAML::Value << layer.out;
      if (layer.kind == "conv2d" || layer.kind == "max_pool2d") {
        e << YAML::Key << "kernel" << YAML::Value << layer.kernel;
        e << YAML::Key << "stride" << YAML::Value << layer.stride;
      }
      if (layer.kind == "conv2d") e << YAML::Key << "padding" << YAML::Value << layer.padding;
      if (layer.kind == "dropout" || layer.kind == "dropout2d") e << YAML::Key << "p" << YAML::Value << num(layer.p);
      e << YAML::EndMap << YAML::EndMap;
    }
    e << YAML::EndSeq;
  } else {
    e << YAML::Key << "layers" << YAML::Value << YAML::Flow << c.model.layers;
    e << YAML::Key << "activation" << YAML::Value << c.model.activation;
  }
  e << YAML::Key << "loss" << YAML::Value << c.model.loss;
  e << YAML::Key << "label_smoothing" << YAML::Value << c.model.label_smoothing;
  if (!c.model.is_sequential()) e << YAML::Key << "dropout" << YAML::Value << c.model.dropout;
  e << YAML::EndMap;
  e << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "dir" << YAML::Value << c.data.dir;
  e << YAML::Key << "batch_size" << YAML::Value << c.data.batch_size;
  e << YAML::Key << "shuffle_seed" << YAML::Value << c.data.shuffle_seed;
  e << YAML::Key << "normalize" << YAML::Value << c.data.normalize;
  e << YAML::Key << "mean" << YAML::Value << num(c.data.mean);
  e << YAML::Key << "std" << YAML::Value << num(c.data.std);
  e << YAML::Key << "train_limit" << YAML::Value << c.data.train_limit;
  e << YAML::Key << "test_limit" << YAML::Value << c.data.test_limit;
  e << YAML::Key << "eval_batch_size" << YAML::Value << c.data.eval_batch_size;
  e << YAML::Key << "format" << YAML::Value << c.data.format;
  e << YAML::Key << "train_x" << YAML::Value << c.data.train_x;
  e << YAML::Key << "train_y" << YAML::Value << c.data.train_y;
  e << YAML::Key << "test_x" << YAML::Value << c.data.test_x;
  e << YAML::Key << "test_y" << YAML::Value << c.data.test_y;
  e << YAML::Key << "label_column" << YAML::Value << c.data.label_column;
  e << YAML::Key << "test_fraction" << YAML::Value << num(c.data.test_fraction);
  e << YAML::Key << "split_seed" << YAML::Value << c.data.split_seed << YAML::EndMap;
  e << YAML::Key << "optim" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value << c.optim.name;
  e << YAML::Key << "lr" << YAML::Value << num(c.optim.lr);
  e << YAML::Key << "momentum" << YAML::Value << num(c.optim.momentum);
  e << YAML::Key << "weight_decay" << YAML::Value << num(c.optim.weight_decay);
  e << YAML::Key << "nesterov" << YAML::Value << c.optim.nesterov;
  e << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq << num(c.optim.beta1) << num(c.optim.beta2)
    << YAML::EndSeq;
  e << YAML::Key << "eps" << YAML::Value << num(c.optim.eps);
  e << YAML::Key << "clip_grad_norm" << YAML::Value << num(c.optim.clip_grad_norm);
  e << YAML::Key << "schedule" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.optim.schedule.kind;
  e << YAML::Key << "warmup_steps" << YAML::Value << c.optim.schedule.warmup_steps;
  e << YAML::Key << "step_size" << YAML::Value << c.optim.schedule.step_size;
  e << YAML::Key << "gamma" << YAML::Value << num(c.optim.schedule.gamma);
  e << YAML::Key << "min_lr" << YAML::Value << num(c.optim.schedule.min_lr) << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "precision" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "weights" << YAML::Value << c.precision.weights;
  e << YAML::Key << "accumulate" << YAML::Value << c.precision.accumulate;
  e << YAML::Key << "compute" << YAML::Value << c.precision.compute << YAML::EndMap;
  e << YAML::Key << "run" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "steps" << YAML::Value << c.run.steps;
  e << YAML::Key << "epochs" << YAML::Value << c.run.epochs;
  e << YAML::Key << "seed" << YAML::Value << c.run.seed;
  e << YAML::Key << "eval_every" << YAML::Value << c.run.eval_every;
  e << YAML::Key << "log_every" << YAML::Value << c.run.log_every;
  e << YAML::Key << "out_dir" << YAML::Value << c.run.out_dir;
  e << YAML::Key << "checkpoint" << YAML::Value << c.run.checkpoint;
  e << YAML::Key << "checkpoint_every" << YAML::Value << c.run.checkpoint_every;
  e << YAML::Key << "resume" << YAML::Value << c.run.resume << YAML::EndMap;
  e << YAML::Key << "backend" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.backend.kind;
  e << YAML::Key << "cuda_graph" << YAML::Value << c.backend.cuda_graph;
  e << YAML::Key << "autotune" << YAML::Value << c.backend.autotune;
  e << YAML::Key << "whole_step" << YAML::Value << c.backend.whole_step;
  e << YAML::Key << "one_pass_backward" << YAML::Value << c.backend.one_pass_backward;
  e << YAML::Key << "steps_per_launch" << YAML::Value << c.backend.steps_per_launch;
  e << YAML::Key << "whole_step_mode" << YAML::Value << c.backend.whole_step_mode;
  e << YAML::Key << "small_batch_forward" << YAML::Value << c.backend.small_batch_forward;
  e << YAML::Key << "conv_kernels" << YAML::Value << c.backend.conv_kernels;
  e << YAML::Key << "fold_input_update" << YAML::Value << c.backend.fold_input_update;
  e << YAML::Key << "dependent_launch" << YAML::Value << c.backend.dependent_launch;
  e << YAML::Key << "classifier_mma" << YAML::Value << c.backend.classifier_mma;
  e << YAML::Key << "one_pass_multicast" << YAML::Value << c.backend.one_pass_multicast;
  e << YAML::Key << "strip_splits" << YAML::Value << c.backend.strip_splits;
  e << YAML::Key << "resident_cluster" << YAML::Value << c.backend.resident_cluster << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace sg::app
