// Client strings in the engine (Note [Quoting client strings] in engine/util/quote.h): Quote,
// LogField and ClientMessage, and graph::Validate's bound on names (Limits::max_name_bytes),
// whose errors quote the name cut and escaped.

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/graph/interpreter.h"
#include "engine/util/quote.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph {
namespace {

using ::gradserve::graph::testing::F64;
using ::gradserve::graph::testing::GradCall;
using ::gradserve::graph::testing::GraphBuilder;
using ::gradserve::graph::testing::MessageHas;

// Whether s has a byte that is not printable ASCII (a newline, an escape, a NUL, UTF-8).
bool HasRawByte(absl::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return true;
  }
  return false;
}

TEST(QuoteTest, QuotesEscapesAndCuts) {
  EXPECT_EQ(Quote("x"), "'x'");
  EXPECT_EQ(Quote(""), "''");
  EXPECT_EQ(Quote("a\nb"), "'a\\nb'");
  EXPECT_EQ(Quote("tab\there\r"), "'tab\\there\\r'");
  EXPECT_EQ(Quote(std::string("nul\0esc\x1b", 8)), "'nul\\x00esc\\x1b'");
  EXPECT_EQ(Quote("it's a\\b"), "'it\\'s a\\\\b'");
  EXPECT_EQ(Quote("caf\xc3\xa9"), "'caf\\xc3\\xa9'");  // not ASCII: escaped byte by byte
  EXPECT_EQ(Quote(std::string(64, 'n')), "'" + std::string(64, 'n') + "'");
  EXPECT_EQ(Quote(std::string(4096, 'n')), "'" + std::string(64, 'n') + "...' (4096 bytes)");
  EXPECT_EQ(Quote("abcdef", 3), "'abc...' (6 bytes)");
  // The worst case: every byte escaped, four bytes each.
  const std::string worst = Quote(std::string(1 << 20, '\n'));
  EXPECT_LE(worst.size(), 2 * kQuotedBytes + 32);
  EXPECT_FALSE(HasRawByte(worst));
}

TEST(QuoteTest, LogFieldHasNoSpaceAndNoQuotes) {
  EXPECT_EQ(LogField("square"), "square");
  EXPECT_EQ(LogField(""), "-");
  EXPECT_EQ(LogField("a b=c\nd"), "a\\x20b\\=c\\nd");
  EXPECT_EQ(LogField(std::string(100, 'i')), std::string(64, 'i') + "...(100_bytes)");
  EXPECT_FALSE(absl::StrContains(LogField("x\n2026-01-01T00:00:00 forged"), "\n"));
}

