#include "runtime/export/onnx_writer.hpp"

#include <functional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#ifdef STEPGRAPH_HAVE_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace sg::exporting {

#ifndef STEPGRAPH_HAVE_ONNX

bool onnx_export_available() { return false; }

namespace {
[[noreturn]] void no_onnx() {
  throw std::runtime_error(
      "this build of stepgraph has no ONNX support (it was built without libonnx-dev and protobuf; install them "
      "with scripts/install_deps.sh and rebuild), so --format onnx is not available: use --format safetensors");
}
}  // namespace

std::string onnx_bytes(const ExportedMlp&) { no_onnx(); }
std::string onnx_bytes(const ExportedGraph&) { no_onnx(); }

#else

namespace {

class GraphBuilder {
 public:
  explicit GraphBuilder(onnx::GraphProto& g) : g_(g) {}

  std::string node(const std::string& op, std::vector<std::string> inputs, const std::string& output) {
    auto* n = g_.add_node();
    n->set_op_type(op);
    n->set_name(fmt::format("{}_{}", op, ++count_));
    for (const auto& i : inputs) n->add_input(i);
    n->add_output(output);
    last_ = n;
    return output;
  }
  void int_attr(const std::string& name, std::int64_t v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  void float_attr(const std::string& name, float v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  void ints_attr(const std::string& name, const std::vector<std::int64_t>& v) {
    auto* a = last_->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  std::string int64s(const std::string& name, const std::vector<std::int64_t>& values) {
    auto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<std::int64_t>(values.size()));
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t)));
    return name;
  }
  std::string constant(const std::string& name, std::vector<std::int64_t> dims, const std::vector<float>& values) {
    auto* t = g_.add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return name;
  }
  std::string scalar(const std::string& name, float v) { return constant(name, {}, {v}); }

  // y = activation(x), named `out`.
  std::string activation(const std::string& a, const std::string& x, const std::string& out) {
    if (a == "relu") return node("Relu", {x}, out);
    if (a == "tanh") return node("Tanh", {x}, out);
    if (a == "sigmoid") return node("Sigmoid", {x}, out);
    if (a == "silu") return node("Mul", {x, node("Sigmoid", {x}, out + "_sigmoid")}, out);
    if (a == "gelu") {  // 0.5 x (1 + erf(x / sqrt 2))
      const auto erf = node("Erf", {node("Mul", {x, scalar(out + "_rsqrt2", 0.70710678118654752f)}, out + "_u")}, out + "_erf");
      const auto one_plus = node("Add", {erf, scalar(out + "_one", 1.0f)}, out + "_1p");
      return node("Mul", {node("Mul", {x, scalar(out + "_half", 0.5f)}, out + "_hx"), one_plus}, out);
    }
    if (a == "gelu_tanh") {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const auto x3 = node("Mul", {node("Mul", {x, x}, out + "_x2"), x}, out + "_x3");
      const auto inner = node("Add", {x, node("Mul", {x3, scalar(out + "_c", 0.044715f)}, out + "_cx3")}, out + "_in");
      const auto t = node("Tanh", {node("Mul", {inner, scalar(out + "_k", 0.79788456080286536f)}, out + "_kin")}, out + "_t");
      const auto one_plus = node("Add", {t, scalar(out + "_one", 1.0f)}, out + "_1p");
      return node("Mul", {node("Mul", {x, scalar(out + "_half", 0.5f)}, out + "_hx"), one_plus}, out);
    }
    if (a == "identity") return x;
    throw std::runtime_error(fmt::format("model.activation '{}' cannot be exported to ONNX", a));
  }

 private:
  onnx::GraphProto& g_;
  onnx::NodeProto* last_ = nullptr;
  int count_ = 0;
};

// The checked, serialised model.
std::string checked_bytes(const onnx::ModelProto& model) {
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("onnx export: the ONNX checker rejects the model: {}", e.what()));
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw std::runtime_error("onnx export: protobuf serialisation failed");
  return bytes;
}

void start_model(onnx::ModelProto& model, const std::string& doc) {
  model.set_ir_version(onnx::IR_VERSION);
  model.set_producer_name("stepgraph");
  model.set_doc_string(doc);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
}

