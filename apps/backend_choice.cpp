#include "apps/backend_choice.hpp"

#include "graph/dtype.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#endif

namespace sg::app {

TrainerSpec trainer_spec(const TrainConfig& c) {
  TrainerSpec s;
  s.mlp.layers = c.model.layers;
  s.mlp.batch = c.data.batch_size;
  s.mlp.weight_dtype = c.precision.weights == "fp32" ? DType::f32 : DType::f16;
  s.mlp.compute_dtype = DType::f16;
  if (c.data.normalize) {
    s.mlp.input_scale = 1.0 / (255.0 * c.data.std);
    s.mlp.input_shift = -c.data.mean / c.data.std;
  } else {
    s.mlp.input_scale = 1.0 / 255.0;
    s.mlp.input_shift = 0.0;
  }
  s.sgd = {c.optim.lr, c.optim.momentum, c.optim.weight_decay};
  s.eval_batch = c.data.eval_batch_size;
  s.init_seed = c.run.seed;
  s.shuffle_seed = c.data.shuffle_seed;
  s.accumulate_f16 = c.precision.accumulate == "fp16";
  s.cuda_graph = c.backend.cuda_graph;
  s.autotune = c.backend.autotune;
  s.whole_step = c.backend.whole_step;
  s.one_pass_backward = c.backend.one_pass_backward;
  s.steps_per_launch = c.backend.steps_per_launch;
  return s;
}

bool cuda_backend_usable() {
#ifdef STEPGRAPH_HAVE_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note) {
  const TrainerSpec spec = trainer_spec(config);
  const std::string& kind = config.backend.kind;
  if (kind == "cpu") return make_cpu_trainer(spec, data);
  if (cuda_backend_usable()) {
#ifdef STEPGRAPH_HAVE_CUDA
    return cuda::make_cuda_trainer(spec, data);
#endif
  }
  if (kind == "cuda")
    throw ConfigError(config.source + ": backend.kind: cuda, but no CUDA GPU is available on this machine");
  note = "no CUDA GPU found: falling back to the CPU reference backend (f32, much slower)";
  return make_cpu_trainer(spec, data);
}

}  // namespace sg::app
