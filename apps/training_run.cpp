#include "apps/training_run.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/lr_schedule.hpp"
#include "apps/report/metrics_log.hpp"
#include "apps/report/progress.hpp"
#include "runtime/data/idx_reader.hpp"
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
  TrainingLoop(const TrainConfig& config, const RunControls& controls)
      : config_(config), controls_(controls), out_dir_(config.run.out_dir) {}

  TrainSummary run() {
    const std::string resolved = to_yaml(config_);
    spdlog::info("resolved config ({}):\n{}", config_.source, resolved);
    io::write_file_atomically(out_dir_ / "config.yaml", resolved);

    Dataset data{data::load_split(config_.data.dir, "train", config_.data.train_limit),
                 data::load_split(config_.data.dir, "t10k", config_.data.test_limit)};
    check_data(data);
    spdlog::info("data: {} training and {} test images of {}x{} from {}", data.train.images.count,
                 data.test.images.count, data.train.images.rows, data.train.images.cols, config_.data.dir);
    std::string note;
    trainer_ = make_trainer(config_, data, note);
    if (!note.empty()) spdlog::warn("{}", note);
    summary_.backend = trainer_->description();
    spdlog::info("backend: {}", summary_.backend);
    total_ = total_steps(config_, data.train.images.count);
    if (!config_.run.resume.empty()) resume();
    train_until_done();
    finish();
    return summary_;
  }

 private:
  void check_data(const Dataset& data) const {
    const auto in = config_.model.layers.front();
    if (data.train.images.pixels_per_image() != in)
      throw ConfigError(fmt::format("{}: model.layers[0] is {} but the images in {} have {}x{} = {} pixels",
                                    config_.source, in, config_.data.dir, data.train.images.rows,
                                    data.train.images.cols, data.train.images.pixels_per_image()));
    if (data.train.classes > config_.model.layers.back())
      throw ConfigError(fmt::format("{}: the model has {} outputs but the labels in {} go up to {}", config_.source,
                                    config_.model.layers.back(), config_.data.dir, data.train.classes - 1));
    if (config_.data.batch_size > data.train.images.count)
      throw ConfigError(fmt::format("{}: data.batch_size {} exceeds the {} training images", config_.source,
                                    config_.data.batch_size, data.train.images.count));
  }

  void resume() {
    const auto ckpt = io::load_checkpoint(config_.run.resume);
    trainer_->load_state(ckpt.tensors);
    spdlog::info("resumed from {} at step {}", config_.run.resume, trainer_->step());
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
      trainer_->train(until - step);
      const auto now_step = trainer_->step();
      const bool log_due = now_step % config_.run.log_every == 0 || now_step == total_;
      if (log_due) {
        const double loss = checked_loss(now_step);
        const double window_s = seconds_since(window_start);
        const double us_per_step = 1e6 * window_s / double(std::max<std::int64_t>(1, now_step - window_first));
        progress.update({now_step, total_, loss, config_.data.batch_size * 1e6 / us_per_step, us_per_step,
                         us_per_step * 1e-6 * double(total_ - now_step)});
        metrics_.add({now_step, loss, NAN, NAN, current_lr(now_step), seconds_since(start)});
        window_start = Clock::now();
        window_first = now_step;
      }
      if (config_.run.eval_every > 0 && now_step % config_.run.eval_every == 0 && now_step < total_) {
        progress.finish();
        evaluate(now_step, seconds_since(start));
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
    if (!std::isfinite(loss))
      throw TrainingError(fmt::format("training loss is {} at step {} (last finite loss at step {}): stopping; "
                                      "try a lower optim.lr or precision.weights: fp32",
                                      loss, step, last_finite_step_));
    last_finite_step_ = step;
    summary_.final_train_loss = loss;
    return loss;
  }

  EvalResult evaluate(std::int64_t step, double elapsed) {
    const EvalResult r = trainer_->evaluate();
    spdlog::info("eval at step {}: test loss {:.4f}, test accuracy {:.2f}% ({} images)", step, r.loss, 100 * r.accuracy,
                 r.examples);
    metrics_.add({step, NAN, r.loss, r.accuracy, current_lr(step), elapsed});
    return r;
  }

  std::filesystem::path checkpoint_path() const {
    if (!config_.run.checkpoint.empty()) return config_.run.checkpoint;
    return out_dir_ / "checkpoint.sgck";
  }

  void save_checkpoint(const std::filesystem::path& path) {
    io::Checkpoint ckpt{trainer_->step(), config_.data.shuffle_seed, to_yaml(config_), trainer_->save_state()};
    io::save_checkpoint(path, ckpt);
    spdlog::info("checkpoint at step {} written to {}", ckpt.step, path.string());
  }

  void finish() {
    if (summary_.interrupted) {
      spdlog::warn("interrupted at step {} of {}", summary_.steps, total_);
      save_checkpoint(checkpoint_path());
    } else {
      summary_.final_eval = evaluate(summary_.steps, summary_.seconds);
      if (!config_.run.checkpoint.empty()) save_checkpoint(config_.run.checkpoint);
    }
    summary_.samples_per_second =
        summary_.seconds > 0 ? double(summary_.steps) * double(config_.data.batch_size) / summary_.seconds : 0;
    metrics_.write(out_dir_);
    metrics_.write_loss_plot(out_dir_, fmt::format("{} ({})", config_.source, summary_.backend));
    spdlog::info("done: {} steps in {:.2f} s ({:.0f} samples/s); final train loss {:.4f}; test accuracy {:.2f}%, "
                 "test loss {:.4f}; metrics and loss.svg in {}",
                 summary_.steps, summary_.seconds, summary_.samples_per_second, summary_.final_train_loss,
                 100 * summary_.final_eval.accuracy, summary_.final_eval.loss, out_dir_.string());
  }

  const TrainConfig& config_;
  RunControls controls_;
  std::filesystem::path out_dir_;
  std::unique_ptr<Trainer> trainer_;
  report::MetricsLog metrics_;
  TrainSummary summary_;
  std::int64_t total_ = 0;
  std::int64_t last_finite_step_ = 0;
};

}  // namespace

std::int64_t total_steps(const TrainConfig& config, std::int64_t train_rows) {
  if (config.run.steps > 0) return config.run.steps;
  return config.run.epochs * (train_rows / config.data.batch_size);
}

TrainSummary run_training(const TrainConfig& config, const RunControls& controls) {
  return TrainingLoop(config, controls).run();
}

}  // namespace sg::app