void add_io(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name,
            std::int64_t width) {
  auto* v = list->Add();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("N");
  t->mutable_shape()->add_dim()->set_dim_value(width);
}

// Layer `i` of a model.sequential network as ONNX nodes writing `out`;
// `in(k)` names its k-th input. Parameters are initializers named as the
// safetensors export names them (layer<i>.weight / .bias).
std::string graph_layer_node(GraphBuilder& b, const GraphLayer& l, std::size_t i,
                             const std::function<std::string(std::size_t)>& in, const std::string& out) {
  const std::string x = in(0);
  const auto weight = [&] { return b.constant(graph_parameter_name(i, "weight"), l.weight_shape, l.weight); };
  const auto bias = [&] { return b.constant(graph_parameter_name(i, "bias"), l.bias_shape, l.bias); };
  const auto window = [&] {
    b.ints_attr("kernel_shape", {l.kernel, l.kernel});
    b.ints_attr("strides", {l.stride, l.stride});
  };
  if (l.kind == "conv2d") {
    b.node("Conv", l.bias.empty() ? std::vector<std::string>{x, weight()} : std::vector<std::string>{x, weight(), bias()},
           out);
    window();
    b.ints_attr("pads", {l.padding, l.padding, l.padding, l.padding});
    return out;
  }
  if (l.kind == "linear") {
    b.node("Gemm", l.bias.empty() ? std::vector<std::string>{x, weight()} : std::vector<std::string>{x, weight(), bias()},
           out);
    b.int_attr("transB", 1);
    return out;
  }
  if (l.kind == "max_pool2d" || l.kind == "avg_pool2d") {  // no padding, floored sizes: ONNX's defaults
    b.node(l.kind == "max_pool2d" ? "MaxPool" : "AveragePool", {x}, out);
    window();
    return out;
  }
  if (l.kind == "global_avg_pool2d" || l.kind == "flatten") {
    const std::string from = l.kind == "flatten" ? x : b.node("GlobalAveragePool", {x}, out + "_pooled");
    b.node("Flatten", {from}, out);
    b.int_attr("axis", 1);
    return out;
  }
  if (l.kind == "dropout" || l.kind == "dropout2d" || l.kind == "identity") return b.node("Identity", {x}, out);
  if (l.kind == "add") {
    std::string sum = x;
    for (std::size_t k = 1; k < l.inputs.size(); ++k)
      sum = b.node("Add", {sum, in(k)}, k + 1 == l.inputs.size() ? out : fmt::format("{}_{}", out, k));
    return sum;
  }
  if (l.kind == "concat") {
    std::vector<std::string> parts;
    for (std::size_t k = 0; k < l.inputs.size(); ++k) parts.push_back(in(k));
    b.node("Concat", parts, out);
    b.int_attr("axis", 1);
    return out;
  }
  if (l.kind == "batch_norm") {  // inference: the running statistics, as nn.BatchNorm in eval()
    const auto mean = b.constant(graph_parameter_name(i, "running_mean"), l.bias_shape, l.running_mean);
    const auto var = b.constant(graph_parameter_name(i, "running_var"), l.bias_shape, l.running_var);
    b.node("BatchNormalization", {x, weight(), bias(), mean, var}, out);
    b.float_attr("epsilon", static_cast<float>(l.eps));
    b.float_attr("momentum", static_cast<float>(1.0 - l.momentum));  // ONNX's momentum weights the running value
    return out;
  }
  if (l.kind == "layer_norm") {  // opset 13 has no LayerNormalization (17 does): its formula, biased variance
    std::vector<std::int64_t> axes;
    for (std::size_t a = 1; a <= l.weight_shape.size(); ++a) axes.push_back(static_cast<std::int64_t>(a));
    const auto mean_of = [&](const std::string& v, const std::string& name) {
      b.node("ReduceMean", {v}, name);
      b.ints_attr("axes", axes);
      b.int_attr("keepdims", 1);
      return name;
    };
    const auto centred = b.node("Sub", {x, mean_of(x, out + "_mean")}, out + "_centred");
    const auto var = mean_of(b.node("Mul", {centred, centred}, out + "_squares"), out + "_var");
    const auto var_eps = b.node("Add", {var, b.scalar(out + "_eps", static_cast<float>(l.eps))}, out + "_vareps");
    const auto deviation = b.node("Sqrt", {var_eps}, out + "_std");
    const auto normed = b.node("Div", {centred, deviation}, out + "_normed");
    return b.node("Add", {b.node("Mul", {normed, weight()}, out + "_scaled"), bias()}, out);
  }
  return b.activation(l.kind, x, out);  // throws for a kind it does not know
}

}  // namespace

