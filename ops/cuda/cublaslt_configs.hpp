#pragma once
// The configurations cuBLASLt can run one matmul with, beyond its heuristic's
// short list: every tile, stage count, thread-block cluster shape, custom option
// and CTA swizzle of the algorithm ids the heuristic named, as cublasLtMatmulAlgoCheck
// accepts them. The heuristic ranks by a model of the kernel; at batch 256 its
// first pick for the fused SGD matmul (W read as C, written as D) ran 129 us
// where another configuration of the same algorithm id ran 108 us (8192 x 8192 x
// 256 on an H100, docs/performance.md section 23), so autotuning times these too.
#include <cublasLt.h>

#include <cstddef>
#include <string>
#include <vector>

namespace sg::cuda {

struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // D shares C's layout
};

// The heuristic's candidates first (its order), then the other configurations
// of their algorithm ids that fit in `workspace_bytes`, without repeats.
std::vector<cublasLtMatmulAlgo_t> candidate_configs(cublasLtHandle_t handle, const LtDescriptors& desc,
                                                    const std::vector<cublasLtMatmulAlgo_t>& heuristic,
                                                    std::size_t workspace_bytes);

// An algorithm's configuration as cuBLASLt numbers it, for launch labels:
// "algorithm 21, tile 20, stages 8" (+ ", split-K 8" where the reduction is split).
std::string describe_config(const cublasLtMatmulAlgo_t& algo);

// The heuristic's algorithms with the reduction split 2, 4, 8 or 16 ways (the
// partials reduced in the compute type by a second pass, deterministic), as
// cublasLtMatmulAlgoCheck accepts them, without repeats of `heuristic`: for a
// long reduction into few output tiles (long_reduction in cublaslt_matmul.hpp).
std::vector<cublasLtMatmulAlgo_t> split_k_configs(cublasLtHandle_t handle, const LtDescriptors& desc,
                                                  const std::vector<cublasLtMatmulAlgo_t>& heuristic,
                                                  std::size_t workspace_bytes);

}  // namespace sg::cuda
