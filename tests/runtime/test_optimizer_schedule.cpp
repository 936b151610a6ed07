// Adam/AdamW, clipping and Nesterov graphs covered by the CUDA lowerings (no
// GPU needed): the new lowerings take their updates, the fp16 SGD fast
// lowerings take none of them, and the SGD schedule is what it was.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "models/mlp.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/schedule.hpp"

using namespace sg;

namespace {

// Launches per lowering; `last` gets the last launch's lowering name and rider count.
std::map<std::string, int> lowered_counts(const MlpSpec& spec, const OptimizerSpec& opt,
                                          std::pair<std::string, std::size_t>* last = nullptr) {
  const Graph g = build_training_stages(spec, opt).fused;
  BackendOptions options;
  const auto lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
  const Schedule s = build_schedule(g, cuda::as_lowerings(lowerings));
  check_schedule_order(g, s);
  std::map<std::string, int> counts;
  for (const auto& l : s.launches) ++counts[std::string(l.lowering->name())];
  if (last) *last = {std::string(s.launches.back().lowering->name()), s.launches.back().riders.size()};
  return counts;
}

MlpSpec bench_mlp(std::int64_t batch) {
  MlpSpec spec;
  spec.layers = {784, 1024, 1024, 10};
  spec.batch = batch;
  return spec;
}

const char* const kSgdOnly[] = {"whole_step", "resident_step", "output_layer_backward", "one_pass_wgmma",
                                "one_pass_row_ranges", "one_pass_strips", "small_m_wgrad_sgd", "bias_grad_sgd"};

}  // namespace

TEST_CASE("AdamW: bias updates fused with their column sums, the hidden weights' updates with their gradient "
          "tiles, the rest in one launch with the step advance") {
  for (std::int64_t batch : {32, 128}) {
    INFO("batch " << batch);
    OptimizerSpec adamw;
    adamw.kind = OptimizerKind::adamw;
    adamw.weight_decay = 0.01;
    std::pair<std::string, std::size_t> last;
    const auto counts = lowered_counts(bench_mlp(batch), adamw, &last);
    CHECK(counts.at("bias_grad_update") == 3);
    // fp16 weights: the buffered weight updates (measured faster than the gradient tiles' path)
    CHECK(counts.count("wgrad_update") == 0);
    CHECK(counts.at("update_multi_tensor") == 1);  // (W2's 23 MB: under large_updates_apart's 32)
    for (const char* name : kSgdOnly) CHECK(counts.count(name) == 0);
    CHECK(counts.count("elementwise") == 0);  // the step advance rode on the last Adam launch
    CHECK(last.first == "update_multi_tensor");
    CHECK(last.second == 1);
  }
}

TEST_CASE("clipping: one global-norm launch, Adam reads the scale, SGD through scale_grad, no fused SGD") {
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adam;
  adam.clip_grad_norm = 1.0;
  auto counts = lowered_counts(bench_mlp(128), adam);
  CHECK(counts.at("grad_clip_scale") == 1);
  CHECK(counts.at("update_multi_tensor") == 1);  // biases too: the scale exists only after every gradient
  CHECK(counts.count("bias_grad_update") == 0);
  CHECK(counts.count("wgrad_update") == 0);  // and weights: no update from a gradient tile before the norm

  OptimizerSpec sgd;
  sgd.clip_grad_norm = 1.0;
  for (std::int64_t batch : {32, 128}) {
    counts = lowered_counts(bench_mlp(batch), sgd);
    CHECK(counts.at("grad_clip_scale") == 1);
    CHECK(counts.at("scale_grad") == 6);
    for (const char* name : kSgdOnly) CHECK(counts.count(name) == 0);
  }
}

