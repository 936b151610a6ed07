// The CNN's schedule: issue 22's own lowerings (pooling chains, dropout2d,
// channel sums, conv weight updates), views and casts, and none of them in MLP schedules.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "tests/runtime/schedule_test_support.hpp"

using namespace sg;
using namespace sg::schedule_test;

namespace {

// Takes whatever the CUDA lowerings leave (the convolutions and views, where
// this build has no lowering for them or it asks the device), so the test
// sees how the CNN's other nodes are covered.
class TakeTheRest final : public Lowering {
 public:
  std::string_view name() const override { return "rest"; }
  std::optional<Match> match(const Cover&, const CoverUnit& unit) const override {
    Match m;
    m.units = {unit.id};
    return m;
  }
};

// configs/mnist_cnn.yaml's network: conv 1->10 k5, pool 2, relu; conv 10->20
// k5, dropout2d, pool 2, relu; flatten, linear 320->50, relu, dropout, linear
// 50->10; fp32 master weights, f16 compute.
SequentialSpec mnist_cnn(DType compute = DType::f16) {
  SequentialSpec spec;
  spec.input_shape = {1, 28, 28};
  auto layer = [](LayerKind kind) { return LayerSpec{kind}; };
  LayerSpec conv1 = layer(LayerKind::conv2d), conv2 = layer(LayerKind::conv2d);
  conv1.out = 10;
  conv1.kernel = 5;
  conv2.out = 20;
  conv2.kernel = 5;
  LayerSpec pool = layer(LayerKind::max_pool2d);
  pool.kernel = 2;
  LayerSpec drop2d = layer(LayerKind::dropout2d), drop = layer(LayerKind::dropout);
  drop2d.p = 0.5;
  drop.p = 0.5;
  LayerSpec fc1 = layer(LayerKind::linear), fc2 = layer(LayerKind::linear);
  fc1.out = 50;
  fc2.out = 10;
  const LayerSpec relu = layer(LayerKind::activation);
  spec.layers = {conv1, pool, relu, conv2, drop2d, pool, relu, layer(LayerKind::flatten), fc1, relu, drop, fc2};
  spec.batch = 64;
  spec.weight_dtype = DType::f32;
  spec.compute_dtype = compute;
  return spec;
}

struct CnnLowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  TakeTheRest rest;
  Schedule schedule;
};

std::unique_ptr<CnnLowered> lower_cnn(const Graph& g, const BackendOptions& o = {}) {
  auto l = std::make_unique<CnnLowered>();
  l->lowerings = cuda::cuda_lowerings(o, /*device_present=*/false);
  auto all = cuda::as_lowerings(l->lowerings);
  all.push_back(&l->rest);
  l->schedule = build_schedule(g, all);
  return l;
}

std::vector<NodeId> nodes_of(const Graph& g, OpKind op) {
  std::vector<NodeId> out;
  for (const Node& n : g.nodes())
    if (n.op == op) out.push_back(n.id);
  return out;
}

// backend.conv_kernels: cudnn: no convolution is ours, so no bias gradient
// rides in one of our weight gradients (conv_wgrad_bias) and the kernels
// made for the bias sums take them.
BackendOptions cudnn_convs() {
  BackendOptions o;
  o.conv_kernels = ConvKernels::cudnn;
  return o;
}

// The launch running `node`.
const Launch& launch_of(const Schedule& s, NodeId node) {
  for (const Launch& l : s.launches)
    if (std::find(l.nodes.begin(), l.nodes.end(), node) != l.nodes.end()) return l;
  FAIL("node " << node << " is in no launch");
  throw std::logic_error("unreachable");
}

std::vector<OpKind> ops_of(const Graph& g, const Launch& l) {
  std::vector<OpKind> ops;
  for (NodeId n : l.nodes) ops.push_back(g.node(n).op);
  std::sort(ops.begin(), ops.end());
  return ops;
}

std::vector<OpKind> sorted(std::vector<OpKind> ops) {
  std::sort(ops.begin(), ops.end());
  return ops;
}

