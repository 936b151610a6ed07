// One block per batch row: the row index comes from the permutation at the
// device-side step counter, then the row is converted element by element
// (the tables here are small feature rows or a few targets: a plain strided
// copy; the u8 image fast path with 16-byte loads is batch_fetch.cu).
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/table_fetch.hpp"

#include <type_traits>

namespace sg::cuda {
namespace {

__device__ __forceinline__ float load_float(std::uint8_t v) { return float(v); }
__device__ __forceinline__ float load_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float load_float(float v) { return v; }

template <typename Out>
__device__ __forceinline__ Out store_as(float v) {
  if constexpr (std::is_same_v<Out, std::int32_t>) return static_cast<std::int32_t>(v);
  else return from_float<Out>(v);
}

template <typename In, typename Out>
__global__ void table_fetch_kernel(const std::int32_t* perm, std::int64_t n, const std::int32_t* step,
                                   std::int64_t batch, const In* table, std::int64_t cols, float scale, float shift,
                                   Out* out, std::int64_t rank, std::int64_t ranks) {
  const std::int64_t i = blockIdx.x;
  const std::int64_t global = batch * ranks;  // this rank's slice of the global batch (ranks 1: the batch)
  const std::int64_t batches_per_epoch = n / global;
  const std::int64_t row = perm[(static_cast<std::int64_t>(*step) % batches_per_epoch) * global + rank * batch + i];
  const In* src = table + row * cols;
  Out* dst = out + i * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = store_as<Out>(load_float(src[c]) * scale + shift);
}

}  // namespace

template <typename In, typename Out>
void launch_table_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
                        const In* table, std::int64_t cols, float scale, float shift, Out* out, cudaStream_t stream,
                        std::int64_t rank, std::int64_t ranks) {
  const int threads = cols >= 256 ? 256 : cols >= 64 ? 64 : 32;
  table_fetch_kernel<In, Out><<<static_cast<unsigned>(batch), threads, 0, stream>>>(perm, n, step, batch, table, cols,
                                                                                    scale, shift, out, rank, ranks);
  SG_LAUNCH_CHECK("table_fetch_kernel");
}

#define SG_TABLE_FETCH(In, Out)                                                                                      \
  template void launch_table_fetch<In, Out>(const std::int32_t*, std::int64_t, const std::int32_t*, std::int64_t, \
                                            const In*, std::int64_t, float, float, Out*, cudaStream_t,     \
                                            std::int64_t, std::int64_t);
SG_TABLE_FETCH(std::uint8_t, __half)
SG_TABLE_FETCH(std::uint8_t, __nv_bfloat16)
SG_TABLE_FETCH(std::uint8_t, float)
SG_TABLE_FETCH(std::uint8_t, std::int32_t)
SG_TABLE_FETCH(__half, __half)
SG_TABLE_FETCH(__half, __nv_bfloat16)
SG_TABLE_FETCH(__half, float)
SG_TABLE_FETCH(float, __half)
SG_TABLE_FETCH(float, __nv_bfloat16)
SG_TABLE_FETCH(float, float)
#undef SG_TABLE_FETCH

}  // namespace sg::cuda
