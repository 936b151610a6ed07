#include "apps/config/sequential_layers.hpp"

#include <fmt/format.h>

namespace sg::app {

std::vector<LayerSpec> layer_specs(const std::vector<LayerConfig>& layers) {
  std::vector<LayerSpec> out;
  for (const auto& l : layers) {
    LayerSpec s;
    s.out = l.out;
    s.kernel = l.kernel;
    s.stride = l.stride;
    s.padding = l.padding;
    s.p = l.p;
    s.name = l.name;
    s.inputs = l.inputs;
    if (l.kind == "linear") s.kind = LayerKind::linear;
    else if (l.kind == "add") s.kind = LayerKind::add;
    else if (l.kind == "conv2d") s.kind = LayerKind::conv2d;
    else if (l.kind == "max_pool2d") s.kind = LayerKind::max_pool2d;
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
    out.push_back(s);
  }
  return out;
}

}  // namespace sg::app
