// Core-only mode and the fast-path records (issue 35), on the CPU: for every
// shipped config and the bench shapes (MLP widths, the report CNN, AdamW),
// the core lowerings alone (backend.core_only) cover the training graph with
// no fast-path lowering and a valid order, and the normal schedule names
// each fast path that declined it with a reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "models/mlp_program.hpp"
#include "runtime/backend_option_table.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/schedule.hpp"
#include "tests/runtime/report_cnn.hpp"

namespace {

using namespace sg;

struct NamedGraph {
  std::string name;
  Graph graph;
  BackendOptions options;
};

// The names only fast paths' lowerings carry (conv_implicit_gemm is also the core's fallback).
std::set<std::string> fast_path_only_names() {
  BackendOptions core;
  core.core_only = true;
  std::set<std::string> core_names;
  for (const auto& l : cuda::cuda_lowerings(core, true)) core_names.insert(std::string(l->name()));
  std::set<std::string> names;
  for (const cuda::FastPath& record : cuda::fast_paths())
    for (const auto& l : record.lowerings(BackendOptions{}))
      if (!core_names.count(std::string(l.lowering->name()))) names.insert(std::string(l.lowering->name()));
  return names;
}

std::vector<NamedGraph> shipped_configs() {
  std::vector<NamedGraph> out;
  // configs/ and the benchmarks' networks (bench/networks/, docs/benchmarks.md).
  std::vector<std::filesystem::path> files;
  for (const char* folder : {"configs", "bench/networks"})
    for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(SG_SOURCE_DIR) / folder))
      if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  for (const auto& path : files) {
    const std::filesystem::directory_entry entry(path);
    const app::TrainConfig config = app::load_config(entry.path());
    const bool table = !config.data.train_x.empty() || !config.data.format.empty();  // float features (issue 23)
    const std::int64_t rows = 20 * std::max<std::int64_t>(config.data.batch_size, 1000);
    const TrainerSpec spec = app::trainer_spec(config, rows, rows, ProgramTarget::cuda, table ? DType::f32 : DType::u8);
    out.push_back({entry.path().parent_path().filename().string() + "/" + entry.path().filename().string(),
                   spec.program.train, spec.backend});
  }
  return out;
}

Graph bench_mlp(std::int64_t width, std::int64_t batch, OptimizerKind optimizer, DType compute) {
  MlpTraining model;
  model.mlp.layers = {784, width, width, width, 10};
  model.mlp.batch = batch;
  model.mlp.compute_dtype = compute;
  model.mlp.weight_dtype = compute;
  model.optimizer.kind = optimizer;
  return build_mlp_program(model, 60000, 10000, ProgramTarget::cuda).train;
}

std::vector<NamedGraph> bench_shapes() {
  std::vector<NamedGraph> out;
  for (std::int64_t width : {128, 1024, 8192})
    for (std::int64_t batch : {32, 256, 1024})
      out.push_back({"bench MLP H" + std::to_string(width) + " B" + std::to_string(batch),
                     bench_mlp(width, batch, OptimizerKind::sgd, DType::f16), BackendOptions{}});
  out.push_back({"bench MLP adamw", bench_mlp(1024, 256, OptimizerKind::adamw, DType::f16), BackendOptions{}});
  out.push_back({"bench MLP bf16", bench_mlp(1024, 256, OptimizerKind::sgd, DType::bf16), BackendOptions{}});
  out.push_back({"report CNN", test::report_cnn_cuda_graph(test::report_cnn()), BackendOptions{}});
  return out;
}

void check_core_only(const NamedGraph& g, const std::set<std::string>& fast_only) {
  INFO(g.name);
  BackendOptions core = g.options;
  core.core_only = true;
  const auto lowerings = cuda::cuda_lowerings(core, /*device_present=*/false);
  for (const auto& l : lowerings) CHECK_MESSAGE(!fast_only.count(std::string(l->name())), l->name());
  Schedule s;
  REQUIRE_NOTHROW(s = build_schedule(g.graph, cuda::as_lowerings(lowerings)));
  CHECK_NOTHROW(check_schedule_order(g.graph, s));
  for (const Launch& l : s.launches) CHECK_MESSAGE(!fast_only.count(std::string(l.lowering->name())), l.lowering->name());
  const auto declined = cuda::declined_fast_paths(g.graph, s, core, false);
  CHECK(declined.size() == cuda::fast_paths().size());  // core-only: every record declines
}

