// The op registry: one complete entry per op kind, names and attributes that
// round-trip, typed attribute access, and what autodiff now takes from it
// (any registered loss as the seed, nodes with several outputs).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "graph/autodiff.hpp"
#include "graph/dump.hpp"
#include "graph/op_registry.hpp"
#include "graph/verifier.hpp"

using namespace sg;

namespace {

constexpr std::size_t kOpKinds = static_cast<std::size_t>(OpKind::all_gather_batch) + 1;  // the last OpKind

// Attributes of the given kind with every field away from its default.
OpAttrs sample_attrs(std::size_t index) {
  switch (index) {
    case attrs_index<BatchIndicesAttrs>(): return BatchIndicesAttrs{48, 1, 3};
    case attrs_index<GatherRowsAttrs>(): return GatherRowsAttrs{DType::f16, 0.5, -0.25};
    case attrs_index<MatmulAttrs>(): return MatmulAttrs{true, false};
    case attrs_index<CastAttrs>(): return CastAttrs{DType::f16};
    case attrs_index<SgdUpdateAttrs>(): return SgdUpdateAttrs{0.9, 1e-4, true};
    case attrs_index<LabelSmoothingAttrs>(): return LabelSmoothingAttrs{0.1, 0.5};
    case attrs_index<DropoutAttrs>(): return DropoutAttrs{0.25, 0x123456789abcull, 2};
    case attrs_index<AdamUpdateAttrs>(): return AdamUpdateAttrs{0.8, 0.95, 1e-6, 0.01, true};
    case attrs_index<ClipGradAttrs>(): return ClipGradAttrs{2.5};
    case attrs_index<Conv2dAttrs>(): return Conv2dAttrs{2, 1, 7, 5, true};
    case attrs_index<Pool2dAttrs>(): return Pool2dAttrs{3, 1, 9, 8, true};
    case attrs_index<ReshapeAttrs>(): return ReshapeAttrs{{6, 1, 4}};
    case attrs_index<RmspropUpdateAttrs>(): return RmspropUpdateAttrs{0.9, 1e-6, 0.01, 0.5, true};
    case attrs_index<LayerNormAttrs>(): return LayerNormAttrs{1e-3};
    case attrs_index<SliceAttrs>(): return SliceAttrs{3, 5};
    case attrs_index<AugmentAttrs>(): return AugmentAttrs{2, true, -0.42, 0xfedcba9876543210ull, 64};
    case attrs_index<BatchNormAttrs>(): return BatchNormAttrs{1e-3, 0.25, true};
    case attrs_index<LossGradientAttrs>(): return LossGradientAttrs{0.25};
    case attrs_index<AllReduceAttrs>(): return AllReduceAttrs{true};
    default: return NoAttrs{};
  }
}

std::size_t count_op(const Graph& g, OpKind op) {
  return static_cast<std::size_t>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

}  // namespace

TEST_CASE("every op kind has one complete registry entry and its name round-trips") {
  REQUIRE(all_op_defs().size() == kOpKinds);
  for (std::size_t i = 0; i < kOpKinds; ++i) {
    const auto kind = static_cast<OpKind>(i);
    const OpDef& def = op_def(kind);
    INFO("op " << def.name);
    CHECK(&def == all_op_defs()[i]);
    CHECK(def.kind == kind);
    CHECK_FALSE(def.name.empty());
    CHECK(op_name(kind) == def.name);
    CHECK(op_from_name(def.name) == kind);
    CHECK((def.infer != nullptr));
    CHECK((def.attrs_to_json != nullptr));
    CHECK((def.attrs_from_json != nullptr));
    CHECK((def.attrs_text != nullptr));
    CHECK((def.cpu_f32 != nullptr));
    CHECK((def.cpu_f64 != nullptr));
    CHECK(def.attrs_index < std::variant_size_v<OpAttrs>);
    CHECK((op_updates_in_place(kind) == (def.in_place != nullptr)));
  }
  CHECK_THROWS_AS(op_from_name("matmux"), std::invalid_argument);
  CHECK(op_def(OpKind::matmul).attrs_index == attrs_index<MatmulAttrs>());
  CHECK(op_def(OpKind::sgd_update).attrs_index == attrs_index<SgdUpdateAttrs>());
  CHECK(op_def(OpKind::softmax_xent).is_loss());
  CHECK_FALSE(op_def(OpKind::add).is_loss());
  CHECK((op_def(OpKind::gelu).gradient != nullptr));
  CHECK((op_def(OpKind::gelu_backward).gradient == nullptr));  // backward-only
}

TEST_CASE("each op's JSON attributes round-trip, and a wrong kind is refused") {
  for (const OpDef* def : all_op_defs()) {
    INFO("op " << def->name);
    const OpAttrs attrs = sample_attrs(def->attrs_index);
    REQUIRE(attrs.index() == def->attrs_index);
    const auto j = attrs_to_json(def->kind, attrs);
    CHECK(attrs_from_json(def->kind, j) == attrs);
    CHECK(attrs_from_json(def->kind, nlohmann::json::parse(j.dump())) == attrs);
    const OpAttrs other = def->attrs_index == 0 ? OpAttrs{MatmulAttrs{}} : OpAttrs{NoAttrs{}};
    CHECK_THROWS_WITH_AS(attrs_to_json(def->kind, other), doctest::Contains("attributes are"), GraphError);
  }
  // Only the op's own fields are written.
  CHECK(attrs_to_json(OpKind::sgd_update, SgdUpdateAttrs{0.9, 0.0}) ==
        nlohmann::json{{"momentum", 0.9}, {"weight_decay", 0.0}});
  CHECK(attrs_to_json(OpKind::relu, NoAttrs{}) == nlohmann::json::object());
}

TEST_CASE("Node::attr returns the typed attributes or names the node and the kind") {
  Graph g;
  const auto x = g.input("x", {2, 3}, DType::f32);
  g.relu(x);
  g.matmul(x, x, false, true);
  CHECK(g.node(1).attr<MatmulAttrs>() == MatmulAttrs{false, true});
  CHECK_THROWS_WITH_AS(g.node(0).attr<MatmulAttrs>(), "node 0 (relu): attributes are not matmul", GraphError);
  CHECK_THROWS_WITH_AS(g.node(1).attr<SgdUpdateAttrs>(), "node 1 (matmul): attributes are not sgd_update", GraphError);
  // Appending a node with the wrong kind of attributes fails in shape inference.
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::matmul, {x, x}, CastAttrs{}),
                       doctest::Contains("matmul: attributes are cast, expected matmul"), GraphError);
}

