// The shortest end-to-end use of the runtime: build the reference MLP
// (784-128-128-128-10, fp16, SGD lr 0.003, batch 32), capture one CUDA graph
// per training step, replay it 5000 times on MNIST batches, print the loss.
// Usage: replay_reference [MNIST_DIR=data/mnist]
#include <cstdio>

#include "models/mlp_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/data/idx_reader.hpp"

int main(int argc, char** argv) try {
  const char* dir = argc > 1 ? argv[1] : "data/mnist";
  sg::Dataset data{sg::data::load_split(dir, "train"), sg::data::load_split(dir, "t10k")};
  sg::MlpTraining model;  // what the graphs, initial weights and data bindings are built from
  model.mlp.layers = {784, 128, 128, 128, 10};
  model.mlp.batch = 32;
  model.mlp.weight_dtype = sg::DType::f16;
  model.optimizer = {0.003, 0.0, 0.0};
  sg::TrainerSpec spec;
  spec.program = sg::build_mlp_program(model, data.train.images.count, data.test.images.count, sg::ProgramTarget::cuda);
  sg::cuda::CudaTrainer trainer(spec, data);  // lowers the step, captures it once
  std::printf("%s, %zu CUDA graph nodes per step\n", trainer.description().c_str(), trainer.cuda_graph_nodes());
  for (int chunk = 0; chunk < 10; ++chunk) {
    trainer.train(500);  // 500 replays of the captured step
    std::printf("step %5lld  loss %.4f\n", static_cast<long long>(trainer.step()), trainer.last_loss());
  }
  const auto eval = trainer.evaluate();
  std::printf("test accuracy %.2f%%, test loss %.4f\n", 100 * eval.accuracy, eval.loss);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "replay_reference: %s\n", e.what());
  return 1;
}
