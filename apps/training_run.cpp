#include "apps/training_run.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>

#include <fmt/ranges.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/data_parallel_run.hpp"
#include "apps/load_dataset.hpp"
#include "apps/lr_schedule.hpp"
#include "apps/saved_model.hpp"
#include "apps/report/metrics_log.hpp"
#include "apps/report/progress.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"

namespace sg::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Next step (after `step`) that is a multiple of `every`, or `total` if that comes first.
std::int64_t next_multiple(std::int64_t step, std::int64_t every, std::int64_t total) {
  if (every <= 0) return total;
  return std::min(total, (step / every + 1) * every);
}

class TrainingLoop {
 public:
  TrainingLoop(const TrainConfig& config, const RunControls& controls, const RankLaunch& rank_launch)
      : config_(config),
        controls_(controls),
        rank_launch_(rank_launch),
        out_dir_(config.run.out_dir),
        launch_steps_(std::max<std::int64_t>(1, config.backend.steps_per_launch)) {}

  TrainSummary run() {
    if (writes_outputs_) check_outputs();  // before any work: a bad output path must not cost a whole run
    std::optional<io::Checkpoint> resume_from;
    if (!config_.run.resume.empty()) resume_from = load_resume_checkpoint();
    // The CUDA start-up (driver, context, cuBLASLt) begins on worker threads
    // now, once the output paths and the resume checkpoint are known to be
    // good, so writing config.yaml and reading the data both overlap it. A
    // data-parallel rank starts none: that would land on GPU 0 for every
    // rank; its trainer selects its own GPU.
    std::future<DeviceWarmup> device_ready;
    if (!data_parallel()) device_ready = start_device_warmup(config_);
    const std::string resolved = to_yaml(config_);
    if (data_parallel()) {  // every rank checks in (same world size and resolved config) before any work
      const auto start = Clock::now();
      group_ = join_data_parallel_run(config_, rank_launch_, resolved);
      summary_.timing.add("data-parallel rendezvous (every rank, NCCL id)", seconds_since(start));
    }
    if (writes_outputs_) {
      spdlog::info("resolved config ({}):\n{}", config_.source, resolved);
      io::write_file_atomically(out_dir_ / "config.yaml", resolved);
    }

    Dataset data = data_parallel() ? load_dataset(config_)
                                   : load_dataset_while_device_starts(config_, std::move(device_ready), summary_.timing);
    check_data(data);
    feature_dtype_ = data.train.images.dtype;
    spdlog::info("data: {} training and {} test {} of {}x{} {} from {}", data.train.images.count,
                 data.test.images.count, data.train.images.dtype == DType::u8 ? "images" : "rows",
                 data.train.images.rows, data.train.images.cols, dtype_name(data.train.images.dtype),
                 data_source(false));
    std::string note;
    auto phase_start = Clock::now();
    trainer_ = data_parallel() ? make_data_parallel_trainer(config_, data, group_) : make_trainer(config_, data, note);
    const std::string construction = "backend construction (upload, lowering, autotune, capture)";
    summary_.timing.add(construction, seconds_since(phase_start));
    for (const auto& [part, seconds] : trainer_->setup_phases()) summary_.timing.add_part(construction, part, seconds);
    if (!note.empty()) spdlog::warn("{}", note);
    on_cuda_ = data_parallel() || (config_.backend.kind != "cpu" && note.empty());  // note: fell back to the CPU
    summary_.backend = trainer_->description();
    if (data_parallel())
      summary_.backend += fmt::format(", data parallel: rank {} of {}, global batch {} x {}", group_.rank,
                                      group_.world_size, group_.world_size, config_.data.batch_size);
    spdlog::info("backend: {}", summary_.backend);
    total_ = total_steps(config_, data.train.images.count / ranks());  // epochs of global batches of ranks x batch rows
    if (resume_from) resume(*resume_from);
    phase_start = Clock::now();
    train_until_done();
    if (data_parallel()) end_data_parallel_steps(*trainer_, group_, !summary_.interrupted);  // goodbye to the peers
    summary_.timing.add("training steps (incl. logging, periodic checkpoints)", seconds_since(phase_start) - eval_seconds_);
    const double eval_in_loop = eval_seconds_;
    phase_start = Clock::now();
    finish();
    summary_.timing.add("evaluation (test set)", eval_seconds_);
    const std::string outputs = "writing outputs (checkpoint on a worker thread) and releasing the GPU";
    summary_.timing.add(outputs, seconds_since(phase_start) - (eval_seconds_ - eval_in_loop));
    for (const auto& [part, seconds] : output_parts_) summary_.timing.add_part(outputs, part, seconds);
    spdlog::info("{}", summary_.timing.format("where the run's time went"));
    return summary_;
  }