TEST_CASE("in-place slots come from the registry") {
  const auto node = [](OpKind op, int inputs, OpAttrs attrs) {
    Node n;
    n.op = op;
    n.inputs.assign(static_cast<std::size_t>(inputs), 0);
    n.attrs = std::move(attrs);
    return n;
  };
  CHECK(in_place_inputs(node(OpKind::sgd_update, 3, SgdUpdateAttrs{0.9})) == std::vector<int>{0, 2});
  CHECK(in_place_inputs(node(OpKind::sgd_update, 2, SgdUpdateAttrs{})) == std::vector<int>{0});
  CHECK(in_place_inputs(node(OpKind::advance_step, 1, NoAttrs{})) == std::vector<int>{0});
  CHECK(in_place_inputs(node(OpKind::matmul, 2, MatmulAttrs{})).empty());
  // rmsprop_update: its attributes say which inputs are states; a clip scale after them is only read.
  RmspropUpdateAttrs centered_momentum;
  centered_momentum.momentum = 0.9;
  centered_momentum.centered = true;
  CHECK(in_place_inputs(node(OpKind::rmsprop_update, 6, centered_momentum)) == std::vector<int>{0, 2, 3, 4});
  CHECK(in_place_inputs(node(OpKind::rmsprop_update, 4, RmspropUpdateAttrs{})) == std::vector<int>{0, 2});
  CHECK(op_updates_in_place(OpKind::advance_step));
  CHECK_FALSE(op_updates_in_place(OpKind::relu));
}

