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

// configs/mnist_resnet.yaml in small: conv-BN-ReLU, a residual block
// (conv-BN-ReLU-conv-BN added to its input), ReLU, a 2x2 pool, conv-BN-ReLU,
// global average pooling, the classifier; convs without bias, `width`
// channels, then twice that.
inline std::vector<LayerSpec> batch_norm_residual_layers(std::int64_t width) {
  const auto conv = [](std::int64_t out) {
    LayerSpec l = net_layer(LayerKind::conv2d, out, 3, 1);
    l.bias = false;
    return l;
  };
  LayerSpec a1 = net_layer(LayerKind::activation);
  a1.name = "a1";
  LayerSpec b3 = net_layer(LayerKind::batch_norm);
  b3.name = "b3";
  LayerSpec add = net_layer(LayerKind::add);
  add.inputs = {"a1", "b3"};
  return {conv(width),
          net_layer(LayerKind::batch_norm),
          a1,
          conv(width),
          net_layer(LayerKind::batch_norm),
          net_layer(LayerKind::activation),
          conv(width),
          b3,
          add,
          net_layer(LayerKind::activation),
          net_layer(LayerKind::max_pool2d, 0, 2),
          conv(2 * width),
          net_layer(LayerKind::batch_norm),
          net_layer(LayerKind::activation),
          net_layer(LayerKind::global_avg_pool2d),
          net_layer(LayerKind::linear, 10)};
}

}  // namespace sg::test
