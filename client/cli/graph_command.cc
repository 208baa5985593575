// gradserve graph FILE.json: draws a GradRequest's graph with Graphviz (Note [Graph pictures]).

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"

// --format is load's flag (load_command.cc): one flag of a name per program. Its default,
// "summary", means svg here.
ABSL_DECLARE_FLAG(std::string, format);
ABSL_FLAG(std::string, out, "-", "Where to write the picture ('-' for stdout).");
ABSL_FLAG(bool, with_gradients, false,
          "Run the request first (on --target) and label each backward call's edges to its "
          "inputs with the L2 norm of their gradients; on a failed request, the node its error "
          "names is drawn red with the message.");
ABSL_FLAG(std::string, dot_binary, "dot", "Graphviz's dot, for svg and png.");

// Note [Graph pictures]
// `gradserve graph` writes the request as Graphviz DOT: a box per leaf (filled blue when it
// requires grad; its dtype and shape), an ellipse per op ("op #i" and the op's name, as the
// server's messages name ops), an edge from each value's producer to each op that reads it
// (labelled with the value's name), and a diamond per backward call with solid edges from its
// roots and dashed edges to its inputs. A checkpoint's body is summarised in its label. With
// --with-gradients the request is sent first: the dashed edges carry |grad| (L2) of each
// input, or, if the call fails, the op or call that the status message names ("op #3",
// "call #1") is drawn red, with the message below the picture. svg and png are made by piping
// the DOT through Graphviz's `dot` (Debian's graphviz package).

namespace gradserve::cli {
namespace {

// A DOT string literal.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// The number after the first `prefix` in message ("op #3" -> 3), or -1.
int NumberAfter(const std::string& message, const std::string& prefix) {
  const size_t at = message.find(prefix);
  if (at == std::string::npos) return -1;
  int n = -1;
  for (size_t i = at + prefix.size(); i < message.size() && message[i] >= '0' && message[i] <= '9';
       ++i) {
    n = (n < 0 ? 0 : n) * 10 + (message[i] - '0');
    if (n > 1000000000) return -1;
  }
  return n;
}

struct Highlight {
  int op = -1;    // "op #N" in the error
  int call = -1;  // "call #N"
  std::string message;
};

std::string Dot(const v1::GradRequest& request, const client::GradResult* result,
                const Highlight& highlight) {
  std::ostringstream dot;
  dot << "digraph gradserve {\n  rankdir=LR;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
         "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  std::map<std::string, std::string> producer;  // value name -> node id
  const v1::Graph& graph = request.graph();
  for (int i = 0; i < graph.leaves_size(); ++i) {
    const v1::Leaf& leaf = graph.leaves(i);
    const std::string id = absl::StrCat("leaf", i);
    producer[leaf.name()] = id;
    dot << "  " << id << " [shape=box, style=filled, fillcolor="
        << (leaf.requires_grad() ? "\"#cfe2ff\"" : "\"#eeeeee\"") << ", label="
        << Quote(absl::StrCat(leaf.name(), "\n", client::DTypeName(leaf.value().dtype()), "[",
                              absl::StrJoin(leaf.value().shape(), ", "), "]",
                              leaf.requires_grad() ? "\nrequires grad" : ""))
        << "];\n";
  }
  for (int i = 0; i < graph.ops_size(); ++i) {
    const v1::Op& op = graph.ops(i);
    const std::string id = absl::StrCat("op", i);
    std::string label = absl::StrCat("op #", i, "\n", op.op());
    if (op.op() == "checkpoint") {
      absl::StrAppend(&label, "\n(body: ", op.body().ops_size(), " ops)");
    }
    if (op.no_grad()) absl::StrAppend(&label, "\nno_grad");
    dot << "  " << id << " [shape=ellipse, label=" << Quote(label);
    if (i == highlight.op) dot << ", style=filled, fillcolor=\"#f8d7da\", color=red, penwidth=2";
    dot << "];\n";
    for (const std::string& input : op.inputs()) {
      auto it = producer.find(input);
      dot << "  " << (it == producer.end() ? Quote(input) : it->second) << " -> " << id
          << " [label=" << Quote(input) << "];\n";
    }
    for (const std::string& output : op.outputs()) producer[output] = id;
  }
  for (int c = 0; c < request.calls_size(); ++c) {
    const v1::BackwardCall& call = request.calls(c);
    const std::string id = absl::StrCat("call", c);
    std::string label =
        absl::StrCat("call #", c, "\n", call.accumulate_grad() ? "backward" : "grad");
    if (call.create_graph()) absl::StrAppend(&label, "\ncreate_graph");
    dot << "  " << id << " [shape=diamond, label=" << Quote(label);
    if (c == highlight.call) dot << ", style=filled, fillcolor=\"#f8d7da\", color=red, penwidth=2";
    dot << "];\n";
    for (const std::string& root : call.roots()) {
      auto it = producer.find(root);
      dot << "  " << (it == producer.end() ? Quote(root) : it->second) << " -> " << id
          << " [label=" << Quote(root) << ", penwidth=1.5];\n";
    }
    std::vector<std::string> inputs(call.inputs().begin(), call.inputs().end());
    if (inputs.empty() && result != nullptr && c < static_cast<int>(result->calls.size())) {
      for (const client::Gradient& g : result->calls[c].gradients) inputs.push_back(g.name);
    }
    for (const std::string& input : inputs) {
      std::string edge_label = absl::StrCat("d/d ", input);
      if (result != nullptr && c < static_cast<int>(result->calls.size())) {
        const client::Gradient* g = result->calls[c].Find(input);
        if (g != nullptr && g->value.has_value()) {
          double sum = 0;
          for (double v : g->value->ToDoubles()) sum += v * v;
          absl::StrAppend(&edge_label, absl::StrFormat("\n|grad| %.4g", std::sqrt(sum)));
        } else if (g != nullptr) {
          absl::StrAppend(&edge_label, "\nnot connected");
        }
      }
      auto it = producer.find(input);
      dot << "  " << id << " -> " << (it == producer.end() ? Quote(input) : it->second)
          << " [style=dashed, constraint=false, color=\"#0d6efd\", label=" << Quote(edge_label)
          << "];\n";
    }
  }
  if (!highlight.message.empty()) {
    dot << "  label=" << Quote(highlight.message) << ";\n  labelloc=b;\n  fontcolor=red;\n";
  }
  dot << "}\n";
  return dot.str();
}

int RunGraph(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "gradserve graph: expected one FILE.json ('-' for stdin); see --help\n");
    return kExitUsage;
  }
  std::string format = absl::GetFlag(FLAGS_format);
  if (format == "summary") format = "svg";  // the flag's default (load's)
  if (format != "svg" && format != "png" && format != "dot") {
    std::fprintf(stderr, "gradserve graph: --format=%s: use svg, png or dot\n", format.c_str());
    return kExitUsage;
  }
  v1::GradRequest request;
  if (int code = ReadRequestFile("graph", args[0], &request); code != kExitOk) return code;

