#include "apps/resume_check.hpp"

#include <filesystem>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/data_parallel_run.hpp"

namespace sg::app {
namespace {

// "model.layers [784, 64, 10] (an MLP)" or "model.sequential [conv2d{...}, relu{}, ...] (a CNN, 8 layers)".
std::string model_form(const ModelConfig& m) {
  if (!m.is_sequential()) return fmt::format("model.layers [{}] (an MLP)", fmt::join(m.layers, ", "));
  std::vector<std::string> texts;
  bool convolutional = false;
  for (const auto& l : m.sequential) {
    if (texts.size() < 3) texts.push_back(layer_text(l));
    convolutional = convolutional || l.kind == "conv2d" || l.kind == "max_pool2d" || l.kind == "avg_pool2d" ||
                    l.kind == "global_avg_pool2d";
  }
  return fmt::format("model.sequential [{}{}] ({}, {} layers)", fmt::join(texts, ", "),
                     m.sequential.size() > 3 ? ", ..." : "", convolutional ? "a CNN" : "a Sequential model", m.sequential.size());
}

// A data file as the readers open it: relative to the working folder,
// symlinks and ".." resolved; an .npz member (`data.npz:x`) kept as given.
std::string resolved_data_path(const std::string& text) {
  if (text.empty()) return text;
  std::string file = text, member;
  const auto colon = text.rfind(':');
  if (colon != std::string::npos && colon >= 4 && text.compare(colon - 4, 4, ".npz") == 0) {
    file = text.substr(0, colon);
    member = text.substr(colon);
  }
  std::error_code ec;
  const auto resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(file, ec), ec);
  return (ec ? file : resolved.string()) + member;
}

bool has_dropout(const ModelConfig& m) {
  if (m.dropout > 0) return true;
  for (const auto& l : m.sequential)
    if (l.kind == "dropout" || l.kind == "dropout2d") return true;
  return false;
}

}  // namespace

