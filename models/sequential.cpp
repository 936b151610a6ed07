#include "models/sequential.hpp"

#include <utility>

#include <fmt/format.h>

#include "models/layer_graph.hpp"
#include "models/model_pieces.hpp"
#include "models/param_init.hpp"

namespace sg {

std::string layer_name(const LayerSpec& layer) {
  switch (layer.kind) {
    case LayerKind::linear: return "linear";
    case LayerKind::conv2d: return "conv2d";
    case LayerKind::max_pool2d: return "max_pool2d";
    case LayerKind::flatten: return "flatten";
    case LayerKind::activation: return std::string(activation_name(layer.activation));
    case LayerKind::dropout: return "dropout";
    case LayerKind::dropout2d: return "dropout2d";
    case LayerKind::add: return "add";
    case LayerKind::avg_pool2d: return "avg_pool2d";
    case LayerKind::global_avg_pool2d: return "global_avg_pool2d";
    case LayerKind::layer_norm: return "layer_norm";
    case LayerKind::concat: return "concat";
    case LayerKind::batch_norm: return "batch_norm";
  }
  return "?";
}

std::int64_t layer_stride(const LayerSpec& layer) {
  if (layer.stride > 0) return layer.stride;
  return layer.kind == LayerKind::max_pool2d || layer.kind == LayerKind::avg_pool2d ? layer.kernel : 1;
}

bool needs_cnn_lowerings(const std::vector<std::int64_t>& input_shape, const std::vector<LayerSpec>& layers) {
  if (input_shape.size() != 1) return true;
  for (const auto& l : layers)
    if (l.kind == LayerKind::conv2d || l.kind == LayerKind::max_pool2d || l.kind == LayerKind::flatten ||
        l.kind == LayerKind::dropout2d || l.kind == LayerKind::avg_pool2d || l.kind == LayerKind::global_avg_pool2d)
      return true;
  return false;
}

namespace {

bool has_parameters(const LayerSpec& l) {
  return l.kind == LayerKind::linear || l.kind == LayerKind::conv2d || l.kind == LayerKind::layer_norm ||
         l.kind == LayerKind::batch_norm;
}

// Spatial output size of a window of `kernel` moved by `stride` over `size`
// (+ 2 * padding) positions, floored as PyTorch does.
std::int64_t window_out(std::int64_t size, std::int64_t kernel, std::int64_t stride, std::int64_t padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}

// One layer's per-example output shape; throws SequentialShapeError.
Shape layer_output(const Shape& in, const LayerSpec& l, std::int64_t index) {
  const auto fail = [&](const std::string& problem) -> SequentialShapeError {
    return SequentialShapeError(index, fmt::format("layer {} ({}): {}", index, layer_name(l), problem), problem);
  };
  const auto spatial = [&]() {
    if (in.size() != 3)
      throw fail(fmt::format("needs a [channels, height, width] input but gets {} per example (model.input [C, H, W] "
                             "gives the images that shape)",
                             shape_string(in)));
  };
  switch (l.kind) {
    case LayerKind::linear:
      if (l.out <= 0) throw fail(fmt::format("out must be > 0 (got {})", l.out));
      if (in.size() != 1)
        throw fail(fmt::format("needs a [features] input but gets {} per example: put a flatten layer before it",
                               shape_string(in)));
      return {l.out};
    case LayerKind::conv2d: {
      spatial();
      if (l.out <= 0) throw fail(fmt::format("out must be > 0 (got {})", l.out));
      if (l.kernel <= 0) throw fail(fmt::format("kernel must be > 0 (got {})", l.kernel));
      if (l.stride < 0 || l.padding < 0) throw fail("stride must be > 0 and padding >= 0");
      const auto h = in[1] + 2 * l.padding, w = in[2] + 2 * l.padding;
      if (l.kernel > h || l.kernel > w)
        throw fail(fmt::format("kernel {} is larger than its (padded) input {}x{} ({} per example)", l.kernel, h, w,
                               shape_string(in)));
      const auto s = layer_stride(l);
      return {l.out, window_out(in[1], l.kernel, s, l.padding), window_out(in[2], l.kernel, s, l.padding)};
    }
    case LayerKind::max_pool2d:
    case LayerKind::avg_pool2d: {
      spatial();
      if (l.kernel <= 0) throw fail(fmt::format("kernel must be > 0 (got {})", l.kernel));
      if (l.stride < 0) throw fail("stride must be > 0");
      if (l.kernel > in[1] || l.kernel > in[2])
        throw fail(fmt::format("kernel {} is larger than its input {}x{} ({} per example)", l.kernel, in[1], in[2],
                               shape_string(in)));
      const auto s = layer_stride(l);
      return {in[0], window_out(in[1], l.kernel, s, 0), window_out(in[2], l.kernel, s, 0)};
    }
    case LayerKind::global_avg_pool2d: spatial(); return {in[0]};
    case LayerKind::flatten: return {element_count(in)};
    case LayerKind::activation: return in;
    case LayerKind::layer_norm:
      if (!(l.eps > 0.0)) throw fail(fmt::format("eps must be > 0 (got {})", l.eps));
      return in;
    case LayerKind::batch_norm:  // BatchNorm1d over [features], BatchNorm2d over [C, H, W]
      if (in.size() != 1 && in.size() != 3)
        throw fail(fmt::format("needs a [features] or [channels, height, width] input but gets {} per example",
                               shape_string(in)));
      if (!(l.eps > 0.0)) throw fail(fmt::format("eps must be > 0 (got {})", l.eps));
      if (!(l.momentum >= 0.0 && l.momentum <= 1.0))
        throw fail(fmt::format("momentum must be in [0, 1] (got {})", l.momentum));
      return in;
    case LayerKind::dropout:
    case LayerKind::dropout2d:
      if (!(l.p >= 0.0 && l.p < 1.0)) throw fail(fmt::format("p must be in [0, 1) (got {})", l.p));
      if (l.kind == LayerKind::dropout2d) spatial();
      return in;
    case LayerKind::add:     // (its inputs' shapes agree: merged_input_shape)
    case LayerKind::concat:  // (merged_input_shape joined them)
      return in;
  }
  throw fail("unknown layer kind");
}

// The per-example shape layer `index` reads: its (first) input's; for an add
// every input's, which must agree; for a concat the inputs' joined along
// their first dimension (the rest must agree). `shapes[j]`: after layer j;
// -1: the input.
Shape merged_input_shape(const std::vector<std::int64_t>& input_shape, const std::vector<Shape>& shapes,
                         const std::vector<LayerSpec>& layers, const std::vector<std::int64_t>& reads,
                         std::size_t index) {
  const auto shape_of = [&](std::int64_t j) { return j < 0 ? Shape(input_shape) : shapes[static_cast<std::size_t>(j)]; };
  const auto source = [&](std::int64_t j) {
    return j < 0 ? std::string("the model's input")
                 : fmt::format("layer {}{}", j, layers[static_cast<std::size_t>(j)].name.empty()
                                                    ? std::string()
                                                    : fmt::format(" '{}'", layers[static_cast<std::size_t>(j)].name));
  };
  const Shape first = shape_of(reads.front());
  const bool concat = layers[index].kind == LayerKind::concat;
  Shape joined = first;  // concat: the first dimension summed
  // Shapes that must agree: every dimension for add, all but the first for concat.
  const auto comparable = [&](Shape s) {
    if (concat && !s.empty()) s[0] = 0;
    return s;
  };
  for (std::size_t k = 1; k < reads.size(); ++k) {
    if (concat && !joined.empty()) joined[0] += shape_of(reads[k]).front();
    if (comparable(shape_of(reads[k])) != comparable(first)) {
      const LayerSpec& l = layers[index];
      const std::string problem =
          concat ? fmt::format("joins {} ({}) and {} ({}): all but the first dimension must agree",
                               shape_string(first), source(reads.front()), shape_string(shape_of(reads[k])),
                               source(reads[k]))
                 : fmt::format("adds {} ({}) and {} ({}): the shapes must agree", shape_string(first),
                               source(reads.front()), shape_string(shape_of(reads[k])), source(reads[k]));
      throw SequentialShapeError(static_cast<std::int64_t>(index),
                                 fmt::format("layer {} ({}): {}", index, layer_name(l), problem), problem);
    }
  }
  return concat ? joined : first;
}

// Builds the layers on x ([batch, features] from the gather); returns the last one's output.
ValueId add_layers(Graph& g, const SequentialSpec& spec, ValueId x, bool training) {
  const auto shapes = infer_sequential_shapes(spec.input_shape, spec.layers);
  const auto reads = layer_inputs(spec.layers);
  ValueId input = x;
  if (spec.input_shape.size() == 3) {
    Shape nchw{spec.batch};
    nchw.insert(nchw.end(), spec.input_shape.begin(), spec.input_shape.end());
    input = g.append_node(OpKind::reshape, {input}, ReshapeAttrs{nchw}, Role::activation).front();
    if (training && (spec.augment_translate > 0 || spec.augment_flip)) {
      // A raw 0 pixel after the fetch's scaling fills what moves in; each
      // rank draws for its examples' global indices.
      const AugmentAttrs a{spec.augment_translate, spec.augment_flip, spec.input_shift, spec.dropout_seed,
                           spec.batch_rank * spec.batch};
      input = g.append_node(OpKind::augment_images, {input, g.value_named(names::step)}, a, Role::activation).front();
    }
  }
  std::vector<ValueId> outputs;  // outputs[i]: layer i's
  const auto value_of = [&](std::int64_t j) { return j < 0 ? input : outputs[static_cast<std::size_t>(j)]; };
  std::size_t k = 0;              // layers with parameters so far
  std::int64_t dropouts_here = 0;  // dropout layers since the last layer with parameters
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    const std::int64_t first = reads[i].front();
    const Shape in = first < 0 ? Shape(spec.input_shape) : shapes[static_cast<std::size_t>(first)];
    ValueId h = value_of(first);
    if (has_parameters(l)) {
      ++k;
      dropouts_here = 0;
    }
    switch (l.kind) {
      case LayerKind::linear: {
        // Parameters first, then their casts: build_mlp_*'s order, so a Sequential MLP is its graph.
        const ValueId w = g.param(names::weight(k), {l.out, in[0]}, spec.weight_dtype);
        if (!l.bias) {
          h = g.matmul(h, model_pieces::as_compute(g, w, spec.compute_dtype), false, true);
          break;
        }
        const ValueId b = g.param(names::bias(k), {l.out}, spec.weight_dtype);
        h = g.linear(h, model_pieces::as_compute(g, w, spec.compute_dtype),
                     model_pieces::as_compute(g, b, spec.compute_dtype));
        break;
      }
      case LayerKind::conv2d: {
        const ValueId w = g.param(names::weight(k), {l.out, in[0], l.kernel, l.kernel}, spec.weight_dtype);
        const ValueId b = l.bias ? g.param(names::bias(k), {l.out}, spec.weight_dtype) : -1;
        std::vector<ValueId> operands{h, model_pieces::as_compute(g, w, spec.compute_dtype)};
        if (l.bias) operands.push_back(model_pieces::as_compute(g, b, spec.compute_dtype));
        h = g.append_node(OpKind::conv2d, operands, Conv2dAttrs{layer_stride(l), l.padding, 0, 0}, Role::activation)
                .front();
        break;
      }
      case LayerKind::max_pool2d:
      case LayerKind::avg_pool2d:
        h = g.append_node(l.kind == LayerKind::max_pool2d ? OpKind::max_pool2d : OpKind::avg_pool2d, {h},
                          Pool2dAttrs{l.kernel, layer_stride(l)}, Role::activation)
                .front();
        break;
      case LayerKind::layer_norm: {  // over the example's values, as nn.LayerNorm(its shape)
        const ValueId w = g.param(names::weight(k), in, spec.weight_dtype);
        const ValueId b = g.param(names::bias(k), in, spec.weight_dtype);
        h = g.append_node(OpKind::layer_norm,
                          {h, model_pieces::as_compute(g, w, spec.compute_dtype),
                           model_pieces::as_compute(g, b, spec.compute_dtype)},
                          LayerNormAttrs{l.eps}, Role::activation)
                .front();
        break;
      }
      case LayerKind::batch_norm: {  // per channel: the first per-example dimension
        const Shape channels{in[0]};
        const ValueId gamma = model_pieces::as_compute(g, g.param(names::weight(k), channels, spec.weight_dtype),
                                                       spec.compute_dtype);
        const ValueId beta = model_pieces::as_compute(g, g.param(names::bias(k), channels, spec.weight_dtype),
                                                      spec.compute_dtype);
        const BatchNormAttrs attrs{l.eps, l.momentum};
        if (training) {
          // The running statistics (f32 state) move towards this batch's in
          // place; nothing in this graph reads them.
          g.append_node(OpKind::batch_norm_stats_update,
                        {h, g.state(names::running_mean(k), channels, DType::f32),
                         g.state(names::running_var(k), channels, DType::f32)},
                        attrs, Role::activation);
          h = g.append_node(OpKind::batch_norm, {h, gamma, beta}, attrs, Role::activation).front();
        } else {  // eval and predict read them as parameters of the same names
          h = g.append_node(OpKind::batch_norm_inference,
                            {h, gamma, beta, g.param(names::running_mean(k), channels, DType::f32),
                             g.param(names::running_var(k), channels, DType::f32)},
                            attrs, Role::activation)
                  .front();
        }
        break;
      }
      case LayerKind::global_avg_pool2d:  // [N, C, 1, 1] as PyTorch's, then flattened to [N, C]
        h = g.append_node(OpKind::global_avg_pool2d, {h}, NoAttrs{}, Role::activation).front();
        h = g.append_node(OpKind::flatten, {h}, NoAttrs{}, Role::activation).front();
        break;
      case LayerKind::flatten: h = g.append_node(OpKind::flatten, {h}, NoAttrs{}, Role::activation).front(); break;
      case LayerKind::activation: h = model_pieces::add_activation(g, l.activation, h); break;
      case LayerKind::dropout:
      case LayerKind::dropout2d:
        if (!training || l.p == 0.0) break;
        {
          // The MLP keys layer l's dropout on stream l (the linear layer before
          // it); a second dropout after the same layer takes its own stream,
          // 2^16 further on: Philox reads only the stream's low 32 bits
          // (ops/philox.hpp), so the offset must stay inside them.
          const auto stream = static_cast<std::int64_t>(k) + (static_cast<std::int64_t>(dropouts_here) << 16);
          ++dropouts_here;
          const DropoutAttrs attrs{l.p, spec.dropout_seed, stream};
          const OpKind op = l.kind == LayerKind::dropout ? OpKind::dropout : OpKind::dropout2d;
          h = g.append_node(op, {h, g.value_named(names::step)}, attrs, Role::activation).front();
        }
        break;
      case LayerKind::concat: {  // the inputs joined along dimension 1 in their listed order
        std::vector<ValueId> parts;
        for (std::int64_t r : reads[i]) parts.push_back(value_of(r));
        h = g.append_node(OpKind::concat, parts, NoAttrs{}, Role::activation).front();
        break;
      }
      case LayerKind::add:  // a residual connection: the inputs summed in their listed order
        for (std::size_t r = 1; r < reads[i].size(); ++r)
          h = g.append_node(OpKind::add, {h, value_of(reads[i][r])}, NoAttrs{}, Role::activation).front();
        break;
    }
    outputs.push_back(h);
  }
  return outputs.back();
}

model_pieces::BatchSource batch_source(const SequentialSpec& spec) {
  return {spec.dataset_rows, element_count(spec.input_shape), spec.feature_dtype, spec.target_width,
          spec.batch,        spec.compute_dtype,              spec.input_scale,   spec.input_shift,
          spec.batch_rank,   spec.batch_ranks};
}

}  // namespace

