// Text (golden file), JSON (round trip) and DOT dumps.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "graph/dump.hpp"
#include "models/mlp.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;

namespace {

TrainingGraphStages reference_stages() {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  return build_training_stages(spec, {0.003, 0.0, 0.0});
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("text dump of the reference training step matches the golden file") {
  const auto golden = sg::test::golden_dir() / "reference_784_128x3_10.txt";
  const std::string text = dump_text(reference_stages().fused);
  if (std::getenv("SG_UPDATE_GOLDEN")) std::ofstream(golden) << text;
  REQUIRE_MESSAGE(std::filesystem::exists(golden), "missing golden file " << golden);
  CHECK(text == read_text(golden));
}

TEST_CASE("text dump lines carry id, op, inputs, output shape/dtype and fusion") {
  const std::string text = dump_text(reference_stages().fused);
  CHECK(text.find("matmul(x, w1) -> matmul:[32,128]f16 {trans_a=false,trans_b=true} fused=linear_forward#") !=
        std::string::npos);
  CHECK(text.find("sgd_update(w1, grad_w1) -> (in place) {momentum=0,weight_decay=0} fused=wgrad_sgd#") !=
        std::string::npos);
}

TEST_CASE("JSON round-trips every stage") {
  const auto stages = reference_stages();
  for (const Graph* g : {&stages.forward, &stages.backward, &stages.optimized, &stages.fused}) {
    const Graph loaded = graph_from_json(dump_json(*g));
    CHECK(loaded == *g);
    CHECK(dump_json(loaded) == dump_json(*g));
  }
}

TEST_CASE("JSON loading rejects broken documents with a GraphError") {
  const std::string good = dump_json(reference_stages().forward);
  CHECK_THROWS_AS(graph_from_json("{not json"), GraphError);
  std::string bad_op = good;
  bad_op.replace(bad_op.find("\"matmul\""), 8, "\"matmux\"");
  CHECK_THROWS_WITH_AS(graph_from_json(bad_op), doctest::Contains("matmux"), GraphError);
  std::string bad_shape = good;
  bad_shape.replace(bad_shape.find("128,\n"), 3, "129");
  CHECK_THROWS_AS(graph_from_json(bad_shape), GraphError);
}

TEST_CASE("DOT dump draws every node and one cluster per fusion group") {
  const Graph g = reference_stages().fused;
  const std::string dot = dump_dot(g);
  CHECK(dot.rfind("digraph", 0) == 0);
  std::size_t clusters = 0;
  for (auto pos = dot.find("subgraph cluster_"); pos != std::string::npos; pos = dot.find("subgraph cluster_", pos + 1))
    ++clusters;
  CHECK(clusters == g.fusion_groups().size());
  for (const auto& n : g.nodes()) CHECK(dot.find("  n" + std::to_string(n.id) + " [shape=box") != std::string::npos);
  CHECK(dot.find("label=\"updates\"") != std::string::npos);
  CHECK(dot.back() == '\n');
}