bool onnx_export_available() { return true; }

std::string onnx_bytes(const ExportedMlp& m) {
  if (m.layers.empty()) throw std::runtime_error("onnx export: the model has no layers");
  torch_activation(m.activation);  // an unknown activation fails here, before any work
  onnx::ModelProto model;
  start_model(model, fmt::format("stepgraph MLP {}; input scaled as {}", torch_sequential_text(m), input_scaling_text(m)));
  onnx::GraphProto& g = *model.mutable_graph();
  g.set_name("stepgraph_mlp");
  GraphBuilder b(g);
  add_io(g.mutable_input(), "input", m.layers.front().in);
  std::string h = b.node("Mul", {"input", b.scalar("input_scale", static_cast<float>(m.input_scale))}, "input_scaled");
  h = b.node("Add", {h, b.scalar("input_shift", static_cast<float>(m.input_shift))}, "x");
  const auto indices = torch_linear_indices(m);
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    const auto& layer = m.layers[l];
    const bool last = l + 1 == m.layers.size();
    const auto w = b.constant(fmt::format("{}.weight", indices[l]), {layer.out, layer.in}, layer.weight);
    const auto bias = b.constant(fmt::format("{}.bias", indices[l]), {layer.out}, layer.bias);
    const std::string out = last ? (m.regression ? "outputs" : "logits") : fmt::format("linear{}", l + 1);
    h = b.node("Gemm", {h, w, bias}, out);
    b.int_attr("transB", 1);
    if (!last) h = b.activation(m.activation, h, fmt::format("hidden{}", l + 1));
  }
  add_io(g.mutable_output(), h, m.layers.back().out);
  if (!m.regression) {
    b.node("Softmax", {h}, "probabilities");
    b.int_attr("axis", 1);
    add_io(g.mutable_output(), "probabilities", m.layers.back().out);
  }
  return checked_bytes(model);
}

std::string onnx_bytes(const ExportedGraph& m) {
  if (m.layers.empty()) throw std::runtime_error("onnx export: the model has no layers");
  std::int64_t features = 1;
  for (auto d : m.input_shape) features *= d;
  onnx::ModelProto model;
  start_model(model, fmt::format("stepgraph model.sequential network (the module in its safetensors export); input "
                                 "[N, {}] rows scaled as {}",
                                 features, input_scaling_text(m.input_scale, m.input_shift)));
  onnx::GraphProto& g = *model.mutable_graph();
  g.set_name("stepgraph_graph");
  GraphBuilder b(g);
  add_io(g.mutable_input(), "input", features);
  std::string x = b.node("Mul", {"input", b.scalar("input_scale", static_cast<float>(m.input_scale))}, "input_scaled");
  x = b.node("Add", {x, b.scalar("input_shift", static_cast<float>(m.input_shift))}, "x_rows");
  if (m.input_shape.size() > 1) {
    std::vector<std::int64_t> shape{-1};
    shape.insert(shape.end(), m.input_shape.begin(), m.input_shape.end());
    x = b.node("Reshape", {x, b.int64s("input_shape", shape)}, "x");
  }
  std::vector<std::string> h;  // h[i]: layer i's output
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const GraphLayer& l = m.layers[i];
    const auto in = [&](std::size_t k) { return l.inputs.at(k) < 0 ? x : h[static_cast<std::size_t>(l.inputs[k])]; };
    const bool last = i + 1 == m.layers.size();
    const std::string out = last ? (m.regression ? "outputs" : "logits") : fmt::format("h{}", i);
    h.push_back(graph_layer_node(b, l, i, in, out));
  }
  add_io(g.mutable_output(), h.back(), m.outputs);
  if (!m.regression) {
    b.node("Softmax", {h.back()}, "probabilities");
    b.int_attr("axis", 1);
    add_io(g.mutable_output(), "probabilities", m.outputs);
  }
  return checked_bytes(model);
}

#endif

}  // namespace sg::exporting
