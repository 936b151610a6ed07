// Which form the CUDA backend runs (runtime/cuda/activation_layout_choice.hpp)
// and how the channels-last step is lowered, without a GPU: an MNIST CNN of
// two 5x5 convs (32 and 64 channels, AdamW, fp32 master weights) goes
// channels-last under `auto`; its second layer's convolutions run in cuDNN
// with channels-last tensors, the one-channel layer's forward and weight
// gradient on our few-channel kernels (fast path few_channel_conv: the batch
// fetch, the image's views and the layer's parameter casts in the forward's
// launch, the bias's gradient in the weight gradient's pass), the region's
// exit and its gradient ride in the last pooling's
// launches, the other conv bias gradient is a column sum over all its rows
// (column_sum), and every gradient cast rides in
// the update launch. A batch_norm or a dropout2d inside the region keeps the
// network NCHW under `auto` (each would add a transpose each way), so do
// few-channel convolutions that our NCHW kernels run, and `nchw` /
// `channels_last` force either form.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>

#include "models/sequential_program.hpp"
#include "runtime/cuda/activation_layout_choice.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/schedule_test_support.hpp"

using namespace sg;
using namespace sg::schedule_test;

namespace {

SequentialTraining two_conv_cnn() {
  SequentialTraining t;
  t.model.input_shape = {1, 28, 28};
  t.model.layers = test::two_conv_layers();
  t.model.batch = 128;
  t.model.weight_dtype = DType::f32;
  t.optimizer.kind = OptimizerKind::adamw;
  t.optimizer.lr = 2e-3;
  t.optimizer.weight_decay = 0.01;
  return t;
}

TrainingProgram program(const SequentialTraining& t) {
  return build_sequential_program(t, 60000, 10000, ProgramTarget::cuda);
}

std::string choose(TrainingProgram& p, ActivationLayout layout) {
  BackendOptions o;
  o.activation_layout = layout;
  return cuda::choose_activation_layout(p, o, /*device_present=*/false);
}

int count_op(const Graph& g, OpKind op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

// The launch (lowering name) that runs node `n`.
std::string lowering_of(const Schedule& s, NodeId n) {
  for (const Launch& l : s.launches)
    if (std::find(l.nodes.begin(), l.nodes.end(), n) != l.nodes.end()) return name_of(l);
  return "";
}

}  // namespace

TEST_CASE("auto runs the two-conv CNN channels-last, each conversion and cast inside another launch") {
  TrainingProgram p = program(two_conv_cnn());
  REQUIRE(p.channels_last);
  CHECK(choose(p, ActivationLayout::automatic) == "channels-last (its regions end at flattens or the global pooling)");
  CHECK_FALSE(p.channels_last);  // chosen: the variant is now p.train
  const Graph& g = p.train;
  // The image in (a view), the flatten's gradient back, the second layer's filter [O,KH,KW,C] (its copy for cuDNN).
  CHECK(count_op(g, OpKind::to_channels_last) == 3);
  // Before the flatten; the second layer's weight gradient [O,KH,KW,C] back to the parameter's layout.
  CHECK(count_op(g, OpKind::to_channels_first) == 2);
  const Lowered lowered = lower(g, BackendOptions{});
  for (const Node& n : g.nodes()) {
    CAPTURE(op_name(n.op));
    CAPTURE(n.id);
    const std::string how = lowering_of(lowered.schedule, n.id);
    switch (n.op) {
      case OpKind::conv2d:  // the one-channel layer's by our few-channel kernel, reading the parameter's layout
        CHECK(n.attr<Conv2dAttrs>().channels_last);
        CHECK(n.attr<Conv2dAttrs>().filter_channels_last == (g.value(n.inputs[0]).shape[3] != 1));
        CHECK(how == (g.value(n.inputs[0]).shape[3] == 1 ? "few_channel_conv" : "conv_cudnn"));
        break;
      case OpKind::conv2d_backward_data:
        CHECK(n.attr<Conv2dAttrs>().channels_last);
        CHECK(n.attr<Conv2dAttrs>().filter_channels_last);
        CHECK(how == "conv_cudnn");
        break;
      case OpKind::conv2d_backward_filter:  // the one-channel layer's by our kernel, with its bias's sums
        CHECK(how == (g.value(n.inputs[1]).shape[3] == 1 ? "few_channel_wgrad" : "conv_cudnn"));
        CHECK(n.attr<Conv2dAttrs>().filter_channels_last == (g.value(n.inputs[1]).shape[3] != 1));
        break;
      case OpKind::to_channels_first:  // the region's exit in the pooling; a weight gradient's in its update
        CHECK(how == (g.value(n.outputs[0]).role == Role::activation ? "max_pool2d" : "update_multi_tensor"));
        break;
      case OpKind::to_channels_last:  // the image's (a view) in the first layer's launch, a filter's its own
        if (g.value(n.inputs[0]).role == Role::param || g.node(g.value(n.inputs[0]).producer).op == OpKind::cast)
          CHECK(how == "channels_permute");
        else
          CHECK(how == (g.value(n.inputs[0]).shape[1] == 1 ? "few_channel_conv" : "max_pool2d_backward"));
        break;
      case OpKind::reduce_rows:  // the conv biases' over N*H*W rows (the first in its weight gradient's pass);
                                 // the linear layers' in their weight gradient's tile, with both updates
        CHECK(how == (g.value(n.inputs[0]).shape[0] <= 128 ? "wgrad_update"
                      : g.value(n.inputs[0]).shape[1] == 32 ? "few_channel_wgrad"
                                                             : "column_sum"));
        break;
      case OpKind::cast:
        CHECK(how != "elementwise");
        break;
      default:
        break;
    }
  }
  const auto counts = launch_counts(g, lowered.schedule);
  CHECK(counts.count("channels_permute") == 0);
  CHECK(counts.at("column_sum") == 1);
  CHECK(counts.at("few_channel_conv[forward+bias+relu,stride=1,padding=2,channels_last,+batch fetch,+fp32 "
                  "parameters' casts]") == 1);
  CHECK(counts.count("batch_fetch") == 0);
  CHECK(name_of(lowered.schedule.launches.front()) == "few_channel_conv");
  CHECK(counts.at("few_channel_wgrad[wgrad+bias,stride=1,padding=2,channels_last]") == 1);
  CHECK(counts.count("elementwise") == 0);
  // conv_kernels: cudnn takes the few-channel kernels away: cuDNN runs every convolution.
  BackendOptions cudnn;
  cudnn.conv_kernels = ConvKernels::cudnn;
  for (const Launch& l : lower(g, cudnn).schedule.launches) CHECK(name_of(l).rfind("few_channel", 0) != 0);
}

TEST_CASE("auto keeps NCHW for a dropout between convolutions or a 6-channel layer of our kernels, else channels-last") {
  SequentialTraining normalised = two_conv_cnn();  // a batch_norm keeps its region (BatchNorm1d over N*H*W rows)
  normalised.model.layers.insert(normalised.model.layers.begin() + 1, test::net_layer(LayerKind::batch_norm));
  TrainingProgram with_norm = program(normalised);
  REQUIRE(with_norm.channels_last);
  CHECK(with_norm.channels_last->inner_exits == 0);
  CHECK(with_norm.channels_last->batch_norms == 1);
  // ... and runs on the rows kernel, faster there than NCHW's (docs/benchmarks.md): auto takes channels-last.
  CHECK(choose(with_norm, ActivationLayout::automatic) ==
        "channels-last (its regions end at flattens or the global pooling; 1 batch_norm layer(s) on the [N*H*W, C] "
        "rows kernel)");
  // avg_pool2d and dropout2d have channels-last kernels: the region goes on through them.
  for (const LayerKind inside : {LayerKind::avg_pool2d, LayerKind::dropout2d}) {
    SequentialTraining t = two_conv_cnn();
    LayerSpec l = test::net_layer(inside, 0, 2);
    l.p = 0.25;
    t.model.layers.insert(t.model.layers.begin() + 1, l);
    TrainingProgram p = program(t);
    REQUIRE(p.channels_last);
    CHECK(p.channels_last->inner_exits == 0);
    CHECK(choose(p, ActivationLayout::automatic).find("channels-last (its regions end at flattens") == 0);
    TrainingProgram plain = program(two_conv_cnn());  // the same conversions as without the layer
    choose(plain, ActivationLayout::automatic);
    CHECK(count_op(p.train, OpKind::to_channels_first) == count_op(plain.train, OpKind::to_channels_first));
  }
  {
    SequentialTraining t = two_conv_cnn();
    LayerSpec l = test::net_layer(LayerKind::dropout);
    l.p = 0.25;
    t.model.layers.insert(t.model.layers.begin() + 1, l);
    TrainingProgram p = program(t);
    REQUIRE(p.channels_last);
    CHECK(p.channels_last->inner_exits == 1);
    CHECK(choose(p, ActivationLayout::automatic).find("NCHW (1 channels-last region(s) end inside") == 0);
    CHECK(count_op(p.train, OpKind::to_channels_last) == 0);
    TrainingProgram forced = program(t);
    CHECK(choose(forced, ActivationLayout::channels_last) ==
          "channels-last (backend.activation_layout: channels_last)");
    CHECK(count_op(forced.train, OpKind::to_channels_first) >= 2);
  }
  {
    // A dropout between the last pooling and the flatten (as Keras-style CNNs put it): the region's one
    // exit moves before it, still written by the pooling's launch, and auto stays channels-last.
    SequentialTraining t = two_conv_cnn();
    LayerSpec l = test::net_layer(LayerKind::dropout);
    l.p = 0.25;
    const auto flatten = std::find_if(t.model.layers.begin(), t.model.layers.end(),
                                      [](const LayerSpec& s) { return s.kind == LayerKind::flatten; });
    t.model.layers.insert(flatten, l);
    TrainingProgram p = program(t);
    REQUIRE(p.channels_last);
    CHECK(p.channels_last->inner_exits == 0);
    CHECK(choose(p, ActivationLayout::automatic).find("channels-last (its regions end at flattens") == 0);
    const Lowered lowered = lower(p.train, BackendOptions{});
    const auto counts = launch_counts(p.train, lowered.schedule);
    CHECK(counts.count("max_pool2d[k=2,s=2,channels_last+to_channels_first]") == 1);
    CHECK(counts.count("channels_permute") == 0);  // no conversion launch of its own
  }
  SequentialTraining few = two_conv_cnn();  // 1 -> 6 -> 16 channels: our kernels' in NCHW
  few.model.layers[0].out = 6;
  few.model.layers[3].out = 16;
  TrainingProgram small = program(few);
  REQUIRE(small.channels_last);
  CHECK(small.channels_last->inner_exits == 0);
  CHECK(choose(small, ActivationLayout::automatic).find("NCHW (our kernels run the 6-channel") == 0);
  CHECK(count_op(small.train, OpKind::to_channels_last) == 0);
  // 8 input channels: cuDNN's channels-last engines take them (measured faster a step).
  few.model.layers[0].out = 8;
  TrainingProgram eight = program(few);
  CHECK(choose(eight, ActivationLayout::automatic).find("channels-last") == 0);
  TrainingProgram p = program(two_conv_cnn());
  CHECK(choose(p, ActivationLayout::nchw) == "NCHW (backend.activation_layout: nchw)");
  CHECK(count_op(p.train, OpKind::to_channels_last) == 0);
  SequentialTraining mlp = two_conv_cnn();
  mlp.model.input_shape = {784};
  mlp.model.layers = {test::net_layer(LayerKind::linear, 64), test::net_layer(LayerKind::activation),
                      test::net_layer(LayerKind::linear, 10)};
  TrainingProgram plain = program(mlp);
  CHECK_FALSE(plain.channels_last);
  CHECK(choose(plain, ActivationLayout::channels_last) == "NCHW (no convolution layers)");
}

// A first layer whose activation the next convolution reads (no pooling
// between: bench/networks/wide_adam.yaml's 1 -> 64 -> 64): the few-channel
// weight gradient takes the activation's backward (its kernel stages dY
// through it), so that backward has no launch and its output no buffer.
// After a pooling, the pooling's backward takes it instead.
TEST_CASE("the few-channel weight gradient takes the activation backward before it") {
  for (const MlpActivation a : {MlpActivation::relu, MlpActivation::gelu, MlpActivation::sigmoid}) {
    CAPTURE(activation_name(a));
    SequentialTraining t = two_conv_cnn();
    t.model.batch = 64;
    LayerSpec act = test::net_layer(LayerKind::activation);
    act.activation = a;
    t.model.layers = {test::net_layer(LayerKind::conv2d, 64, 3, 1), act, test::net_layer(LayerKind::conv2d, 64, 3, 1),
                      test::net_layer(LayerKind::activation), test::net_layer(LayerKind::max_pool2d, 0, 2),
                      test::net_layer(LayerKind::flatten), test::net_layer(LayerKind::linear, 10)};
    TrainingProgram p = program(t);
    CHECK(choose(p, ActivationLayout::channels_last) == "channels-last (backend.activation_layout: channels_last)");
    const Graph& g = p.train;
    const Lowered lowered = lower(g, BackendOptions{});
    int backwards = 0;
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::relu_backward && n.op != OpKind::gelu_backward && n.op != OpKind::sigmoid_backward) continue;
      // The first layer's: its output is the few-channel layer's dY (the later ones ride in the pooling's backward).
      const NodeId wgrad = g.consumers(n.outputs[0]).empty() ? -1 : g.consumers(n.outputs[0]).front();
      if (wgrad < 0 || g.node(wgrad).op != OpKind::conv2d_backward_filter) continue;
      if (g.value(g.node(wgrad).inputs[1]).shape[3] != 1) continue;
      ++backwards;
      CHECK(lowering_of(lowered.schedule, n.id) == "few_channel_wgrad");
    }
    CHECK(backwards == 1);
    const auto counts = launch_counts(g, lowered.schedule);
    CHECK(counts.at(fmt::format("few_channel_wgrad[{}_backward+wgrad+bias,stride=1,padding=1,channels_last]",
                                activation_name(a))) == 1);
    // The backward's only launch was the element-wise one (ReLU's forward is the few-channel forward's epilogue).
    if (a == MlpActivation::relu) CHECK(counts.count("elementwise") == 0);
    // With a pooling between, the pooling's backward takes the activation's
    // backward (channels-last: any activation), and the weight gradient reads its result.
    t.model.layers.insert(t.model.layers.begin() + 2, test::net_layer(LayerKind::max_pool2d, 0, 2));
    TrainingProgram pooled = program(t);
    CHECK(choose(pooled, ActivationLayout::channels_last) ==
          "channels-last (backend.activation_layout: channels_last)");
    const Lowered with_pool = lower(pooled.train, BackendOptions{});
    const auto pooled_counts = launch_counts(pooled.train, with_pool.schedule);
    CHECK(pooled_counts.at(fmt::format("max_pool2d_backward[k=2,s=2+{}_backward,channels_last]", activation_name(a))) ==
          1);
    CHECK(pooled_counts.at("few_channel_wgrad[wgrad+bias,stride=1,padding=1,channels_last]") == 1);
  }
}

