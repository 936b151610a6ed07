#include "apps/config/sequential_layers.hpp"

#include <fmt/format.h>

namespace sg::app {
namespace {

LayerSpec spec_of(const LayerConfig& l) {
  LayerSpec s;
  s.out = l.out;
  s.kernel = l.kernel;
  s.stride = l.stride;
  s.padding = l.padding;
  s.bias = l.bias;
  s.p = l.p;
  s.eps = l.eps;
  s.momentum = l.momentum;
  s.name = l.name;
  s.inputs = l.inputs;
  if (l.kind == "linear") s.kind = LayerKind::linear;
  else if (l.kind == "add") s.kind = LayerKind::add;
  else if (l.kind == "concat") s.kind = LayerKind::concat;
  else if (l.kind == "conv2d") s.kind = LayerKind::conv2d;
  else if (l.kind == "max_pool2d") s.kind = LayerKind::max_pool2d;
  else if (l.kind == "avg_pool2d") s.kind = LayerKind::avg_pool2d;
  else if (l.kind == "global_avg_pool2d") s.kind = LayerKind::global_avg_pool2d;
  else if (l.kind == "layer_norm") s.kind = LayerKind::layer_norm;
  else if (l.kind == "batch_norm") s.kind = LayerKind::batch_norm;
  else if (l.kind == "flatten") s.kind = LayerKind::flatten;
  else if (l.kind == "dropout") s.kind = LayerKind::dropout;
  else if (l.kind == "dropout2d") s.kind = LayerKind::dropout2d;
  else {
    try {
      s.activation = activation_from_name(l.kind);
    } catch (const std::invalid_argument&) {
      throw ConfigError(fmt::format("model.sequential: unknown layer '{}'", l.kind));
    }
    s.kind = LayerKind::activation;
  }
  return s;
}

class Expander {
 public:
  ExpandedLayers out;

  // `layers` at `prefix` ("model.sequential", a block's "...residual.layers");
  // `entry`: their model.sequential entry (the list's own index at the top);
  // `first_input`: what the first layer reads unless it says ("" = the layer before).
  void list(const std::vector<LayerConfig>& layers, const std::string& prefix, const std::size_t* entry,
            const std::string& first_input) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      LayerConfig l = layers[i];
      const std::string at = fmt::format("{}[{}]", prefix, i);
      const std::size_t e = entry ? *entry : i;
      if (i == 0 && !first_input.empty() && l.inputs.empty()) l.inputs = {first_input};
      if (l.kind == "residual")
        block(l, at, e);
      else
        push(spec_of(l), at + "." + l.kind, e);
    }
  }

 private:
  void block(const LayerConfig& l, const std::string& at, std::size_t entry) {
    const std::string id = at.substr(at.find('.') + 1) + ".residual";  // "sequential[2].residual"
    const std::string input = !l.inputs.empty() ? l.inputs.front() : out.specs.empty() ? "input" : name_last(id + ".input");
    list(l.body, at + ".residual.layers", &entry, input);
    const std::string body = name_last(id + ".body");
    std::string other = input;
    if (!l.projection.empty()) {
      LayerSpec projection = spec_of(l.projection.front());
      if (projection.inputs.empty()) projection.inputs = {input};
      if (projection.name.empty()) projection.name = id + ".projection";
      other = projection.name;
      push(projection, at + ".residual.projection." + l.projection.front().kind, entry);
    }
    LayerSpec add;
    add.kind = LayerKind::add;
    add.name = l.name;
    add.inputs = {body, other};
    push(add, at + ".residual", entry);
  }

  // The last layer's name, giving it `fallback` when it has none.
  std::string name_last(const std::string& fallback) {
    LayerSpec& last = out.specs.back();
    if (last.name.empty()) last.name = fallback;
    return last.name;
  }

  void push(LayerSpec spec, std::string path, std::size_t entry) {
    out.specs.push_back(std::move(spec));
    out.paths.push_back(std::move(path));
    out.entries.push_back(entry);
  }
};

}  // namespace

ExpandedLayers expand_layers(const std::vector<LayerConfig>& layers) {
  Expander x;
  x.list(layers, "model.sequential", nullptr, "");
  return std::move(x.out);
}

std::vector<LayerSpec> layer_specs(const std::vector<LayerConfig>& layers) { return expand_layers(layers).specs; }

}  // namespace sg::app
