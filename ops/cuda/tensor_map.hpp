#pragma once
// TMA tensor maps (the driver's cuTensorMapEncodeTiled) for row-major fp16
// matrices, read and written by the copies in tma.cuh.
#include <cuda.h>

#include <cstdint>

namespace sg::cuda {

// A map of the row-major fp16 matrix `data` [rows][cols] whose boxes are
// `box_rows` rows of 64 halves, stored 128-byte swizzled in shared memory.
// Throws CudaError naming the shape when TMA cannot address it.
CUtensorMap fp16_tile_map(const void* data, std::int64_t rows, std::int64_t cols, int box_rows);

}  // namespace sg::cuda
