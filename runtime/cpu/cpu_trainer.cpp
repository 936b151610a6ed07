// The CPU reference backend behind the Trainer interface: the fallback when
// no GPU exists and the oracle the CUDA trainer is compared with.
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "graph/training_graph.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/epoch_schedule.hpp"
#include "runtime/param_init.hpp"
#include "runtime/tensor_blob.hpp"
#include "runtime/trainer.hpp"

namespace sg {

std::int64_t eval_batch_for(std::int64_t rows, std::int64_t wanted) {
  for (std::int64_t b = std::min(rows, wanted); b > 1; --b)
    if (rows % b == 0) return b;
  return 1;
}

namespace {

void load_split(CpuExecutor<float>& exec, const data::Split& split) {
  exec.tensor(names::images).u8 = split.images.pixels;
  exec.tensor(names::labels).u8 = split.labels.labels;
}

class CpuTrainer final : public Trainer {
 public:
  CpuTrainer(const TrainerSpec& spec, const Dataset& data)
      : train_(training_graph(spec, data)),
        eval_(eval_graph(spec, data)),
        schedule_(data.train.images.count, spec.mlp.batch, spec.shuffle_seed),
        eval_batches_(data.test.images.count / eval_.graph().node(0).attrs.batch) {
    load_split(train_, data.train);
    load_split(eval_, data.test);
    auto& eval_perm = eval_.tensor(names::perm).i32;
    std::iota(eval_perm.begin(), eval_perm.end(), 0);
    for (const auto& p : initial_parameters(spec.mlp.layers, spec.init_seed))
      train_.tensor(p.name).real = p.values;
  }

  std::string description() const override { return "cpu (f32 reference backend)"; }

  void train(std::int64_t steps) override {
    for (std::int64_t i = 0; i < steps; ++i) {
      if (auto perm = schedule_.permutation_if_changed(step_)) train_.tensor(names::perm).i32 = std::move(*perm);
      train_.run();
      ++step_;
    }
  }

  double last_loss() override { return train_.tensor(names::loss).real[0]; }

  EvalResult evaluate() override {
    for (ValueId p : train_.graph().values_with_role(Role::param)) {
      const auto& name = train_.graph().value(p).name;
      eval_.tensor(name).real = train_.tensor(name).real;
    }
    eval_.tensor(names::step).i32[0] = 0;
    const auto batch = eval_.graph().node(0).attrs.batch;
    double loss_sum = 0, correct = 0;
    for (std::int64_t b = 0; b < eval_batches_; ++b) {
      eval_.run();
      loss_sum += eval_.tensor(names::loss).real[0] * static_cast<double>(batch);
      correct += eval_.tensor(names::correct).i32[0];
    }
    const double n = static_cast<double>(eval_batches_ * batch);
    return {loss_sum / n, correct / n, eval_batches_ * batch};
  }

  void set_learning_rate(double lr) override { train_.graph().set_sgd_learning_rate(lr); }

  std::vector<io::TensorBlob> save_state() override {
    std::vector<io::TensorBlob> blobs;
    for (Role role : {Role::param, Role::state})
      for (ValueId id : train_.graph().values_with_role(role)) {
        const Value& v = train_.graph().value(id);
        if (v.name == names::step) continue;
        blobs.push_back(blob_from_floats(v.name, v.shape, DType::f32, train_.tensor(id).real));
      }
    blobs.push_back(step_blob(step_));
    return blobs;
  }

  void load_state(const std::vector<io::TensorBlob>& blobs) override {
    for (const auto& blob : blobs) {
      if (blob.name == names::step) continue;
      const auto id = train_.graph().find_value(blob.name);
      if (!id || train_.graph().value(*id).shape != blob.shape)
        throw std::invalid_argument(fmt::format("state entry '{}' {} does not match the model", blob.name,
                                                shape_string(blob.shape)));
      train_.tensor(*id).real = floats_from_blob(blob);
    }
    step_ = step_from_blobs(blobs);
    train_.tensor(names::step).i32[0] = static_cast<std::int32_t>(step_);
  }

  std::int64_t step() const override { return step_; }

 private:
  static Graph training_graph(TrainerSpec spec, const Dataset& data) {
    spec.mlp.dataset_rows = data.train.images.count;
    return build_training_stages(spec.mlp, spec.sgd, spec.fusion).fused;
  }
  static Graph eval_graph(TrainerSpec spec, const Dataset& data) {
    spec.mlp.dataset_rows = data.test.images.count;
    spec.mlp.batch = eval_batch_for(data.test.images.count, spec.eval_batch);
    return build_mlp_eval(spec.mlp);
  }

  CpuExecutor<float> train_;
  CpuExecutor<float> eval_;
  EpochSchedule schedule_;
  std::int64_t eval_batches_;
  std::int64_t step_ = 0;
};

}  // namespace

std::unique_ptr<Trainer> make_cpu_trainer(const TrainerSpec& spec, const Dataset& data) {
  return std::make_unique<CpuTrainer>(spec, data);
}

}  // namespace sg