TEST_CASE("only the scalar output of a registered loss seeds autodiff") {
  Graph g;
  const auto x = g.input("x", {4, 3}, DType::f32);
  const auto w = g.param("w", {5, 3}, DType::f32);
  const auto logits = g.matmul(x, w, false, true);
  const auto labels = g.label("y", {4}, DType::i32);
  const auto loss = g.softmax_xent(logits, labels);

  Graph not_a_loss = g;
  CHECK_THROWS_WITH_AS(append_backward(not_a_loss, logits),
                       doctest::Contains("loss 'matmul' is the output of matmul (node 0), which is not a loss op"),
                       GraphError);
  CHECK_THROWS_WITH_AS(append_backward(not_a_loss, w), doctest::Contains("loss 'w' is a param value"), GraphError);

  const auto grads = append_backward(g, loss);
  REQUIRE(grads.of_param.count(w) == 1);
  CHECK(g.value(grads.of_param.at(w)).shape == Shape{5, 3});
  CHECK(count_op(g, OpKind::softmax_xent_backward) == 1);
}

TEST_CASE("autodiff of a node with two outputs uses the gradients of both") {
  Graph g;
  const auto x = g.input("x", {4, 3}, DType::f32);
  const auto w = g.param("w", {5, 3}, DType::f32);
  const auto b = g.param("b", {5}, DType::f32);
  const auto outs = g.bias_add_relu(g.matmul(x, w, false, true), b);
  REQUIRE(outs.size() == 2);
  const ValueId z = outs[0], a = outs[1];
  CHECK(g.value(z).shape == Shape{4, 5});
  CHECK(g.value(a).shape == Shape{4, 5});
  const auto labels = g.label("y", {4}, DType::i32);

  SUBCASE("both outputs reach the loss") {
    const auto w2 = g.param("w2", {2, 5}, DType::f32);
    const auto w3 = g.param("w3", {2, 5}, DType::f32);
    const auto logits = g.add(g.matmul(a, w2, false, true), g.matmul(z, w3, false, true));
    const auto grads = append_backward(g, g.softmax_xent(logits, labels));
    CHECK(find_graph_problems(g).empty());
    CHECK(grads.of_param.size() == 4);
    CHECK(g.value(grads.of_param.at(b)).shape == Shape{5});
    CHECK(g.value(grads.of_param.at(w)).shape == Shape{5, 3});
    // relu_backward(dA, A) added to dZ: one add for the two paths into Z.
    std::size_t masks = 0;
    for (const Node& n : g.nodes())
      if (n.op == OpKind::relu_backward) {
        ++masks;
        CHECK(n.inputs[1] == a);
      }
    CHECK(masks == 1);
    CHECK(count_op(g, OpKind::add) == 2);  // the forward sum and dZ + masked dA
  }
  SUBCASE("only the activation reaches the loss") {
    const auto w2 = g.param("w2", {2, 5}, DType::f32);
    const auto grads = append_backward(g, g.softmax_xent(g.matmul(a, w2, false, true), labels));
    CHECK(find_graph_problems(g).empty());
    CHECK(grads.of_param.size() == 3);
    CHECK(count_op(g, OpKind::relu_backward) == 1);
    CHECK(count_op(g, OpKind::add) == 0);
  }
  SUBCASE("only the pre-activation reaches the loss") {
    const auto w3 = g.param("w3", {2, 5}, DType::f32);
    const auto grads = append_backward(g, g.softmax_xent(g.matmul(z, w3, false, true), labels));
    CHECK(find_graph_problems(g).empty());
    CHECK(grads.of_param.size() == 3);
    CHECK(count_op(g, OpKind::relu_backward) == 0);
  }
}

