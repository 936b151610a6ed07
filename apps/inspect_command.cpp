#include "apps/inspect_command.hpp"

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include <fmt/format.h>

#include "apps/backend_choice.hpp"
#include "graph/dump.hpp"
#include "graph/training_graph.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cublaslt_matmul.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#endif

namespace sg::app {
namespace {

// The graphs need only the dataset's row count; dumps use the full split size.
MlpSpec mlp_for(const TrainConfig& config, std::int64_t rows) {
  MlpSpec mlp = trainer_spec(config).mlp;
  mlp.dataset_rows = rows;
  return mlp;
}

Graph stage_graph(const TrainConfig& config, const std::string& stage) {
  const std::int64_t train_rows = config.data.train_limit > 0 ? config.data.train_limit : 60000;
  const auto spec = trainer_spec(config);
  if (stage == "eval") {
    const std::int64_t test_rows = config.data.test_limit > 0 ? config.data.test_limit : 10000;
    MlpSpec mlp = mlp_for(config, test_rows);
    mlp.batch = eval_batch_for(test_rows, spec.eval_batch);
    Graph g = build_mlp_eval(mlp);
    fuse(g, spec.fusion);
    return g;
  }
  auto stages = build_training_stages(mlp_for(config, train_rows), spec.sgd, spec.fusion);
  if (stage == "forward") return stages.forward;
  if (stage == "backward") return stages.backward;
  if (stage == "optimized") return stages.optimized;
  if (stage == "fused") return stages.fused;
  throw ConfigError(fmt::format("inspect: unknown stage '{}' (forward, backward, optimized, fused, eval)", stage));
}

std::string memory_dump(const Graph& g) {
#ifdef STEPGRAPH_HAVE_CUDA
  const Schedule s = build_schedule(g);
  std::vector<std::size_t> bytes, masks;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  for (const auto& aux : s.aux) masks.push_back(cuda::relu_aux_bytes(aux.rows, aux.cols));
  return dump_memory_plan(plan_memory(arena_request(g, s, bytes, masks).buffers));
#else
  (void)g;
  throw ConfigError("inspect --format memory needs a build with CUDA (the ReLU mask layout is cuBLASLt's)");
#endif
}

std::string cuda_graph_dump(const TrainConfig& config) {
#ifdef STEPGRAPH_HAVE_CUDA
  if (!cuda_backend_usable()) throw ConfigError("inspect --format cuda-graph needs a CUDA GPU; none is available");
  Dataset data{data::load_split(config.data.dir, "train", config.data.train_limit),
               data::load_split(config.data.dir, "t10k", config.data.test_limit)};
  TrainerSpec spec = trainer_spec(config);
  spec.cuda_graph = true;
  cuda::CudaTrainer trainer(spec, data);
  const auto tmp = std::filesystem::temp_directory_path() / fmt::format("stepgraph-cuda-graph-{}.dot", ::getpid());
  const std::size_t nodes = trainer.dump_cuda_graph(tmp.string());
  std::string dot = io::read_file(tmp);
  std::filesystem::remove(tmp);
  return fmt::format("// captured CUDA graph of one training step: {} nodes for {} scheduled launches\n{}", nodes,
                     trainer.training_program().schedule().launches.size(), dot);
#else
  (void)config;
  throw ConfigError("inspect --format cuda-graph needs a build with CUDA");
#endif
}

}  // namespace

std::string run_inspect(const TrainConfig& config, const InspectRequest& request) {
  std::string out;
  const auto& f = request.format;
  if (f == "cuda-graph") {
    out = cuda_graph_dump(config);
  } else {
    const Graph g = stage_graph(config, request.stage);
    if (f == "text") out = dump_text(g);
    else if (f == "json") out = dump_json(g);
    else if (f == "dot") out = dump_dot(g, fmt::format("{} ({})", config.source, request.stage));
    else if (f == "schedule") out = dump_schedule(g, build_schedule(g));
    else if (f == "memory") out = memory_dump(g);
    else throw ConfigError(fmt::format("inspect: unknown format '{}' (text, json, dot, schedule, memory, cuda-graph)", f));
  }
  if (!request.out.empty()) io::write_file_atomically(request.out, out);
  return out;
}

}  // namespace sg::app
