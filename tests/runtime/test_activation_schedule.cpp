// MLP variants of issue 21 (activations, dropout, label smoothing, regression
// losses) covered by the CUDA lowerings: which fused kernels take or refuse them.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"
#include "tests/runtime/schedule_test_support.hpp"

using namespace sg;
using namespace sg::schedule_test;

namespace {

// Issue 21's model variants on the reference network (fp16, plain SGD).
struct Variant {
  std::string what;
  MlpSpec spec;
};

std::vector<Variant> issue21_variants(std::int64_t batch) {
  MlpSpec base;
  base.layers = {784, 128, 128, 128, 10};
  base.batch = batch;
  std::vector<Variant> out;
  for (const auto a : {MlpActivation::gelu, MlpActivation::gelu_tanh, MlpActivation::silu, MlpActivation::tanh,
                       MlpActivation::sigmoid, MlpActivation::identity}) {
    MlpSpec s = base;
    s.activation = a;
    out.push_back({"activation " + std::string(activation_name(a)), s});
  }
  MlpSpec dropout = base;
  dropout.dropout = 0.2;
  out.push_back({"relu + dropout", dropout});
  MlpSpec smoothed = base;
  smoothed.label_smoothing = 0.1;
  out.push_back({"label smoothing", smoothed});
  for (const auto loss : {MlpLoss::mse, MlpLoss::l1}) {
    MlpSpec s = base;
    s.loss = loss;
    s.target_width = 10;
    out.push_back({"loss " + std::string(loss_name(loss)), s});
  }
  MlpSpec all = base;
  all.activation = MlpActivation::gelu_tanh;
  all.dropout = 0.1;
  all.loss = MlpLoss::mse;
  all.target_width = 10;
  out.push_back({"gelu_tanh + dropout + mse", all});
  return out;
}

}  // namespace

