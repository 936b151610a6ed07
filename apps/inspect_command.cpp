#include "apps/inspect_command.hpp"

#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/backend_choice.hpp"
#include "apps/load_dataset.hpp"
#include "apps/config/backend_options_from_config.hpp"
#include "graph/dump.hpp"
#include "models/mlp_program.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cublaslt_matmul.hpp"
#include "runtime/cuda/activation_layout_choice.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/stream_plan.hpp"
#endif

namespace sg::app {
namespace {

// The graphs need only the dataset's row counts; dumps use the full split
// sizes. They are the CUDA backend's (what -f schedule/memory lower).
Graph stage_graph(const TrainConfig& config, const std::string& stage, const InspectRequest& request) {
  std::int64_t train_rows = config.data.train_limit > 0 ? config.data.train_limit : 60000;
  std::int64_t test_rows = config.data.test_limit > 0 ? config.data.test_limit : 10000;
  DType features = DType::u8;
  if (!config.data.train_x.empty()) {  // own data (issue 23): its rows and feature dtype shape the graphs
    const Dataset data = load_dataset(config);
    train_rows = data.train.images.count;
    test_rows = data.test.images.count;
    features = data.train.images.dtype;
  }
  if (config.model.is_sequential()) {  // issue 22's model.sequential: the same stages from the Sequential builder
    const SequentialTraining training = sequential_training(config, features);
    if ((stage == "eval" || stage == "fused") && request.world_size == 0) {
      // The form the CUDA backend runs: channels-first or channels-last convolution layers (by the host rule:
      // with backend.autotune a trainer times both forms instead, runtime/cuda/timed_layout_choice.hpp).
      TrainingProgram program = build_sequential_program(training, train_rows, test_rows, ProgramTarget::cuda);
#ifdef STEPGRAPH_HAVE_CUDA
      cuda::choose_activation_layout(program, backend_options_from_config(config), cuda_backend_usable());
#endif
      return stage == "eval" ? program.eval : program.train;
    }
    SequentialSpec spec = sequential_for_target(training.model, ProgramTarget::cuda);
    spec.dataset_rows = train_rows;
    OptimizerSpec optimizer = training.optimizer;
    if (request.world_size > 0) shard_for_rank(spec, optimizer, request.rank, request.world_size);
    auto stages = build_sequential_training_stages(spec, optimizer, training.fusion);
    if (stage == "forward") return stages.forward;
    if (stage == "backward") return stages.backward;
    if (stage == "optimized") return stages.optimized;
    if (stage == "fused") return stages.fused;
    throw ConfigError(fmt::format("inspect: unknown stage '{}' (forward, backward, optimized, fused, eval)", stage));
  }
  const MlpTraining training = mlp_training(config, features);
  if (stage == "eval") {
    return build_mlp_program(training, train_rows, test_rows, ProgramTarget::cuda).eval;
  }
  MlpSpec mlp = mlp_for_target(training.mlp, ProgramTarget::cuda);
  mlp.dataset_rows = train_rows;
  OptimizerSpec sgd = training.optimizer;
  if (request.world_size > 0) shard_for_rank(mlp, sgd, request.rank, request.world_size);
  auto stages = build_training_stages(mlp, sgd, training.fusion);
  if (stage == "forward") return stages.forward;
  if (stage == "backward") return stages.backward;
  if (stage == "optimized") return stages.optimized;
  if (stage == "fused") return stages.fused;
  throw ConfigError(fmt::format("inspect: unknown stage '{}' (forward, backward, optimized, fused, eval)", stage));
}

#ifdef STEPGRAPH_HAVE_CUDA
// The CUDA backend's cover of `g` under the config's backend options. Without
// a GPU the lowerings that ask the device are left out, and the dump says so.
struct CudaCover {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  Schedule schedule;
  std::string note;
};

CudaCover cuda_cover(const TrainConfig& config, const Graph& g) {
  CudaCover c;
  const bool device = cuda_backend_usable();
  c.lowerings = cuda::cuda_lowerings(backend_options_from_config(config), device);
  c.schedule = build_schedule(g, cuda::as_lowerings(c.lowerings));
  if (!device) {
    std::vector<std::string> left_out;
    for (const auto& l : cuda::cuda_lowerings(backend_options_from_config(config), true))
      if (l->asks_device()) left_out.emplace_back(l->name());
    if (!left_out.empty())
      c.note = fmt::format("# no CUDA GPU here: lowerings that ask the device ({}) were not tried\n",
                           fmt::join(left_out, ", "));
  }
  return c;
}
#endif

std::string schedule_dump(const TrainConfig& config, const Graph& g) {
#ifdef STEPGRAPH_HAVE_CUDA
  const CudaCover c = cuda_cover(config, g);
  const BackendOptions backend = backend_options_from_config(config);
  // Where each all-reduce (data parallel) or weight gradient (one GPU) leaves the step's stream and where the step
  // waits for it.
  const cuda::StreamPlan streams = cuda::plan_streams(g, c.schedule, backend);
  const auto launch_name = [&](std::size_t i) {
    return i == c.schedule.launches.size() ? std::string("the step's end") : fmt::format("L{}", i);
  };
  // A side launch that also waits for the other side stream's launches (a rank's all-reduce for the weight
  // gradients, an update for the all-reduce) names them.
  const auto waits = [&](std::size_t i) {
    std::vector<std::string> names;
    for (std::size_t w : streams.waits_for[i]) names.push_back(launch_name(w));
    return names.empty() ? std::string() : fmt::format(", after {}", fmt::join(names, " "));
  };
  std::string forks;
  for (std::size_t i = 0; i < c.schedule.launches.size(); ++i)
    if (streams.on_communication[i])
      forks += fmt::format("# L{} runs on the communication stream: forked there{}, joined before {}\n", i, waits(i),
                           launch_name(streams.join_before[i]));
    else if (streams.on_gradient_stream[i])
      forks += fmt::format("# L{} runs on the gradient stream{}: forked before {}{}, joined before {}\n", i,
                           streams.gradient_lanes() > 1 ? fmt::format(" {}", streams.gradient_lane[i] + 1) : "",
                           launch_name(streams.fork_before[i]), waits(i), launch_name(streams.join_before[i]));
  // The fast paths without a launch here, and why (the same lines `train` logs and `bench` reports).
  std::string declined;
  for (const auto& d : cuda::declined_fast_paths(g, c.schedule, backend, cuda_backend_usable()))
    declined += fmt::format("# fast path {} declined: {}\n", d.name, d.reason);
  return c.note + dump_schedule(g, c.schedule) + forks + declined;
#else
  (void)config;
  (void)g;
  throw ConfigError("inspect --format schedule needs a build with CUDA (it shows the CUDA lowerings' cover)");
#endif
}

std::string memory_dump(const TrainConfig& config, const Graph& g) {
#ifdef STEPGRAPH_HAVE_CUDA
  const CudaCover c = cuda_cover(config, g);
  std::vector<std::size_t> bytes, masks;
  for (const auto& v : g.values()) bytes.push_back(value_bytes(v));
  for (const auto& aux : c.schedule.aux) masks.push_back(cuda::relu_aux_bytes(aux.rows, aux.cols));
  std::vector<std::string> cudnn_launches;
  for (std::size_t i = 0; i < c.schedule.launches.size(); ++i)
    if (c.schedule.launches[i].lowering->name() == "conv_cudnn") cudnn_launches.push_back(fmt::format("L{}", i));
  // cuDNN says how much workspace a plan needs only once the plan is chosen on the GPU.
  const std::string workspace =
      cudnn_launches.empty() ? ""
                             : fmt::format("# plus a device workspace per stream for the cuDNN launches ({}: those on "
                                           "one stream run one after another and share it), sized by the largest "
                                           "plan chosen on the GPU\n",
                                           fmt::join(cudnn_launches, ", "));
  ArenaRequest request = arena_request(g, c.schedule, bytes, masks);
  cuda::keep_live_until_joined(  // as CudaProgram plans it
      request, c.schedule,
      cuda::plan_streams(g, c.schedule, backend_options_from_config(config)));
  return c.note + dump_memory_plan(plan_memory(std::move(request.buffers))) + workspace;
#else
  (void)config;
  (void)g;
  throw ConfigError("inspect --format memory needs a build with CUDA (the ReLU mask layout is cuBLASLt's)");
#endif
}

std::string cuda_graph_dump(const TrainConfig& config) {
#ifdef STEPGRAPH_HAVE_CUDA
  if (!cuda_backend_usable()) throw ConfigError("inspect --format cuda-graph needs a CUDA GPU; none is available");
  const Dataset data = load_dataset(config);
  TrainerSpec spec = trainer_spec(config, data.train.images.count, data.test.images.count, ProgramTarget::cuda,
                                 data.train.images.dtype);
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
  if (!request.out.empty()) io::check_writable_file(request.out, "inspect -o");  // before any work
  if (request.world_size < 0)
    throw ConfigError(fmt::format("inspect: --world-size must be >= 0 (got {}; 0: a single-process run)", request.world_size));
  if (request.world_size > 0 && (request.rank < 0 || request.rank >= request.world_size))
    throw ConfigError(fmt::format("inspect: --rank {} is not in 0..{} (--world-size {})", request.rank,
                                  request.world_size - 1, request.world_size));
  if (f == "cuda-graph") {
    if (request.world_size > 0)
      throw ConfigError("inspect --format cuda-graph --world-size: capturing a data-parallel step needs its ranks "
                        "(train --gpus N); -f schedule shows its launches");
    out = cuda_graph_dump(config);
  } else {
    const Graph g = stage_graph(config, request.stage, request);
    if (f == "text") out = dump_text(g);
    else if (f == "json") out = dump_json(g);
    else if (f == "dot") out = dump_dot(g, fmt::format("{} ({})", config.source, request.stage));
    else if (f == "schedule") out = schedule_dump(config, g);
    else if (f == "memory") out = memory_dump(config, g);
    else throw ConfigError(fmt::format("inspect: unknown format '{}' (text, json, dot, schedule, memory, cuda-graph)", f));
  }
  if (!request.out.empty()) io::write_file_atomically(request.out, out);
  return out;
}

}  // namespace sg::app
