// `stepgraph bench --config CONFIG --torch` (issue 36: PyTorch's three
// settings on the config's network in the same run), its host side without
// a GPU or PyTorch: the module `export` prints for the config's initial
// parameters goes to --out-dir, and the script is run with the config's
// settings as flags (they hold without PyYAML). A stub interpreter (/bin/sh
// and a script that records its arguments and writes the --out records)
// stands in for Python; the real bench/torch_sequential.py runs on the GPU
// image (docs/benchmarks.md).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench_command.hpp"
#include "apps/bench_torch.hpp"
#include "apps/config/train_config.hpp"
#include "runtime/io/atomic_file.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/safetensors_file.hpp"
#include "tests/support/temp_files.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

const char* kCnn = R"(model:
  input: [1, 28, 28]
  sequential:
    - conv2d: {out: 8, kernel: 5, padding: 2}
    - relu: {}
    - max_pool2d: {kernel: 2}
    - flatten: {}
    - linear: {out: 10}
data: {dir: data/mnist, batch_size: 64, normalize: true}
optim: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}
precision: {weights: fp32, compute: bf16}
run: {epochs: 1, seed: 7}
)";

const char* kMlp = R"(model: {layers: [784, 32, 10]}
data: {dir: data/mnist, batch_size: 32}
optim: {name: adamw, lr: 0.002, weight_decay: 0.01}
run: {steps: 10}
)";

// Records its arguments (one a line) beside itself, then writes one record to --out and exits with `status`.
std::string stub_script(int status) {
  return "args=\"$(dirname \"$0\")/args.txt\"; : > \"$args\"\n"
         "out=''; while [ $# -gt 0 ]; do printf '%s\\n' \"$1\" >> \"$args\"; "
         "if [ \"$1\" = --out ]; then out=\"$2\"; fi; shift; done\n"
         "printf '{\"records\":[{\"mode\":\"torch_eager\",\"width\":0,\"batch\":64,\"us_per_step\":512.5,"
         "\"error\":null}]}\\n' > \"$out\"\n"
         "exit " +
         std::to_string(status) + "\n";
}

struct Twin {
  fs::path dir;
  app::BenchRequest request;
  app::TrainConfig config;
};

Twin make_twin(const std::string& name, const char* yaml, int status) {
  Twin t{sg::test::fresh_dir(name), {}, {}};
  sg::test::write_file(t.dir / "net.yaml", yaml);
  sg::test::write_file(t.dir / "stub.sh", stub_script(status));
  t.config = app::parse_config(yaml, (t.dir / "net.yaml").string());
  t.request.config = (t.dir / "net.yaml").string();
  t.request.out_dir = (t.dir / "out").string();
  t.request.data_dir = "some/mnist";
  t.request.python = "/bin/sh";
  t.request.torch_script = (t.dir / "stub.sh").string();
  t.request.torch_modes = "eager,cuda_graph";
  return t;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The value after `flag` in the recorded arguments ("(absent)" without it).
std::string after(const std::vector<std::string>& args, const std::string& flag) {
  const auto it = std::find(args.begin(), args.end(), flag);
  return it == args.end() || it + 1 == args.end() ? "(absent)" : *(it + 1);
}

nlohmann::json safetensors_metadata(const fs::path& p) {
  return sg::test::read_safetensors(p).header.at("__metadata__");
}

}  // namespace

TEST_CASE("bench --torch exports the config's initial module and runs the script with the config's settings") {
  Twin t = make_twin("bench-torch", kCnn, 0);
  const std::string json_path = app::run_torch_twin(t.request, t.config, DType::u8, {64}).front();
  CHECK(fs::path(json_path).parent_path() == fs::path(t.request.out_dir));
  CHECK(nlohmann::json::parse(io::read_file(json_path)).at("records").at(0).at("us_per_step") == 512.5);
  const auto args = lines_of(t.dir / "args.txt");
  const fs::path module = fs::path(t.request.out_dir) / "torch_module.safetensors";
  CHECK(after(args, "--module-from") == module.string());
  CHECK(after(args, "--mode") == "speed");
  CHECK(after(args, "--batch") == "64");
  CHECK(after(args, "--modes") == "eager,cuda_graph");
  CHECK(after(args, "--data") == "some/mnist");
  CHECK(after(args, "--optim") == "sgd");
  CHECK(after(args, "--lr") == "0.05");
  CHECK(after(args, "--momentum") == "0.9");
  CHECK(after(args, "--weight-decay") == "0.0005");
  CHECK(after(args, "--compute") == "bf16");
  CHECK(after(args, "--seed") == "7");
  CHECK(std::count(args.begin(), args.end(), "--nesterov") == 1);
  CHECK(std::count(args.begin(), args.end(), "--centered") == 0);
  // The module export prints, with the input scaling beside it.
  const nlohmann::json meta = safetensors_metadata(module);
  const std::string code = meta.at("stepgraph.torch_module").get<std::string>();
  CHECK(code.find("class StepgraphNet") != std::string::npos);
  CHECK(code.find("nn.Conv2d(1, 8") != std::string::npos);
  CHECK(meta.contains("stepgraph.input_scale"));

  // A model.layers MLP: its nn.Sequential, AdamW's settings.
  Twin mlp = make_twin("bench-torch-mlp", kMlp, 0);
  app::run_torch_twin(mlp.request, mlp.config, DType::u8, {32});
  const auto mlp_args = lines_of(mlp.dir / "args.txt");
  CHECK(after(mlp_args, "--optim") == "adamw");
  CHECK(after(mlp_args, "--betas") == "0.9,0.999");
  CHECK(std::count(mlp_args.begin(), mlp_args.end(), "--nesterov") == 0);
  const std::string mlp_code =
      safetensors_metadata(fs::path(mlp.request.out_dir) / "torch_module.safetensors").at("stepgraph.torch_module");
  CHECK(mlp_code.find("nn.Linear(784, 32)") != std::string::npos);
  fs::remove_all(t.dir);
  fs::remove_all(mlp.dir);
}

TEST_CASE("bench --torch: a failing script ends the bench naming its status, bad options fail before any timing") {
  Twin t = make_twin("bench-torch-fail", kCnn, 3);
  CHECK(sg::test::error_of([&] { app::run_torch_twin(t.request, t.config, DType::u8, {64}); })
            .find("exited with status 3") != std::string::npos);
  app::BenchRequest no_config = t.request;
  no_config.config.clear();
  CHECK(sg::test::error_of([&] { app::check_torch_twin(no_config); }).find("give --config") != std::string::npos);
  app::BenchRequest no_script = t.request;
  no_script.torch_script = (t.dir / "missing.py").string();
  const std::string why = sg::test::error_of([&] { app::check_torch_twin(no_script); });
  CHECK(why.find("--torch-script") != std::string::npos);
  CHECK(why.find("missing.py") != std::string::npos);
  app::BenchRequest no_python = t.request;
  no_python.python = "python-that-is-not-there-3";
  CHECK(sg::test::error_of([&] { app::check_torch_twin(no_python); }).find("--python python-that-is-not-there-3") !=
        std::string::npos);
  no_python.python = "sh";  // found on PATH
  CHECK(sg::test::error_of([&] { app::check_torch_twin(no_python); }) == "(no error)");
  CHECK(sg::test::error_of([&] { app::check_torch_twin(t.request); }) == "(no error)");
  fs::remove_all(t.dir);
}