  std::optional<client::GradResult> result;
  Highlight highlight;
  if (absl::GetFlag(FLAGS_with_gradients)) {
    std::unique_ptr<client::Client> client = ConnectFromFlags("graph");
    if (client == nullptr) return kExitUsage;
    absl::StatusOr<v1::GradResponse> response =
        client->ComputeGradients(request, CallOptionsFromFlags());
    if (response.ok()) {
      absl::StatusOr<client::GradResult> r = client::FromProto(*response);
      if (!r.ok()) return ReportError("graph", r.status());
      result = *std::move(r);
    } else {
      const std::string message(response.status().message());
      highlight.message = absl::StrCat(absl::StatusCodeToString(response.status().code()), ": ",
                                       message.substr(0, 300));
      highlight.op = NumberAfter(message, "op #");
      highlight.call = NumberAfter(message, "call #");
      std::fprintf(stderr, "gradserve graph: the request failed: %s\n", highlight.message.c_str());
    }
  }
  const std::string dot = Dot(request, result ? &*result : nullptr, highlight);

  const std::string out = absl::GetFlag(FLAGS_out);
  if (format == "dot") {
    if (out == "-") {
      std::fwrite(dot.data(), 1, dot.size(), stdout);
      return kExitOk;
    }
    std::ofstream file(out, std::ios::binary | std::ios::trunc);
    file << dot;
    file.close();
    if (!file) return ReportError("graph", absl::PermissionDeniedError("cannot write " + out));
    return kExitOk;
  }
  // Graphviz does the drawing: `dot -Tsvg -o OUT`, the DOT on its standard input.
  std::string command = absl::StrCat(absl::GetFlag(FLAGS_dot_binary), " -T", format);
  if (out != "-") absl::StrAppend(&command, " -o '", out, "'");
  if (out.find('\'') != std::string::npos) {
    std::fprintf(stderr, "gradserve graph: --out must not contain a quote\n");
    return kExitUsage;
  }
  FILE* pipe = popen(command.c_str(), "w");
  if (pipe == nullptr) {
    return ReportError("graph", absl::UnavailableError("cannot run " + command));
  }
  std::fwrite(dot.data(), 1, dot.size(), pipe);
  const int status = pclose(pipe);
  if (status != 0) {
    std::fprintf(stderr,
                 "gradserve graph: '%s' failed (status %d); install Graphviz "
                 "(apt-get install graphviz) or use --format=dot\n",
                 command.c_str(), status);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command GraphCommand() {
  return Command{
      "graph", "draw a GradRequest's graph (svg, png or dot) with Graphviz",
      "Usage: gradserve graph [--format=svg|png|dot] [--out=FILE] [--with_gradients] FILE.json\n\n"
      "Draws the graph of the GradRequest in FILE.json ('-' for stdin): leaves (blue: requires\n"
      "grad), ops, and each backward call's roots and inputs. --with_gradients runs the request\n"
      "on --target first and labels the inputs' edges with their gradients' norms, or draws\n"
      "the op or call that a failed request's error names in red. svg and png need Graphviz's\n"
      "dot. Exit code 0 on success (also when the drawn request failed), 1 when dot fails, 2\n"
      "for bad arguments.",
      ConnectionFlags({"format", "out", "with_gradients", "dot_binary"}), RunGraph};
}

}  // namespace gradserve::cli
