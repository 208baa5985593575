// Note [Flag spelling] (engine/util/flag_spelling.h): which arguments FlagArguments rewrites.
// The executables' own tests (ServerFlagsTest, LoadCliTest) parse such arguments end to end.

#include "engine/util/flag_spelling.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, flag_spelling_test_count, 0, "a flag of FlagSpellingTest");
ABSL_FLAG(bool, flag_spelling_test_switch, false, "a flag of FlagSpellingTest");

namespace gradserve {
namespace {

std::vector<std::string> Spelled(std::vector<std::string> in) {
  std::vector<char*> argv;
  for (std::string& s : in) argv.push_back(s.data());
  FlagArguments arguments(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(arguments.argv()[arguments.argc()], nullptr);
  return std::vector<std::string>(arguments.argv(), arguments.argv() + arguments.argc());
}

TEST(FlagSpellingTest, HyphenatedNamesOfFlagsAreSpelledAsDeclared) {
  EXPECT_EQ(Spelled({"prog-name", "--flag-spelling-test-count=3", "-flag-spelling-test-switch",
                     "--flag-spelling-test-count", "5-6"}),
            (std::vector<std::string>{"prog-name", "--flag_spelling_test_count=3",
                                      "-flag_spelling_test_switch", "--flag_spelling_test_count",
                                      "5-6"}));
}

TEST(FlagSpellingTest, EverythingElseIsLeftAsTyped) {
  const std::vector<std::string> as_typed = {
      "prog",
      "--flag_spelling_test_count=4",      // declared spelling
      "--flag-spelling-test-count-x=1",    // no flag either way
      "--not-a-flag=with-a-value",         // no flag: value untouched too
      "positional-argument",               // not a flag
      "-",                                 // a lone dash
      "--flag_spelling_test_count=a-b-c",  // the value is not a name
      "--",                                // the end of the flags
      "--flag-spelling-test-count=7"};     // after it, an argument as any other
  EXPECT_EQ(Spelled(as_typed), as_typed);
}

}  // namespace
}  // namespace gradserve