// The first layer's forward takes the step's batch fetch where the images
// reach it through views, and the casts of its fp32 master filter and bias
// where it alone reads them (first_layer_inputs.hpp): the step's first
// launch is the convolution, and the other casts run beside it. It writes
// the images only where a later launch reads them (the training graph's
// weight gradient, not the eval graph); an augmentation between keeps the
// fetch apart, fp16 weights need no cast.
TEST_CASE("the first layer's forward takes the batch fetch and its fp32 parameters' casts") {
  const auto first_layer = [](const Schedule& s) -> const Launch& {
    for (const Launch& l : s.launches)
      if (name_of(l) == "few_channel_conv") return l;
    FAIL("no few_channel_conv launch");
    return s.launches.front();
  };
  const auto writes_named = [](const Graph& g, const Launch& l, const char* name) {
    return std::any_of(l.writes.begin(), l.writes.end(), [&](ValueId v) { return g.value(v).name == name; });
  };
  TrainingProgram p = program(two_conv_cnn());
  choose(p, ActivationLayout::automatic);
  for (const bool eval : {false, true}) {
    CAPTURE(eval);
    const Graph& g = eval ? p.eval : p.train;
    const Lowered lowered = lower(g, BackendOptions{});  // (owns the lowerings the launches name)
    const Schedule& s = lowered.schedule;
    const Launch& conv = first_layer(s);
    CHECK(&conv == &s.launches.front());
    const auto counts = launch_counts(g, s);
    CHECK(counts.count("batch_fetch") == 0);
    CHECK(counts.at("cast_params[6 tensors]") == 1);  // the other layers' casts, beside it
    CHECK(writes_named(g, conv, "y"));
    CHECK(writes_named(g, conv, "reshape_nhwc") == !eval);  // the images: the weight gradient reads them
    for (ValueId v : conv.reads) CHECK(is_graph_owned(g.value(v).role));  // tables and fp32 parameters only
  }
  // An augmentation between the fetch and the layer: only the casts.
  SequentialTraining augmented = two_conv_cnn();
  augmented.model.augment_translate = 2;
  TrainingProgram a = program(augmented);
  choose(a, ActivationLayout::automatic);
  const Lowered augment_lowered = lower(a.train, BackendOptions{});
  const Schedule& with_augment = augment_lowered.schedule;
  CHECK(launch_counts(a.train, with_augment).at("batch_fetch") == 1);
  CHECK(name_of(first_layer(with_augment)) == "few_channel_conv");
  CHECK(first_layer(with_augment).lowering->describe(a.train, first_layer(with_augment)).find(
            "+batch fetch,") == std::string::npos);
  // fp16 weights: no cast to take, the fetch still taken.
  SequentialTraining half = two_conv_cnn();
  half.model.weight_dtype = DType::f16;
  TrainingProgram h = program(half);
  choose(h, ActivationLayout::automatic);
  const Lowered fp16_lowered = lower(h.train, BackendOptions{});
  const Schedule& fp16 = fp16_lowered.schedule;
  CHECK(fp16.launches.front().lowering->describe(h.train, fp16.launches.front()) ==
        "forward+bias+relu,stride=1,padding=2,channels_last,+batch fetch");
}

