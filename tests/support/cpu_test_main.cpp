// Entry point of every CPU test binary: doctest's, except that a run whose
// every case was skipped (SG_SKIP_CASE) exits 77, which ctest reports as
// "Skipped".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/support/case_skips.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return sg::test::exit_code_with_skips(context.run());
}
