// A doctest binary with the test mains' skip rule, for test_case_skips.sh:
// each case is selected by name there (they do nothing useful on their own).
#include <doctest/doctest.h>

#include "tests/support/case_skips.hpp"

TEST_CASE("probe: skips") { SG_SKIP_CASE("this probe always skips"); }

TEST_CASE("probe: passes") { CHECK(1 + 1 == 2); }

TEST_CASE("probe: fails") { CHECK(1 + 1 == 3); }
