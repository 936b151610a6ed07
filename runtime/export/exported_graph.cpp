#include "runtime/export/exported_graph.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg::exporting {
namespace {

// The value layer `index` reads as input `k`: "x" for the model's input, else "h<j>".
std::string operand(const GraphLayer& l, std::size_t k) {
  const int j = l.inputs.at(k);
  return j < 0 ? std::string("x") : fmt::format("h{}", j);
}

// An activation applied to `h`, as a function call.
std::string activation_call(const std::string& kind, const std::string& h) {
  if (kind == "relu") return fmt::format("F.relu({})", h);
  if (kind == "gelu") return fmt::format("F.gelu({})", h);
  if (kind == "gelu_tanh") return fmt::format("F.gelu({}, approximate='tanh')", h);
  if (kind == "silu") return fmt::format("F.silu({})", h);
  if (kind == "tanh") return fmt::format("torch.tanh({})", h);
  if (kind == "sigmoid") return fmt::format("torch.sigmoid({})", h);
  if (kind == "identity") return h;
  throw std::invalid_argument(fmt::format("layer '{}' has no PyTorch counterpart here to export to", kind));
}

}  // namespace

std::string graph_parameter_name(std::size_t index, const char* tensor) { return fmt::format("layer{}.{}", index, tensor); }

std::string torch_module_code(const ExportedGraph& m) {
  std::string init, forward;
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const GraphLayer& l = m.layers[i];
    const std::string h = operand(l, 0);
    std::string value;
    if (l.kind == "conv2d") {
      init += fmt::format("        self.layer{} = nn.Conv2d({}, {}, kernel_size={}, stride={}, padding={}{})\n", i, l.in,
                          l.out, l.kernel, l.stride, l.padding, l.bias.empty() ? ", bias=False" : "");
      value = fmt::format("self.layer{}({})", i, h);
    } else if (l.kind == "linear") {
      init += fmt::format("        self.layer{} = nn.Linear({}, {}{})\n", i, l.in, l.out, l.bias.empty() ? ", bias=False" : "");
      value = fmt::format("self.layer{}({})", i, h);
    } else if (l.kind == "layer_norm") {
      init += fmt::format("        self.layer{} = nn.LayerNorm([{}], eps={})\n", i, fmt::join(l.weight_shape, ", "),
                          l.eps);
      value = fmt::format("self.layer{}({})", i, h);
    } else if (l.kind == "batch_norm") {
      init += fmt::format("        self.layer{} = nn.BatchNorm{}d({}, eps={}, momentum={})\n", i, l.spatial ? 2 : 1,
                          l.in, l.eps, l.momentum);
      value = fmt::format("self.layer{}({})", i, h);
    } else if (l.kind == "max_pool2d") {
      value = fmt::format("F.max_pool2d({}, kernel_size={}, stride={})", h, l.kernel, l.stride);
    } else if (l.kind == "avg_pool2d") {
      value = fmt::format("F.avg_pool2d({}, kernel_size={}, stride={})", h, l.kernel, l.stride);
    } else if (l.kind == "global_avg_pool2d") {  // [N, C, 1, 1] flattened to [N, C], as stepgraph's layer does
      value = fmt::format("torch.flatten(F.adaptive_avg_pool2d({}, 1), 1)", h);
    } else if (l.kind == "flatten") {
      value = fmt::format("torch.flatten({}, 1)", h);
    } else if (l.kind == "dropout" || l.kind == "dropout2d") {
      value = fmt::format("{}  # {}(p={}): off at inference", h, l.kind, l.p);
    } else if (l.kind == "concat") {
      std::vector<std::string> parts;
      for (std::size_t k = 0; k < l.inputs.size(); ++k) parts.push_back(operand(l, k));
      value = fmt::format("torch.cat([{}], 1)", fmt::join(parts, ", "));
    } else if (l.kind == "add") {
      std::vector<std::string> terms;
      for (std::size_t k = 0; k < l.inputs.size(); ++k) terms.push_back(operand(l, k));
      value = fmt::format("{}", fmt::join(terms, " + "));
    } else {
      value = activation_call(l.kind, h);
    }
    forward += fmt::format("        h{} = {}\n", i, value);
  }
  return fmt::format(
      "import torch\n"
      "import torch.nn as nn\n"
      "import torch.nn.functional as F\n"
      "\n"
      "\n"
      "class StepgraphNet(nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "{}"
      "\n"
      "    def forward(self, x):  # x: [N, {}], scaled as in training\n"
      "{}"
      "        return h{}\n",
      init, fmt::join(m.input_shape, ", "), forward, m.layers.empty() ? 0 : m.layers.size() - 1);
}

}  // namespace sg::exporting