ValueId output_of(const Graph& g, NodeId n) { return g.node(n).outputs[0]; }

}  // namespace

TEST_CASE("the CNN's pooling chains, channel sums and conv weight updates take issue 22's own lowerings") {
  for (const DType compute : {DType::f16, DType::bf16, DType::f32}) {
    CAPTURE(dtype_name(compute));
    const Graph g = build_sequential_training_stages(mnist_cnn(compute), {0.01, 0.5, 0.0}).fused;
    const auto lowered = lower_cnn(g, cudnn_convs());
    const Schedule& s = lowered->schedule;
    const auto pools = nodes_of(g, OpKind::max_pool2d);
    const auto relus = nodes_of(g, OpKind::relu);
    const auto dropout2d = nodes_of(g, OpKind::dropout2d);
    REQUIRE(pools.size() == 2);
    REQUIRE(dropout2d.size() == 1);

    // Forward: "max-pool, relu" and "dropout2d, max-pool, relu", one launch each.
    const Launch& first = launch_of(s, pools[0]);
    CHECK(name_of(first) == "max_pool2d");
    CHECK(ops_of(g, first) == sorted({OpKind::max_pool2d, OpKind::relu}));
    CHECK(first.lowering->describe(g, first) == "k=2,s=2+relu");
    CHECK_FALSE(writes(first, output_of(g, pools[0])));  // the pooled values live only in the kernel
    CHECK(writes(first, output_of(g, relus[0])));        // the next conv, its wgrad and relu_backward read it
    const Launch& second = launch_of(s, pools[1]);
    CHECK(name_of(second) == "max_pool2d");
    CHECK(ops_of(g, second) == sorted({OpKind::dropout2d, OpKind::max_pool2d, OpKind::relu}));
    CHECK(second.lowering->describe(g, second) == "dropout2d+k=2,s=2+relu");
    CHECK(writes(second, output_of(g, dropout2d[0])));  // max_pool2d_backward takes its argmax from it
    CHECK_FALSE(writes(second, output_of(g, pools[1])));

    // Backward: relu_backward -> max_pool2d_backward [-> dropout2d_backward], one launch each.
    const auto pool_grads = nodes_of(g, OpKind::max_pool2d_backward);
    REQUIRE(pool_grads.size() == 2);
    const Launch& deep = launch_of(s, pool_grads[0]);  // the second pooling's backward comes first
    CHECK(name_of(deep) == "max_pool2d_backward");
    CHECK(ops_of(g, deep) ==
          sorted({OpKind::relu_backward, OpKind::max_pool2d_backward, OpKind::dropout2d_backward}));
    CHECK(deep.writes == std::vector<ValueId>{output_of(g, nodes_of(g, OpKind::dropout2d_backward).at(0))});
    const Launch& shallow = launch_of(s, pool_grads[1]);
    CHECK(name_of(shallow) == "max_pool2d_backward");
    CHECK(ops_of(g, shallow) == sorted({OpKind::relu_backward, OpKind::max_pool2d_backward}));
    CHECK(shallow.writes == std::vector<ValueId>{output_of(g, pool_grads[1])});

    // Each conv bias: channel_sum [+ cast] + sgd_update in one launch.
    const auto sums = nodes_of(g, OpKind::channel_sum);
    REQUIRE(sums.size() == 2);
    const std::vector<OpKind> bias_ops = compute == DType::f32
                                             ? sorted({OpKind::channel_sum, OpKind::sgd_update})
                                             : sorted({OpKind::channel_sum, OpKind::cast, OpKind::sgd_update});
    for (NodeId sum : sums) {
      const Launch& l = launch_of(s, sum);
      CHECK(name_of(l) == "channel_sum_sgd");
      CHECK(ops_of(g, l) == bias_ops);
      CHECK(l.writes.empty());
      CHECK(l.updates.size() == 2);  // bias and velocity
    }

    // Both conv weights' updates (with their casts) in ONE launch, after both
    // gradients, with the step advance riding on it.
    int weight_launches = 0;
    for (const Launch& l : s.launches) {
      if (name_of(l) != "sgd_multi_tensor") continue;
      ++weight_launches;
      CHECK(l.lowering->describe(g, l) == "2 tensors");
      CHECK(updates(l, g.value_named("w1")));
      CHECK(updates(l, g.value_named("w2")));
      CHECK(updates(l, g.value_named("step")));
      CHECK(l.writes.empty());
    }
    CHECK(weight_launches == 1);

    // Nothing of these is left to the element-wise lowering (the linear
    // layers' relu_backward and updates stay with theirs).
    for (const Launch& l : s.launches)
      if (name_of(l) == "elementwise")
        for (NodeId n : l.nodes) {
          const Node& node = g.node(n);
          CAPTURE(op_name(node.op));
          CHECK(node.op != OpKind::channel_sum);
          CHECK_FALSE((node.op == OpKind::sgd_update && g.value(node.inputs[0]).shape.size() == 4));
          for (NodeId reader : g.consumers(node.outputs.empty() ? node.inputs[0] : node.outputs[0]))
            CHECK(g.node(reader).op != OpKind::max_pool2d_backward);
        }
  }
}

