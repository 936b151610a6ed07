#pragma once
// A trained MLP as the exporters see it (issue 23): its dense layers in
// PyTorch nn.Linear's layout, the activation between them, the dropout
// (identity at eval, but it shifts nn.Sequential's indices) and the input
// scaling it was trained with. Filled from a checkpoint by apps/saved_model.
#include <cstdint>
#include <string>
#include <vector>

namespace sg::exporting {

struct DenseLayer {
  std::int64_t in = 0, out = 0;
  std::vector<float> weight;  // [out, in] row-major
  std::vector<float> bias;    // [out]
};

struct ExportedMlp {
  std::vector<DenseLayer> layers;
  std::string activation = "relu";  // relu | gelu | gelu_tanh | silu | tanh | sigmoid | identity
  double dropout = 0.0;             // > 0: an nn.Dropout after each hidden activation
  bool regression = false;          // outputs are values (no softmax)
  double input_scale = 1.0;         // the model sees x * input_scale + input_shift
  double input_shift = 0.0;
};

// nn.Sequential index of each Linear: per hidden layer one Linear, then the
// activation (none for identity), then nn.Dropout when dropout > 0.
std::vector<std::int64_t> torch_linear_indices(const ExportedMlp& model);
// "nn.Sequential(nn.Linear(784, 128), nn.ReLU(), ..., nn.Linear(128, 10))".
std::string torch_sequential_text(const ExportedMlp& model);
// The input scaling as code: "x * 0.00392 - 0.4242" (a negative shift
// subtracted, a zero shift or a unit scale left out; "x" for neither).
std::string input_scaling_text(double input_scale, double input_shift);
inline std::string input_scaling_text(const ExportedMlp& model) {
  return input_scaling_text(model.input_scale, model.input_shift);
}
// The PyTorch module of an activation ("nn.GELU(approximate='tanh')"), "" for
// identity; throws std::invalid_argument for one it does not know.
std::string torch_activation(const std::string& activation);

}  // namespace sg::exporting
