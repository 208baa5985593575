#include "engine/graph/diagnostics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradserve::graph {
namespace {

// "'a', 'b'".
std::string QuotedList(const std::vector<std::string>& names) {
  return absl::StrJoin(names, ", ", [](std::string* out, const std::string& name) {
    absl::StrAppend(out, "'", name, "'");
  });
}

}  // namespace

std::string DescribeOp(absl::string_view scope, int64_t index, const Op& op) {
  if (!op.outputs.empty()) {
    return absl::StrCat(std::string(scope), "op #", index, " (", op.op, " -> '", op.outputs[0],
                        "')");
  }
  if (!op.inputs.empty()) {
    return absl::StrCat(std::string(scope), "op #", index, " (", op.op, " on '", op.inputs[0],
                        "')");
  }
  return absl::StrCat(std::string(scope), "op #", index, " (", op.op, ")");
}

std::string BodyScope(absl::string_view scope, int64_t index, const Op& op) {
  return absl::StrCat(DescribeOp(scope, index, op), " body: ");
}

std::string NodeLabel(absl::string_view scope, int64_t index, const Op& op) {
  return absl::StrCat(std::string(scope), "op #", index, " ", QuotedList(op.outputs), " = ", op.op);
}

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(std::string(context), ": ", std::string(status.message())));
}

}  // namespace gradserve::graph
