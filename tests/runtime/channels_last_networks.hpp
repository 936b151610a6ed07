#pragma once
// The layer lists of the channels-last tests (graph/channels_last_pass.hpp):
// on the CPU (test_channels_last.cpp), in the schedule
// (test_channels_last_schedule.cpp) and on the GPU (test_channels_last_gpu.cpp).
#include <vector>

#include "models/sequential.hpp"
#include "tests/runtime/layer_specs.hpp"

namespace sg::test {

// configs/mnist_cnn_fast.yaml's network on [1, 28, 28]: two 5x5 convs
// ("same" padding, 32 and 64 channels), each with its ReLU and a 2x2 pool,
// then 128 hidden units and 10 classes.
inline std::vector<LayerSpec> two_conv_layers() {
  return {net_layer(LayerKind::conv2d, 32, 5, 2), net_layer(LayerKind::activation),
          net_layer(LayerKind::max_pool2d, 0, 2), net_layer(LayerKind::conv2d, 64, 5, 2),
          net_layer(LayerKind::activation),       net_layer(LayerKind::max_pool2d, 0, 2),
          net_layer(LayerKind::flatten),          net_layer(LayerKind::linear, 128),
          net_layer(LayerKind::activation),       net_layer(LayerKind::linear, 10)};
}

}  // namespace sg::test
