// Builder, shape inference errors and the verifier.
#include <doctest/doctest.h>

#include <string>

#include "graph/graph.hpp"
#include "graph/verifier.hpp"
#include "models/mlp.hpp"

using namespace sg;

namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const GraphError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("builder reads like the model and infers shapes") {
  Graph g;
  const auto x = g.input("x", {32, 784}, DType::f16);
  const auto w1 = g.param("w1", {128, 784}, DType::f16);
  const auto b1 = g.param("b1", {128}, DType::f16);
  const auto h = g.relu(g.linear(x, w1, b1));
  CHECK(g.value(h).shape == Shape{32, 128});
  CHECK(g.value(h).dtype == DType::f16);
  CHECK(g.value(h).role == Role::activation);
  CHECK(g.nodes().size() == 3);
  CHECK(g.node(0).op == OpKind::matmul);
  CHECK(g.node(0).attr<MatmulAttrs>().trans_b);
  CHECK_FALSE(g.node(0).attr<MatmulAttrs>().trans_a);
  CHECK(g.value(g.matmul(x, w1, false, true)).shape == Shape{32, 128});
  CHECK(g.value(g.matmul(w1, x, false, true)).shape == Shape{128, 32});
  CHECK(g.value(g.matmul(x, x, true, false)).shape == Shape{784, 784});
  CHECK(find_graph_problems(g).empty());
}

TEST_CASE("shape mismatches name the op and both shapes") {
  Graph g;
  const auto x = g.input("x", {32, 784}, DType::f16);
  const auto w = g.param("w", {128, 700}, DType::f16);
  const auto msg = error_of([&] { g.matmul(x, w, false, true); });
  CHECK(msg.find("matmul") != std::string::npos);
  CHECK(msg.find("[32,784]") != std::string::npos);
  CHECK(msg.find("[128,700]") != std::string::npos);

  const auto b = g.param("b", {64}, DType::f16);
  const auto h = g.matmul(x, g.param("w2", {784, 128}, DType::f16));
  CHECK(error_of([&] { g.bias_add(h, b); }).find("bias_add") != std::string::npos);
  const auto wf = g.param("wf", {784, 128}, DType::f32);
  CHECK(error_of([&] { g.matmul(x, wf); }).find("dtype mismatch") != std::string::npos);
  const auto labels = g.label("y", {31}, DType::i32);
  CHECK(error_of([&] { g.softmax_xent(h, labels); }).find("batch mismatch") != std::string::npos);
  CHECK(error_of([&] { g.param("w", {1}, DType::f32); }).find("already used") != std::string::npos);
  CHECK(error_of([&] { g.input("bad", {0, 3}, DType::f32); }).find("non-positive") != std::string::npos);
}

TEST_CASE("sgd_update checks momentum and velocity (the learning rate is executor state)") {
  Graph g;
  const auto w = g.param("w", {4, 4}, DType::f32);
  const auto dw = g.input("dw", {4, 4}, DType::f32);
  // The learning-rate check moved with the lr: CpuExecutor::set_learning_rate
  // (tests/runtime/test_gradients.cpp).
  CHECK(error_of([&] { g.sgd_update(w, dw, -0.5); }).find("momentum") != std::string::npos);
  CHECK(error_of([&] { g.sgd_update(w, dw, 0.9); }).find("velocity") != std::string::npos);
  const auto v = g.state("v", {4, 4}, DType::f32);
  CHECK_NOTHROW(g.sgd_update(w, dw, 0.9, 0.0, v));
  CHECK(g.node(0).outputs.empty());
  CHECK(g.node(0).attr<SgdUpdateAttrs>() == SgdUpdateAttrs{0.9, 0.0});
}

