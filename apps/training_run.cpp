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
#include "apps/memory_estimate.hpp"
#include "apps/resume_check.hpp"
#include "apps/run_lock.hpp"
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

// The resolved config for the log: at most a screenful (a model.layers list
// of thousands of entries is one very long line), the rest left to the file.
std::string config_for_log(const std::string& yaml, const std::filesystem::path& full) {
  constexpr std::size_t kMaxLines = 100, kMaxWidth = 160;
  std::string shown;
  std::size_t lines = 0, start = 0;
  while (start < yaml.size()) {
    auto end = yaml.find('\n', start);
    if (end == std::string::npos) end = yaml.size();
    if (lines < kMaxLines) {
      const auto line = yaml.substr(start, std::min(end - start, kMaxWidth));
      shown += line + (end - start > kMaxWidth ? " ...\n" : "\n");
    }
    ++lines;
    start = end + 1;
  }
  if (lines > kMaxLines) shown += fmt::format("... {} more lines\n", lines - kMaxLines);
  if (lines > kMaxLines || shown.size() < yaml.size()) shown += fmt::format("(the full config: {})\n", full.string());
  return shown;
}

class TrainingLoop {
 public:
  TrainingLoop(const TrainConfig& config, const RunControls& controls, const RankLaunch& rank_launch)
      : config_(config),
        controls_(controls),
        rank_launch_(rank_launch),
        out_dir_(config.run.out_dir),
        launch_steps_(std::max<std::int64_t>(1, config.backend.options.steps_per_launch)) {}

