#pragma once
// A small residual CNN (issue 37's model graph: a conv, its ReLU, a second
// conv added back to the ReLU's output, max-pool, a linear classifier) on
// 1x6x6 images with 6 classes, f32, for the data-parallel tests of
// model.sequential models on the CPU and on the GPU.
#include "models/sequential_program.hpp"
#include "tests/runtime/layer_specs.hpp"

namespace sg::test {

inline SequentialTraining small_residual_cnn(std::int64_t batch, OptimizerKind kind) {
  SequentialTraining t;
  t.model.input_shape = {1, 6, 6};
  LayerSpec relu = net_layer(LayerKind::activation);
  relu.name = "a1";
  LayerSpec c2 = net_layer(LayerKind::conv2d, 3, 3, 1);
  c2.name = "c2";
  LayerSpec add = net_layer(LayerKind::add);
  add.inputs = {"a1", "c2"};
  t.model.layers = {net_layer(LayerKind::conv2d, 3, 3, 1), relu, c2, add, net_layer(LayerKind::max_pool2d, 0, 2),
                    net_layer(LayerKind::flatten), net_layer(LayerKind::linear, 6)};
  t.model.batch = batch;
  t.model.compute_dtype = DType::f32;
  t.model.weight_dtype = DType::f32;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.1 : 0.01;
  t.optimizer.kind = kind;
  t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  t.eval_batch = 10;
  t.init_seed = 5;
  return t;
}

}  // namespace sg::test