 private:
  void check_outputs() const {
    io::check_writable_dir(out_dir_, "run.out_dir");
    io::check_writable_file(checkpoint_path(), config_.run.checkpoint.empty() ? "the checkpoint in run.out_dir" : "run.checkpoint");
  }

  // The checkpoint to resume from, refused when this config would train it
  // differently from the run that wrote it.
  io::Checkpoint load_resume_checkpoint() const {
    auto ckpt = io::load_checkpoint(config_.run.resume);
    // A step's batches depend on the rank count: resume at the one that wrote it.
    if (const int saved = data_parallel_ranks_of(ckpt.tensors); saved != rank_launch_.world_size)
      throw ConfigError(fmt::format("{}: run.resume {} was written by {} but this run is {}; resume it as it was written{}",
                                    config_.source, config_.run.resume,
                                    saved > 0 ? fmt::format("a data-parallel run over {} ranks", saved)
                                              : std::string("a single-process run"),
                                    data_parallel() ? fmt::format("data parallel over {} ranks", ranks())
                                                    : std::string("a single-process run"),
                                    saved > 0 ? fmt::format(" (--gpus {})", saved) : std::string(" (without --gpus)")));
    TrainConfig saved;
    try {
      saved = parse_config(ckpt.config_yaml, config_.run.resume + " (its saved config)");
    } catch (const ConfigError& e) {
      throw ConfigError(fmt::format("run.resume {}: cannot read the config saved in the checkpoint: {}", config_.run.resume, e.what()));
    }
    auto differs = [&](const char* key, auto a, auto b) {
      if (a != b)
        throw ConfigError(fmt::format("{}: run.resume {}: {} is {} here but {} in the checkpoint's run; resuming would "
                                      "change the training trajectory (use the checkpoint's value or start a fresh run)",
                                      config_.source, config_.run.resume, key, fmt::format("{}", b), fmt::format("{}", a)));
    };
    differs("model.layers", fmt::format("{}", fmt::join(saved.model.layers, ",")), fmt::format("{}", fmt::join(config_.model.layers, ",")));
    differs("model.input", fmt::format("[{}]", fmt::join(saved.model.input_shape, ",")),
            fmt::format("[{}]", fmt::join(config_.model.input_shape, ",")));
    const auto layer_list = [](const ModelConfig& m) {
      std::vector<std::string> texts;
      for (const auto& l : m.sequential) texts.push_back(layer_text(l));
      return fmt::format("[{}]", fmt::join(texts, ", "));
    };
    differs("model.sequential", layer_list(saved.model), layer_list(config_.model));
    differs("model.activation", saved.model.activation, config_.model.activation);
    differs("model.loss", saved.model.loss, config_.model.loss);
    differs("model.label_smoothing", saved.model.label_smoothing, config_.model.label_smoothing);
    differs("model.dropout", saved.model.dropout, config_.model.dropout);
    differs("data.batch_size", saved.data.batch_size, config_.data.batch_size);
    differs("data.shuffle_seed", saved.data.shuffle_seed, config_.data.shuffle_seed);
    differs("data.train_limit", saved.data.train_limit, config_.data.train_limit);
    differs("data.normalize", saved.data.normalize, config_.data.normalize);
    differs("data.mean", saved.data.mean, config_.data.mean);
    differs("data.std", saved.data.std, config_.data.std);
    differs("data.format", saved.data.format, config_.data.format);
    differs("data.train_x", saved.data.train_x, config_.data.train_x);
    differs("data.train_y", saved.data.train_y, config_.data.train_y);
    differs("data.label_column", saved.data.label_column, config_.data.label_column);
    differs("data.test_fraction", saved.data.test_fraction, config_.data.test_fraction);
    differs("data.split_seed", saved.data.split_seed, config_.data.split_seed);
    differs("optim.lr", saved.optim.lr, config_.optim.lr);
    differs("optim.momentum", saved.optim.momentum, config_.optim.momentum);
    differs("optim.weight_decay", saved.optim.weight_decay, config_.optim.weight_decay);
    differs("optim.name", saved.optim.name, config_.optim.name);
    differs("optim.nesterov", saved.optim.nesterov, config_.optim.nesterov);
    differs("optim.betas[0]", saved.optim.beta1, config_.optim.beta1);
    differs("optim.betas[1]", saved.optim.beta2, config_.optim.beta2);
    differs("optim.eps", saved.optim.eps, config_.optim.eps);
    differs("optim.clip_grad_norm", saved.optim.clip_grad_norm, config_.optim.clip_grad_norm);
    differs("optim.schedule.kind", saved.optim.schedule.kind, config_.optim.schedule.kind);
    differs("optim.schedule.warmup_steps", saved.optim.schedule.warmup_steps, config_.optim.schedule.warmup_steps);
    differs("optim.schedule.step_size", saved.optim.schedule.step_size, config_.optim.schedule.step_size);
    differs("optim.schedule.gamma", saved.optim.schedule.gamma, config_.optim.schedule.gamma);
    differs("optim.schedule.min_lr", saved.optim.schedule.min_lr, config_.optim.schedule.min_lr);
    differs("precision.weights", saved.precision.weights, config_.precision.weights);
    differs("precision.accumulate", saved.precision.accumulate, config_.precision.accumulate);
    differs("precision.compute", saved.precision.compute, config_.precision.compute);
    return ckpt;
  }