// An activation that no convolution epilogue takes (GELU, tanh, ...)
// before a pooling whose windows tile its input runs in the pooling's pass
// (bench/networks/gelu3_adamw.yaml's layers): no element-wise forward
// launch; a ReLU stays in the convolution's epilogue, and windows that do
// not tile (7 -> 3) keep the element-wise launch.
TEST_CASE("the activation before a channels-last pooling runs in the pooling's pass") {
  for (const MlpActivation a : {MlpActivation::gelu, MlpActivation::tanh, MlpActivation::relu}) {
    CAPTURE(activation_name(a));
    SequentialTraining t = two_conv_cnn();
    LayerSpec act = test::net_layer(LayerKind::activation);
    act.activation = a;
    t.model.layers = {test::net_layer(LayerKind::conv2d, 16, 3, 1), act, test::net_layer(LayerKind::max_pool2d, 0, 2),
                      test::net_layer(LayerKind::conv2d, 32, 3, 1), act, test::net_layer(LayerKind::max_pool2d, 0, 2),
                      test::net_layer(LayerKind::conv2d, 32, 3, 1), act, test::net_layer(LayerKind::max_pool2d, 0, 2),
                      test::net_layer(LayerKind::flatten), test::net_layer(LayerKind::linear, 10)};
    TrainingProgram p = program(t);
    CHECK(choose(p, ActivationLayout::channels_last) == "channels-last (backend.activation_layout: channels_last)");
    const auto counts = launch_counts(p.train, lower(p.train, BackendOptions{}).schedule);
    const std::string name(activation_name(a));
    // (launch_counts names an element-wise launch by its op.)
    if (a == MlpActivation::relu) {
      CHECK(counts.at("max_pool2d[k=2,s=2,channels_last]") == 2);
      CHECK(counts.count("relu") == 0);
      continue;
    }
    CHECK(counts.at(fmt::format("max_pool2d[{}+k=2,s=2,channels_last]", name)) == 2);  // 28 -> 14 -> 7
    CHECK(counts.at(name) == 1);  // the third layer's (7 -> 3 does not tile)
  }
}

