#pragma once
// The generic Sequential model builder (issue 22): a list of layers in the
// spirit of PyTorch's nn.Sequential (linear, conv2d, max_pool2d, avg_pool2d,
// global_avg_pool2d, flatten, activations, dropout, dropout2d) on top of the same in-graph batch fetch
// and losses as the MLP (models/model_pieces.hpp). Layers may name the
// earlier layers they read and `add` merges several (a model graph, issue
// 37: residual connections; models/layer_graph.hpp). A list of linear /
// activation / dropout layers builds exactly the graph build_mlp_* builds for
// the same network, so the CUDA fast paths see the same structure.
//
// Parameter names: w<k> / b<k> for the k-th layer with parameters (linear,
// conv2d, layer_norm or batch_norm's weight and bias, 1-based in list
// order), the MLP's names: a Sequential MLP is the MLP (same graph, same
// checkpoint entries, same export), and a CNN's
// checkpoint lists its parameters in PyTorch's state-dict order. A
// batch_norm layer's running statistics are f32 state values of the training
// graph, running_mean<k> / running_var<k>, which its graph updates in place
// and the eval and predict graphs read as parameters of those names (so the
// trainers share them by name, and checkpoints hold them).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/fusion_pass.hpp"
#include "graph/graph.hpp"
#include "graph/optimizer_pass.hpp"
#include "graph/training_graph.hpp"
#include "models/mlp.hpp"
#include "runtime/training_program.hpp"

namespace sg {

enum class LayerKind : std::uint8_t {
  linear,
  conv2d,
  max_pool2d,
  flatten,
  activation,
  dropout,
  dropout2d,
  add,
  avg_pool2d,         // PyTorch's AvgPool2d(kernel, stride)
  global_avg_pool2d,  // AdaptiveAvgPool2d(1) + flatten: [C, H, W] -> [C]
  layer_norm,         // LayerNorm(the per-example shape, eps), affine: weight 1 and bias 0 at the start
  concat,             // torch.cat(inputs, dim=1): channels of images, features of vectors
  batch_norm,         // BatchNorm1d ([features]) / BatchNorm2d ([C, H, W]): batch statistics in
                      // training, running ones at eval
};

struct LayerSpec {
  LayerKind kind = LayerKind::linear;
  std::int64_t out = 0;      // linear: output features; conv2d: output channels
  std::int64_t kernel = 0;   // conv2d, max_pool2d, avg_pool2d: square kernel
  std::int64_t stride = 0;   // conv2d: 0 = 1; max/avg_pool2d: 0 = kernel (PyTorch's defaults)
  std::int64_t padding = 0;  // conv2d
  bool bias = true;          // linear, conv2d: false: no b<k> (PyTorch's bias=False)
  MlpActivation activation = MlpActivation::relu;  // kind activation
  double p = 0.0;            // dropout, dropout2d: in [0, 1)
  double eps = 1e-5;         // layer_norm, batch_norm (PyTorch's default)
  double momentum = 0.1;     // batch_norm: the running statistics' step towards the batch's (PyTorch's)
  // A model graph (issue 37, models/layer_graph.hpp): the name later layers'
  // `inputs` use, and the layers this one reads (empty: the one before it).
  // add: the sum of two or more inputs of one shape (a residual connection);
  // concat: two or more inputs joined along their first per-example
  // dimension (channels or features), the others agreeing.
  std::string name = {};
  std::vector<std::string> inputs = {};
};

// "linear", "conv2d", ..., the activation's own name for an activation layer.
std::string layer_name(const LayerSpec& layer);
// The stride a layer uses (its default resolved).
std::int64_t layer_stride(const LayerSpec& layer);
// Whether the model has layers whose CUDA lowerings need cuDNN 9 (conv2d) or
// come with it (the poolings, flatten, dropout2d, and the reshape of the batch
// to [N, C, H, W] a rank-3 input needs): a build without cuDNN refuses them.
bool needs_cnn_lowerings(const std::vector<std::int64_t>& input_shape, const std::vector<LayerSpec>& layers);

struct SequentialSpec {
  std::vector<std::int64_t> input_shape;  // per example: [features] or [C, H, W]
  std::vector<LayerSpec> layers;
  // The rest as in MlpSpec (models/mlp.hpp).
  std::int64_t batch = 32;
  std::int64_t dataset_rows = 60000;
  DType weight_dtype = DType::f16;
  DType compute_dtype = DType::f16;
  double input_scale = 1.0 / 255.0;
  double input_shift = 0.0;
  DType feature_dtype = DType::u8;
  std::int64_t target_width = 0;
  MlpLoss loss = MlpLoss::softmax_xent;
  double label_smoothing = 0.0;
  std::uint64_t dropout_seed = 0;
  // Training images ([C, H, W] inputs) translated by up to this many pixels
  // each way and/or flipped, per example and step (issue 37; the training
  // graph only, keyed on dropout_seed; graph/ops/augment_images.cpp).
  std::int64_t augment_translate = 0;
  bool augment_flip = false;
  // Data parallel, as in MlpSpec: rank `batch_rank`'s `batch` rows of every
  // global batch of batch_ranks * batch rows.
  std::int64_t batch_rank = 0;
  std::int64_t batch_ranks = 1;
};

// A layer list that does not fit its input: `index` is the 0-based position
// in the list (the whole list: -1).
// what(): "layer 3 (linear): <problem>"; `problem` alone for callers that
// name the layer themselves (the config names file, line and list index).
struct SequentialShapeError : GraphError {
  SequentialShapeError(std::int64_t index, const std::string& message, std::string problem)
      : GraphError(message), index(index), problem(std::move(problem)) {}
  std::int64_t index;
  std::string problem;
};

// The per-example shape after every layer (result[i]: after layers[i]).
// Throws SequentialShapeError naming the layer ("layer 3 (linear): ...").
std::vector<Shape> infer_sequential_shapes(const std::vector<std::int64_t>& input_shape,
                                           const std::vector<LayerSpec>& layers);
// The outputs per example of the last layer (a rank-1 result is required).
std::int64_t sequential_outputs(const std::vector<std::int64_t>& input_shape, const std::vector<LayerSpec>& layers);

// Throws GraphError (SequentialShapeError for the layers) when unusable.
void validate_sequential_spec(const SequentialSpec& spec);

// As build_mlp_forward / build_mlp_eval / build_mlp_predict, same value names
// (names::images, ..., names::loss, names::correct), so mlp_data_bindings
// binds them.
Graph build_sequential_forward(const SequentialSpec& spec);
Graph build_sequential_eval(const SequentialSpec& spec);
Graph build_sequential_predict(const SequentialSpec& spec);
TrainingGraphStages build_sequential_training_stages(const SequentialSpec& spec, const OptimizerSpec& sgd,
                                                     const FusionOptions& fusion = {});

// Initial w<k>, b<k> (and a batch_norm's running_mean<k> 0, running_var<k>
// 1): PyTorch's defaults from the project's counter-based RNG
// (models/param_init.hpp). nn.Linear and nn.Conv2d both draw weight and bias
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5)),
// fan_in = in features, or C*KH*KW for a convolution. Parameter indices as
// the MLP's: w<k> is 2(k-1), b<k> 2(k-1)+1, so a Sequential MLP starts from
// mlp_initial_parameters' values.
std::vector<ParameterInit> sequential_initial_parameters(const std::vector<std::int64_t>& input_shape,
                                                         const std::vector<LayerSpec>& layers, std::uint64_t seed);

}  // namespace sg