TEST_CASE("a lone dropout2d, a lone max-pool and its backward, and a channel sum without SGD take their own launches") {
  Graph g;
  const ValueId x = g.input("x", {3, 5, 9, 7}, DType::f16);
  const ValueId step = g.state("step", {1}, DType::i32);
  const DropoutAttrs drop{0.25, 7, 1};
  const ValueId dropped = g.append_node(OpKind::dropout2d, {x, step}, drop).front();
  const ValueId back = g.append_node(OpKind::dropout2d_backward, {dropped, step}, drop).front();
  const ValueId pooled = g.append_node(OpKind::max_pool2d, {back}, Pool2dAttrs{3, 2}).front();
  const ValueId pool_grad = g.append_node(OpKind::max_pool2d_backward, {pooled, back}, Pool2dAttrs{3, 2}).front();
  const ValueId sum = g.append_node(OpKind::channel_sum, {pool_grad}, NoAttrs{}).front();
  g.mark_output(dropped);
  g.mark_output(pooled);
  g.mark_output(sum);
  const auto lowered = lower_cnn(g);
  std::vector<std::string> names;
  for (const Launch& l : lowered->schedule.launches) names.push_back(name_of(l));
  // Nothing to fold: the pooling's input comes from a dropout2d_backward (only
  // a forward dropout2d folds in), its backward's gradient from the pooling
  // itself (not a relu_backward) and goes to a channel sum, whose result is a
  // graph output (no update to fuse).
  CHECK(names ==
        std::vector<std::string>{"dropout2d", "dropout2d", "max_pool2d", "max_pool2d_backward", "channel_sum"});
}

// (No ';' in a test name: ctest's doctest discovery cuts the name there and
// then runs no test case at all, which passes.)
TEST_CASE("conv-shaped Adam updates run in update_multi_tensor with every gradient cast, the conv bias sums alone") {
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adam;
  adam.lr = 1e-3;
  const Graph g = build_sequential_training_stages(mnist_cnn(), adam).fused;
  const auto lowered = lower_cnn(g, cudnn_convs());
  for (const char* conv_weight : {"w1", "w2"}) {
    CAPTURE(conv_weight);
    const ValueId w = g.value_named(conv_weight);
    const auto adam_nodes = nodes_of(g, OpKind::adam_update);
    const auto update = std::find_if(adam_nodes.begin(), adam_nodes.end(),
                                     [&](NodeId n) { return g.node(n).inputs.at(0) == w; });
    REQUIRE(update != adam_nodes.end());
    const Launch& adam_launch = launch_of(lowered->schedule, *update);
    CHECK(name_of(adam_launch) == "update_multi_tensor");
    CHECK(updates(adam_launch, w));
  }
  // The sums stay f16; their f16 -> f32 casts for the fp32 master biases ride
  // in the update launch with the weights' casts (it reads every gradient in f16).
  for (NodeId sum : nodes_of(g, OpKind::channel_sum)) {
    const Launch& l = launch_of(lowered->schedule, sum);
    CHECK(name_of(l) == "channel_sum");
    CHECK(ops_of(g, l) == sorted({OpKind::channel_sum}));
    CHECK(l.writes.size() == 1);
    CHECK(g.value(l.writes.at(0)).dtype == DType::f16);
    const NodeId cast = g.consumers(g.node(sum).outputs[0]).at(0);
    CHECK(name_of(launch_of(lowered->schedule, cast)) == "update_multi_tensor");
  }
  for (const Launch& l : lowered->schedule.launches) CHECK(name_of(l) != "sgd_multi_tensor");
}

