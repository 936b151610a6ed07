#pragma once
// Conversions between host float arrays and checkpoint blobs of any floating
// dtype (f16 and bf16 blobs keep 16-bit weights bit-exact across save and
// resume).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/io/checkpoint.hpp"

namespace sg {

// Name of the checkpoint entry holding the global step (i32 [1]); no model
// parameter or state value may use it (check_training_program).
inline constexpr const char* kStepEntry = "step";

io::TensorBlob blob_from_floats(std::string name, Shape shape, DType dtype, const std::vector<float>& values);
std::vector<float> floats_from_blob(const io::TensorBlob& blob);  // f32, f16 or bf16 blobs
io::TensorBlob step_blob(std::int64_t step);                       // kStepEntry, i32 [1]
std::int64_t step_from_blobs(const std::vector<io::TensorBlob>& blobs);  // throws if absent

// IEEE half <-> float on the host (round to nearest even).
std::uint16_t float_to_half_bits(float value);
float half_bits_to_float(std::uint16_t bits);

}  // namespace sg
