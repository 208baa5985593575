#include "server/metrics/text_format.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/metrics/histogram.h"

namespace gradserve::server::metrics {
namespace {

// Seconds from microseconds, exactly ("%.6f" of an integer number of microseconds).
std::string Seconds(int64_t us) {
  return absl::StrFormat("%d.%06d", us / 1000000, us % 1000000 < 0 ? 0 : us % 1000000);
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  if (value.size() > kMaxLabelValueBytes) value = value.substr(0, kMaxLabelValueBytes);
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c > 0x7e) {  // char may be signed: bytes >= 0x80 are negative
      out += '_';
    } else {
      out += c;
    }
  }
  return out;
}

void TextWriter::Family(absl::string_view name, absl::string_view type, absl::string_view help) {
  std::string escaped;  // HELP escapes backslash and newline
  for (char c : help) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  absl::StrAppend(&out_, "# HELP ", name, " ", escaped, "\n# TYPE ", name, " ", type, "\n");
}

void TextWriter::Series(absl::string_view name, Labels labels, absl::string_view le) {
  out_.append(name.data(), name.size());
  if (labels.size() > 0 || !le.empty()) {
    out_ += '{';
    bool first = true;
    for (const auto& [label, value] : labels) {
      absl::StrAppend(&out_, first ? "" : ",", label, "=\"", EscapeLabelValue(value), "\"");
      first = false;
    }
    if (!le.empty()) absl::StrAppend(&out_, first ? "" : ",", "le=\"", le, "\"");
    out_ += '}';
  }
  out_ += ' ';
}

void TextWriter::Sample(absl::string_view name, Labels labels, int64_t value) {
  Series(name, labels);
  absl::StrAppend(&out_, value, "\n");
}

void TextWriter::Sample(absl::string_view name, Labels labels, double value) {
  Series(name, labels);
  absl::StrAppend(&out_, absl::StrFormat("%.17g", value), "\n");
}

void TextWriter::Histogram(absl::string_view name, Labels labels, const int64_t* buckets,
                           int64_t sum_us) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  int64_t cumulative = 0;
  for (int i = 0; i < kBuckets; ++i) {
    cumulative += buckets[i];
    const std::string le =
        i + 1 < kBuckets ? absl::StrFormat("%g", static_cast<double>(kBucketBoundsUs[i]) / 1e6)
                         : std::string("+Inf");
    Series(bucket, labels, le);
    absl::StrAppend(&out_, cumulative, "\n");
  }
  Series(absl::StrCat(name, "_sum"), labels);
  absl::StrAppend(&out_, Seconds(sum_us), "\n");
  Series(absl::StrCat(name, "_count"), labels);
  absl::StrAppend(&out_, cumulative, "\n");
}

}  // namespace gradserve::server::metrics
