#include "apps/config/read_config.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/config/backend_options_from_config.hpp"

namespace sg::app {
namespace {

// The option keys each model.sequential layer kind takes ("" kinds: none).
const std::vector<std::pair<std::string, std::vector<std::string>>>& layer_kinds() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kinds = {
      {"linear", {"out", "bias"}},
      {"conv2d", {"out", "kernel", "stride", "padding", "bias"}},
      {"max_pool2d", {"kernel", "stride"}},
      {"avg_pool2d", {"kernel", "stride"}},
      {"global_avg_pool2d", {}},
      {"layer_norm", {"eps"}},
      {"batch_norm", {"eps", "momentum"}},
      {"flatten", {}},
      {"dropout", {"p"}},
      {"dropout2d", {"p"}},
      {"relu", {}}, {"gelu", {}}, {"gelu_tanh", {}}, {"silu", {}}, {"tanh", {}}, {"sigmoid", {}}, {"identity", {}},
      {"add", {}},
      {"concat", {}},
      {"residual", {"layers", "projection"}},
  };
  return kinds;
}

// The keys every layer takes besides its own (issue 37's model graph).
bool graph_key(const std::string& key) { return key == "name" || key == "inputs"; }

// `inputs: name` or `inputs: [a, b]`: the layers a layer reads.
std::vector<std::string> read_inputs(const ConfigReader& r, const YAML::Node& node, const std::string& path) {
  std::vector<std::string> names;
  if (node.IsScalar()) return {node.Scalar()};
  if (!node.IsSequence()) r.fail(node, path, "expected a layer name or a list of them, e.g. [block1, input]");
  for (const auto& item : node) {
    if (!item.IsScalar()) r.fail(item, path, "expected layer names, e.g. [block1, input]");
    names.push_back(item.Scalar());
  }
  return names;
}

LayerConfig read_layer(const ConfigReader& r, const YAML::Node& item, const std::string& at);

// A list of `- kind: {options}` (or `- kind`) entries at `path` (model.sequential, a residual block's layers).
std::vector<LayerConfig> read_layer_list(const ConfigReader& r, const YAML::Node& list, const std::string& path) {
  if (!list.IsSequence())
    r.fail(list, path, "expected a list of layers, e.g. [{linear: {out: 10}}] (one `- kind: {...}` per line)");
  std::vector<LayerConfig> out;
  for (std::size_t i = 0; i < list.size(); ++i) out.push_back(read_layer(r, list[i], fmt::format("{}[{}]", path, i)));
  return out;
}

// A residual block's own keys: its body (required), its projection (one layer, not a block).
void read_residual(const ConfigReader& r, const YAML::Node& options, const YAML::Node& item, const std::string& path,
                   LayerConfig& layer) {
  // Blocks nest (a block's layer may be a block), but not without end: the reader recurses.
  constexpr std::size_t kMaxNesting = 8;
  std::size_t depth = 0;
  for (auto at = path.find(".residual"); at != std::string::npos; at = path.find(".residual", at + 1)) ++depth;
  if (depth > kMaxNesting)
    r.fail(item, path, fmt::format("residual blocks nested {} deep; at most {}", depth, kMaxNesting));
  if (!options || options.IsNull() || !options["layers"] || options["layers"].IsNull())
    r.fail(options ? options : item, path + ".layers",
           "is required for residual: the block's layers, e.g. [{conv2d: {out: 16, kernel: 3, padding: 1}}, relu]");
  layer.body = read_layer_list(r, options["layers"], path + ".layers");
  if (layer.body.empty()) r.fail(options["layers"], path + ".layers", "needs at least one layer");
  if (const YAML::Node projection = options["projection"]; projection && !projection.IsNull()) {
    layer.projection = {read_layer(r, projection, path + ".projection")};
    if (layer.projection[0].kind == "residual")
      r.fail(projection, path + ".projection", "is one layer (e.g. {conv2d: {out: 16, kernel: 1}}), not a residual block");
  }
  if (layer.inputs.size() > 1)
    r.fail(options["inputs"], path + ".inputs", "a residual block reads one input (its sum's other term is its body)");
}

// model.sequential: a list of `- kind: {options}` (or `- kind`) entries.
void read_layers(const ConfigReader& r, const YAML::Node& model, std::vector<LayerConfig>& out) {
  if (!model || !model.IsMap()) return;
  const YAML::Node list = model["sequential"];
  if (!list || list.IsNull()) return;
  out = read_layer_list(r, list, "model.sequential");
}

LayerConfig read_layer(const ConfigReader& r, const YAML::Node& item, const std::string& at) {
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
      if (!graph_key(key) && std::find(kind->second.begin(), kind->second.end(), key) == kind->second.end())
        r.fail(kv.first, path + "." + key,
               kind->second.empty()
                   ? fmt::format("unknown option ({} takes only name and inputs)", layer.kind)
                   : fmt::format("unknown option (known here: {}, name, inputs)", fmt::join(kind->second, ", ")));
    }
    r.read(options, path, "name", layer.name);
    if (options["inputs"] && !options["inputs"].IsNull())
      layer.inputs = read_inputs(r, options["inputs"], path + ".inputs");
    r.read(options, path, "out", layer.out);
    r.read(options, path, "kernel", layer.kernel);
    r.read(options, path, "stride", layer.stride);
    r.read(options, path, "padding", layer.padding);
    r.read(options, path, "bias", layer.bias);
    r.read(options, path, "p", layer.p);
    r.read(options, path, "eps", layer.eps);
    r.read(options, path, "momentum", layer.momentum);
  }
  if (layer.kind == "residual") read_residual(r, options, item, path, layer);
  const auto has = [&](const char* key) { return options && options.IsMap() && options[key]; };
  for (const auto& key : kind->second)
    if ((key == "out" || key == "kernel") && !has(key.c_str()))
      r.fail(options ? options : item, path + "." + key, fmt::format("is required for {}", layer.kind));
  if (has("stride") && layer.stride <= 0) r.fail(options["stride"], path + ".stride", "must be > 0");
  if (layer.kind == "conv2d" && layer.stride == 0) layer.stride = 1;
  if ((layer.kind == "max_pool2d" || layer.kind == "avg_pool2d") && layer.stride == 0) layer.stride = layer.kernel;
  if (layer.kind != "dropout" && layer.kind != "dropout2d") layer.p = LayerConfig{}.p;
  if (has("out") && layer.out <= 0) r.fail(options["out"], path + ".out", "must be > 0");
  if (has("kernel") && layer.kernel <= 0) r.fail(options["kernel"], path + ".kernel", "must be > 0");
  if (layer.padding < 0) r.fail(options["padding"], path + ".padding", "must be >= 0");
  if (has("p") && !(layer.p >= 0.0 && layer.p < 1.0)) r.fail(options["p"], path + ".p", "must be in [0, 1)");
  if (has("eps") && !(layer.eps > 0.0)) r.fail(options["eps"], path + ".eps", "must be > 0");
  if (has("momentum") && !(layer.momentum >= 0.0 && layer.momentum <= 1.0))
    r.fail(options["momentum"], path + ".momentum", "must be in [0, 1]");
  return layer;
}

}  // namespace

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
  const auto augment = data && data.IsMap() ? data["augment"] : YAML::Node();
  r.read(augment, "data.augment", "translate", c.data.augment_translate);
  r.read(augment, "data.augment", "flip", c.data.augment_flip);
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
  r.read(optim, "optim", "alpha", c.optim.alpha);
  r.read(optim, "optim", "centered", c.optim.centered);
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
  r.read(prec, "precision", "all_reduce", c.precision.all_reduce);

  const auto parallel = section_of(root, "data_parallel");
  r.read(parallel, "data_parallel", "bucket_mb", c.data_parallel.bucket_mb);
  r.read(parallel, "data_parallel", "nccl_ctas", c.data_parallel.nccl_ctas);
  r.read(parallel, "data_parallel", "symmetric_memory", c.data_parallel.symmetric_memory);
  r.read(parallel, "data_parallel", "zero1", c.data_parallel.zero1);
  r.read(parallel, "data_parallel", "zero1_min_mb", c.data_parallel.zero1_min_mb);
  r.read(parallel, "data_parallel", "weight_gradients", c.data_parallel.weight_gradients);

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
  r.read(run, "run", "loss_plot_scale", c.run.loss_plot_scale);

  const auto backend = section_of(root, "backend");
  r.read(backend, "backend", "kind", c.backend.kind);
  r.read(backend, "backend", "cuda_graph", c.backend.cuda_graph);
  read_backend_options(r, backend, c.backend.options);
  c.backend.options.accumulate_f16 = c.precision.accumulate == "fp16";
}

}  // namespace sg::app
