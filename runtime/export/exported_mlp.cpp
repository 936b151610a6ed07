#include "runtime/export/exported_mlp.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace sg::exporting {

std::string torch_activation(const std::string& a) {
  if (a == "relu") return "nn.ReLU()";
  if (a == "gelu") return "nn.GELU()";
  if (a == "gelu_tanh") return "nn.GELU(approximate='tanh')";
  if (a == "silu") return "nn.SiLU()";
  if (a == "tanh") return "nn.Tanh()";
  if (a == "sigmoid") return "nn.Sigmoid()";
  if (a == "identity") return "";
  throw std::invalid_argument(fmt::format("model.activation '{}' has no PyTorch module here to export to", a));
}

std::vector<std::int64_t> torch_linear_indices(const ExportedMlp& m) {
  const std::int64_t per_hidden = 1 + (torch_activation(m.activation).empty() ? 0 : 1) + (m.dropout > 0 ? 1 : 0);
  std::vector<std::int64_t> out;
  for (std::size_t l = 0; l < m.layers.size(); ++l) out.push_back(static_cast<std::int64_t>(l) * per_hidden);
  return out;
}

std::string torch_sequential_text(const ExportedMlp& m) {
  const std::string act = torch_activation(m.activation);
  std::string s = "nn.Sequential(";
  for (std::size_t l = 0; l < m.layers.size(); ++l) {
    s += fmt::format("{}nn.Linear({}, {})", l ? ", " : "", m.layers[l].in, m.layers[l].out);
    if (l + 1 == m.layers.size()) break;
    if (!act.empty()) s += ", " + act;
    if (m.dropout > 0) s += fmt::format(", nn.Dropout({})", m.dropout);
  }
  return s + ")";
}

std::string input_scaling_text(double scale, double shift) {
  std::string s = scale == 1.0 ? "x" : fmt::format("x * {}", scale);
  if (shift > 0) s += fmt::format(" + {}", shift);
  if (shift < 0) s += fmt::format(" - {}", -shift);
  return s;
}

}  // namespace sg::exporting