  TrainSummary run() {
    // Before any work: a bad output path or an out_dir in use must not cost a whole run.
    if (writes_outputs_) claim_outputs();
    if (!config_.run.resume.empty()) resume_from_ = load_resume_point(config_, rank_launch_.world_size);
    // The model alone (tables of one batch), before the data is read: a model
    // that cannot fit the host fails here instead of in an allocation after
    // the data load. The GPU is asked only after the data load: asking now
    // would start the CUDA context on this thread instead of beside the load.
    check_memory(data_shape_before_loading(config_), config_.backend.kind != "cpu" || data_parallel(), false, false);
    // The CUDA start-up (driver, context, cuBLASLt) begins on worker threads
    // now, once the output paths and the resume checkpoint are known to be
    // good, so reading the data overlaps it. A data-parallel rank starts
    // none: that would land on GPU 0 for every rank; its trainer selects its own GPU.
    std::future<DeviceWarmup> device_ready;
    if (!data_parallel()) device_ready = start_device_warmup(config_);
    const std::string resolved = to_yaml(config_);
    if (data_parallel()) {  // every rank checks in (same world size and resolved config) before any work
      const auto start = Clock::now();
      group_ = join_data_parallel_run(config_, rank_launch_, resolved);
      summary_.timing.add("data-parallel rendezvous (every rank, NCCL id)", seconds_since(start));
    }
    if (writes_outputs_)
      spdlog::info("resolved config ({}):\n{}", config_.source, config_for_log(resolved, out_dir_ / "config.yaml"));

    Dataset data = data_parallel() ? load_dataset(config_)
                                   : load_dataset_while_device_starts(config_, std::move(device_ready), summary_.timing);
    check_data(data);
    const bool cuda = data_parallel() || config_.backend.kind == "cuda" ||
                      (config_.backend.kind == "auto" && cuda_backend_usable());
    check_memory(data_shape_of(data), cuda, true, true);
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
    for (const auto& [fast_path, why] : trainer_->declined_fast_paths())
      spdlog::info("fast path {} declined: {}", fast_path, why);
    total_ = total_steps(config_, data.train.images.count / ranks());  // epochs of global batches of ranks x batch rows
    if (resume_from_) resume(data.train.images.count / ranks());
    // Every check passed and the trainer stands: from here the run has outputs.
    if (writes_outputs_) {
      io::write_file_atomically(out_dir_ / "config.yaml", resolved);
      new_folders_.keep();
    }
    if (controls_.training_started) controls_.training_started->store(true);
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
  // The out_dir (created if missing, removed again if this run fails before
  // it writes an output), locked against a second run writing into it, and
  // the checkpoint's folder.
  void claim_outputs() {
    new_folders_.create(out_dir_, "run.out_dir");
    lock_.emplace(out_dir_);
    const auto checkpoint = checkpoint_path();
    if (std::filesystem::is_directory(checkpoint))
      throw io::IoError(fmt::format("{} {}: is a folder, expected a file path", checkpoint_key(), checkpoint.string()));
    new_folders_.create(checkpoint.parent_path(), checkpoint_key());
    // A config written for the old rule (a path relative to the working
    // folder that repeats run.out_dir) now lands one level deeper: say so.
    const std::filesystem::path given = config_.run.checkpoint;
    const auto inside_out_dir = given.lexically_normal().lexically_relative(out_dir_.lexically_normal());
    if (!given.empty() && given.is_relative() && !inside_out_dir.empty() && *inside_out_dir.begin() != ".." &&
        inside_out_dir != given.lexically_normal())
      spdlog::warn("run.checkpoint {} is relative, so it goes under run.out_dir: {} (for {}, give run.checkpoint: {})",
                   given.string(), checkpoint.string(), (out_dir_ / inside_out_dir).string(), inside_out_dir.string());
  }

  std::string checkpoint_key() const {
    return config_.run.checkpoint.empty() ? "the checkpoint in run.out_dir" : "run.checkpoint";
  }

  // Refuses (ConfigError naming the model key and the GB) a run whose
  // estimated memory exceeds the host's or (with `ask_gpu`) the GPU's; warns
  // above half when `warn`.
  void check_memory(const DataShape& shape, bool cuda, bool ask_gpu, bool warn) const {
    const auto need = estimate_run_memory(config_, shape, cuda);
    // A data-parallel rank's GPU is selected by its trainer: only the host is checked here.
    const auto available = available_memory(ask_gpu && cuda && !data_parallel());
    const auto warnings = check_memory_fits(config_, need, available, shape.loaded_bytes);
    if (warn)
      for (const auto& warning : warnings) spdlog::warn("{}", warning);
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

  void resume(std::int64_t train_rows) {
    const auto& ckpt = resume_from_->checkpoint;
    for (const auto& warning :
         resume_trajectory_warnings(config_, *resume_from_, total_, total_steps(resume_from_->saved, train_rows)))
      spdlog::warn("{}", warning);
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
    resume_from_.reset();  // its tensors are in the trainer now
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
        if (!evaluate(now_step, elapsed_before_ + seconds_since(start))) break;  // stopped
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

  // The test set's loss (and accuracy), logged and recorded; nullopt when a
  // stop request ended it early (within one eval batch).
  std::optional<EvalResult> evaluate(std::int64_t step, double elapsed) {
    const auto eval_start = Clock::now();
    const EvalResult r = trainer_->evaluate_cancellable([this] { return stop_requested(); });
    eval_seconds_ += seconds_since(eval_start);
    if (r.stopped) {
      spdlog::info("evaluation at step {} stopped after {} test examples", step, r.examples);
      return std::nullopt;
    }
    // A regression run (model.loss mse/l1) measures no accuracy (NaN): its eval is the test loss alone.
    if (std::isnan(r.accuracy))
      spdlog::info("eval at step {}: test loss {:.4f} ({} examples)", step, r.loss, r.examples);
    else
      spdlog::info("eval at step {}: test loss {:.4f}, test accuracy {:.2f}% ({} images)", step, r.loss,
                   100 * r.accuracy, r.examples);
    metrics_.add({step, NAN, r.loss, r.accuracy, current_lr(step), elapsed});
    return r;
  }

  // run.checkpoint, a relative one under run.out_dir (so a run given another
  // out_dir never overwrites the config's checkpoint); OUT_DIR/checkpoint.sgck without one.
  std::filesystem::path checkpoint_path() const {
    const std::filesystem::path given = config_.run.checkpoint;
    if (given.empty()) return out_dir_ / "checkpoint.sgck";
    return given.is_absolute() ? given : out_dir_ / given;
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
    // One copy of the weights: rank 0's (every rank holds the same weights; batch_norm's
    // running statistics come from each rank's own batches: these are rank 0's), with
    // every rank's ZeRO-1 shares gathered first (a collective: every rank is here).
    trainer_->gather_shards();
    if (!writes_outputs_) return;
    const io::Checkpoint ckpt = checkpoint_now();
    io::save_checkpoint(path, ckpt);
    spdlog::info("checkpoint at step {} written to {}", ckpt.step, path.string());
  }

  // The run's last checkpoint, written (temp file, fsync, rename) on a worker
  // thread while the metrics are written and the trainer releases the GPU;
  // finish() waits for it. Nothing to write: an empty future.
  std::future<double> start_final_checkpoint(const std::filesystem::path& path) {
    trainer_->gather_shards();  // every rank, as save_checkpoint
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
    if (!summary_.interrupted) {
      if (summary_.steps == first_step_ && first_step_ > 0)
        spdlog::warn("nothing to train: {} is already at step {} of {}", config_.run.resume, first_step_, total_);
      if (const auto eval = evaluate(summary_.steps, elapsed_before_ + summary_.seconds)) summary_.final_eval = *eval;
      else summary_.interrupted = true;  // stopped during the final evaluation: a stopped run like any other
    }
    if (summary_.interrupted) {
      spdlog::warn("interrupted at step {} of {}", summary_.steps, total_);
      final_checkpoint = checkpoint_path();
    } else if (!config_.run.checkpoint.empty()) {
      final_checkpoint = checkpoint_path();
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
      metrics_.write_loss_plot(out_dir_, fmt::format("{} ({})", config_.source, summary_.backend),
                               report::loss_plot_scale(config_.run.loss_plot_scale));
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
  NewFolders new_folders_;        // destroyed after lock_: the lock file goes first
  std::optional<RunLock> lock_;   // the out_dir's, held by the run that writes outputs
  std::optional<ResumePoint> resume_from_;
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
