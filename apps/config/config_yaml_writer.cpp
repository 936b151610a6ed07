#include <yaml-cpp/yaml.h>

#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/config/train_config.hpp"
#include "runtime/backend_option_table.hpp"

// to_yaml and layer_text (declared in train_config.hpp): the resolved config
// as YAML, every key written, floats as the shortest text that reads back.
namespace sg::app {

// The shortest decimal that parses back to the same double (0.05, not 0.050000000000000003).
static std::string num(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // keep it a float to the eye
  return text;
}

std::string layer_text(const LayerConfig& l) {
  std::vector<std::string> keys;
  if (l.kind == "linear" || l.kind == "conv2d") keys.push_back(fmt::format("out: {}", l.out));
  if (l.kind == "conv2d" || l.kind == "max_pool2d" || l.kind == "avg_pool2d") {
    keys.push_back(fmt::format("kernel: {}", l.kernel));
    keys.push_back(fmt::format("stride: {}", l.stride));
  }
  if (l.kind == "conv2d") keys.push_back(fmt::format("padding: {}", l.padding));
  if ((l.kind == "linear" || l.kind == "conv2d") && !l.bias) keys.push_back("bias: false");
  if (l.kind == "dropout" || l.kind == "dropout2d") keys.push_back(fmt::format("p: {}", num(l.p)));
  if (l.kind == "layer_norm" || l.kind == "batch_norm") keys.push_back(fmt::format("eps: {}", num(l.eps)));
  if (l.kind == "batch_norm") keys.push_back(fmt::format("momentum: {}", num(l.momentum)));
  if (l.kind == "residual") {
    std::vector<std::string> body;
    for (const LayerConfig& b : l.body) body.push_back(layer_text(b));
    keys.push_back(fmt::format("layers: [{}]", fmt::join(body, ", ")));
    if (!l.projection.empty()) keys.push_back("projection: " + layer_text(l.projection.front()));
  }
  if (!l.name.empty()) keys.push_back(fmt::format("name: {}", l.name));
  if (!l.inputs.empty()) keys.push_back(fmt::format("inputs: [{}]", fmt::join(l.inputs, ", ")));
  return fmt::format("{}{{{}}}", l.kind, fmt::join(keys, ", "));
}

// One model.sequential entry, `kind: {options}`; a residual block's layers nested as a list.
static void emit_layer(YAML::Emitter& e, const LayerConfig& layer) {
  const bool block = layer.kind == "residual";
  e << YAML::BeginMap << YAML::Key << layer.kind << YAML::Value;
  if (!block) e << YAML::Flow;
  e << YAML::BeginMap;
  if (layer.kind == "linear" || layer.kind == "conv2d") e << YAML::Key << "out" << YAML::Value << layer.out;
  if (layer.kind == "conv2d" || layer.kind == "max_pool2d" || layer.kind == "avg_pool2d") {
    e << YAML::Key << "kernel" << YAML::Value << layer.kernel;
    e << YAML::Key << "stride" << YAML::Value << layer.stride;
  }
  if (layer.kind == "conv2d") e << YAML::Key << "padding" << YAML::Value << layer.padding;
  if ((layer.kind == "linear" || layer.kind == "conv2d") && !layer.bias) e << YAML::Key << "bias" << YAML::Value << false;
  if (layer.kind == "dropout" || layer.kind == "dropout2d") e << YAML::Key << "p" << YAML::Value << num(layer.p);
  if (layer.kind == "layer_norm" || layer.kind == "batch_norm") e << YAML::Key << "eps" << YAML::Value << num(layer.eps);
  if (layer.kind == "batch_norm") e << YAML::Key << "momentum" << YAML::Value << num(layer.momentum);
  if (block) {
    e << YAML::Key << "layers" << YAML::Value << YAML::BeginSeq;
    for (const LayerConfig& b : layer.body) emit_layer(e, b);
    e << YAML::EndSeq;
    if (!layer.projection.empty()) {
      e << YAML::Key << "projection" << YAML::Value;
      emit_layer(e, layer.projection.front());
    }
  }
  if (!layer.name.empty()) e << YAML::Key << "name" << YAML::Value << layer.name;
  if (!layer.inputs.empty()) e << YAML::Key << "inputs" << YAML::Value << YAML::Flow << layer.inputs;
  e << YAML::EndMap << YAML::EndMap;
}

std::string to_yaml(const TrainConfig& c) {
  YAML::Emitter e;
  e.SetDoublePrecision(17);  // unused below: doubles go through num(), the shortest text that reads back exactly
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (c.model.is_sequential()) {
    e << YAML::Key << "input" << YAML::Value << YAML::Flow << c.model.input_shape;
    e << YAML::Key << "sequential" << YAML::Value << YAML::BeginSeq;
    for (const auto& layer : c.model.sequential) emit_layer(e, layer);
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
  e << YAML::Key << "augment" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "translate" << YAML::Value << c.data.augment_translate;
  e << YAML::Key << "flip" << YAML::Value << c.data.augment_flip;
  e << YAML::EndMap;
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
  e << YAML::Key << "alpha" << YAML::Value << num(c.optim.alpha);
  e << YAML::Key << "centered" << YAML::Value << c.optim.centered;
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
  e << YAML::Key << "compute" << YAML::Value << c.precision.compute;
  e << YAML::Key << "all_reduce" << YAML::Value << c.precision.all_reduce << YAML::EndMap;
  e << YAML::Key << "data_parallel" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "bucket_mb" << YAML::Value << num(c.data_parallel.bucket_mb);
  e << YAML::Key << "nccl_ctas" << YAML::Value << c.data_parallel.nccl_ctas;
  e << YAML::Key << "symmetric_memory" << YAML::Value << c.data_parallel.symmetric_memory;
  e << YAML::Key << "zero1" << YAML::Value << c.data_parallel.zero1;
  e << YAML::Key << "zero1_min_mb" << YAML::Value << num(c.data_parallel.zero1_min_mb);
  e << YAML::Key << "weight_gradients" << YAML::Value << c.data_parallel.weight_gradients << YAML::EndMap;
  e << YAML::Key << "run" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "steps" << YAML::Value << c.run.steps;
  e << YAML::Key << "epochs" << YAML::Value << c.run.epochs;
  e << YAML::Key << "seed" << YAML::Value << c.run.seed;
  e << YAML::Key << "eval_every" << YAML::Value << c.run.eval_every;
  e << YAML::Key << "log_every" << YAML::Value << c.run.log_every;
  e << YAML::Key << "out_dir" << YAML::Value << c.run.out_dir;
  e << YAML::Key << "checkpoint" << YAML::Value << c.run.checkpoint;
  e << YAML::Key << "checkpoint_every" << YAML::Value << c.run.checkpoint_every;
  e << YAML::Key << "resume" << YAML::Value << c.run.resume;
  e << YAML::Key << "loss_plot_scale" << YAML::Value << c.run.loss_plot_scale << YAML::EndMap;
  e << YAML::Key << "backend" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kind" << YAML::Value << c.backend.kind;
  e << YAML::Key << "cuda_graph" << YAML::Value << c.backend.cuda_graph;
  for (const auto& row : backend_option_table()) {  // every backend option, from the table
    e << YAML::Key << row.key << YAML::Value;
    std::visit([&e](const auto& v) { e << v; }, row.get(c.backend.options));
  }
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace sg::app
