#include "apps/backend_choice.hpp"

#include <fmt/format.h>

#include "apps/config/backend_options_from_config.hpp"
#include "apps/config/sequential_layers.hpp"
#include "graph/dtype.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/device_release.hpp"
#include "runtime/cuda/device_warmup.hpp"
#endif

namespace sg::app {

std::int64_t target_width(const TrainConfig& c) {
  return is_regression(loss_from_name(c.model.loss)) ? c.model.classes : 0;
}

MlpTraining mlp_training(const TrainConfig& c, DType feature_dtype) {
  if (c.model.is_sequential())
    throw ConfigError(fmt::format("{}: model.sequential: this command works on model.layers MLPs only so far (training "
                                  "runs model.sequential; issue 22)",
                                  c.source));
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
  t.optimizer = {c.optim.lr, c.optim.momentum, c.optim.weight_decay};
  t.optimizer.kind = optimizer_from_name(c.optim.name);
  t.optimizer.nesterov = c.optim.nesterov;
  t.optimizer.beta1 = c.optim.beta1;
  t.optimizer.beta2 = c.optim.beta2;
  t.optimizer.eps = c.optim.eps;
  t.optimizer.alpha = c.optim.alpha;
  t.optimizer.centered = c.optim.centered;
  t.optimizer.clip_grad_norm = c.optim.clip_grad_norm;
  t.optimizer.reduce_in_compute_dtype = c.precision.all_reduce == "compute";
  t.optimizer.bucket_bytes = static_cast<std::int64_t>(c.data_parallel.bucket_mb * 1024.0 * 1024.0);
  t.optimizer.shard_updates = c.data_parallel.zero1;
  t.optimizer.shard_min_bytes = static_cast<std::int64_t>(c.data_parallel.zero1_min_mb * 1024.0 * 1024.0);
  t.optimizer.weight_gradients = weight_gradients_from_name(c.data_parallel.weight_gradients);
  t.eval_batch = c.data.eval_batch_size;
  t.init_seed = c.run.seed;
  return t;
}

SequentialTraining sequential_training(const TrainConfig& c, DType feature_dtype) {
  // The data, loss, precision and optimizer settings exactly as the MLP's.
  TrainConfig as_mlp = c;
  as_mlp.model.sequential.clear();
  as_mlp.model.layers = {c.model.input, c.model.classes};
  const MlpTraining m = mlp_training(as_mlp, feature_dtype);
  SequentialTraining t;
  t.model.input_shape = c.model.input_shape;
  t.model.layers = layer_specs(c.model.sequential);
  t.model.batch = m.mlp.batch;
  t.model.weight_dtype = m.mlp.weight_dtype;
  t.model.compute_dtype = m.mlp.compute_dtype;
  t.model.input_scale = m.mlp.input_scale;
  t.model.input_shift = m.mlp.input_shift;
  t.model.feature_dtype = m.mlp.feature_dtype;
  t.model.target_width = m.mlp.target_width;
  t.model.loss = m.mlp.loss;
  t.model.label_smoothing = m.mlp.label_smoothing;
  t.model.dropout_seed = m.mlp.dropout_seed;
  t.model.augment_translate = c.data.augment_translate;
  t.model.augment_flip = c.data.augment_flip;
  t.optimizer = m.optimizer;
  t.fusion = m.fusion;
  t.eval_batch = m.eval_batch;
  t.init_seed = m.init_seed;
  return t;
}

TrainerSpec trainer_spec(const TrainConfig& c, std::int64_t train_rows, std::int64_t test_rows,
                         ProgramTarget target, DType feature_dtype) {
  TrainerSpec s;
  if (c.model.is_sequential())
    s.program = build_sequential_program(sequential_training(c, feature_dtype), train_rows, test_rows, target);
  else
    s.program = build_mlp_program(mlp_training(c, feature_dtype), train_rows, test_rows, target);
  s.shuffle_seed = c.data.shuffle_seed;
  s.cuda_graph = c.backend.cuda_graph;
  s.backend = backend_options_from_config(c);
  return s;
}

void check_cuda_can_run(const TrainConfig& c) {
#ifdef STEPGRAPH_HAVE_CUDNN
  (void)c;  // convolutions run through cuDNN's graph API (runtime/cuda/lowerings/conv_cudnn.cpp)
#else
  if (c.model.is_sequential() && needs_cnn_lowerings(c.model.input_shape, layer_specs(c.model.sequential)))
    throw ConfigError(fmt::format(
        "{}: model.sequential: CNN layers (conv2d, the poolings, flatten, dropout2d, a [C, H, W] input) need cuDNN 9 "
        "on the CUDA backend, and this build has none (CMake did not find it; see README): install cuDNN 9 and "
        "rebuild, or train on the CPU with backend.kind: cpu (--set backend.kind=cpu)",
        c.source));
#endif
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
                           {"CUDA primary context (worker thread, after the driver)", t.context_s},
                           {"loading cuBLASLt (second worker thread, beside the context)", t.cublaslt_load_s},
                           {"cuBLASLt handle and first heuristic query (second worker thread)", t.cublaslt_s},
                           {"driver, context and cuBLASLt together (wall time)", t.total_s}}};
    });
#endif
  (void)config;
  std::promise<DeviceWarmup> none;
  none.set_value({});
  return none.get_future();
}

void release_cuda_device() noexcept {
#ifdef STEPGRAPH_HAVE_CUDA
  (void)cuda::release_device();
#endif
}

std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note) {
  const auto spec = [&](ProgramTarget target) {
    return trainer_spec(config, data.train.images.count, data.test.images.count, target, data.train.images.dtype);
  };
  const std::string& kind = config.backend.kind;
  if (kind == "cpu") return make_cpu_trainer(spec(ProgramTarget::cpu), data);
  if (kind == "cuda") check_cuda_can_run(config);  // with or without a GPU here: the config cannot run there
  if (cuda_backend_usable()) {
    check_cuda_can_run(config);
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