TEST(QuoteTest, ClientMessageIsOneShortLine) {
  EXPECT_EQ(ClientMessage("op #0 (mul -> 'h'): fine"), "op #0 (mul -> 'h'): fine");
  EXPECT_EQ(ClientMessage("two\nlines"), "two\\nlines");
  const std::string long_message(100'000, 'm');
  const std::string cut = ClientMessage(long_message);
  EXPECT_LE(cut.size(), kMaxMessageBytes);
  EXPECT_TRUE(absl::EndsWith(cut, "... (message cut, 100000 bytes)")) << cut;
  EXPECT_LE(ClientMessage(std::string(10'000, '\x01')).size(), kMaxMessageBytes);
}

struct LongName {
  std::string name;
  Graph graph;
  std::vector<std::string> message_parts;
};

// A graph for each place Validate reads a client's string, with `s` there.
std::vector<LongName> GraphsNaming(const std::string& s) {
  std::vector<LongName> cases;
  auto base = [] {
    GraphBuilder b;
    b.Leaf("x", F64({1, 2, 3}), true);
    return b;
  };
  cases.push_back({"LeafName", base().Leaf(s, F64({1})).Build(), {"leaf #1", "value name"}});
  cases.push_back({"OpName", base().Op(s, {"x"}, {"y"}).Build(), {"op #0", "op name"}});
  cases.push_back({"OutputName", base().Op("neg", {"x"}, {s}).Build(), {"op #0", "value name"}});
  cases.push_back({"InputName", base().Op("neg", {s}, {"y"}).Build(), {"op #0", "input"}});
  cases.push_back({"AttributeName",
                   base().Op("sum", {"x"}, {"y"}, ops::Attrs({{s, int64_t{0}}})).Build(),
                   {"op #0", "attribute name"}});
  cases.push_back({"StringAttribute",
                   base().Op("gelu", {"x"}, {"y"}, ops::Attrs({{"approximate", s}})).Build(),
                   {"op #0", "attribute 'approximate': string"}});
  cases.push_back(
      {"GradWrt",
       base()
           .Op("sum", {"x"}, {"l"})
           .Op("grad", {"l"}, {"g"}, ops::Attrs({{"wrt", std::vector<std::string>{"x", s}}}))
           .Build(),
       {"op #1", "attribute 'wrt'"}});
  cases.push_back({"HookKind",
                   base().Op("hook", {"x"}, {}, ops::Attrs({{"kind", s}})).Build(),
                   {"op #0", "attribute 'kind': string"}});
  return cases;
}

TEST(ClientStringsTest, NamesOverMaxNameBytesAreInvalidWithAShortMessage) {
  for (const size_t length : {size_t{257}, size_t{4096}, size_t{1} << 20}) {
    for (const LongName& c : GraphsNaming(std::string(length, 'n'))) {
      SCOPED_TRACE(c.name + " of " + std::to_string(length) + " bytes");
      absl::Status s = Validate(c.graph, Limits{}).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_TRUE(MessageHas(s, "max_name_bytes"));
      EXPECT_TRUE(MessageHas(s, "is longer than the limit of 256 bytes"));
      EXPECT_TRUE(MessageHas(s, absl::StrCat("...' (", length, " bytes)")));
      for (const std::string& part : c.message_parts) EXPECT_TRUE(MessageHas(s, part));
      EXPECT_LT(s.message().size(), 512u) << s;
    }
  }
  // At the limit is fine, and the limit is the caller's.
  Limits small;
  small.max_name_bytes = 4;
  EXPECT_TRUE(Validate(GraphBuilder().Leaf("abcd", F64({1})).Build(), small).ok());
  absl::Status s = Validate(GraphBuilder().Leaf("abcde", F64({1})).Build(), small).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(MessageHas(s,
                         "leaf #0 'abcde': value name 'abcde' is "
                         "longer than the limit of 4 bytes (max_name_bytes)"));
}

// Control bytes in names never reach a message raw, however the graph fails: in validation,
// or while it runs and during backward, where the names come back through Node labels.
TEST(ClientStringsTest, ControlBytesInNamesAreEscapedInMessages) {
  static constexpr char kEvil[] = "a\nb\r\x1b[31m\x00\x7f\xff!";
  int failed_cases = 0;
  for (const LongName& c : GraphsNaming(std::string(kEvil, sizeof(kEvil) - 1))) {
    SCOPED_TRACE(c.name);
    // Some of these graphs are good (a leaf may have that name); the others fail in
    // validation or in their op (gelu's approximate).
    auto s = RecordedGraph::Record(c.graph, Limits{});
    if (s.ok()) continue;
    ++failed_cases;
    EXPECT_FALSE(HasRawByte(s.status().message())) << s.status();
  }
  EXPECT_GE(failed_cases, 5);
  const std::string name = std::string("h\nforged", 8);
  // Runs, then fails in the op: the output's name is in the op's description.
  auto failed = RecordedGraph::Record(GraphBuilder()
                                          .Leaf("x", F64({1, 2, 3}), true)
                                          .Leaf(name, F64({1, 2}))
                                          .Op("add", {"x", name}, {name + "2"})
                                          .Build(),
                                      Limits{});
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(MessageHas(failed.status(), "'h\\nforged2'"));
  EXPECT_FALSE(HasRawByte(failed.status().message())) << failed.status();
  // A backward call naming a value that is not there.
  auto recorded = RecordedGraph::Record(
      GraphBuilder().Leaf(name, F64({1, 2, 3}), true).Op("sum", {name}, {"l"}).Build(), Limits{});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  auto result = (*recorded)->Backward(GradCall("l", {name + "\n"}));
  ASSERT_FALSE(result.ok());
  EXPECT_FALSE(HasRawByte(result.status().message())) << result.status();
  EXPECT_FALSE(HasRawByte((*recorded)->Value("no\nsuch").status().message()));
}

}  // namespace
}  // namespace gradserve::graph
