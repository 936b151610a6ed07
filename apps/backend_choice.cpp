#include "apps/backend_choice.hpp"

#include "apps/config/backend_options_from_config.hpp"
#include "graph/dtype.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#endif

namespace sg::app {

MlpTraining mlp_training(const TrainConfig& c) {
  MlpTraining t;
  t.mlp.layers = c.model.layers;
  t.mlp.batch = c.data.batch_size;
  t.mlp.weight_dtype = c.precision.weights == "fp32" ? DType::f32 : DType::f16;
  t.mlp.compute_dtype = DType::f16;
  if (c.data.normalize) {
    t.mlp.input_scale = 1.0 / (255.0 * c.data.std);
    t.mlp.input_shift = -c.data.mean / c.data.std;
  } else {
    t.mlp.input_scale = 1.0 / 255.0;
    t.mlp.input_shift = 0.0;
  }
  t.sgd = {c.optim.lr, c.optim.momentum, c.optim.weight_decay};
  t.eval_batch = c.data.eval_batch_size;
  t.init_seed = c.run.seed;
  return t;
}

TrainerSpec trainer_spec(const TrainConfig& c, std::int64_t train_rows, std::int64_t test_rows,
                         ProgramTarget target) {
  TrainerSpec s;
  s.program = build_mlp_program(mlp_training(c), train_rows, test_rows, target);
  s.shuffle_seed = c.data.shuffle_seed;
  s.cuda_graph = c.backend.cuda_graph;
  s.backend = backend_options_from_config(c);
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
  const auto spec = [&](ProgramTarget target) {
    return trainer_spec(config, data.train.images.count, data.test.images.count, target);
  };
  const std::string& kind = config.backend.kind;
  if (kind == "cpu") return make_cpu_trainer(spec(ProgramTarget::cpu), data);
  if (cuda_backend_usable()) {
#ifdef STEPGRAPH_HAVE_CUDA
    return cuda::make_cuda_trainer(spec(ProgramTarget::cuda), data);
#endif
  }
  if (kind == "cuda")
    throw ConfigError(config.source + ": backend.kind: cuda, but no CUDA GPU is available on this machine");
  note = "no CUDA GPU found: falling back to the CPU reference backend (f32, much slower)";
  return make_cpu_trainer(spec(ProgramTarget::cpu), data);
}

}  // namespace sg::app
