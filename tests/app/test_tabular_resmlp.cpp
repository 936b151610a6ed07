// configs/tabular_resmlp.yaml (issue 37: a pre-norm residual MLP with
// layer_norm on a tabular CSV) on the CPU backend: it learns its image at a
// fraction of its steps, resumes bit-exactly (the LayerNorm weights and
// their AdamW state in the checkpoint), and exports as the state_dict of a
// PyTorch module with nn.LayerNorm layers (names, shapes, eps).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "apps/config/train_config.hpp"
#include "apps/export_command.hpp"
#include "apps/training_run.hpp"
#include "runtime/io/atomic_file.hpp"
#include "tests/support/checkpoint_checks.hpp"
#include "tests/support/safetensors_file.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

app::TrainConfig tabular_config(const fs::path& out, std::vector<std::string> extra) {
  extra.push_back("data.train_x=" + (sg::test::source_dir() / "configs/data/inr_pattern.csv").string());
  extra.push_back("run.out_dir=" + out.string());
  extra.push_back("backend.kind=cpu");
  extra.push_back("run.log_every=100000");
  return app::load_config(sg::test::source_dir() / "configs/tabular_resmlp.yaml", extra);
}

}  // namespace

TEST_CASE("configs/tabular_resmlp.yaml learns on the CPU backend, resumes bit-exactly and exports nn.LayerNorm") {
  const auto dir = test::fresh_dir("tabular-resmlp");
  // 800 of its 4000 steps (the cosine schedule shortened with them): ~4 s on one core.
  const auto a = app::run_training(
      tabular_config(dir / "a", {"run.steps=800", "run.eval_every=0", "run.checkpoint=" + (dir / "a.sgck").string()}));
  MESSAGE("tabular residual MLP, 800 steps: test MSE " << a.final_eval.loss);
  CHECK(a.final_eval.loss < 0.01);  // the targets' mean scores 0.18

  // 100 steps, then 100 more from the checkpoint: the same bits as 200
  // straight (a constant rate: the cosine schedule depends on run.steps).
  const std::vector<std::string> constant = {"optim.schedule.kind=constant", "optim.schedule.warmup_steps=0",
                                             "run.eval_every=0"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), constant.begin(), constant.end());
    return extra;
  };
  app::run_training(tabular_config(dir / "s", with({"run.steps=200", "run.checkpoint=" + (dir / "s.sgck").string()})));
  app::run_training(tabular_config(dir / "b", with({"run.steps=100", "run.checkpoint=" + (dir / "b.sgck").string()})));
  app::run_training(tabular_config(dir / "c", with({"run.steps=200", "run.resume=" + (dir / "b.sgck").string(),
                                                    "run.checkpoint=" + (dir / "c.sgck").string()})));
  test::check_same_checkpoints(dir / "s.sgck", dir / "c.sgck", 200);

  // Layers: 0 linear, 1 layer_norm, 2 linear, 3 silu, 4 linear, 5 add, 6..10 the second block, 11 layer_norm, 12 linear.
  app::ExportRequest e{(dir / "a.sgck").string(), "safetensors", (dir / "model.safetensors").string()};
  REQUIRE(app::run_export(e) == 0);
  const auto header = test::read_safetensors(dir / "model.safetensors").header;
  const std::string code = header["__metadata__"]["stepgraph.torch_module"];
  INFO(code);
  for (const char* line : {"self.layer1 = nn.LayerNorm([128], eps=1e-05)", "self.layer11 = nn.LayerNorm([128], eps=1e-05)",
                           "h1 = self.layer1(h0)", "h5 = h4 + h0", "self.layer12 = nn.Linear(128, 2)"})
    CHECK(code.find(line) != std::string::npos);
  for (const char* name : {"layer1.weight", "layer1.bias", "layer11.weight", "layer11.bias"}) {
    CAPTURE(name);
    REQUIRE(header.contains(name));
    CHECK(header[name]["shape"] == nlohmann::json({128}));
  }
  fs::remove_all(dir);
}