// backend.conv_kernels: tensor_core opts into our channels-last tensor-core
// convolutions (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp): the 32 -> 64 layer's forward
// (with its bias and ReLU) and backward data are theirs; the one-channel
// layer (not a multiple of 16 channels: the few-channel kernels') and the
// weight gradients stay as under `auto`. Under `auto`, autotune or not, they never run.
TEST_CASE("conv_kernels: tensor_core runs the channels-last convolutions it fits on our tensor-core kernels") {
  TrainingProgram p = program(two_conv_cnn());
  CHECK(choose(p, ActivationLayout::channels_last) == "channels-last (backend.activation_layout: channels_last)");
  const Graph& g = p.train;
  BackendOptions o;
  o.conv_kernels = ConvKernels::tensor_core;
  const Lowered lowered = lower(g, o);
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d && n.op != OpKind::conv2d_backward_data && n.op != OpKind::conv2d_backward_filter)
      continue;
    CAPTURE(op_name(n.op));
    CAPTURE(n.id);
    const std::string how = lowering_of(lowered.schedule, n.id);
    const bool one_channel = n.op == OpKind::conv2d && g.value(n.inputs[0]).shape[3] == 1;
    if (n.op == OpKind::conv2d_backward_filter)
      CHECK(how == (g.value(n.inputs[1]).shape[3] == 1 ? "few_channel_wgrad" : "conv_cudnn"));
    else
      CHECK(how == (one_channel ? "few_channel_conv" : "tensor_core_conv"));
  }
  const auto counts = launch_counts(g, lowered.schedule);
  CHECK(counts.at("tensor_core_conv[forward+bias+relu,stride=1,padding=2,channels_last]") == 1);
  CHECK(counts.at("tensor_core_conv[dgrad,stride=1,padding=2,channels_last]") == 1);
  for (const bool autotune : {false, true}) {
    BackendOptions automatic;
    automatic.autotune = autotune;
    for (const Launch& l : lower(g, automatic).schedule.launches) CHECK(name_of(l).rfind("tensor_core_conv", 0) != 0);
  }
}