  // Where the training (or test) data came from, for messages: data.dir's IDX
  // files, or the configured file (own data).
  std::string data_source(bool test, bool labels = false) const {
    const auto& d = config_.data;
    if (d.train_x.empty()) return d.dir;
    if (labels && test && !d.test_y.empty()) return "data.test_y " + d.test_y;
    const bool test_file = test && !d.test_x.empty();  // else the test rows come from the training files
    if (labels && !test_file && !d.train_y.empty()) return "data.train_y " + d.train_y;
    if (test && !d.test_x.empty()) return "data.test_x " + d.test_x;
    return "data.train_x " + d.train_x;
  }

  void check_data(const Dataset& data) const {
    if (data.train.labels.target_width != target_width(config_))
      throw ConfigError(fmt::format("{}: model.loss {} needs {}, but {} holds {}", config_.source, config_.model.loss,
                                    target_width(config_) > 0 ? "float targets" : "class labels", data_source(false, true),
                                    data.train.labels.target_width > 0 ? "float targets" : "class labels"));
    const auto in = config_.model.input;
    if (data.train.images.pixels_per_image() != in)
      throw ConfigError(fmt::format("{}: {} is {} but the images in {} have {}x{} = {} pixels", config_.source,
                                    config_.model.is_sequential()
                                        ? fmt::format("model.input [{}] (element count)", fmt::join(config_.model.input_shape, ", "))
                                        : std::string("model.layers[0]"),
                                    in, data_source(false), data.train.images.rows, data.train.images.cols,
                                    data.train.images.pixels_per_image()));
    if (data.train.classes > config_.model.classes)
      throw ConfigError(fmt::format("{}: the model has {} outputs but the labels in {} go up to {}", config_.source,
                                    config_.model.classes, data_source(false, true), data.train.classes - 1));
    if (data.test.images.rows != data.train.images.rows || data.test.images.cols != data.train.images.cols)
      throw ConfigError(fmt::format("{}: the test images in {} are {}x{} but the training images are {}x{}", config_.source,
                                    data_source(true), data.test.images.rows, data.test.images.cols,
                                    data.train.images.rows, data.train.images.cols));
    if (data.test.classes > config_.model.classes)
      throw ConfigError(fmt::format("{}: the model has {} outputs but the test labels in {} go up to {}", config_.source,
                                    config_.model.classes, data_source(true, true), data.test.classes - 1));
    if (config_.data.batch_size > data.train.images.count)
      throw ConfigError(fmt::format("{}: data.batch_size {} exceeds the {} training images", config_.source,
                                    config_.data.batch_size, data.train.images.count));
  }