TEST_CASE("gelu: shape rule, gradient rule gelu_backward(dy, x), dumps") {
  Graph g;
  const auto x = g.input("x", {4, 3}, DType::f32);
  const auto w = g.param("w", {6, 3}, DType::f32);
  const auto h = g.matmul(x, w, false, true);
  const auto y = g.gelu(h);
  CHECK(g.value(y).shape == Shape{4, 6});
  CHECK(g.value(y).dtype == DType::f32);
  CHECK_THROWS_WITH_AS(g.gelu(g.label("y", {4}, DType::i32)), doctest::Contains("gelu: 'y' [4] i32 must be f32, f16 or bf16"),
                       GraphError);
  CHECK_THROWS_WITH_AS(g.gelu_backward(y, x), doctest::Contains("gelu_backward: shape mismatch"), GraphError);
  const auto labels = g.label("labels", {4}, DType::i32);
  append_backward(g, g.softmax_xent(y, labels));
  REQUIRE(count_op(g, OpKind::gelu_backward) == 1);
  for (const Node& n : g.nodes())
    if (n.op == OpKind::gelu_backward) {
      CHECK(g.value(n.inputs[0]).name == "grad_gelu");
      CHECK(n.inputs[1] == h);  // the forward input, not the output
      CHECK(g.value(n.outputs[0]).name == "grad_matmul");
    }
  const Graph loaded = graph_from_json(dump_json(g));
  CHECK(loaded == g);
  CHECK(dump_text(g).find("gelu(matmul) -> gelu:[4,6]f32 fused=-") != std::string::npos);
}

TEST_CASE("typed attributes in the dumps, multi-output nodes round-trip through JSON") {
  Graph g;
  const auto x = g.input("x", {4, 3}, DType::f32);
  const auto w = g.param("w", {5, 3}, DType::f32);
  const auto dw = g.input("dw", {5, 3}, DType::f32);
  const auto v = g.state("v", {5, 3}, DType::f32);
  g.bias_add_relu(g.cast(g.matmul(x, w, false, true), DType::f16), g.param("b", {5}, DType::f16));
  g.sgd_update(w, dw, 0.9, 0.001, v);
  const std::string text = dump_text(g);
  CHECK(text.find("matmul(x, w) -> matmul:[4,5]f32 {trans_a=false,trans_b=true}") != std::string::npos);
  CHECK(text.find("bias_add_relu(cast, b) -> bias_add_relu:[4,5]f16, bias_add_relu_1:[4,5]f16 fused=-") !=
        std::string::npos);
  CHECK(text.find("sgd_update(w, dw, v) -> (in place) {momentum=0.9,weight_decay=0.001}") != std::string::npos);
  const std::string dot = dump_dot(g);
  CHECK(dot.find("n0 matmul\\n{trans_a=false,trans_b=true}") != std::string::npos);
  CHECK(dot.find("n3 sgd_update\\n{momentum=0.9,weight_decay=0.001}") != std::string::npos);
  const std::string json = dump_json(g);
  CHECK(json.find("\"out_dtype\": \"f16\"") != std::string::npos);  // the cast's target
  CHECK(json.find("\"lr\"") == std::string::npos);
  const Graph loaded = graph_from_json(json);
  CHECK(loaded == g);
  CHECK(loaded.node(1).attr<CastAttrs>().out_dtype == DType::f16);
  CHECK(loaded.node(3).attr<SgdUpdateAttrs>() == SgdUpdateAttrs{0.9, 0.001});
}