TEST_CASE("AdamW with fp32 master weights: each layer's weight and bias update from one tile launch, casts inside") {
  MlpSpec spec = bench_mlp(128);
  spec.weight_dtype = DType::f32;
  OptimizerSpec adamw;
  adamw.kind = OptimizerKind::adamw;
  const auto counts = lowered_counts(spec, adamw);
  // W1 [1024, 784], W2 [1024, 1024] and W3 [10, 1024] (its dY rows read by element) straight
  // from their gradient tiles, each with its bias (dY's column sums in the same blocks).
  CHECK(counts.at("wgrad_update") == 3);
  CHECK(counts.count("bias_grad_update") == 0);
  CHECK(counts.count("update_multi_tensor") == 0);
  CHECK(counts.at("elementwise") == 1);  // the step's advance, after every launch that reads the step
  // Where the buffered path measured faster, or the options say so, cuBLASLt keeps the weight gradients:
  // batch 256; W over 1024 x 1024; fp16 accumulation; backend.one_pass_backward: false.
  const auto tiles = [&](MlpSpec mlp, BackendOptions options) {
    const Graph g = build_training_stages(mlp, adamw).fused;
    const auto lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
    const Schedule s = build_schedule(g, cuda::as_lowerings(lowerings));
    check_schedule_order(g, s);
    return std::count_if(s.launches.begin(), s.launches.end(),
                         [](const Launch& l) { return l.lowering->name() == "wgrad_update"; });
  };
  CHECK(tiles(spec, {}) == 3);
  MlpSpec big_batch = spec, wide = spec;
  big_batch.batch = 256;
  wide.layers = {784, 2048, 2048, 10};
  CHECK(tiles(big_batch, {}) == 0);
  CHECK(tiles(wide, {}) == 1);  // the classifier's [10, 2048] only
  BackendOptions f16_accumulate, two_pass;
  f16_accumulate.accumulate_f16 = true;
  two_pass.one_pass_backward = false;
  CHECK(tiles(spec, f16_accumulate) == 0);
  CHECK(tiles(spec, two_pass) == 0);
}

TEST_CASE("Nesterov SGD: the multi-tensor update, never the fused momentum matmul") {
  OptimizerSpec nesterov;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  const auto counts = lowered_counts(bench_mlp(32), nesterov);
  CHECK(counts.at("sgd_multi_tensor") == 1);  // the six updates ride into one launch
  for (const char* name : kSgdOnly) CHECK(counts.count(name) == 0);
}

TEST_CASE("plain SGD still lowers to the fast fused path (no optimizer lowering of issue 21 in it)") {
  const auto counts = lowered_counts(bench_mlp(128), OptimizerSpec{0.01, 0.0, 0.0});
  for (const char* name : {"bias_grad_update", "update_multi_tensor", "grad_clip_scale", "scale_grad", "sgd_multi_tensor"})
    CHECK(counts.count(name) == 0);
  CHECK(counts.at("bias_grad_sgd") == 3);
}

TEST_CASE("RMSprop lowers through the same fused update lowerings as Adam, with the same launch count") {
  // A new update rule touches no fast path: its updates take wgrad_update, bias_grad_update and
  // update_multi_tensor exactly where Adam's do.
  const auto launches = [](const MlpSpec& mlp, const OptimizerSpec& opt) {
    std::size_t total = 0;
    const auto counts = lowered_counts(mlp, opt);
    for (const auto& [name, n] : counts) total += static_cast<std::size_t>(n);
    return std::pair{counts, total};
  };
  MlpSpec master = bench_mlp(128);
  master.weight_dtype = DType::f32;
  for (const MlpSpec& mlp : {bench_mlp(32), bench_mlp(128), master}) {
    INFO("batch " << mlp.batch << ", weights " << dtype_name(mlp.weight_dtype));
    OptimizerSpec adam;
    adam.kind = OptimizerKind::adam;
    for (const bool centered : {false, true}) {
      OptimizerSpec rms;
      rms.kind = OptimizerKind::rmsprop;
      rms.momentum = centered ? 0.9 : 0.0;
      rms.centered = centered;
      INFO("centered " << centered);
      const auto [adam_counts, adam_total] = launches(mlp, adam);
      const auto [rms_counts, rms_total] = launches(mlp, rms);
      CHECK(rms_counts == adam_counts);
      CHECK(rms_total == adam_total);
      // fp32 master weights: every layer's weight and bias from its tile; fp16 weights: the biases
      // from their column sums, the weights in the multi-tensor launch.
      const bool master_weights = mlp.weight_dtype == DType::f32;
      CHECK(rms_counts.count("bias_grad_update") == (master_weights ? 0 : 1));
      if (!master_weights) CHECK(rms_counts.at("bias_grad_update") == 3);
      CHECK(rms_counts.count("update_multi_tensor") == (master_weights ? 0 : 1));
      const int tiles = rms_counts.count("wgrad_update") ? rms_counts.at("wgrad_update") : 0;
      CHECK(tiles == (master_weights ? 3 : 0));
      for (const char* name : kSgdOnly) CHECK(rms_counts.count(name) == 0);
    }
  }
  // Clipping: every RMSprop update in the one multi-tensor launch, as Adam's.
  OptimizerSpec clipped;
  clipped.kind = OptimizerKind::rmsprop;
  clipped.clip_grad_norm = 1.0;
  const auto counts = lowered_counts(bench_mlp(128), clipped);
  CHECK(counts.at("grad_clip_scale") == 1);
  CHECK(counts.at("update_multi_tensor") == 1);
  CHECK(counts.count("bias_grad_update") == 0);
}
