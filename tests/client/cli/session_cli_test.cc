// `gradserve session` end to end: the binary against a local server, from files: Forward,
// Extend, N Backward calls and Release; its exit codes and --help.

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::HasSubstr;

// x [3] requires grad; y = x * x; loss = sum(y), one call that keeps the graph.
constexpr char kForward[] = R"({
  "graph": {
    "leaves": [{"name": "x", "requires_grad": true,
                "value": {"dtype": "DTYPE_FLOAT32", "shape": [3], "values": {"doubles": [1, 2, 3]}}}],
    "ops": [{"op": "mul", "inputs": ["x", "x"], "outputs": ["y"]},
            {"op": "sum", "inputs": ["y"], "outputs": ["loss"]}]
  },
  "return_values": ["y"],
  "calls": [{"roots": ["loss"], "inputs": ["x"], "retain_graph": true}]
})";

// loss2 = sum(y * t); its call's gradient of x is 2 x t = [-2, 0, 6].
constexpr char kExtend[] = R"({
  "graph": {
    "leaves": [{"name": "t",
                "value": {"dtype": "DTYPE_FLOAT32", "shape": [3], "values": {"doubles": [-1, 0, 1]}}}],
    "ops": [{"op": "mul", "inputs": ["y", "t"], "outputs": ["yt"]},
            {"op": "sum", "inputs": ["yt"], "outputs": ["loss2"]}]
  },
  "return_values": ["loss2"],
  "calls": [{"roots": ["loss2"], "inputs": ["x"], "retain_graph": true}]
})";

// A file in the test's temporary directory, removed when it goes.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text) : path_(TestTempPath(name)) {
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

TEST(SessionCliTest, ForwardExtendBackwardCallsRelease) {
  LocalServer server;
  TempFile forward("forward.json", kForward), extend("extend.json", kExtend);
  CliRun run =
      RunGradserve(absl::StrCat("session --target=", server.target(), " --extend=", extend.path(),
                                " --backward_calls=3 ", forward.path()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("value y: float32[3] [1, 4, 9]"));
  EXPECT_THAT(run.out, HasSubstr("value loss2: float32[] 8"));
  EXPECT_THAT(run.out, HasSubstr("backward 2:"));
  EXPECT_THAT(run.out, HasSubstr("d/d x: float32[3] [2, 4, 6]"));   // loss
  EXPECT_THAT(run.out, HasSubstr("d/d x: float32[3] [-2, 0, 6]"));  // loss2
  EXPECT_THAT(run.out, HasSubstr("released"));
  EXPECT_EQ(server.server().service().sessions().size(), 0);
}

TEST(SessionCliTest, FailuresAndHelp) {
  LocalServer server;
  // Without retain_graph the second backward call fails, as in PyTorch; the session is
  // released all the same.
  std::string once = kForward;
  once.replace(once.find(R"(, "retain_graph": true)"), 22, "");
  TempFile forward("forward.json", once);
  CliRun run = RunGradserve(
      absl::StrCat("session --target=", server.target(), " --backward_calls=2 ", forward.path()));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("backward 1: FAILED_PRECONDITION"));
  EXPECT_EQ(server.server().service().sessions().size(), 0);
  EXPECT_EQ(RunGradserve(absl::StrCat("session --target=", server.target(), " --backward_calls=-1 ",
                                      forward.path()))
                .exit_code,
            2);
  EXPECT_EQ(RunGradserve("session /nonexistent.json").exit_code, 1);
  run = RunGradserve("session --help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.out, HasSubstr("--backward_calls"));
  EXPECT_THAT(run.out, HasSubstr("--extend"));
}

}  // namespace
}  // namespace gradserve::testing
