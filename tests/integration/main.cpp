// The integration tests' main: doctest's, plus a run that selects no test case fails.
// CTest and meson run each tests/integration/*_test.cpp file in a process of its own through
// --source-file=*/<name>_test.cpp on one shared executable; a misspelt or renamed file would otherwise
// "pass" by running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

unsigned g_selected = 0;
bool g_query = false;  // --list-test-cases and the like: nothing is meant to run

struct selection_listener : doctest::IReporter {
  explicit selection_listener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override { g_query = true; }
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override { g_selected = s.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
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

REGISTER_LISTENER("selection", 1, selection_listener);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit() || g_query) return rc;
  if (rc == 0 && g_selected == 0) {
    std::fprintf(stderr,
                 "integration tests: the filters selected no test case (a --source-file that "
                 "names no file of this executable?)\n");
    return 1;
  }
  return rc;
}