// Fast path classifier_head (issue 37): a CNN ending "global average pool, linear, softmax cross-entropy" runs
// the pool (with the region's exit), the classifier, the loss, its data gradient and the pool's backward (with
// the way back into the region) as one launch in either layout; a classifier over a flatten stays per-op.
TEST_CASE("the global-pool classifier and its backward run as one classifier_head launch in either layout") {
  SequentialTraining residual = two_conv_cnn();
  residual.model.layers = test::batch_norm_residual_layers(16);
  for (const ActivationLayout layout : {ActivationLayout::channels_last, ActivationLayout::nchw}) {
    TrainingProgram p = program(residual);
    choose(p, layout);
    const Graph& g = p.train;
    const Lowered lowered = lower(g, BackendOptions{});
    const auto counts = launch_counts(g, lowered.schedule);
    const std::string layout_name = layout == ActivationLayout::nchw ? "NCHW" : "channels-last";
    CAPTURE(layout_name);
    CHECK(counts.at("classifier_head[" + layout_name + " global pool -> 10 classes, dX through the pool's backward]") ==
          1);
    CHECK(counts.count("channels_permute") == 0);
    CHECK(counts.count("avg_pool2d") == 0);
    CHECK(counts.count("softmax_xent") == 0);
    for (OpKind op : {OpKind::global_avg_pool2d, OpKind::global_avg_pool2d_backward, OpKind::softmax_xent})
      for (const Node& n : g.nodes())
        if (n.op == op) CHECK(lowering_of(lowered.schedule, n.id) == "classifier_head");
    // The weight and bias gradients read what the launch writes: the pooled features and the dlogits.
    for (const Launch& l : lowered.schedule.launches)
      if (name_of(l) == "classifier_head") CHECK(l.writes.size() == 4);  // features, loss, dlogits, the pool's dX
    BackendOptions core;
    core.core_only = true;
    for (const Launch& l : lower(g, core).schedule.launches) CHECK(name_of(l) != "classifier_head");
  }
  // Over a flatten (the two-conv CNN): the per-op kernels, and the record says why.
  TrainingProgram flat = program(two_conv_cnn());
  choose(flat, ActivationLayout::automatic);
  const Lowered lowered = lower(flat.train, BackendOptions{});
  for (const Launch& l : lowered.schedule.launches) CHECK(name_of(l) != "classifier_head");
  bool said = false;
  for (const auto& d : cuda::declined_fast_paths(flat.train, lowered.schedule, BackendOptions{}, false))
    if (d.name == "classifier_head") said = d.reason.find("not a global average pool") != std::string::npos;
  CHECK(said);
}

