// Training on real MNIST with the CPU backend, and bit-exact resume.
#include <doctest/doctest.h>

#include "runtime/data/idx_reader.hpp"
#include "runtime/trainer.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::cpu_spec;
using sg::test::MlpTrainerSpec;

namespace {

Dataset small_mnist() {
  return {data::load_split(sg::test::mnist_dir_or_skip(), "train", 2000),
          data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 1000)};
}

MlpTrainerSpec small_spec() {
  MlpTrainerSpec spec;
  spec.mlp.layers = {784, 64, 10};
  spec.mlp.batch = 32;
  spec.optimizer = {0.1, 0.0, 0.0};
  return spec;
}

double mean_loss(Trainer& t, int steps) {
  double sum = 0;
  for (int i = 0; i < steps; ++i) {
    t.train(1);
    sum += t.last_loss();
  }
  return sum / steps;
}

}  // namespace

TEST_CASE("the 784-64-10 MLP learns 2,000 real MNIST images on the CPU") {
  const Dataset data = small_mnist();
  auto trainer = make_cpu_trainer(cpu_spec(small_spec(), data), data);
  const double first = mean_loss(*trainer, 10);
  trainer->train(240);
  const double last = mean_loss(*trainer, 50);
  MESSAGE("mean loss of the first 10 steps " << first << ", of steps 250-300 " << last);
  CHECK(first > 1.5);  // about ln(10) = 2.3 at initialisation
  CHECK(last < 0.5);
  const EvalResult eval = trainer->evaluate();
  MESSAGE("test accuracy " << eval.accuracy << " loss " << eval.loss << " on " << eval.examples);
  CHECK(eval.examples == 1000);
  CHECK(eval.accuracy > 0.80);
}

TEST_CASE("resuming from saved state continues bit-exactly (200 == 100 + save + load + 100)") {
  const Dataset data = small_mnist();
  MlpTrainerSpec spec = small_spec();
  spec.optimizer = {0.05, 0.9, 1e-4};  // momentum: velocities must be saved too

  const auto run = sg::test::check_cpu_resume(spec, data, 200, 100);
  // 62 batches per epoch: the run crossed epoch boundaries, so reshuffles were exercised.
  CHECK(run.straight->step() == 200);
}
