// Entry point of every GPU test binary: skip visibly (exit 77, which ctest
// reports as "Skipped") when the machine has no usable CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "ops/cuda/cuda_check.hpp"

int main(int argc, char** argv) {
  if (!sg::cuda::device_available()) {
    std::printf("SKIPPED: %s needs a CUDA GPU and this machine has none\n", argv[0]);
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