// The weight gradients of 8+ input channels come out [O,KH,KW,C]
// (graph/filter_layout_pass.hpp) and the update launch reads them in the
// parameter's order: their to_channels_first is no launch of its own, for
// SGD with momentum and Adam, fp32 master weights or f16 weights; with
// clipping (the clip norm reads the gradient too) it stays a launch.
TEST_CASE("channels-last weight gradients are read by the update launch through their [O,KH,KW,C] order") {
  for (const int variant : {0, 1, 2, 3}) {  // SGD fp32 master, Adam f16 weights, AdamW fp32 master, clipped SGD
    SequentialTraining t = two_conv_cnn();
    t.optimizer.kind = variant == 0 || variant == 3 ? OptimizerKind::sgd : variant == 1 ? OptimizerKind::adam
                                                                                      : OptimizerKind::adamw;
    t.optimizer.momentum = t.optimizer.kind == OptimizerKind::sgd ? 0.9 : 0.0;
    if (variant == 1) t.model.weight_dtype = DType::f16;
    if (variant == 3) t.optimizer.clip_grad_norm = 1.0;
    INFO("variant " << variant);
    TrainingProgram p = program(t);
    REQUIRE(choose(p, ActivationLayout::channels_last).starts_with("channels-last"));
    const Graph& g = p.train;
    const Lowered lowered = lower(g, BackendOptions{});
    int weight_gradients = 0;
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::to_channels_first || g.value(n.outputs[0]).role == Role::activation) continue;
      ++weight_gradients;
      CHECK(g.node(g.value(n.inputs[0]).producer).op == OpKind::conv2d_backward_filter);
      const std::string how = lowering_of(lowered.schedule, n.id);
      if (variant == 3)
        CHECK(how == "channels_permute");
      else
        CHECK(how == (t.optimizer.kind == OptimizerKind::sgd ? "sgd_multi_tensor" : "update_multi_tensor"));
    }
    CHECK(weight_gradients == 1);  // the second convolution's (32 input channels); the first has one
  }
}

