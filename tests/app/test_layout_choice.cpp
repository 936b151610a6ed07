// Which activation layout `auto` gives the benchmark networks no issue names
// (bench/networks/, docs/benchmarks.md "Channels-last through dropout2d and
// mean pooling"), from the host alone: each was timed both ways on an H200,
// and these are the faster ones the rule picks (and the one it misses).
// A dropout2d or an avg_pool2d inside a region no longer ends it; our NCHW
// kernels' convolutions of 6 or 10 input channels keep the network NCHW,
// those of 4 (the few-channel kernels' channels-last) no longer do.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "runtime/cuda/activation_layout_choice.hpp"

namespace {

using namespace sg;

// The layout line `auto` gives `file` (under the source tree) without a GPU.
std::string auto_layout(const std::string& file) {
  const app::TrainConfig config = app::load_config(std::filesystem::path(SG_SOURCE_DIR) / file, {});
  TrainerSpec spec = app::trainer_spec(config, 2000, 1000, ProgramTarget::cuda, DType::u8);
  spec.backend.activation_layout = ActivationLayout::automatic;
  return cuda::choose_activation_layout(spec.program, spec.backend, /*device_present=*/false);
}

}  // namespace

TEST_CASE("auto runs the CNNs with a dropout2d or mean pooling inside a region channels-last") {
  // measured 216.8 -> 139-141 us (tanh/dropout2d), 130.2 -> 97.5-97.9 (7x7 + avg pool), 184.5 -> 107-110 (8 channels)
  for (const char* file : {"bench/networks/tanh_dropout2d_adamw.yaml", "bench/networks/k7_avgpool_sgd.yaml",
                           "bench/networks/gelu8_adam.yaml"}) {
    CAPTURE(std::string(file));
    CHECK(auto_layout(file) == "channels-last (its regions end at flattens or the global pooling)");
  }
}

TEST_CASE("auto keeps NCHW where our kernels run a convolution of 6 or 10 input channels that cuDNN would take") {
  // The report CNN with fp16 weights (1 -> 10 -> 20, no whole-step kernel): 92.9 us NCHW against 102.8
  // channels-last (its 10-channel layer on cuDNN).
  CHECK(auto_layout("bench/networks/report_cnn_f16_weights.yaml").find("NCHW (our kernels run the 10-channel") == 0);
  // The proxy's measured miss (LeNet-5: 179.3 NCHW against 147.0 channels-last): kept here so a better rule shows in
  // this test; backend.autotune times both forms instead.
  CHECK(auto_layout("bench/networks/lenet5_sgd.yaml").find("NCHW (our kernels run the 6-channel conv2d") == 0);
}

TEST_CASE("auto runs a CNN channels-last where the few-channel kernels take its layers of 4 input channels") {
  // 1 -> 4 -> 16: 115.9 us NCHW against 71.7 channels-last, its 4-filter first layer and its 4-channel second on
  // the few-channel kernels (any filter count).
  CHECK(auto_layout("bench/networks/c4_gelu_adam.yaml") ==
        "channels-last (its regions end at flattens or the global pooling)");
  // Keras's example (a dropout between the pooling and the flatten): 236.4 NCHW against 158.7 channels-last.
  CHECK(auto_layout("bench/networks/keras_mnist_adam.yaml") ==
        "channels-last (its regions end at flattens or the global pooling)");
}