std::vector<Shape> infer_sequential_shapes(const std::vector<std::int64_t>& input_shape,
                                           const std::vector<LayerSpec>& layers) {
  const auto input_error = [&](const std::string& problem) {
    return SequentialShapeError(-1, fmt::format("input {}: {}", shape_string(input_shape), problem), problem);
  };
  if (input_shape.size() != 1 && input_shape.size() != 3)
    throw input_error("must be [features] or [channels, height, width]");
  for (auto d : input_shape)
    if (d <= 0) throw input_error("sizes must be > 0");
  if (layers.empty()) throw input_error("the layer list is empty");
  const auto reads = layer_inputs(layers);
  std::vector<Shape> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Shape in = merged_input_shape(input_shape, out, layers, reads[i], i);
    out.push_back(layer_output(in, layers[i], static_cast<std::int64_t>(i)));
  }
  return out;
}

std::int64_t sequential_outputs(const std::vector<std::int64_t>& input_shape, const std::vector<LayerSpec>& layers) {
  const Shape last = infer_sequential_shapes(input_shape, layers).back();
  if (last.size() != 1) {
    const std::string problem = fmt::format(
        "the last layer gives {} per example, but the loss needs [outputs]: end with flatten and a linear layer",
        shape_string(last));
    throw SequentialShapeError(static_cast<std::int64_t>(layers.size()) - 1,
                               fmt::format("layer {} ({}): {}", layers.size() - 1, layer_name(layers.back()), problem),
                               problem);
  }
  return last[0];
}

