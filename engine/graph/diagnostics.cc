#include "engine/graph/diagnostics.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/util/quote.h"

namespace gradserve::graph {
namespace {

// "'a', 'b'", each name quoted (Note [Quoting client strings]).
std::string QuotedList(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ", [](std::string* out, const std::string& name) {
    absl::StrAppend(out, Quote(name));
  });
}

// The op's name as the client wrote it: bare, as in "op #3 (mul -> 'h')", when it is made of
// the characters op names are made of (as every known op's is), quoted otherwise.
std::string OpName(const Op& op) {
  const bool plain =
      !op.op.empty() && op.op.size() <= kQuotedBytes &&
      absl::c_all_of(op.op, [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
  return plain ? op.op : Quote(op.op);
}

}  // namespace

std::string DescribeOp(absl::string_view scope, int64_t index, const Op& op) {
  if (!op.outputs.empty()) {
    return absl::StrCat(std::string(scope), "op #", index, " (", OpName(op), " -> ",
                        Quote(op.outputs[0]), ")");
  }
  if (!op.inputs.empty()) {
    return absl::StrCat(std::string(scope), "op #", index, " (", OpName(op), " on ",
                        Quote(op.inputs[0]), ")");
  }
  return absl::StrCat(std::string(scope), "op #", index, " (", OpName(op), ")");
}

std::string BodyScope(absl::string_view scope, int64_t index, const Op& op) {
  return absl::StrCat(DescribeOp(scope, index, op), " body: ");
}

std::string NodeLabel(absl::string_view scope, int64_t index, const Op& op) {
  if (op.outputs.empty() && !op.inputs.empty()) {
    return absl::StrCat(std::string(scope), "op #", index, " ", Quote(op.inputs[0]), " = ",
                        OpName(op));
  }
  return absl::StrCat(std::string(scope), "op #", index, " ", QuotedList(op.outputs), " = ",
                      OpName(op));
}

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(std::string(context), ": ", std::string(status.message())));
}

}  // namespace gradserve::graph
