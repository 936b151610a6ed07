#include "runtime/export/batch_norm_folding.hpp"

#include <cmath>
#include <cstddef>

namespace sg::exporting {
namespace {

// How many layers read layer `index` (counting a layer that reads it twice twice).
int readers(const ExportedGraph& m, int index) {
  int n = 0;
  for (const GraphLayer& l : m.layers)
    for (int i : l.inputs) n += i == index;
  return n;
}

}  // namespace

int fold_batch_norms(ExportedGraph& m) {
  int folded = 0;
  for (GraphLayer& bn : m.layers) {
    if (bn.kind != "batch_norm" || bn.inputs.size() != 1 || bn.inputs[0] < 0) continue;
    GraphLayer& layer = m.layers[static_cast<std::size_t>(bn.inputs[0])];
    if ((layer.kind != "conv2d" && layer.kind != "linear") || readers(m, bn.inputs[0]) != 1) continue;
    const auto channels = static_cast<std::size_t>(layer.out);
    if (bn.weight.size() != channels || channels == 0) continue;
    if (layer.bias.empty()) {  // bias=False: the fold gives it one
      layer.bias.assign(channels, 0.f);
      layer.bias_shape = {layer.out};
    }
    const std::size_t per_channel = layer.weight.size() / channels;
    for (std::size_t o = 0; o < channels; ++o) {
      const double scale = double(bn.weight[o]) / std::sqrt(double(bn.running_var[o]) + bn.eps);
      for (std::size_t k = 0; k < per_channel; ++k) {
        float& w = layer.weight[o * per_channel + k];
        w = static_cast<float>(double(w) * scale);
      }
      layer.bias[o] = static_cast<float>((double(layer.bias[o]) - bn.running_mean[o]) * scale + bn.bias[o]);
    }
    GraphLayer identity;
    identity.kind = "identity";
    identity.inputs = bn.inputs;
    identity.in = bn.in;
    bn = identity;
    ++folded;
  }
  return folded;
}

}  // namespace sg::exporting