// With SGD a bias gradient and its update would make one bgrad_sgd group
// (graph/fusion_pass.cpp), a column sum of its own; a channels-last
// convolution's is left to the weight gradient's pass over dY (LeNet-5's
// 6-filter layer: 23.5 us of column sums on an H200), any filter count.
TEST_CASE("with SGD a channels-last convolution's bias gradient rides in its few-channel weight gradient") {
  for (const std::int64_t filters : {6, 32}) {
    CAPTURE(filters);
    SequentialTraining t = two_conv_cnn();
    t.model.layers[0].out = filters;
    t.optimizer.kind = OptimizerKind::sgd;
    t.optimizer.momentum = 0.9;
    t.optimizer.weight_decay = 0.0;
    TrainingProgram p = program(t);
    REQUIRE(choose(p, ActivationLayout::channels_last) == "channels-last (backend.activation_layout: channels_last)");
    const Lowered lowered = lower(p.train, BackendOptions{});
    const auto counts = launch_counts(p.train, lowered.schedule);
    CHECK(counts.at("few_channel_wgrad[wgrad+bias,stride=1,padding=2,channels_last]") == 1);
    CHECK(counts.count("column_sum[+sgd_update]") == 0);
    // The linear layers' bias gradients keep their fused update.
    CHECK(counts.count("bias_grad_sgd") == 1);
    for (const FusionGroup& group : p.train.fusion_groups()) {
      if (group.kind != FusionKind::bgrad_sgd) continue;
      for (NodeId id : group.nodes)
        if (const Node& n = p.train.node(id); n.op == OpKind::reduce_rows)
          CHECK(p.train.value(n.inputs[0]).shape.size() == 2);  // a linear layer's, not a reshaped 4-D dY
    }
  }
}
