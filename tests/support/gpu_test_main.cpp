// Entry point of every GPU test binary: skip visibly (exit 77, which ctest
// reports as "Skipped") when the machine has no usable CUDA device, and when
// every case that ran was skipped (SG_SKIP_CASE). Listing the cases (as
// doctest_discover_tests does at build time) needs no device. `--core-only`
// (test-only, issue 35; tests/CMakeLists.txt registers every GPU binary a
// second time with it, label gpu_core_only) runs every CudaProgram of the
// process with the core lowerings alone (runtime/core_only_switch.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/core_only_switch.hpp"
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
  std::vector<char*> args;  // argv without --core-only, which doctest does not know
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--core-only") == 0) {
      sg::force_core_only_for_tests(true);
      continue;
    }
    args.push_back(argv[i]);
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
  if (!only_lists(argc, argv) && !sg::cuda::device_available()) {
    std::printf("SKIPPED: %s needs a CUDA GPU and this machine has none\n", argv[0]);
    return 77;
  }
  doctest::Context context(argc, argv);
  return sg::test::exit_code_with_skips(context.run());
}
