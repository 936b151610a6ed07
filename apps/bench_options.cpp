// `stepgraph bench`'s command-line options (apps/bench_command.hpp's
// BenchRequest), apart from running the benchmark.
#include <string>

#include <CLI/CLI.hpp>

#include "apps/backend_flags.hpp"
#include "apps/bench_command.hpp"
#include "apps/cli_bounds.hpp"

namespace sg::app {

void add_bench_options(CLI::App& cmd, BenchRequest& r) {
  cmd.add_option("--widths", r.widths, "hidden widths H of 784-H-H-H-10")->capture_default_str();
  cmd.add_option("--batches", r.batches, "batch sizes (default: 32,256,1024; with --config, the config's data.batch_size)");
  cmd.add_option("--config", r.config,
                 "time the model of this training config (model.layers or model.sequential, with its optimizer, "
                 "precision and backend settings) instead of the MLP sweep; --widths is ignored");
  cmd.add_option("--steps", r.steps, "timed steps per repeat")->capture_default_str()->check(integer_in(1));
  cmd.add_option("--repeats", r.repeats, "repeats (the median is reported)")->capture_default_str()->check(integer_in(1));
  cmd.add_option("--warmup", r.warmup, "untimed steps first (clocks ramp up)")->capture_default_str()->check(integer_in(0));
  cmd.add_option("--data", r.data_dir, "MNIST IDX folder")->capture_default_str();
  cmd.add_option("--out-dir", r.out_dir, "where bench.json/.csv/.md and the plots go")->capture_default_str();
  cmd.add_option("--torch-json", r.torch_json, "PyTorch results from bench/torch_bench.py to merge (comma-separated files)");
  cmd.add_flag("--torch", r.torch,
               "with --config: time the same network in PyTorch in this run (bench/torch_sequential.py --mode speed: "
               "the module export prints, stepgraph's initial values, the config's optimizer) and add its rows");
  cmd.add_option("--torch-modes", r.torch_modes,
                 "--torch's settings: eager (fused optimizers), cuda_graph (the eager step hand-captured), "
                 "compile_in_graph (torch.compile max-autotune-no-cudagraphs inside the captured graph; minutes "
                 "of compiling)")
      ->capture_default_str();
  cmd.add_option("--torch-steps", r.torch_steps, "--torch: timed steps per repeat (PyTorch eager is ~100x slower)")
      ->capture_default_str()
      ->check(integer_in(1));
  cmd.add_option("--torch-warmup", r.torch_warmup, "--torch: untimed steps first")->capture_default_str()->check(integer_in(0));
  cmd.add_option("--python", r.python, "--torch: the Python with PyTorch")->capture_default_str();
  r.torch_script = STEPGRAPH_SOURCE_DIR "/bench/torch_sequential.py";
  cmd.add_option("--torch-script", r.torch_script, "--torch: bench/torch_sequential.py")->capture_default_str();
  cmd.add_option("--weights", r.weights, "fp16 | bf16 (the --compute dtype) | fp32 master weights")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  cmd.add_option("--accumulate", r.accumulate, "fp16 | fp32 matmul accumulation")->capture_default_str();
  cmd.add_option("--compute", r.compute,
                 "fp16 | bf16 matmul inputs and activations (bf16 runs cuBLASLt and the generic kernels: the fast "
                 "kernels are fp16 only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp16", "bf16"}));
  cmd.add_option("--optim", r.optim,
                 "sgd | adam | adamw | rmsprop (lr 0.01 for sgd, 1e-3 for the others; betas 0.9/0.999, eps 1e-8, "
                 "weight decay 0.01 for adamw; rmsprop: PyTorch's alpha 0.99, eps 1e-8)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw", "rmsprop"}));
  cmd.add_option("--activation", r.activation,
                 "activation between hidden layers (model.activation): relu | gelu | gelu_tanh | silu | tanh | "
                 "sigmoid | identity (gelu_tanh fuses into cuBLASLt's GELU epilogues; every one into our "
                 "batch-16/32 kernels; every one but identity into the batch-48/64 whole-step kernels)")
      ->capture_default_str()
      ->check(CLI::IsMember({"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "identity"}));
  cmd.add_option("--depth", r.depth, "hidden layers (784-H-...-H-10; 2 for the issue's 784-1024-1024-10)")
      ->capture_default_str()
      ->check(integer_in(1, 16));
  cmd.add_option("--multi-step", r.multi_step,
                 "also time graph replay with K training steps per graph launch, as mode graph_replay_xK (0: off); "
                 "bench/torch_bench.py's torch_cudagraph_xK is its PyTorch counterpart")
      ->capture_default_str()
      ->check(integer_in(0));
  cmd.add_flag("!--no-profile", r.profile, "skip the per-launch profile");
  // The same knobs as a config's backend: section, one flag per row of the
  // backend option table; with --config only the flags given override the config's.
  add_backend_option_flags(cmd, r.backend, r.backend_given);
  cmd.add_option("--replot", r.replot, "only re-render bench.md and the plots of this bench.json into --out-dir");
}


}  // namespace sg::app