TEST_CASE("dropout, label smoothing, mse/l1 and identity graphs refuse the kernels fused for their absent pattern") {
  // The whole-step kernels (written for softmax-xent + plain SGD) must
  // refuse every one of these graphs but the activation variants, the fused output layer every graph
  // without softmax-xent or with no activation backward right after the
  // classifier's dgrad; the kernels that fuse an activation's derivative into
  // a dgrad (one-pass dgrad+SGD, the small-K dgrad) must refuse every graph
  // whose dgrad is not followed directly by an activation backward (dropout
  // between them; identity). Graphs with gelu, gelu_tanh, silu, tanh or
  // sigmoid take them (the next test case); the plain-linear kernels
  // (small_batch_forward, small_n_forward, small_m_wgrad_sgd) compute what
  // the graph says and may take any graph's layers.
  const std::vector<std::string> whole_step = {"whole_step", "resident_step"};
  const std::vector<std::string> loss_specific = {"output_layer_backward", "whole_step", "resident_step"};
  const std::vector<std::string> relu_specific = {"one_pass_wgmma", "one_pass_row_ranges", "one_pass_strips",
                                                  "small_k_dgrad_relu"};
  for (const std::int64_t batch : {32, 128}) {
    for (const Variant& v : issue21_variants(batch)) {
      CAPTURE(v.what);
      CAPTURE(batch);
      const Graph g = build_training_stages(v.spec, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      // A dgrad followed directly by an activation's backward (none with identity, dropout between).
      const bool activation_dgrad = v.spec.activation != MlpActivation::identity && v.spec.dropout == 0.0;
      const bool plain_xent = v.spec.loss == MlpLoss::softmax_xent && v.spec.label_smoothing == 0.0;
      std::vector<std::string> refused = activation_dgrad && plain_xent ? whole_step : loss_specific;
      if (!activation_dgrad) refused.insert(refused.end(), relu_specific.begin(), relu_specific.end());
      std::map<std::string, int> by_lowering;
      for (const Launch& l : lowered.schedule.launches) {
        CAPTURE(name_of(l));
        CHECK(std::find(refused.begin(), refused.end(), name_of(l)) == refused.end());
        ++by_lowering[name_of(l)];
        // No launch that fuses a ReLU takes a non-ReLU network's layer.
        if (v.spec.activation != MlpActivation::relu) {
          const std::string note = l.lowering->describe(g, l);
          CHECK(note.find("relu") == std::string::npos);
        }
      }
      if (v.spec.dropout > 0) CHECK(by_lowering["dropout"] == 2 * 3);  // forward + backward per hidden layer
      if (v.spec.label_smoothing > 0) CHECK(by_lowering["softmax_xent_smoothed"] == 2);
      if (is_regression(v.spec.loss)) CHECK(by_lowering["regression_loss"] == 2);
      // The whole-step kernels (left out above: they ask the device) take every activation's plain
      // softmax-xent step (test_whole_step_match.cpp) and refuse the others by structure.
      if (activation_dgrad && plain_xent)
        CHECK(match_whole_step(g).has_value());
      else
        for (const bool resident : {false, true})
          CHECK(cuda::whole_step_blocker(g, BackendOptions{}, resident) == "the graph is not a plain MLP training step");
      // The eval graph (no dropout; loss only for regression) is covered too.
      MlpSpec eval_spec = v.spec;
      eval_spec.batch = 100;
      Graph eval = build_mlp_eval(eval_spec);
      fuse(eval);
      for (const auto& n : eval.nodes()) CHECK(n.op != OpKind::dropout);
    }
  }
  // The same network with ReLU and softmax-xent is a whole-step match, and at
  // batch 32 takes both kinds of fast lowerings (so the checks above can fail).
  for (const std::int64_t batch : {32, 128}) {
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = batch;
    const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
    const auto lowered = lower(g, BackendOptions{});
    for (const auto* kind : {&loss_specific, &relu_specific})
      if (batch == 32) CHECK(std::any_of(lowered.schedule.launches.begin(), lowered.schedule.launches.end(), [&](const Launch& l) {
        return std::find(kind->begin(), kind->end(), name_of(l)) != kind->end();
      }));
    CHECK(match_whole_step(g).has_value());
  }
}

TEST_CASE("gelu_tanh fuses into cuBLASLt's GELU_AUX_BIAS forward and DGELU dgrad (GELU_BIAS in the eval graph)") {
  // (At batch 16/32 our kernels take these layers: the next test case.)
  for (const std::int64_t batch : {128, 256}) {
    CAPTURE(batch);
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = batch;
    spec.activation = MlpActivation::gelu_tanh;
    const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
    const auto lowered = lower(g, BackendOptions{});
    const auto counts = launch_counts(g, lowered.schedule);
    CHECK(counts.count("cublaslt_matmul[epilogue=gelu_aux_bias]") == 1);
    CHECK(counts.at("cublaslt_matmul[epilogue=gelu_aux_bias]") == 3);  // every hidden layer's forward
    CHECK(counts.at("cublaslt_matmul[epilogue=dgelu]") == 2);          // every dgrad between hidden layers
    // (the classifier's, over 10 terms, is our small-K kernel's at any batch, as with ReLU)
    CHECK(counts.at("small_k_dgrad_relu[gelu_tanh_backward reading the pre-activation]") == 1);
    CHECK(counts.count("gelu_tanh") == 0);                             // no element-wise GELU left
    CHECK(counts.count("gelu_tanh_backward") == 0);
    MlpSpec eval_spec = spec;
    eval_spec.batch = 100;
    Graph eval = build_mlp_eval(eval_spec);
    fuse(eval);
    const auto eval_counts = launch_counts(eval, lower(eval, BackendOptions{}).schedule);
    CHECK(eval_counts.at("cublaslt_matmul[epilogue=gelu_bias]") == 3);  // nothing reads the pre-activation
  }
  // A width that is not a multiple of 8 cannot be cuBLASLt's aux: the same
  // launch runs the bias epilogue and then the gelu map kernels.
  // (Two hidden layers: the classifier's dgrad, over 10 terms, is our small-K kernel's.)
  MlpSpec odd;
  odd.layers = {784, 100, 100, 10};
  odd.batch = 128;
  odd.activation = MlpActivation::gelu_tanh;
  const Graph g = build_training_stages(odd, {0.003, 0.0, 0.0}).fused;
  const auto lowered = lower(g, BackendOptions{});
  const auto counts = launch_counts(g, lowered.schedule);
  CHECK(counts.at("cublaslt_matmul[epilogue=bias+gelu_tanh kernel]") == 2);
  CHECK(counts.at("cublaslt_matmul[epilogue=none+gelu_tanh_backward kernel]") == 1);
  // Exact GELU (erf) is not cuBLASLt's: it stays element-wise, but for the
  // last hidden layer's, which the classifier's forward applies on its load.
  MlpSpec exact = odd;
  exact.layers = {784, 128, 128, 10};
  exact.activation = MlpActivation::gelu;
  const Graph ge = build_training_stages(exact, {0.003, 0.0, 0.0}).fused;
  const auto exact_counts = launch_counts(ge, lower(ge, BackendOptions{}).schedule);
  CHECK(exact_counts.at("gelu") == 1);
  CHECK(exact_counts.at("small_n_forward[gelu on the input's load,epilogue=bias]") == 1);
  CHECK(exact_counts.at("gelu_backward") == 1);
}

TEST_CASE("the classifier's forward on tensor-core tiles applies a lone activation before it on its load") {
  struct Case {
    std::int64_t batch, width;
    bool fp32_masters;
  };
  std::vector<Case> cases;
  for (const std::int64_t batch : {32, 128, 256})
    for (const std::int64_t width : {128, 144})
      for (const bool fp32_masters : {false, true}) cases.push_back({batch, width, fp32_masters});
  for (const auto a : {MlpActivation::gelu, MlpActivation::silu, MlpActivation::tanh, MlpActivation::sigmoid,
                       MlpActivation::gelu_tanh, MlpActivation::relu})
    for (const Case& c : cases) {
      const std::string act(activation_name(a));
      CAPTURE(act);
      CAPTURE(c.batch);
      CAPTURE(c.width);
      CAPTURE(c.fp32_masters);
      MlpSpec spec;
      spec.layers = {784, 256, c.width, 10};
      spec.batch = c.batch;
      spec.activation = a;
      spec.weight_dtype = c.fp32_masters ? DType::f32 : DType::f16;
      const Graph g = build_training_stages(spec, {0.003, 0.9, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      const auto counts = launch_counts(g, lowered.schedule);
      // gelu_tanh and relu ride in cuBLASLt's epilogues; at batch 32 the
      // classifier is a warp per output, which would apply the activation to
      // a whole row in every warp (and the small-batch forward takes a 256 ->
      // 128 layer with its activation).
      const bool folded = c.batch >= 64 && a != MlpActivation::gelu_tanh && a != MlpActivation::relu;
      CHECK(counts.count("small_n_forward[" + act + " on the input's load,epilogue=bias]") == (folded ? 1 : 0));
      CHECK(counts.count("small_n_forward[epilogue=bias]") == (folded ? 0 : 1));
      for (const Launch& l : lowered.schedule.launches) {
        if (name_of(l) != "small_n_forward" || !folded) continue;
        // The activation's output leaves the launch for the classifier's weight gradient.
        const NodeId act_node = l.nodes.front();
        CHECK(op_name(g.node(act_node).op) == act);
        CHECK(writes(l, g.node(act_node).outputs[0]));
      }
    }
}

TEST_CASE("gelu, gelu_tanh, silu, tanh and sigmoid MLPs at batch 32 run in our small-batch kernels, as ReLU does") {
  for (const auto a : {MlpActivation::gelu, MlpActivation::gelu_tanh, MlpActivation::silu, MlpActivation::tanh,
                       MlpActivation::sigmoid}) {
    const std::string act(activation_name(a));
    CAPTURE(act);
    // gelu, gelu_tanh and silu backwards read the pre-activation, tanh and sigmoid the output.
    const bool reads_input = a == MlpActivation::gelu || a == MlpActivation::gelu_tanh || a == MlpActivation::silu;
    const std::string saved = reads_input ? "pre-activation" : "output";
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = 32;
    spec.activation = a;
    {  // plain SGD: the 7 launches of the ReLU step
      const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      const Schedule& s = lowered.schedule;
      const auto counts = launch_counts(g, s);
      const std::string forward = "small_batch_forward[epilogue=bias+" + act + (reads_input ? ",writes pre-activation" : "");
      CHECK(counts.count(forward + ",+batch fetch]") == 1);
      CHECK(counts.count(forward + "]") == 1);
      if (counts.count(forward + "]")) CHECK(counts.at(forward + "]") == 2);
      CHECK(counts.count("output_layer_backward[" + act + "_backward reading the " + saved + ",+bias updates]") == 1);
      int one_pass = 0;
      for (const Launch& l : s.launches) {
        CAPTURE(name_of(l));
        CHECK(name_of(l) != "cublaslt_matmul");
        CHECK(name_of(l) != "elementwise");  // no activation or backward left on its own
        const std::string note = l.lowering->describe(g, l);
        if (name_of(l) == "one_pass_strips") {
          ++one_pass;
          CHECK(note.find(act + "_backward reading the " + saved + "," + kIntoParam + ",+bias update") == 0);
        }
        if (name_of(l) == "small_batch_forward") {
          // The pre-activation leaves the launch exactly when a backward reads it.
          const NodeId bias_add = *std::find_if(l.nodes.begin(), l.nodes.end(),
                                                [&](NodeId n) { return g.node(n).op == OpKind::bias_add; });
          CHECK(writes(l, g.node(bias_add).outputs[0]) == reads_input);
          CHECK(op_name(g.node(l.nodes.back()).op) == act);  // the activation node rides along
        }
      }
      CHECK(one_pass == 2);
      CHECK(s.launches.size() == 7);
      CHECK(s.aux.empty());
    }
    {  // momentum: no one-pass or fused output layer (plain SGD only); the classifier's dgrad is small_k_dgrad's
      const Graph g = build_training_stages(spec, {0.003, 0.9, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      const auto counts = launch_counts(g, lowered.schedule);
      CHECK(counts.count("small_k_dgrad_relu[" + act + "_backward reading the " + saved + "]") == 1);
      // The two dgrads between hidden layers: cuBLASLt, then the map (gelu_tanh: cuBLASLt's DGELU).
      if (a == MlpActivation::gelu_tanh) CHECK(counts.at("cublaslt_matmul[epilogue=dgelu]") == 2);
      else CHECK(counts.at(act + "_backward") == 2);
      for (const Launch& l : lowered.schedule.launches) CHECK(name_of(l).rfind("one_pass", 0) != 0);
    }
    {  // batch 128: none of our small-batch kernels; the element-wise maps (or cuBLASLt's GELU) run the activation
      MlpSpec wide = spec;
      wide.batch = 128;
      const Graph g = build_training_stages(wide, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      for (const Launch& l : lowered.schedule.launches)
        for (const char* ours : {"small_batch_forward", "one_pass_strips", "output_layer_backward"})
          CHECK(name_of(l) != ours);
      // (The classifier's dgrad, over 10 terms, is the small-K kernel's at any batch, as with ReLU.)
      CHECK(launch_counts(g, lowered.schedule).at("small_k_dgrad_relu[" + act + "_backward reading the " + saved + "]") == 1);
    }
    {  // K = 8192: the row-range one-pass kernel
      MlpSpec big = spec;
      big.layers = {784, 8192, 8192, 10};
      const Graph g = build_training_stages(big, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      CHECK(launch_counts(g, lowered.schedule)
                .count("one_pass_row_ranges[" + act + "_backward reading the " + saved + "," + kIntoParam +
                       ",+bias update]") == 1);
    }
    {  // the eval graph at batch 32: nothing reads the pre-activation
      MlpSpec eval_spec = spec;
      Graph eval = build_mlp_eval(eval_spec);
      fuse(eval);
      const auto lowered = lower(eval, BackendOptions{});
      const auto counts = launch_counts(eval, lowered.schedule);
      int forwards = 0;
      for (const auto& [key, n] : counts)
        if (key.rfind("small_batch_forward[epilogue=bias+" + act, 0) == 0) {
          forwards += n;
          CHECK(key.find("writes pre-activation") == std::string::npos);
        }
      CHECK(forwards == 3);
    }
  }
}

// ---- Issue 22: the CNN's own kernels (pooling chains, dropout2d, channel sums, conv weight updates)
