#pragma once
// The layer lists of the channels-last tests (graph/channels_last_pass.hpp):
// on the CPU (test_channels_last.cpp), in the schedule
// (test_channels_last_schedule.cpp) and on the GPU (test_channels_last_gpu.cpp).
#include <stdexcept>
#include <vector>

#include "models/sequential.hpp"
#include "models/sequential_program.hpp"
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

// The CUDA training program of a channels-last CNN with its channels-last
// training graph as `train`, for the schedule tests: variant 0 the two 5x5
// convolutions with AdamW and fp32 master weights, 1 batch_norm_residual_layers(16)
// with momentum SGD in f16; batch 64.
inline TrainingProgram channels_last_training_program(int variant) {
  SequentialTraining t;
  t.model.input_shape = {1, 28, 28};
  t.model.layers = variant == 1 ? batch_norm_residual_layers(16) : two_conv_layers();
  t.model.batch = 64;
  t.model.weight_dtype = variant == 1 ? DType::f16 : DType::f32;
  t.optimizer.kind = variant == 1 ? OptimizerKind::sgd : OptimizerKind::adamw;
  t.optimizer.momentum = variant == 1 ? 0.9 : 0.0;
  TrainingProgram p = build_sequential_program(t, 6400, 1000, ProgramTarget::cuda);
  if (!p.channels_last) throw std::logic_error("channels_last_training_program: no channels-last variant");
  p.train = p.channels_last->train;
  return p;
}

}  // namespace sg::test
