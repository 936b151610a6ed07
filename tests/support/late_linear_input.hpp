#pragma once
// Test helper for linear kernels launched as dependent launches: the check
// that a kernel waits for the kernel that writes its input x.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <random>

namespace sg::test {

// launch(x, w, bias, y, stream) computes y[m,n] from x[m,k], w[n,k], bias[n].
using LinearLaunch = std::function<void(const __half* x, const __half* w, const __half* bias, __half* y, cudaStream_t)>;

// Runs `launch` on random fp16 operands on the default stream, then right
// behind a late copy of x into a poisoned buffer (run_behind_late_copy), on
// a stream and in a graph; CHECKs that both give the first run's bits.
void check_waits_for_late_x(std::int64_t m, std::int64_t n, std::int64_t k, std::mt19937_64& rng,
                            const LinearLaunch& launch);

}  // namespace sg::test
