#pragma once
// The report CNN of configs/mnist_cnn.yaml (issue 22) as a sequential model,
// for the tests of its fused CUDA step.
#include "models/sequential_program.hpp"
#include "tests/runtime/layer_specs.hpp"

namespace sg::test {

inline SequentialTraining report_cnn() {
  SequentialTraining t;
  t.model.input_shape = {1, 28, 28};
  LayerSpec drop2d = net_layer(LayerKind::dropout2d);
  drop2d.p = 0.5;
  LayerSpec drop = net_layer(LayerKind::dropout);
  drop.p = 0.5;
  t.model.layers = {net_layer(LayerKind::conv2d, 10, 5), net_layer(LayerKind::max_pool2d, 0, 2),
                    net_layer(LayerKind::activation), net_layer(LayerKind::conv2d, 20, 5),
                    drop2d, net_layer(LayerKind::max_pool2d, 0, 2), net_layer(LayerKind::activation),
                    net_layer(LayerKind::flatten), net_layer(LayerKind::linear, 50), net_layer(LayerKind::activation),
                    drop, net_layer(LayerKind::linear, 10)};
  t.model.batch = 64;
  t.model.weight_dtype = DType::f32;
  t.optimizer.lr = 0.01;
  t.optimizer.momentum = 0.5;
  return t;
}

// Its CUDA training graph (60000 rows are not needed: 1280 train, 200 test).
inline Graph report_cnn_cuda_graph(const SequentialTraining& t) {
  return build_sequential_program(t, 1280, 200, ProgramTarget::cuda).train;
}

}  // namespace sg::test
