// How the resident-filter tensor-core convolution (ops/cuda/fast_paths/
// tensor_core_conv/conv_nhwc_resident.cu) splits the shipped CNNs' layers
// into units and blocks: host code, no GPU. The kernel itself is checked
// against the CPU reference in tests/kernels/test_conv_nhwc_mma.cpp.
#include <doctest/doctest.h>

#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_resident.hpp"

using sg::cuda::NhwcConvShape;
using sg::cuda::nhwc_conv::resident_split;

TEST_CASE("the resident convolution gives each image of a 14x14 layer one block of its own on 132 multiprocessors") {
  // mnist_cnn_fast's second convolution at batch 128 (32 -> 64 channels, 5x5) and its backward data pass
  // (the forward over dY: 64 -> 32 channels).
  const NhwcConvShape forward{128, 14, 14, 32, 64, 5, 5, 1, 2}, backward_data{128, 14, 14, 64, 32, 5, 5, 1, 2};
  for (const int bn : {32, 64}) {
    const auto split = resident_split(forward, bn, 132);
    CHECK(split.tile_rows == 14);
    CHECK(split.blocks == (bn == 64 ? 128 : 66));  // 64 channels: two column blocks share the 132
  }
  const auto data = resident_split(backward_data, 32, 132);
  CHECK(data.tile_rows == 14);
  CHECK(data.blocks == 128);
}

TEST_CASE("the resident convolution splits 28x28 images into units of whole rows and balances them over the blocks") {
  // wide_adam's 64 -> 64 3x3 layer at batch 64: 7 rows (196 pixels) a unit, 256 units over 132 blocks.
  const auto split = resident_split({64, 28, 28, 64, 64, 3, 3, 1, 1}, 64, 132);
  CHECK(split.tile_rows == 7);
  CHECK(split.blocks == 132);
  // Two multiprocessors: each block walks many units.
  const auto few = resident_split({64, 28, 28, 64, 64, 3, 3, 1, 1}, 64, 2);
  CHECK(few.tile_rows == 7);
  CHECK(few.blocks == 2);
}

TEST_CASE("the resident convolution refuses what does not fit its shared memory or its barriers") {
  // 64 rows of a 5x5 filter over 64 channels (205 KB) leave no room for two halos of four or more rows.
  CHECK(resident_split({128, 14, 14, 64, 32, 5, 5, 1, 2}, 64, 132).tile_rows == 0);
  // One mbarrier a row of taps, sixteen at most.
  CHECK(resident_split({1, 40, 40, 16, 16, 17, 17, 1, 8}, 32, 132).tile_rows == 0);
  // A small image is one unit even below four pieces: 7x7 = 49 pixels.
  const auto small = resident_split({128, 7, 7, 64, 128, 3, 3, 1, 1}, 64, 132);
  CHECK(small.tile_rows == 7);
  CHECK(small.blocks == 66);
}
