// Which shipped CNN the fused CNN step (cnn_step, issue 36) takes on a Hopper
// GPU, from the host alone: its structural checks (the layers, the compute
// dtype, the optimizer) and the shared memory a block would need against
// Hopper's 227 KB a block. The small networks run as its two kernels (the
// report CNN, the 99%-in-0.1 s sprint, the bf16 Nesterov benchmark network
// and its GELU/tanh/AdamW variants); the wider ones keep the per-layer
// launches, which the device check refuses for their shared memory; the
// residual network is refused by its layers.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "runtime/cuda/fast_paths/whole_step/cnn_step.hpp"

namespace {

using namespace sg;

constexpr std::size_t kHopperBlockBytes = 227 * 1024;  // cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200

struct Verdict {
  std::string why_not;  // structural
  cuda::CnnStepFit fit;
};

// `file` under the source tree, with `sets` applied as `--set` would.
Verdict verdict(const std::string& file, const std::vector<std::string>& sets = {}) {
  const app::TrainConfig config = app::load_config(std::filesystem::path(SG_SOURCE_DIR) / file, sets);
  const std::int64_t rows = 20 * std::max<std::int64_t>(config.data.batch_size, 1000);
  const TrainerSpec spec = app::trainer_spec(config, rows, rows, ProgramTarget::cuda, DType::u8);
  Verdict v;
  v.why_not = cuda::cnn_step_structural_blocker(spec.program.train, spec.backend, &v.fit);
  return v;
}

}  // namespace

TEST_CASE("the small shipped CNNs pass the fused step's checks and fit a Hopper block") {
  struct Case {
    const char* file;
    std::vector<std::string> sets;
    bool bf16;
  };
  for (const Case& c : {Case{"configs/mnist_cnn.yaml", {}, false}, Case{"configs/mnist_cnn_sprint.yaml", {}, false},
                        Case{"bench/networks/bf16_nesterov.yaml", {}, true},
                        Case{"bench/networks/bf16_nesterov.yaml",
                             {"data.batch_size=64", "optim.name=adamw", "optim.nesterov=false", "optim.momentum=0"},
                             true}}) {
    CAPTURE(std::string(c.file));
    CAPTURE(c.sets.size());
    const Verdict v = verdict(c.file, c.sets);
    CHECK(v.why_not == "");
    CHECK(v.fit.bf16 == c.bf16);
    CHECK(v.fit.shared_bytes > 0);
    CHECK(v.fit.shared_bytes <= kHopperBlockBytes);
  }
}

TEST_CASE("the wider shipped CNNs need more shared memory than a Hopper block, the residual one has other layers") {
  for (const char* file : {"configs/mnist_cnn_fast.yaml", "bench/networks/gelu3_adamw.yaml",
                           "bench/networks/wide_adam.yaml"}) {
    CAPTURE(std::string(file));
    const Verdict v = verdict(file);
    CHECK(v.why_not == "");
    CHECK(v.fit.shared_bytes > kHopperBlockBytes);
  }
  const Verdict resnet = verdict("configs/mnist_resnet.yaml");
  CHECK(resnet.why_not.find("not a plain CNN training step") != std::string::npos);
}
