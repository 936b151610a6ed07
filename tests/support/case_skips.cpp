// Counts the test cases that ran and those that called SG_SKIP_CASE, through a
// doctest listener (test_case_start fires once per case; subcases re-enter).
#include "tests/support/case_skips.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <set>

namespace sg::test {
namespace {

struct CaseCounts {
  int started = 0;
  const doctest::TestCaseData* current = nullptr;
  std::set<const doctest::TestCaseData*> skipped;
};

CaseCounts& counts() {
  static CaseCounts c;
  return c;
}

struct CaseSkipListener : doctest::IReporter {
  explicit CaseSkipListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    ++counts().started;
    counts().current = &tc;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("sg_case_skips", 1, CaseSkipListener);

void note_skipped_case(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  counts().skipped.insert(counts().current);
}

int exit_code_with_skips(int run_result) {
  const CaseCounts& c = counts();
  if (c.skipped.empty()) return run_result;
  std::printf("%zu of %d test cases skipped\n", c.skipped.size(), c.started);
  return run_result == 0 && int(c.skipped.size()) == c.started ? 77 : run_result;
}

}  // namespace sg::test
