#pragma once
// A trained model.sequential network (issue 37: CNNs, residual graphs) as the
// exporters see it: its layers in run order, each with the earlier layers it
// reads, its sizes and its parameters in PyTorch's layouts (nn.Conv2d
// [out, in, k, k], nn.Linear [out, in], nn.LayerNorm the normalised shape,
// nn.BatchNorm1d/2d [C] with its buffers), and the input scaling it was trained
// with. Filled from a checkpoint by apps/saved_model.
#include <cstdint>
#include <string>
#include <vector>

namespace sg::exporting {

struct GraphLayer {
  // conv2d, linear, max_pool2d, avg_pool2d, global_avg_pool2d, layer_norm,
  // batch_norm, flatten, dropout, dropout2d, add, or an activation (relu, gelu,
  // gelu_tanh, silu, tanh, sigmoid, identity).
  std::string kind;
  std::vector<int> inputs;  // earlier layers' indices; -1: the model's input
  std::int64_t in = 0, out = 0;  // conv2d: channels; linear: features
  std::int64_t kernel = 0, stride = 1, padding = 0;
  double p = 0.0;  // dropout, dropout2d (off at inference)
  double eps = 1e-5;  // layer_norm, batch_norm
  double momentum = 0.1;  // batch_norm
  std::vector<std::int64_t> weight_shape;  // layer_norm: the per-example shape it normalises; batch_norm: [C]
  std::vector<std::int64_t> bias_shape;    // [out]; layer_norm: weight_shape; batch_norm: [C]
  std::vector<float> weight, bias;  // conv2d, linear (bias empty: bias=False), layer_norm, batch_norm
  // batch_norm's buffers: the running statistics ([C]) and the training
  // steps that updated them (PyTorch's num_batches_tracked).
  std::vector<float> running_mean, running_var;
  std::int64_t num_batches_tracked = 0;
  bool spatial = false;  // batch_norm: over [C, H, W] (BatchNorm2d), else [features] (BatchNorm1d)
};

struct ExportedGraph {
  std::vector<std::int64_t> input_shape;  // per example: [C, H, W] or [features]
  std::vector<GraphLayer> layers;
  std::int64_t outputs = 0;  // the last layer's per-example outputs (classes or targets)
  bool regression = false;
  double input_scale = 1.0;  // the model sees x * input_scale + input_shift
  double input_shift = 0.0;
};

// "layer3.weight": the state_dict name of layer `index`'s tensor in torch_module_code's module.
std::string graph_parameter_name(std::size_t index, const char* tensor);
// The PyTorch module of the same structure, as Python source: `class
// StepgraphNet(nn.Module)` with one submodule per layer with parameters
// (layer<i>, i its index in the list) and a forward that runs the list in
// order (pooling, activations, flatten and adds as functions; dropout is
// off at inference). Its input is [N, *input_shape], already scaled.
// Throws std::invalid_argument for a layer kind it does not know.
std::string torch_module_code(const ExportedGraph& model);

}  // namespace sg::exporting
