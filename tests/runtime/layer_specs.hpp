#pragma once
// One layer of a model.sequential list, as the model tests write them
// (report_cnn.hpp, small_residual_cnn.hpp, channels_last_networks.hpp).
#include "models/sequential.hpp"

namespace sg::test {

// A layer of `kind`; stride 0 and padding 0 are the layer's defaults.
inline LayerSpec net_layer(LayerKind kind, std::int64_t out = 0, std::int64_t kernel = 0, std::int64_t padding = 0,
                           std::int64_t stride = 0) {
  LayerSpec l;
  l.kind = kind;
  l.out = out;
  l.kernel = kernel;
  l.padding = padding;
  l.stride = stride;
  return l;
}

inline LayerSpec activation_layer(MlpActivation a) {
  LayerSpec l = net_layer(LayerKind::activation);
  l.activation = a;
  return l;
}

}  // namespace sg::test