void validate_sequential_spec(const SequentialSpec& spec) {
  const auto outputs = sequential_outputs(spec.input_shape, spec.layers);
  if (spec.batch <= 0 || spec.batch > spec.dataset_rows)
    throw GraphError(fmt::format("sequential: batch {} must be in 1..{} (dataset rows)", spec.batch, spec.dataset_rows));
  if (!is_floating(spec.weight_dtype) || !is_floating(spec.compute_dtype))
    throw GraphError("sequential: weight and compute dtypes must be f32, f16 or bf16");
  if (!(spec.label_smoothing >= 0.0 && spec.label_smoothing <= 1.0))
    throw GraphError(fmt::format("sequential: label smoothing {} must be in [0, 1]", spec.label_smoothing));
  if (spec.label_smoothing > 0.0 && spec.loss != MlpLoss::softmax_xent)
    throw GraphError(fmt::format("sequential: label smoothing applies to softmax_xent, not to loss {}",
                                 loss_name(spec.loss)));
  if (spec.feature_dtype != DType::u8 && spec.feature_dtype != DType::f16 && spec.feature_dtype != DType::f32)
    throw GraphError(fmt::format("sequential: feature dtype {} must be u8, f16 or f32", dtype_name(spec.feature_dtype)));
  if (spec.target_width < 0) throw GraphError(fmt::format("sequential: target width {} must be >= 0", spec.target_width));
  if (spec.target_width > 0 && spec.target_width != outputs)
    throw GraphError(fmt::format("sequential: {} float targets per example but {} outputs", spec.target_width, outputs));
  if ((spec.target_width > 0) != is_regression(spec.loss))
    throw GraphError(fmt::format("sequential: loss {} needs {}", loss_name(spec.loss),
                                 is_regression(spec.loss) ? "float targets (target width > 0)" : "class labels"));
}

