// The CPU reference backend behind the Trainer interface: the fallback when
// no GPU exists and the oracle the CUDA trainer is compared with. Runs the
// program's graphs as given; values are bound through its DataBindings.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/epoch_schedule.hpp"
#include "runtime/tensor_blob.hpp"
#include "runtime/trainer.hpp"

namespace sg {
namespace {

// u8 images as bytes; f16/f32 features (own data) as the executor's floats;
// class labels as bytes, float targets as floats.
void load_split(CpuExecutor<float>& exec, const DataBindings& d, const data::Split& split) {
  auto& images = exec.tensor(d.images);
  const auto& pixels = split.images.pixels;
  if (split.images.dtype == DType::u8) {
    images.u8 = pixels;
  } else if (split.images.dtype == DType::f32) {
    images.real.resize(pixels.size() / sizeof(float));
    std::memcpy(images.real.data(), pixels.data(), images.real.size() * sizeof(float));
  } else {
    std::vector<std::uint16_t> halves(pixels.size() / sizeof(std::uint16_t));
    std::memcpy(halves.data(), pixels.data(), halves.size() * sizeof(std::uint16_t));
    images.real.resize(halves.size());
    for (std::size_t i = 0; i < halves.size(); ++i) images.real[i] = half_bits_to_float(halves[i]);
  }
  if (split.labels.target_width > 0) exec.tensor(d.labels).real = split.labels.targets;
  else exec.tensor(d.labels).u8 = split.labels.labels;
}

const TrainingProgram& checked(const TrainerSpec& spec, const Dataset& data) {
  check_training_program(spec.program, data.train.images.count, data.test.images.count);
  // Its all_reduce_mean nodes would average over this process alone.
  if (spec.program.train_data.ranks > 1)
    throw std::invalid_argument(fmt::format("data-parallel training over {} ranks needs the CUDA backend with NCCL; "
                                            "the CPU backend runs one process alone",
                                            spec.program.train_data.ranks));
  return spec.program;
}

class CpuTrainer final : public Trainer {
 public:
  CpuTrainer(const TrainerSpec& spec, const Dataset& data)
      : train_(checked(spec, data).train),
        eval_(spec.program.eval),
        train_data_(spec.program.train_data),
        eval_data_(spec.program.eval_data),
        schedule_(data.train.images.count, train_data_.batch, spec.shuffle_seed),
        eval_batches_(data.test.images.count / eval_data_.batch) {
    load_split(train_, train_data_, data.train);
    load_split(eval_, eval_data_, data.test);
    auto& eval_perm = eval_.tensor(eval_data_.perm).i32;
    std::iota(eval_perm.begin(), eval_perm.end(), 0);
    for (const auto& p : spec.program.init) {
      train_.tensor(p.name).real = p.values;
      train_.round_to_dtype(train_.graph().value_named(p.name));  // as a low-precision weight holds it
    }
    set_learning_rate(spec.program.learning_rate);
  }

  std::string description() const override { return "cpu (f32 reference backend)"; }

  void train(std::int64_t steps) override {
    for (std::int64_t i = 0; i < steps; ++i) {
      if (auto perm = schedule_.permutation_if_changed(step_)) train_.tensor(train_data_.perm).i32 = std::move(*perm);
      train_.run();
      ++step_;
      if (first_nonfinite_ < 0 && !std::isfinite(train_.tensor(train_data_.loss).real[0])) first_nonfinite_ = step_;
    }
  }

  double last_loss() override { return train_.tensor(train_data_.loss).real[0]; }

  EvalResult evaluate_cancellable(const EvalStopCheck& stop_requested) override {
    for (ValueId p : eval_.graph().values_with_role(Role::param)) {
      const auto& name = eval_.graph().value(p).name;
      eval_.tensor(p).real = train_.tensor(name).real;
    }
    eval_.tensor(eval_data_.step).i32[0] = 0;
    const auto batch = eval_data_.batch;
    double loss_sum = 0, correct = 0;
    std::int64_t b = 0;
    bool stopped = false;
    for (; b < eval_batches_; ++b) {
      if (stop_requested && stop_requested()) {
        stopped = true;
        break;
      }
      eval_.run();
      loss_sum += eval_.tensor(eval_data_.loss).real[0] * static_cast<double>(batch);
      if (eval_data_.correct) correct += eval_.tensor(*eval_data_.correct).i32[0];
    }
    const double n = static_cast<double>(std::max<std::int64_t>(1, b * batch));
    // A regression eval counts nothing correct: its accuracy is NaN (not measured).
    return {loss_sum / n, eval_data_.correct ? correct / n : NAN, b * batch, stopped};
  }

  void set_learning_rate(double lr) override { train_.set_learning_rate(lr); }

  std::vector<io::TensorBlob> save_state() override {
    std::vector<io::TensorBlob> blobs;
    for (Role role : {Role::param, Role::state})
      for (ValueId id : train_.graph().values_with_role(role)) {
        if (id == train_data_.step) continue;
        const Value& v = train_.graph().value(id);
        blobs.push_back(blob_from_floats(v.name, v.shape, DType::f32, train_.tensor(id).real));
      }
    blobs.push_back(step_blob(step_));
    return blobs;
  }

  void load_state(const std::vector<io::TensorBlob>& blobs) override {
    for (const auto& blob : blobs) {
      if (blob.name == kStepEntry) continue;
      const auto id = train_.graph().find_value(blob.name);
      if (!id || !restorable(*id) || train_.graph().value(*id).shape != blob.shape)
        throw std::invalid_argument(fmt::format("state entry '{}' {} does not match the model", blob.name,
                                                shape_string(blob.shape)));
      train_.tensor(*id).real = floats_from_blob(blob);
      train_.round_to_dtype(*id);
    }
    step_ = step_from_blobs(blobs);
    train_.tensor(train_data_.step).i32[0] = static_cast<std::int32_t>(step_);
  }

  std::int64_t step() const override { return step_; }
  std::int64_t first_nonfinite_step() override { return first_nonfinite_; }

 private:
  // Parameters and optimizer state; the step counter comes from kStepEntry.
  bool restorable(ValueId id) const {
    const Role role = train_.graph().value(id).role;
    return (role == Role::param || role == Role::state) && id != train_data_.step;
  }

  CpuExecutor<float> train_;
  CpuExecutor<float> eval_;
  DataBindings train_data_;
  DataBindings eval_data_;
  EpochSchedule schedule_;
  std::int64_t eval_batches_;
  std::int64_t step_ = 0;
  std::int64_t first_nonfinite_ = -1;
};

}  // namespace

std::unique_ptr<Trainer> make_cpu_trainer(const TrainerSpec& spec, const Dataset& data) {
  return std::make_unique<CpuTrainer>(spec, data);
}

}  // namespace sg
