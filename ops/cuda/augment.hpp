#pragma once
// Training-batch augmentation on the GPU (issue 37): x [n, channels, h, w]
// -> y, each example translated (fill where it moves in from outside) and
// flipped as ops/augment_draws.hpp draws it, the CPU reference's contract
// (graph/ops/augment_images.cpp). The step comes from the device step
// counter, so a replayed graph draws the step's own choices.
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

struct AugmentGeometry {
  std::int64_t n = 0, channels = 0, h = 0, w = 0;
  std::int64_t translate = 0;
  bool flip = false;
  float fill = 0.f;
  std::uint64_t seed = 0;
  std::int64_t example_offset = 0;
};

template <typename T>
void launch_augment_images(const T* x, const std::int32_t* step, const AugmentGeometry& g, T* y, cudaStream_t stream);

}  // namespace sg::cuda