Graph build_sequential_forward(const SequentialSpec& spec) {
  validate_sequential_spec(spec);
  Graph g;
  const auto batch = model_pieces::add_batch_fetch(g, batch_source(spec));
  const ValueId out = add_layers(g, spec, batch.x, /*training=*/true);
  g.mark_output(model_pieces::add_loss(g, spec.loss, spec.label_smoothing, out, batch.y));
  return g;
}

Graph build_sequential_eval(const SequentialSpec& spec) {
  validate_sequential_spec(spec);
  Graph g;
  const auto batch = model_pieces::add_batch_fetch(g, batch_source(spec));
  const ValueId out = add_layers(g, spec, batch.x, /*training=*/false);
  model_pieces::add_eval_outputs(g, spec.loss, spec.label_smoothing, out, batch.y);
  return g;
}

Graph build_sequential_predict(const SequentialSpec& spec) {
  validate_sequential_spec(spec);
  Graph g;
  const ValueId x = model_pieces::add_feature_fetch(g, batch_source(spec));
  g.mark_output(add_layers(g, spec, x, /*training=*/false));
  g.advance_step(g.value_named(names::step));
  return g;
}

TrainingGraphStages build_sequential_training_stages(const SequentialSpec& spec, const OptimizerSpec& sgd,
                                                     const FusionOptions& fusion) {
  Graph forward = build_sequential_forward(spec);
  const ValueId loss = forward.value_named(names::loss);
  const ValueId step = forward.value_named(names::step);
  return build_training_stages(std::move(forward), loss, sgd, fusion, step);
}