TEST_CASE("the reference MLP's schedules take none of the CNN lowerings") {
  const std::vector<std::string> cnn = {"max_pool2d", "max_pool2d_backward", "dropout2d", "channel_sum_sgd",
                                        "channel_sum"};
  for (const double momentum : {0.0, 0.9}) {
    const Graph g = reference_fused(momentum, DType::f32);
    for (const BackendOptions& o : {BackendOptions{}, two_pass()})
      for (const Launch& l : lower(g, o).schedule.launches)
        CHECK(std::find(cnn.begin(), cnn.end(), name_of(l)) == cnn.end());
  }
}

TEST_CASE("conv -> relu -> max-pool: the relu_backward after the pooling's backward joins its launch") {
  // configs/mnist_cnn_fast.yaml's order (the relu before the pooling, fused
  // into the conv forward there), with Adam: the conv bias sums stay alone.
  SequentialSpec spec = mnist_cnn();
  LayerSpec conv = spec.layers[0], pool = spec.layers[1], relu = spec.layers[2];
  conv.padding = 2;
  spec.layers = {conv, relu, pool, conv, relu, pool, spec.layers[7], spec.layers[8], relu, spec.layers[11]};
  spec.layers[3].out = 20;
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adamw;
  const Graph g = build_sequential_training_stages(spec, adam).fused;
  const auto lowered = lower_cnn(g);
  const auto pool_grads = nodes_of(g, OpKind::max_pool2d_backward);
  REQUIRE(pool_grads.size() == 2);
  for (NodeId n : pool_grads) {
    const Launch& l = launch_of(lowered->schedule, n);
    CHECK(name_of(l) == "max_pool2d_backward");
    CHECK(ops_of(g, l) == sorted({OpKind::max_pool2d_backward, OpKind::relu_backward}));
    CHECK(l.lowering->describe(g, l) == "k=2,s=2+relu_backward");
    CHECK_FALSE(writes(l, output_of(g, n)));  // the pooling's gradient lives only in the kernel
  }
  for (NodeId n : nodes_of(g, OpKind::max_pool2d))
    CHECK(ops_of(g, launch_of(lowered->schedule, n)) == sorted({OpKind::max_pool2d}));
}