TEST_CASE("verifier finds use-before-definition, double definition and bad in-place updates") {
  Graph g;
  const auto x = g.input("x", {2, 3}, DType::f32);
  const auto y = g.relu(x);
  CHECK(find_graph_problems(g).empty());

  SUBCASE("input used before it is defined (a cycle once reordered)") {
    Graph bad;
    const auto a = bad.input("a", {2, 3}, DType::f32);
    bad.add_value_raw(Value{-1, "late", {2, 3}, DType::f32, Role::activation, 1});
    bad.add_node_raw(Node{-1, OpKind::relu, {1}, {2}, {}, -1});  // reads 'late' (node 1) ...
    bad.add_value_raw(Value{-1, "early", {2, 3}, DType::f32, Role::activation, 0});
    bad.add_node_raw(Node{-1, OpKind::relu, {a}, {1}, {}, -1});  // ... which only node 1 defines
    const auto problems = find_graph_problems(bad);
    REQUIRE_FALSE(problems.empty());
    CHECK(problems.front().find("before it is defined") != std::string::npos);
  }
  SUBCASE("a value defined twice") {
    Graph bad = g;
    bad.add_node_raw(Node{-1, OpKind::relu, {x}, {y}, {}, -1});
    CHECK_FALSE(find_graph_problems(bad).empty());
  }
  SUBCASE("an in-place update of an activation, and a read after an update") {
    Graph bad;
    const auto w = bad.param("w", {2, 3}, DType::f32);
    const auto a = bad.relu(w);
    const auto grad = bad.relu(w);
    bad.add_node_raw(Node{-1, OpKind::sgd_update, {a, a}, {}, SgdUpdateAttrs{}, -1});
    bad.sgd_update(w, grad);
    bad.relu(w);
    const auto problems = find_graph_problems(bad);
    REQUIRE(problems.size() == 2);
    CHECK(problems[0].find("only param/state") != std::string::npos);
    CHECK(problems[1].find("after its in-place update") != std::string::npos);
  }
  SUBCASE("a dtype that disagrees with inference") {
    Graph bad = g;
    bad.add_value_raw(Value{-1, "wrong", {2, 3}, DType::f16, Role::activation, 1});
    bad.add_node_raw(Node{-1, OpKind::relu, {x}, {2}, {}, -1});
    const auto problems = find_graph_problems(bad);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].find("inference says") != std::string::npos);
    CHECK_THROWS_AS(verify_graph(bad), GraphError);
  }
}

TEST_CASE("the MLP builder makes the reference network with the batch fetch inside") {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  const Graph g = build_mlp_forward(spec);
  CHECK(find_graph_problems(g).empty());
  CHECK(g.values_with_role(Role::param).size() == 8);
  CHECK(g.value(g.value_named("w1")).shape == Shape{128, 784});
  CHECK(g.value(g.value_named("w4")).shape == Shape{10, 128});
  CHECK(g.node(0).op == OpKind::batch_indices);
  CHECK(g.outputs() == std::vector<ValueId>{g.value_named(names::loss)});
  std::size_t relus = 0;
  for (const auto& n : g.nodes()) relus += n.op == OpKind::relu;
  CHECK(relus == 3);

  spec.weight_dtype = DType::f32;
  const Graph master = build_mlp_forward(spec);
  std::size_t casts = 0;
  for (const auto& n : master.nodes()) casts += n.op == OpKind::cast;
  CHECK(casts == 8);

  spec.batch = 70000;
  CHECK_THROWS_AS(build_mlp_forward(spec), GraphError);
}

TEST_CASE("move_after moves a node behind another with new inputs, or refuses an order that breaks") {
  Graph g;
  const ValueId x = g.input("x", {4, 3}, DType::f16);
  const ValueId h = g.relu(x);                     // node 0
  const ValueId wide = g.cast(h, DType::f32);      // node 1
  const ValueId summed = g.reduce_rows(x);         // node 2
  const ValueId mean = g.relu(h);                  // node 3: stands for a reduction of h
  g.move_after(g.value(wide).producer, g.value(mean).producer, {mean});
  verify_graph(g);
  CHECK(g.value(wide).producer == 3);  // ids renumbered: relu, reduce_rows, relu, cast
  CHECK(g.node(3).op == OpKind::cast);
  CHECK(g.node(3).inputs == std::vector<ValueId>{mean});
  CHECK(g.value(summed).producer == 1);
  CHECK(g.value(mean).producer == 2);
  CHECK(g.consumers(h) == std::vector<NodeId>{2});
  // Inputs must exist by then, outputs before their readers, and stand-ins match shape and dtype.
  const ValueId later = g.relu(wide);  // node 4 reads the cast's output
  CHECK_THROWS_WITH_AS(g.move_after(3, 0, {mean}), doctest::Contains("before it is produced"), GraphError);
  CHECK_THROWS_WITH_AS(g.move_after(3, 4, {mean}), doctest::Contains("after its reader 4"), GraphError);
  CHECK_THROWS_WITH_AS(g.move_after(3, 2, {summed}), doctest::Contains("shape or dtype"), GraphError);
  CHECK(g.value(later).producer == 4);  // nothing moved
  verify_graph(g);
  // After its own predecessor: it stays where it is, reading the new inputs.
  const ValueId other = g.relu(h);  // node 5
  const ValueId last = g.cast(h, DType::f32);  // node 6
  g.move_after(6, 5, {other});
  CHECK(g.value(last).producer == 6);
  CHECK(g.node(6).inputs == std::vector<ValueId>{other});
  CHECK_THROWS_WITH_AS(g.move_after(6, 6, {other}), doctest::Contains("after itself"), GraphError);
  verify_graph(g);
}
