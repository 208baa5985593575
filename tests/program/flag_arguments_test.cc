// Note [Flag spelling] and Note [Flags checked first] (program/flag_arguments.h): which
// arguments FlagArguments rewrites, and which it refuses. The executables' own tests
// (ServerFlagsTest, LoadCliTest) parse such arguments end to end.

#include "program/flag_arguments.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
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

absl::Status Checked(std::vector<std::string> in, std::vector<std::string> own = {}) {
  in.insert(in.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& s : in) argv.push_back(s.data());
  FlagArguments arguments(static_cast<int>(argv.size()), argv.data());
  return arguments.Check(own);
}

TEST(FlagCheckTest, WhatAbslParsesPasses) {
  EXPECT_TRUE(Checked({"--flag_spelling_test_count=3", "positional", "--flag-spelling-test-count",
                       "4", "-flag_spelling_test_switch", "--noflag_spelling_test_switch",
                       "--flag_spelling_test_switch=false", "-", "--", "--anything", "-x"})
                  .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_flag_spelling_test_count), 4);  // the values were parsed
  // absl's usage flags always pass; --flagfile and its kind leave everything to absl.
  EXPECT_TRUE(Checked({"--helpfull"}, {"flag_spelling_test_count"}).ok());
  EXPECT_TRUE(Checked({"--bogus", "--flagfile=/dev/null"}).ok());
}

TEST(FlagCheckTest, TheFirstBadFlagIsNamed) {
  const struct {
    std::vector<std::string> arguments;
    std::string message;
  } cases[] = {
      {{"--bogus=1"}, "unknown flag '--bogus=1'"},
      {{"--nobogus"}, "unknown flag '--nobogus'"},
      {{"--noflag_spelling_test_count"}, "unknown flag '--noflag_spelling_test_count'"},
      {{"-=3"}, "unknown flag '-=3'"},
      {{"--flag_spelling_test_count"}, "flag '--flag_spelling_test_count' is missing its value"},
      {{"--flag_spelling_test_count=abc"},
       "Illegal value 'abc' specified for flag 'flag_spelling_test_count'"},
      {{"--flag_spelling_test_count", "5x"},
       "Illegal value '5x' specified for flag 'flag_spelling_test_count'"},
      {{"--flag_spelling_test_count="},
       "Illegal value '' specified for flag 'flag_spelling_test_count'"},
      {{"--flag_spelling_test_switch=maybe"}, "Illegal value 'maybe'"},
      {{"--flag_spelling_test_count", "--", "3"},
       "flag '--flag_spelling_test_count' is missing its value"},
      {{"--noflag_spelling_test_switch=true"},
       "'--noflag_spelling_test_switch=true': the negative form of a bool flag takes no value"},
      {{"--flag_spelling_test_count=1", "--bogus", "--worse"}, "unknown flag '--bogus'"},
  };
  for (const auto& c : cases) {
    const absl::Status status = Checked(c.arguments);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(absl::StartsWith(status.message(), c.message)) << status;
  }
}

TEST(FlagCheckTest, OnlyTheCommandsOwnFlags) {
  const std::vector<std::string> own = {"flag_spelling_test_count"};
  EXPECT_TRUE(Checked({"--flag-spelling-test-count=2"}, own).ok());
  const absl::Status status = Checked({"--flag_spelling_test_switch"}, own);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "'--flag_spelling_test_switch' is not a flag of this command");
}

}  // namespace
}  // namespace gradserve