TEST_CASE("the CNN's reshape/flatten are views sharing their input's buffer, its casts one launch, its convs cuDNN's") {
  for (const DType compute : {DType::f16, DType::bf16, DType::f32}) {
    CAPTURE(dtype_name(compute));
    const Graph g = build_sequential_training_stages(mnist_cnn(compute), {0.01, 0.5, 0.0}).fused;
    const auto lowered = lower_cnn(g);
    const Schedule& s = lowered->schedule;
    std::vector<ValueId> views;
    for (const OpKind op : {OpKind::reshape, OpKind::flatten})
      for (NodeId n : nodes_of(g, op)) {
        const Launch& l = launch_of(s, n);
        CHECK(name_of(l) == "view");
        REQUIRE(l.aliases.size() == 1);
        CHECK(l.aliases[0] == std::pair<ValueId, ValueId>{output_of(g, n), g.node(n).inputs[0]});
        views.push_back(output_of(g, n));
      }
    CHECK(views.size() == 3);  // the input's reshape, the flatten and its gradient's reshape
    std::vector<std::size_t> bytes, masks;
    for (const Value& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
    for (const AuxBuffer& aux : s.aux) masks.push_back(cuda::relu_aux_bytes(aux.rows, aux.cols));
    const ArenaRequest req = arena_request(g, s, bytes, masks);
    for (ValueId v : views) {
      const ValueId source = g.node(g.value(v).producer).inputs[0];
      CAPTURE(g.value(v).name);
      CHECK(req.buffer_of_value[static_cast<std::size_t>(v)] >= 0);
      CHECK(req.buffer_of_value[static_cast<std::size_t>(v)] == req.buffer_of_value[static_cast<std::size_t>(source)]);
    }
    // The shared buffer lives until the view's last reader: the first conv's
    // weight gradient reads the reshaped input near the end of the step.
    const ValueId reshaped = views.front();
    int last_reader = -1;
    for (std::size_t i = 0; i < s.launches.size(); ++i)
      if (std::find(s.launches[i].reads.begin(), s.launches[i].reads.end(), reshaped) != s.launches[i].reads.end())
        last_reader = static_cast<int>(i);
    CHECK(last_reader > static_cast<int>(s.launches.size()) / 2);
    CHECK(req.buffers[static_cast<std::size_t>(req.buffer_of_value[static_cast<std::size_t>(reshaped)])].last >= last_reader);
    int cast_launches = 0;
    for (const Launch& l : s.launches) cast_launches += name_of(l) == "cast_params";
    CHECK(cast_launches == (compute == DType::f32 ? 0 : 1));  // fp32 compute reads the fp32 weights directly
    // backend.conv_kernels auto: the report CNN's few channels (1 x 10, 10 x 20) are our kernels'
    // (the weight gradients with their bias's: the next test case).
    for (const OpKind op : {OpKind::conv2d, OpKind::conv2d_backward_data})
      for (NodeId n : nodes_of(g, op)) CHECK(name_of(launch_of(s, n)) == "conv_implicit_gemm");
    for (NodeId n : nodes_of(g, OpKind::conv2d_backward_filter))
      CHECK(name_of(launch_of(s, n)) == "conv_wgrad_bias");
  }
}

TEST_CASE("where our kernel runs a conv weight gradient, the bias's channel sum rides in its pass") {
  for (const DType compute : {DType::f16, DType::f32}) {
    CAPTURE(dtype_name(compute));
    const Graph g = build_sequential_training_stages(mnist_cnn(compute), {0.01, 0.5, 0.0}).fused;
    const auto lowered = lower_cnn(g);  // backend.conv_kernels auto: ours for the report CNN's few channels
    const Schedule& s = lowered->schedule;
    const auto sums = nodes_of(g, OpKind::channel_sum);
    REQUIRE(sums.size() == 2);
    for (NodeId sum : sums) {
      const Launch& l = launch_of(s, sum);
      CHECK(name_of(l) == "conv_wgrad_bias");
      CHECK(ops_of(g, l) == sorted({OpKind::channel_sum, OpKind::conv2d_backward_filter}));
      CHECK(l.writes.size() == 2);  // dW and db
      CHECK(l.lowering->describe(g, l) == "wgrad+bias,stride=1,padding=0");
    }
    // The biases' SGD steps (with the f16 sums' casts to the fp32 master
    // biases) join the weights' in the one multi-tensor launch.
    for (const Launch& l : s.launches) CHECK(name_of(l) != "channel_sum_sgd");
    int update_launches = 0;
    for (const Launch& l : s.launches) {
      if (name_of(l) != "sgd_multi_tensor") continue;
      ++update_launches;
      CHECK(l.lowering->describe(g, l) == "4 tensors");
      for (const char* name : {"w1", "b1", "w2", "b2"}) CHECK_MESSAGE(updates(l, g.value_named(name)), name);
    }
    CHECK(update_launches == 1);
  }
}