  void resume(const io::Checkpoint& ckpt) {
    trainer_->load_state(without_data_parallel_ranks(without_feature_dtype(ckpt.tensors)));
    first_step_ = last_finite_step_ = trainer_->step();
    // Continue the metrics of the interrupted run in the same out_dir: its rows
    // up to the checkpoint, and its elapsed time.
    const auto csv = out_dir_ / "metrics.csv";
    if (std::filesystem::exists(csv)) {
      for (const auto& row : report::MetricsLog::read_csv(csv)) {
        if (row.step > first_step_) continue;
        metrics_.add(row);
        if (std::isfinite(row.elapsed_s)) elapsed_before_ = std::max(elapsed_before_, row.elapsed_s);
      }
    }
    spdlog::info("resumed from {} at step {}{}", config_.run.resume, trainer_->step(),
                 metrics_.rows().empty() ? "" : fmt::format(" (appending to {})", csv.string()));
  }

  void train_until_done() {
    const bool varying_lr = schedule_varies(config_.optim);
    report::ProgressPrinter progress(stdout, controls_.interactive_progress, config_.run.log_every);
    const auto start = Clock::now();
    auto window_start = start;
    std::int64_t window_first = trainer_->step();
    while (trainer_->step() < total_ && !stop_requested()) {
      const auto step = trainer_->step();
      auto until = std::min({next_multiple(step, config_.run.log_every, total_),
                             next_multiple(step, config_.run.eval_every, total_),
                             next_multiple(step, config_.run.checkpoint_every, total_)});
      if (varying_lr) {
        until = step + 1;  // a new learning rate every step
        trainer_->set_learning_rate(learning_rate_at(config_.optim, step, total_));
      }
      // One launch's worth of steps at a time, so a stop request takes effect
      // within one graph launch (the CPU backend runs them synchronously).
      for (auto s = step; s < until && !stop_requested();) {
        const auto n = std::min(until - s, launch_steps_);
        trainer_->train(n);
        s += n;
      }
      const auto now_step = trainer_->step();
      if (now_step < until) break;  // stopped
      const bool log_due = now_step % config_.run.log_every == 0 || now_step == total_;
      if (log_due) {
        const double loss = checked_loss(now_step);
        const double window_s = seconds_since(window_start);
        const double us_per_step = 1e6 * window_s / double(std::max<std::int64_t>(1, now_step - window_first));
        if (writes_outputs_)  // one progress line per run: rank 0's
          progress.update({now_step, total_, loss, double(config_.data.batch_size * ranks()) * 1e6 / us_per_step, us_per_step,
                         us_per_step * 1e-6 * double(total_ - now_step)});
        metrics_.add({now_step, loss, NAN, NAN, current_lr(now_step), elapsed_before_ + seconds_since(start)});
        window_start = Clock::now();
        window_first = now_step;
      }
      if (config_.run.eval_every > 0 && now_step % config_.run.eval_every == 0 && now_step < total_) {
        progress.finish();
        evaluate(now_step, elapsed_before_ + seconds_since(start));
        window_start = Clock::now();  // keep evaluation out of the step timing
      }
      if (config_.run.checkpoint_every > 0 && now_step % config_.run.checkpoint_every == 0) save_checkpoint(checkpoint_path());
    }
    progress.finish();
    summary_.seconds = seconds_since(start);
    summary_.steps = trainer_->step();
    summary_.interrupted = trainer_->step() < total_;
  }

  double current_lr(std::int64_t step) const { return learning_rate_at(config_.optim, std::max<std::int64_t>(0, step - 1), total_); }

  bool stop_requested() const { return controls_.stop_requested && controls_.stop_requested->load(); }

