#pragma once
// `stepgraph bench`: for each hidden width and batch size of the reference
// MLP (784-H-H-H-10), or for the model of a config (--config), time training steps by CUDA-graph replay and by plain
// stream launches of the same schedule, against floors measured in the same
// run; merge PyTorch's numbers (bench/torch_bench.py) when given; write JSON,
// CSV, SVG plots and a markdown table.
#include <optional>
#include <set>
#include <string>

#include "runtime/backend_options.hpp"

namespace CLI {
class App;
}

namespace sg::app {

struct BenchRequest {
  std::string widths = "128,256,512,1024,2048,4096,8192";
  std::string batches;  // empty: 32,256,1024 for the MLP sweep, the config's batch size with `config`
  // A training config whose model (any the trainer takes: model.layers or
  // model.sequential, e.g. configs/mnist_cnn.yaml) is timed instead of the
  // MLP sweep; its data, loss, optimizer, precision and backend settings
  // come with it (data.dir from --data). Its rows have width 0.
  std::string config;
  long long steps = 5000;
  int repeats = 5;
  long long warmup = 200;
  std::string data_dir = "data/mnist";
  std::string out_dir = "runs/bench";
  std::string torch_json;  // output of bench/torch_bench.py to merge
  // --torch (with --config): PyTorch's twin of the config's network in the
  // same run (apps/bench_torch.hpp): which settings, how many timed steps
  // (the repeats are --repeats), which interpreter and script.
  bool torch = false;
  std::string torch_modes = "eager,cuda_graph,compile_in_graph";
  long long torch_steps = 300;
  long long torch_warmup = 50;
  std::string python = "python3";
  std::string torch_script;  // default: bench/torch_sequential.py of the sources this binary was built from
  std::string weights = "fp16";     // fp16 | bf16 (the compute dtype) | fp32 master weights
  std::string accumulate = "fp32";
  std::string compute = "fp16";     // fp16 | bf16 matmul inputs and activations
  std::string optim = "sgd";        // sgd | adam | adamw (issue 21) | rmsprop (issue 35), PyTorch's defaults
  int depth = 3;                    // hidden layers: 784-H x depth-10
  std::string activation = "relu";  // model.activation between hidden layers (issue 21)
  int multi_step = 0;      // > 1: also time graph replay with this many steps per launch (mode graph_replay_xK)
  bool profile = true;     // per-launch profile of one step at batch 32
  // Lowerings and kernel knobs (steps_per_launch, whole_step, ...); accumulate_f16 comes from
  // `accumulate`. Autotune is on by default here (docs/performance.md section 23).
  BackendOptions backend = [] {
    BackendOptions o;
    o.autotune = true;
    return o;
  }();
  std::set<std::string> backend_given;  // backend option keys set on the command line (they override a config's)
  std::string replot;      // re-render an earlier bench.json (no GPU)
};

void add_bench_options(CLI::App& cmd, BenchRequest& request);
int run_bench(const BenchRequest& request);

}  // namespace sg::app