TEST_CASE("the CNN ops' attributes in the text dump and through a JSON round trip, with their gradients") {
  Graph g;
  const auto x = g.input("x", {2, 3, 9, 8}, DType::f32);
  const auto w = g.param("w", {4, 3, 3, 3}, DType::f32);
  const auto b = g.param("b", {4}, DType::f32);
  const auto step = g.state("step", {1}, DType::i32);
  const auto c = g.conv2d(x, w, b, 2, 1);
  CHECK(g.value(c).shape == Shape{2, 4, 5, 4});
  const auto d = g.dropout2d(c, 0.25, step, 0xabcdef12345ull, 3);
  const auto p = g.max_pool2d(g.relu(d), 2, 2);
  CHECK(g.value(p).shape == Shape{2, 4, 2, 2});
  const auto f = g.flatten(p);
  CHECK(g.value(f).shape == Shape{2, 16});
  const auto labels = g.label("labels", {2}, DType::i32);
  append_backward(g, g.softmax_xent(f, labels));
  for (OpKind op : {OpKind::conv2d_backward_filter, OpKind::channel_sum, OpKind::reshape, OpKind::max_pool2d_backward,
                    OpKind::dropout2d_backward})
    CHECK(count_op(g, op) == 1);
  CHECK(count_op(g, OpKind::conv2d_backward_data) == 0);  // x is an input: no dX

  const std::string text = dump_text(g);
  CHECK(text.find("conv2d(x, w, b) -> conv2d:[2,4,5,4]f32 {stride=2,padding=1} fused=-") != std::string::npos);
  CHECK(text.find("max_pool2d(relu) -> max_pool2d:[2,4,2,2]f32 {kernel=2,stride=2} fused=-") != std::string::npos);
  CHECK(text.find("dropout2d(conv2d, step) -> dropout2d:[2,4,5,4]f32 {p=0.25,seed=11806310474565,stream=3} fused=-") !=
        std::string::npos);
  CHECK(text.find("-> grad_w:[4,3,3,3]f32 {stride=2,padding=1} fused=-") != std::string::npos);
  const Graph loaded = graph_from_json(dump_json(g));
  CHECK(loaded == g);
  for (const Node& n : loaded.nodes()) {
    if (n.op == OpKind::conv2d_backward_filter) CHECK(n.attr<Conv2dAttrs>() == Conv2dAttrs{2, 1, 3, 3});
    if (n.op == OpKind::reshape) CHECK(n.attr<ReshapeAttrs>().shape == Shape{2, 4, 2, 2});
    if (n.op == OpKind::dropout2d) CHECK(n.attr<DropoutAttrs>() == DropoutAttrs{0.25, 0xabcdef12345ull, 3});
  }
}

TEST_CASE("a version-1 document (one flat attribute record, with an lr) still loads") {
  const std::string v1 = R"({"format": "stepgraph-graph-v1",
    "values": [{"id": 0, "name": "x", "shape": [2, 3], "dtype": "f32", "role": "input", "producer": -1},
               {"id": 1, "name": "w", "shape": [4, 3], "dtype": "f32", "role": "param", "producer": -1},
               {"id": 2, "name": "matmul", "shape": [2, 4], "dtype": "f32", "role": "activation", "producer": 0},
               {"id": 3, "name": "g", "shape": [4, 3], "dtype": "f32", "role": "input", "producer": -1}],
    "nodes": [{"id": 0, "op": "matmul", "inputs": [0, 1], "outputs": [2], "fusion_group": -1,
               "attrs": {"trans_a": false, "trans_b": true, "batch": 0, "out_dtype": "f32", "scale": 1.0,
                         "shift": 0.0, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}},
              {"id": 1, "op": "sgd_update", "inputs": [1, 3], "outputs": [], "fusion_group": -1,
               "attrs": {"trans_a": false, "trans_b": false, "batch": 0, "out_dtype": "f32", "scale": 1.0,
                         "shift": 0.0, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.5}}],
    "fusion_groups": [], "outputs": [2]})";
  const Graph g = graph_from_json(v1);
  CHECK(g.node(0).attr<MatmulAttrs>() == MatmulAttrs{false, true});
  CHECK(g.node(1).attr<SgdUpdateAttrs>() == SgdUpdateAttrs{0.0, 0.5});
}