  double checked_loss(std::int64_t step) {
    const double loss = trainer_->last_loss();
    const std::int64_t first_bad = trainer_->first_nonfinite_step();
    if (first_bad >= 0 || !std::isfinite(loss))
      throw TrainingError(fmt::format("training loss is {} at step {}: the first non-finite loss was at step {} "
                                      "(checked every step); stopping; try a lower optim.lr or precision.weights: fp32",
                                      loss, step, first_bad >= 0 ? first_bad : step));
    last_finite_step_ = step;
    summary_.final_train_loss = loss;
    return loss;
  }

  EvalResult evaluate(std::int64_t step, double elapsed) {
    const auto eval_start = Clock::now();
    const EvalResult r = trainer_->evaluate();
    eval_seconds_ += seconds_since(eval_start);
    // A regression run (model.loss mse/l1) measures no accuracy (NaN): its eval is the test loss alone.
    if (std::isnan(r.accuracy))
      spdlog::info("eval at step {}: test loss {:.4f} ({} examples)", step, r.loss, r.examples);
    else
      spdlog::info("eval at step {}: test loss {:.4f}, test accuracy {:.2f}% ({} images)", step, r.loss,
                   100 * r.accuracy, r.examples);
    metrics_.add({step, NAN, r.loss, r.accuracy, current_lr(step), elapsed});
    return r;
  }

  std::filesystem::path checkpoint_path() const {
    if (!config_.run.checkpoint.empty()) return config_.run.checkpoint;
    return out_dir_ / "checkpoint.sgck";
  }

  // The trainer's state now, as a checkpoint (host copies of the device state).
  io::Checkpoint checkpoint_now() const {
    io::Checkpoint ckpt{trainer_->step(), config_.data.shuffle_seed, to_yaml(config_), trainer_->save_state()};
    // What predict/export need besides the config: the dtype of the features trained on (apps/saved_model.hpp).
    ckpt.tensors.push_back(feature_dtype_blob(feature_dtype_));
    if (data_parallel()) ckpt.tensors.push_back(data_parallel_ranks_blob(ranks()));
    return ckpt;
  }

  void save_checkpoint(const std::filesystem::path& path) {
    if (!writes_outputs_) return;  // one copy of the weights: rank 0's (every rank holds the same)
    const io::Checkpoint ckpt = checkpoint_now();
    io::save_checkpoint(path, ckpt);
    spdlog::info("checkpoint at step {} written to {}", ckpt.step, path.string());
  }

  // The run's last checkpoint, written (temp file, fsync, rename) on a worker
  // thread while the metrics are written and the trainer releases the GPU;
  // finish() waits for it. Nothing to write: an empty future.
  std::future<double> start_final_checkpoint(const std::filesystem::path& path) {
    if (!writes_outputs_) return {};
    auto ckpt = std::make_shared<const io::Checkpoint>(checkpoint_now());  // the device state, copied now
    return std::async(std::launch::async, [ckpt, path] {
      const auto start = Clock::now();
      io::save_checkpoint(path, *ckpt);
      return seconds_since(start);
    });
  }

