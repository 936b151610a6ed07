#pragma once
// safetensors (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the raw little-endian data. Written with
// nlohmann-json; tensors are f32 whatever the checkpoint stored (f16 weights
// are widened exactly), named as the state_dict of
// torch_sequential_text(model): "0.weight" [out, in], "0.bias" [out], ...
// __metadata__ holds the input scaling and that module's text.
#include <string>

#include "runtime/export/exported_mlp.hpp"

namespace sg::exporting {

std::string safetensors_bytes(const ExportedMlp& model);

}  // namespace sg::exporting
