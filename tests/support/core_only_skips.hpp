#pragma once
// The GPU suite's second run with `--core-only` (tests/support/gpu_test_main.cpp,
// label gpu_core_only) has no fast path: a case that asserts one (its launch
// counts, its lowering's name, the whole-step kernel) skips visibly there.
#include <string>

#include "runtime/core_only_switch.hpp"
#include "tests/support/case_skips.hpp"

#define SG_SKIP_IF_CORE_ONLY(what)                                                               \
  do {                                                                                           \
    if (::sg::core_only_forced_for_tests())                                                      \
      SG_SKIP_CASE(std::string("--core-only: this case checks a fast path (") + (what) + ")");   \
  } while (0)
