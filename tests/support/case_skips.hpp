#pragma once
// A test case that cannot run here (a GPU other than the one its numbers are
// for, a kernel this device lacks) reports a skip, never a pass:
// SG_SKIP_CASE(why) prints one "SKIPPED: why" line and leaves the case. The
// test mains (cpu_test_main.cpp, gpu_test_main.cpp) then exit 77, which ctest
// reports as skipped, when every case they ran was skipped and none failed;
// ctest runs one case per process (doctest_discover_tests), so each skipped
// case shows as skipped on its own.
#include <string>

namespace sg::test {

void note_skipped_case(const std::string& why);

// The exit code for a doctest run that returned `run_result`: 77 when every
// test case that ran was skipped and none failed, else `run_result`.
int exit_code_with_skips(int run_result);

}  // namespace sg::test

#define SG_SKIP_CASE(why)                 \
  do {                                    \
    ::sg::test::note_skipped_case(why);   \
    return;                               \
  } while (0)
