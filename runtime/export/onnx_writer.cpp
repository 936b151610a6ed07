#include "runtime/export/onnx_writer.hpp"

#include <stdexcept>

#include <fmt/format.h>

#ifdef STEPGRAPH_HAVE_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace sg::exporting {

#ifndef STEPGRAPH_HAVE_ONNX

bool onnx_export_available() { return false; }

std::string onnx_bytes(const ExportedMlp&) {
  throw std::runtime_error(
      "this build of stepgraph has no ONNX support (it was built without libonnx-dev and protobuf; install them "
      "with scripts/install_deps.sh and rebuild), so --format onnx is not available: use --format safetensors");
}

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

void add_io(google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>* list, const std::string& name,
            std::int64_t width) {
  auto* v = list->Add();
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("N");
  t->mutable_shape()->add_dim()->set_dim_value(width);
}

}  // namespace

bool onnx_export_available() { return true; }

std::string onnx_bytes(const ExportedMlp& m) {
  if (m.layers.empty()) throw std::runtime_error("onnx export: the model has no layers");
  torch_activation(m.activation);  // an unknown activation fails here, before any work
  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);
  model.set_producer_name("stepgraph");
  model.set_doc_string(fmt::format("stepgraph MLP {}; input scaled as {}", torch_sequential_text(m), input_scaling_text(m)));
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
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
  try {
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("onnx export: the ONNX checker rejects the model: {}", e.what()));
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) throw std::runtime_error("onnx export: protobuf serialisation failed");
  return bytes;
}

#endif

}  // namespace sg::exporting