  void finish() {
    std::future<double> checkpoint_written;
    std::filesystem::path final_checkpoint;
    if (summary_.interrupted) {
      spdlog::warn("interrupted at step {} of {}", summary_.steps, total_);
      final_checkpoint = checkpoint_path();
    } else {
      if (summary_.steps == first_step_ && first_step_ > 0)
        spdlog::warn("nothing to train: {} is already at step {} of {}", config_.run.resume, first_step_, total_);
      summary_.final_eval = evaluate(summary_.steps, elapsed_before_ + summary_.seconds);
      if (!config_.run.checkpoint.empty()) final_checkpoint = config_.run.checkpoint;
    }
    if (!final_checkpoint.empty()) checkpoint_written = start_final_checkpoint(final_checkpoint);
    const auto steps_here = summary_.steps - first_step_;  // this run's steps, not the resumed ones
    summary_.samples_per_second =
        summary_.seconds > 0 && steps_here > 0
            ? double(steps_here) * double(config_.data.batch_size * ranks()) / summary_.seconds
            : 0;
    // Nothing below needs the device: the trainer's memory, graphs and
    // handles go now, on a worker thread beside the checkpoint's write, and
    // with release_device_at_end the CUDA context too, instead of after
    // main(). A data-parallel rank releases its trainer here (its GPU is not
    // the worker's current device) and leaves the context to the exit.
    std::future<double> released;
    const bool release_context = controls_.release_device_at_end && !data_parallel() && on_cuda_;
    auto part_start = Clock::now();
    if (data_parallel()) {
      trainer_.reset();
      output_parts_.emplace_back("releasing the trainer (GPU memory, graphs, handles)", seconds_since(part_start));
    } else {
      released = std::async(std::launch::async, [this, release_context] {
        const auto start = Clock::now();
        trainer_.reset();
        if (release_context) release_cuda_device();
        return seconds_since(start);
      });
    }
    part_start = Clock::now();
    if (writes_outputs_) {
      metrics_.write(out_dir_);
      metrics_.write_loss_plot(out_dir_, fmt::format("{} ({})", config_.source, summary_.backend));
      output_parts_.emplace_back("metrics.csv, metrics.json, loss.svg", seconds_since(part_start));
    }
    if (released.valid())
      output_parts_.emplace_back(release_context ? "releasing the trainer and the CUDA context (worker thread)"
                                                 : "releasing the trainer (worker thread)",
                                 released.get());
    if (checkpoint_written.valid()) {
      const double write_seconds = checkpoint_written.get();  // rethrows the write's IoError
      output_parts_.emplace_back("checkpoint: serialise, write, fsync, rename (worker thread)", write_seconds);
      spdlog::info("checkpoint at step {} written to {}", summary_.steps, final_checkpoint.string());
    }
    if (summary_.interrupted) {
      spdlog::info("stopped: {} steps ({} in this run, {:.2f} s); not evaluated; resume with --set run.resume={}; "
                   "metrics and loss.svg in {}",
                   summary_.steps, steps_here, summary_.seconds, checkpoint_path().string(), out_dir_.string());
      return;
    }
    const std::string accuracy = std::isnan(summary_.final_eval.accuracy)
                                     ? std::string()
                                     : fmt::format("test accuracy {:.2f}%, ", 100 * summary_.final_eval.accuracy);
    spdlog::info("done: {} steps ({} in this run, {:.2f} s, {:.0f} samples/s); final train loss {:.4f}; {}test loss "
                 "{:.4f}; metrics and loss.svg in {}",
                 summary_.steps, steps_here, summary_.seconds, summary_.samples_per_second, summary_.final_train_loss,
                 accuracy, summary_.final_eval.loss, out_dir_.string());
  }

  bool data_parallel() const { return rank_launch_.data_parallel(); }
  std::int64_t ranks() const { return data_parallel() ? rank_launch_.world_size : 1; }

  const TrainConfig& config_;
  RunControls controls_;
  RankLaunch rank_launch_;
  bool writes_outputs_ = !rank_launch_.data_parallel() || rank_launch_.rank == 0;
  DataParallelGroup group_;  // data parallel: this rank's place (world_size 0 otherwise)
  std::filesystem::path out_dir_;
  std::unique_ptr<Trainer> trainer_;
  report::MetricsLog metrics_;
  TrainSummary summary_;
  std::int64_t total_ = 0;
  std::int64_t last_finite_step_ = 0;
  double eval_seconds_ = 0;  // time in trainer_->evaluate() (summary_.timing)
  std::vector<std::pair<std::string, double>> output_parts_;  // finish(): the outputs' parts (summary_.timing)
  bool on_cuda_ = false;  // the trainer runs on the CUDA backend (finish() may release the context)
  std::int64_t first_step_ = 0;      // the step resumed from (0 for a fresh run)
  double elapsed_before_ = 0;        // elapsed_s of the resumed run's last metrics row
  DType feature_dtype_ = DType::u8;  // of the training data: saved in checkpoints for predict/export
  std::int64_t launch_steps_ = 1;    // steps per trainer_->train call: one graph launch
};

}  // namespace

std::int64_t total_steps(const TrainConfig& config, std::int64_t train_rows) {
  if (config.run.steps > 0) return config.run.steps;
  return config.run.epochs * (train_rows / config.data.batch_size);
}

TrainSummary run_training(const TrainConfig& config, const RunControls& controls, const RankLaunch& rank_launch) {
  return TrainingLoop(config, controls, rank_launch).run();
}

}  // namespace sg::app
