// `stepgraph bench`'s command-line options (apps/bench_command.hpp's
// BenchRequest), apart from running the benchmark.
#include <string>

#include <CLI/CLI.hpp>

#include "apps/bench_command.hpp"
#include "apps/cli_bounds.hpp"
#include "runtime/backend_options.hpp"

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
                 "sgd | adam | adamw (lr 0.01 for sgd, 1e-3 for adam/adamw; betas 0.9/0.999, eps 1e-8, "
                 "weight decay 0.01 for adamw)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd.add_option("--activation", r.activation,
                 "activation between hidden layers (model.activation): relu | gelu | gelu_tanh | silu | tanh | "
                 "sigmoid | identity (gelu_tanh fuses into cuBLASLt's GELU epilogues; every one into our "
                 "batch-16/32 kernels; every one but identity into the batch-48/64 whole-step kernels)")
      ->capture_default_str()
      ->check(CLI::IsMember({"relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "identity"}));
  cmd.add_option("--depth", r.depth, "hidden layers (784-H-...-H-10; 2 for the issue's 784-1024-1024-10)")
      ->capture_default_str()
      ->check(integer_in(1, 16));
  BackendOptions& b = r.backend;
  cmd.add_option("--steps-per-launch", b.steps_per_launch, "training steps captured per CUDA graph")
      ->capture_default_str()
      ->check(integer_in(1));
  cmd.add_option("--multi-step", r.multi_step,
                 "also time graph replay with K training steps per graph launch, as mode graph_replay_xK (0: off); "
                 "bench/torch_bench.py's torch_cudagraph_xK is its PyTorch counterpart")
      ->capture_default_str()
      ->check(integer_in(0));
  cmd.add_flag("!--no-profile", r.profile, "skip the per-launch profile");
  cmd.add_flag("--autotune,!--no-autotune", b.autotune,
               "time cuBLASLt's candidates and their other configurations per shape once (default on; "
               "--no-autotune: the heuristic's first pick)");
  cmd.add_flag("!--no-whole-step", b.whole_step, "always use the per-group cuBLASLt schedule");
  cmd.add_flag("!--no-one-pass-backward", b.one_pass_backward, "dgrad and weight update as two cuBLASLt passes, the output layer's backward as five launches");
  // The same knobs as a config's backend: section (docs/design.md).
  cmd.add_option_function<std::string>(
         "--whole-step-mode", [&b](const std::string& name) { b.whole_step_mode = whole_step_mode_from_name(name); },
         "whole-step variant: auto (where it measured faster) | grid | cluster | resident (wherever it fits)")
      ->check(CLI::IsMember({"auto", "grid", "cluster", "resident"}))
      ->default_str("auto");
  cmd.add_flag("!--no-small-batch-forward", b.small_batch_forward,
               "cuBLASLt for the hidden-layer forwards (no small-batch kernels, no folded batch fetch)");
  cmd.add_option_function<std::string>(
         "--conv-kernels", [&r](const std::string& name) { r.conv_kernels = conv_kernels_from_name(name); },
         "who runs the convolutions of a --config CNN: auto | cudnn | implicit_gemm (ours); the config's backend.conv_kernels otherwise")
      ->check(CLI::IsMember({"auto", "cudnn", "implicit_gemm"}));
  cmd.add_flag("!--no-fold-input-update", b.fold_input_update,
               "the first layer's update as its own launch, not inside the one-pass launch above it");
  cmd.add_flag("!--no-dependent-launch", b.dependent_launch, "plain launches instead of programmatic dependent ones");
  cmd.add_flag("!--no-classifier-mma", b.classifier_mma, "the classifier forward a warp per output (no tensor cores)");
  cmd.add_flag("!--no-one-pass-multicast", b.one_pass_multicast,
               "batch-256 one-pass kernel: one dY copy per block (no shared tiles)");
  const auto problem_check = [](std::string (*problem)(std::int64_t), const char* what) {
    return CLI::Validator(
        [problem](std::string& text) {
          try {
            return problem(std::stoll(text));
          } catch (const std::logic_error&) {
            return "'" + text + "' is not an integer";
          }
        },
        what);
  };
  cmd.add_option("--strip-splits", b.strip_splits,
                 "one-pass column-strip kernel: blocks per strip (0: the measured rule)")
      ->capture_default_str()
      ->check(problem_check(strip_splits_problem, "0|1|2|4|8"));
  cmd.add_option("--resident-cluster", b.resident_cluster,
                 "resident whole-step kernel: cluster size (0: the largest that fits)")
      ->capture_default_str()
      ->check(problem_check(resident_cluster_problem, "0|1|2|4|8|16"));
  cmd.add_option("--replot", r.replot, "only re-render bench.md and the plots of this bench.json into --out-dir");
}


}  // namespace sg::app
