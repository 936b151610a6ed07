#pragma once
// A pooling problem's sizes in the kernels' index type I, shared by the max-
// and mean-pooling kernels (pooling.cu, avg_pooling.cu): 32-bit where every
// index fits (integer division and modulo in 64 bits cost several times
// more, and these kernels are mostly index arithmetic), 64-bit otherwise.
#include <climits>
#include <cstdint>

#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/pooling.hpp"

namespace sg::cuda {

template <typename I>
struct PoolSizes {
  I planes, h, w, kernel, stride, oh, ow;
  explicit PoolSizes(const PoolGeometry& g)
      : planes(I(g.planes)), h(I(g.h)), w(I(g.w)), kernel(I(g.kernel)), stride(I(g.stride)), oh(I(g.oh())),
        ow(I(g.ow())) {}
};

// Whether every index of `elements` (with a grid stride's overshoot) fits 32 bits.
inline bool fits_int32(std::int64_t elements) {
  return elements + std::int64_t(blocks_for(elements)) * kThreads < std::int64_t(INT32_MAX);
}
inline bool fits_int32(const PoolGeometry& g) { return fits_int32(g.planes * g.h * g.w); }

}  // namespace sg::cuda
