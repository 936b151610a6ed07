// Which cuBLASLt shapes autotune also times split 2-16 ways (cuda::long_reduction,
// ops/cuda/cublaslt_matmul.hpp): a long reduction into few outputs, never the
// fused update that reads C. Host arithmetic only: no GPU.
#include <doctest/doctest.h>

#include "ops/cuda/cublaslt_matmul.hpp"

using sg::cuda::MatmulShape;

namespace {

MatmulShape shape(std::int64_t m, std::int64_t n, std::int64_t k, bool reads_c = false) {
  MatmulShape s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.reads_c = reads_c;
  return s;
}

}  // namespace

TEST_CASE("split-K candidates are timed for a long reduction into few outputs, not for the fused update") {
  CHECK(sg::cuda::long_reduction(shape(128, 128, 3136)));     // mnist_cnn_fast's hidden layer after its flatten
  CHECK(sg::cuda::long_reduction(shape(64, 10, 12544)));      // a classifier over a 64 x 14 x 14 flatten
  CHECK_FALSE(sg::cuda::long_reduction(shape(128, 3136, 128)));  // that layer's data gradient: many outputs, short K
  CHECK_FALSE(sg::cuda::long_reduction(shape(32, 1024, 784)));   // an MLP's first layer: K below 4x the outputs' side
  CHECK_FALSE(sg::cuda::long_reduction(shape(1024, 1024, 65536)));  // long, but 1M outputs fill the GPU
  CHECK_FALSE(sg::cuda::long_reduction(shape(10, 64, 256, /*reads_c=*/true)));  // W -= lr * dW in the matmul
}