std::vector<ParameterInit> sequential_initial_parameters(const std::vector<std::int64_t>& input_shape,
                                                         const std::vector<LayerSpec>& layers, std::uint64_t seed) {
  const auto shapes = infer_sequential_shapes(input_shape, layers);
  const auto reads = layer_inputs(layers);
  std::vector<ParameterInit> out;
  std::size_t k = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    const std::int64_t first = reads[i].front();
    const Shape in = first < 0 ? Shape(input_shape) : shapes[static_cast<std::size_t>(first)];
    if (l.kind == LayerKind::layer_norm) {  // nn.LayerNorm's start: weight 1, bias 0 (no draws)
      ++k;
      const auto n = static_cast<std::size_t>(element_count(in));
      out.push_back({names::weight(k), in, std::vector<float>(n, 1.f)});
      out.push_back({names::bias(k), in, std::vector<float>(n, 0.f)});
    } else if (l.kind == LayerKind::batch_norm) {  // nn.BatchNorm's start (no draws)
      ++k;
      const auto n = static_cast<std::size_t>(in[0]);
      out.push_back({names::weight(k), {in[0]}, std::vector<float>(n, 1.f)});
      out.push_back({names::bias(k), {in[0]}, std::vector<float>(n, 0.f)});
      out.push_back({names::running_mean(k), {in[0]}, std::vector<float>(n, 0.f)});
      out.push_back({names::running_var(k), {in[0]}, std::vector<float>(n, 1.f)});
    } else if (has_parameters(l)) {
      ++k;
      const Shape w_shape = l.kind == LayerKind::linear ? Shape{l.out, in[0]} : Shape{l.out, in[0], l.kernel, l.kernel};
      const std::int64_t fan_in = element_count(w_shape) / l.out;
      const auto index = static_cast<std::uint64_t>(2 * (k - 1));
      out.push_back({names::weight(k), w_shape, linear_init(element_count(w_shape), fan_in, param_key(seed, index))});
      if (l.bias) out.push_back({names::bias(k), {l.out}, linear_init(l.out, fan_in, param_key(seed, index + 1))});
    }
  }
  return out;
}

}  // namespace sg
