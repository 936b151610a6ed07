#include "apps/backend_choice.hpp"

#include "apps/config/backend_options_from_config.hpp"
#include "graph/dtype.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/device_warmup.hpp"
#endif

namespace sg::app {

std::int64_t target_width(const TrainConfig& c) {
  return is_regression(loss_from_name(c.model.loss)) ? c.model.layers.back() : 0;
}

MlpTraining mlp_training(const TrainConfig& c, DType feature_dtype) {
  MlpTraining t;
  t.mlp.feature_dtype = feature_dtype;
  t.mlp.target_width = target_width(c);
  t.mlp.layers = c.model.layers;
  t.mlp.activation = activation_from_name(c.model.activation);
  t.mlp.loss = loss_from_name(c.model.loss);
  t.mlp.label_smoothing = c.model.label_smoothing;
  t.mlp.dropout = c.model.dropout;
  t.mlp.dropout_seed = c.run.seed;
  t.mlp.batch = c.data.batch_size;
  t.mlp.compute_dtype = c.precision.compute == "bf16" ? DType::bf16 : DType::f16;
  t.mlp.weight_dtype = c.precision.weights == "fp32" ? DType::f32 : t.mlp.compute_dtype;
  // u8 pixels are scaled to [0, 1] first; float features are taken as they are.
  const double to_unit = feature_dtype == DType::u8 ? 1.0 / 255.0 : 1.0;
  if (c.data.normalize) {
    t.mlp.input_scale = to_unit / c.data.std;
    t.mlp.input_shift = -c.data.mean / c.data.std;
  } else {
    t.mlp.input_scale = to_unit;
    t.mlp.input_shift = 0.0;
  }
  t.sgd = {c.optim.lr, c.optim.momentum, c.optim.weight_decay};
  t.sgd.kind = optimizer_from_name(c.optim.name);
  t.sgd.nesterov = c.optim.nesterov;
  t.sgd.beta1 = c.optim.beta1;
  t.sgd.beta2 = c.optim.beta2;
  t.sgd.eps = c.optim.eps;
  t.sgd.clip_grad_norm = c.optim.clip_grad_norm;
  t.eval_batch = c.data.eval_batch_size;
  t.init_seed = c.run.seed;
  return t;
}

TrainerSpec trainer_spec(const TrainConfig& c, std::int64_t train_rows, std::int64_t test_rows,
                         ProgramTarget target, DType feature_dtype) {
  TrainerSpec s;
  s.program = build_mlp_program(mlp_training(c, feature_dtype), train_rows, test_rows, target);
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

std::future<DeviceWarmup> start_device_warmup(const TrainConfig& config) {
#ifdef STEPGRAPH_HAVE_CUDA
  if (config.backend.kind != "cpu")
    return std::async(std::launch::async, [] {
      const auto t = cuda::warm_up_device();
      return DeviceWarmup{t.device,
                          {{"CUDA driver initialisation (worker thread)", t.driver_s},
                           {"CUDA primary context (worker thread)", t.context_s},
                           {"cuBLASLt handle and first heuristic query (worker thread)", t.cublaslt_s}}};
    });
#endif
  (void)config;
  std::promise<DeviceWarmup> none;
  none.set_value({});
  return none.get_future();
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note) {
  const auto spec = [&](ProgramTarget target) {
    return trainer_spec(config, data.train.images.count, data.test.images.count, target, data.train.images.dtype);
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