ResumePoint load_resume_point(const TrainConfig& config, int world_size) {
  ResumePoint point{io::load_checkpoint(config.run.resume), {}};
  const auto& ckpt = point.checkpoint;
  const std::string& path = config.run.resume;
  // A step's batches depend on the rank count: resume at the one that wrote it.
  if (const int saved = data_parallel_ranks_of(ckpt.tensors); saved != world_size)
    throw ConfigError(fmt::format("{}: run.resume {} was written by {} but this run is {}; resume it as it was written{}",
                                  config.source, path,
                                  saved > 0 ? fmt::format("a data-parallel run over {} ranks", saved)
                                            : std::string("a single-process run"),
                                  world_size > 0 ? fmt::format("data parallel over {} ranks", world_size)
                                                 : std::string("a single-process run"),
                                  saved > 0 ? fmt::format(" (--gpus {})", saved) : std::string(" (without --gpus)")));
  try {
    point.saved = parse_config(ckpt.config_yaml, path + " (its saved config)");
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("run.resume {}: cannot read the config saved in the checkpoint: {}", path, e.what()));
  }
  const TrainConfig& saved = point.saved;
  const auto refuse = [&](const std::string& key, const std::string& here, const std::string& there) {
    throw ConfigError(fmt::format("{}: run.resume {}: {} is {} here but {} in the checkpoint's run; resuming would change "
                                  "the training trajectory (use the checkpoint's value or start a fresh run)",
                                  config.source, path, key, here, there));
  };
  auto differs = [&](const char* key, auto a, auto b) {
    if (a != b) refuse(key, fmt::format("{}", b), fmt::format("{}", a));
  };
  // An MLP against a Sequential model: say what each run had, not an empty list.
  if (saved.model.is_sequential() != config.model.is_sequential())
    throw ConfigError(fmt::format("{}: run.resume {}: this config's model is {} but the checkpoint's run had {}; resuming "
                                  "needs the checkpoint's model (or start a fresh run)",
                                  config.source, path, model_form(config.model), model_form(saved.model)));
  differs("model.layers", fmt::format("{}", fmt::join(saved.model.layers, ",")),
          fmt::format("{}", fmt::join(config.model.layers, ",")));
  differs("model.input", fmt::format("[{}]", fmt::join(saved.model.input_shape, ",")),
          fmt::format("[{}]", fmt::join(config.model.input_shape, ",")));
  const auto layer_list = [](const ModelConfig& m) {
    std::vector<std::string> texts;
    for (const auto& l : m.sequential) texts.push_back(layer_text(l));
    return fmt::format("[{}]", fmt::join(texts, ", "));
  };
  differs("model.sequential", layer_list(saved.model), layer_list(config.model));
  differs("model.activation", saved.model.activation, config.model.activation);
  differs("model.loss", saved.model.loss, config.model.loss);
  differs("model.label_smoothing", saved.model.label_smoothing, config.model.label_smoothing);
  differs("model.dropout", saved.model.dropout, config.model.dropout);
  differs("data.batch_size", saved.data.batch_size, config.data.batch_size);
  differs("data.shuffle_seed", saved.data.shuffle_seed, config.data.shuffle_seed);
  differs("data.train_limit", saved.data.train_limit, config.data.train_limit);
  differs("data.normalize", saved.data.normalize, config.data.normalize);
  differs("data.mean", saved.data.mean, config.data.mean);
  differs("data.std", saved.data.std, config.data.std);
  differs("data.format", saved.data.format, config.data.format);
  differs("data.augment.translate", saved.data.augment_translate, config.data.augment_translate);
  differs("data.augment.flip", saved.data.augment_flip, config.data.augment_flip);
  // The same file named another way (absolute / relative, through a link) is the same data.
  for (const auto& [key, there, here] : {std::tuple{"data.train_x", saved.data.train_x, config.data.train_x},
                                         std::tuple{"data.train_y", saved.data.train_y, config.data.train_y}})
    if (there != here && resolved_data_path(there) != resolved_data_path(here)) refuse(key, here, there);
  differs("data.label_column", saved.data.label_column, config.data.label_column);
  differs("data.test_fraction", saved.data.test_fraction, config.data.test_fraction);
  differs("data.split_seed", saved.data.split_seed, config.data.split_seed);
  differs("optim.lr", saved.optim.lr, config.optim.lr);
  differs("optim.momentum", saved.optim.momentum, config.optim.momentum);
  differs("optim.weight_decay", saved.optim.weight_decay, config.optim.weight_decay);
  differs("optim.name", saved.optim.name, config.optim.name);
  differs("optim.nesterov", saved.optim.nesterov, config.optim.nesterov);
  differs("optim.betas[0]", saved.optim.beta1, config.optim.beta1);
  differs("optim.betas[1]", saved.optim.beta2, config.optim.beta2);
  differs("optim.eps", saved.optim.eps, config.optim.eps);
  differs("optim.clip_grad_norm", saved.optim.clip_grad_norm, config.optim.clip_grad_norm);
  differs("optim.schedule.kind", saved.optim.schedule.kind, config.optim.schedule.kind);
  differs("optim.schedule.warmup_steps", saved.optim.schedule.warmup_steps, config.optim.schedule.warmup_steps);
  differs("optim.schedule.step_size", saved.optim.schedule.step_size, config.optim.schedule.step_size);
  differs("optim.schedule.gamma", saved.optim.schedule.gamma, config.optim.schedule.gamma);
  differs("optim.schedule.min_lr", saved.optim.schedule.min_lr, config.optim.schedule.min_lr);
  differs("precision.weights", saved.precision.weights, config.precision.weights);
  differs("precision.accumulate", saved.precision.accumulate, config.precision.accumulate);
  differs("precision.compute", saved.precision.compute, config.precision.compute);
  differs("precision.all_reduce", saved.precision.all_reduce, config.precision.all_reduce);
  // NCCL rounds a tensor's mean differently in another group of calls (docs/data_parallel.md): a rank's resume
  // is bit-exact with the buckets it was saved with. (A single-process run has no buckets.)
  // The CTA count and the symmetric kernels (a sum and a scale instead of ncclAvg) are other reductions too.
  if (world_size > 0) {
    differs("data_parallel.bucket_mb", saved.data_parallel.bucket_mb, config.data_parallel.bucket_mb);
    differs("data_parallel.nccl_ctas", saved.data_parallel.nccl_ctas, config.data_parallel.nccl_ctas);
    differs("data_parallel.symmetric_memory", saved.data_parallel.symmetric_memory,
            config.data_parallel.symmetric_memory);
    differs("data_parallel.zero1", saved.data_parallel.zero1, config.data_parallel.zero1);
    differs("data_parallel.zero1_min_mb", saved.data_parallel.zero1_min_mb, config.data_parallel.zero1_min_mb);
    differs("data_parallel.weight_gradients", saved.data_parallel.weight_gradients,
            config.data_parallel.weight_gradients);
  }
  return point;
}

std::vector<std::string> resume_trajectory_warnings(const TrainConfig& config, const ResumePoint& resume,
                                                    std::int64_t total_steps, std::int64_t saved_total_steps) {
  std::vector<std::string> warnings;
  const auto& saved = resume.saved.run;
  const std::string where = fmt::format("{}: run.resume {}", config.source, config.run.resume);
  if (config.optim.schedule.kind == "cosine" && total_steps != saved_total_steps) {
    const bool steps = config.run.steps != saved.steps;
    const std::string key = steps ? fmt::format("run.steps is {} here but {}", config.run.steps, saved.steps)
                                  : fmt::format("run.epochs is {} here but {}", config.run.epochs, saved.epochs);
    warnings.push_back(fmt::format("{}: {} in the checkpoint's run ({} total steps here, {} there): the cosine schedule "
                                   "(optim.schedule.kind) spreads its decay over the total, so from step {} on the "
                                   "learning rate differs from the checkpoint's run",
                                   where, key, total_steps, saved_total_steps, resume.checkpoint.step));
  }
  if (config.run.seed != saved.seed && has_dropout(config.model))
    warnings.push_back(fmt::format("{}: run.seed is {} here but {} in the checkpoint's run: the dropout masks are keyed "
                                   "on it, so the steps after the checkpoint drop other units than that run would have",
                                   where, config.run.seed, saved.seed));
  return warnings;
}

}  // namespace sg::app
