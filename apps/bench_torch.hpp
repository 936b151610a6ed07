#pragma once
// `stepgraph bench --config CONFIG --torch`: the config's network in PyTorch,
// timed in the same run. The module `stepgraph export` prints for the config's
// initial parameters goes to --out-dir as torch_module.safetensors;
// bench/torch_sequential.py --mode speed builds it (stepgraph's initial
// values, the config's optimizer, fp16/bf16 autocast) and times PyTorch eager,
// the eager step hand-captured in a CUDA graph, and torch.compile
// (max-autotune-no-cudagraphs) inside the captured graph; its records
// (torch_eager, torch_cuda_graph, torch_compile_in_graph) join the table.
#include <cstdint>
#include <string>
#include <vector>

#include "apps/bench_command.hpp"
#include "apps/config/train_config.hpp"
#include "graph/dtype.hpp"

namespace sg::app {

// Throws ConfigError naming the option when --torch cannot run: no --config,
// a --python that is not an executable (on PATH or as a path), or a
// --torch-script that is not a readable file. Before any timing.
void check_torch_twin(const BenchRequest& request);

// Writes the module once, runs the PyTorch side for each batch and returns
// the paths of their JSON records (one per batch, in order); throws
// std::runtime_error with the command and its exit status when the script
// fails (its own messages went to stderr before).
std::vector<std::string> run_torch_twin(const BenchRequest& request, const TrainConfig& config, DType features,
                                        const std::vector<std::int64_t>& batches);

}  // namespace sg::app
