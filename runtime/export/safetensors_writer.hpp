#pragma once
// safetensors (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the raw little-endian data. Written with
// nlohmann-json; tensors are f32 whatever the checkpoint stored (but batch
// norm's num_batches_tracked, an I64 scalar as in PyTorch; f16 weights
// are widened exactly). An MLP's are named as the state_dict of
// torch_sequential_text(model): "0.weight" [out, in], "0.bias" [out], ...; a
// model.sequential network's as that of torch_module_code(model):
// "layer0.weight", ... __metadata__ holds the input scaling and the module.
#include <string>

#include "runtime/export/exported_graph.hpp"
#include "runtime/export/exported_mlp.hpp"

namespace sg::exporting {

std::string safetensors_bytes(const ExportedMlp& model);
std::string safetensors_bytes(const ExportedGraph& model);

}  // namespace sg::exporting
