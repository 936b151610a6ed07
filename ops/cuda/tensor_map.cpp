// fp16_tile_map: cuTensorMapEncodeTiled through the runtime's driver entry
// point (no link against libcuda), every status checked.
#include "ops/cuda/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    SG_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !fn)
      throw CudaError("cuTensorMapEncodeTiled: the driver does not provide it (TMA needs CUDA 12 and sm_90)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

CUtensorMap fp16_tile_map(const void* data, std::int64_t rows, std::int64_t cols, int box_rows) {
  constexpr int kBoxCols = 64;  // 128 bytes: the swizzle span
  if (rows < box_rows || cols < kBoxCols || cols % 8 != 0 || box_rows <= 0 || box_rows > 256 ||
      reinterpret_cast<std::uintptr_t>(data) % 16 != 0)
    throw CudaError(fmt::format("TMA tensor map: fp16 [{}, {}] at {} with boxes of {} x {} (needs 16-byte aligned "
                                "rows, at least one box, at most 256 box rows)",
                                rows, cols, data, box_rows, kBoxCols));
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t row_pitch[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {kBoxCols, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(data), dims,
                                         row_pitch, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                         CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw CudaError(fmt::format("cuTensorMapEncodeTiled: status {} for fp16 [{}, {}], boxes of {} x {}", int(status),
                                rows, cols, box_rows, kBoxCols));
  return map;
}

}  // namespace sg::cuda
