// Entry point of every GPU test binary: skip visibly (exit 77, which ctest
// reports as "Skipped") when the machine has no usable CUDA device, and when
// every case that ran was skipped (SG_SKIP_CASE). Listing the cases (as
// doctest_discover_tests does at build time) needs no device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "ops/cuda/cuda_check.hpp"
#include "tests/support/case_skips.hpp"

namespace {

bool only_lists(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    for (const char* query : {"--list-test-cases", "-ltc", "--list-test-suites", "-lts", "--count", "-c", "--help", "-h"})
      if (std::strcmp(argv[i], query) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!only_lists(argc, argv) && !sg::cuda::device_available()) {
    std::printf("SKIPPED: %s needs a CUDA GPU and this machine has none\n", argv[0]);
    return 77;
  }
  doctest::Context context(argc, argv);
  return sg::test::exit_code_with_skips(context.run());
}