// The normal schedule: every record without a launch is named, with a reason.
std::vector<cuda::DeclinedFastPath> check_declined(const NamedGraph& g) {
  INFO(g.name);
  const auto lowerings = cuda::cuda_lowerings(g.options, false);
  const Schedule s = build_schedule(g.graph, cuda::as_lowerings(lowerings));
  const auto declined = cuda::declined_fast_paths(g.graph, s, g.options, false);
  std::set<std::string> records;
  for (const cuda::FastPath& r : cuda::fast_paths()) records.insert(r.name);
  for (const auto& d : declined) {
    CHECK(records.count(d.name) == 1);
    CHECK_MESSAGE(!d.reason.empty(), d.name);
    CHECK(d.reason.find('\n') == std::string::npos);  // one line
  }
  return declined;
}

std::string reason_of(const std::vector<cuda::DeclinedFastPath>& declined, const std::string& name) {
  for (const auto& d : declined)
    if (d.name == name) return d.reason;
  return {};
}

}  // namespace

TEST_CASE("core-only: the core lowerings alone cover every shipped config and bench shape, in a valid order") {
  const std::set<std::string> fast_only = fast_path_only_names();
  CHECK(fast_only.count("whole_step") == 1);
  CHECK(fast_only.count("small_m_wgrad_sgd") == 1);
  const auto configs = shipped_configs();
  CHECK(configs.size() >= 13);  // configs/ and bench/networks/
  for (const auto& g : configs) check_core_only(g, fast_only);
  for (const auto& g : bench_shapes()) check_core_only(g, fast_only);
}

TEST_CASE("the normal schedule names each declined fast path with a reason") {
  for (const auto& g : shipped_configs()) check_declined(g);
  for (const auto& g : bench_shapes()) check_declined(g);
  for (const auto& g : shipped_configs())
    if (g.name == "configs/mnist_cnn_fast.yaml") {
      const auto declined = check_declined(g);
      // AdamW is the CNN step's too (issue 35): every structural check
      // passes, and only the device can say whether the step fits (it does
      // not: the 3136x128 layer's weights alone exceed shared memory).
      const std::string why = reason_of(declined, "whole_step");
      INFO(why);
      CHECK((why == "not decided without a GPU: it asks the device whether the step fits" ||
             why.find("bytes of shared memory") != std::string::npos));
      CHECK(reason_of(declined, "our_conv") == "");  // its first conv is 1->32: ours runs it
      // (NCHW here: channels-last, few_channel_conv's kernels would run that layer.)
      CHECK(reason_of(declined, "few_channel_conv") == "conv2d node 6: NCHW activations (these kernels take channels-last)");
    }
  NamedGraph off{"MLP, whole_step off", bench_mlp(128, 64, OptimizerKind::sgd, DType::f16), BackendOptions{}};
  off.options.whole_step = false;
  CHECK(reason_of(check_declined(off), "whole_step") == "turned off (backend.whole_step: false)");
  NamedGraph adam{"MLP adam", bench_mlp(1024, 32, OptimizerKind::adam, DType::f16), BackendOptions{}};
  CHECK(reason_of(check_declined(adam), "one_pass_backward") == "optimizer adam: the kernels apply SGD in-kernel");
}

TEST_CASE("every fast path's option keys are rows of the backend option table that it owns") {
  std::set<std::string> owned;
  for (const cuda::FastPath& record : cuda::fast_paths()) {
    CHECK(!record.doc.empty());
    CHECK(static_cast<bool>(record.why_not));
    for (const std::string& key : record.option_keys) {
      const BackendOptionRow* row = find_backend_option(key);
      REQUIRE_MESSAGE(row, key);
      CHECK(row->owner == record.name);
      owned.insert(key);
    }
  }
  for (const BackendOptionRow& row : backend_option_table()) {
    CHECK(row.problem(row.default_value()) == "");  // the defaults are valid
    if (row.owner != "core") CHECK_MESSAGE(owned.count(row.key) == 1, row.key);
  }
}
