#pragma once
// Which layers each layer of a model.sequential list reads (issue 37: a
// model graph, not only a chain). By default a layer reads the one before
// it; with `inputs` it reads the named earlier layers ("input": the model's
// input). A merge layer (`add`) reads two or more of the same shape. Layers
// read only earlier layers, so the list order is a topological order and no
// cycle can be written; every layer but the last must be read by some layer
// (only the last one's output goes to the loss).
#include <cstdint>
#include <vector>

#include "models/sequential.hpp"

namespace sg {

// The name by which `inputs` refers to the model's input.
inline constexpr const char* kModelInputName = "input";

// result[i]: the layers layer i reads, in its `inputs` order, as list indices
// (-1: the model's input). Throws SequentialShapeError naming the layer for a
// name used twice, an unknown or later input, a layer with the wrong number
// of inputs, and a layer no layer reads.
std::vector<std::vector<std::int64_t>> layer_inputs(const std::vector<LayerSpec>& layers);

}  // namespace sg
