#pragma once
// The in-graph fetch of one batch from a table of any element type the
// datasets hold (issue 23): idx = perm[(step mod (n/batch))*batch + i], then
// out[i, :] = table[idx, :] * scale + shift, converted to the output type.
// Tables: u8 (images, class labels), f16 or f32 (features, float targets);
// outputs: half, bfloat16, float, or i32 (class labels: scale 1, shift 0).
// The u8-images + u8-labels pair keeps its own fused kernel
// (launch_batch_fetch in kernels.hpp); this is the general one. With ranks > 1
// (data parallel, issue 25) it fetches rank `rank`'s `batch` rows of the
// global batch of ranks * batch rows, as launch_batch_fetch does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

template <typename In, typename Out>
void launch_table_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
                        const In* table, std::int64_t cols, float scale, float shift, Out* out, cudaStream_t stream,
                        std::int64_t rank = 0, std::int64_t ranks = 1);

}  // namespace sg::cuda
