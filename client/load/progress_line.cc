#include "client/load/progress_line.h"

#include <unistd.h>

#include "absl/strings/str_format.h"
#include "client/load/units.h"

namespace gradserve::load {

bool ProgressLine::ShouldShow(bool quiet) { return !quiet && isatty(STDERR_FILENO) == 1; }

std::string ProgressLine::Text(absl::Duration elapsed, const ProgressSnapshot& p) {
  std::string text = absl::StrFormat("[%6.1fs] done %d  rate %.1f/s  errors %d  p99 %s",
                                     absl::ToDoubleSeconds(elapsed), p.done, p.rate, p.errors,
                                     p.done > p.errors ? FormatLatency(p.p99_ns) : "-");
  if (p.done == 0 && p.warmup_done > 0)
    absl::StrAppendFormat(&text, "  (warm-up %d)", p.warmup_done);
  return text;
}

void ProgressLine::Update(absl::Duration elapsed, const ProgressSnapshot& p) {
  if (!enabled_) return;
  const std::string text = Text(elapsed, p);
  // Pads with spaces over the rest of a longer previous line.
  const size_t pad = last_length_ > text.size() ? last_length_ - text.size() : 0;
  std::fprintf(out_, "\r%s%*s", text.c_str(), static_cast<int>(pad), "");
  std::fflush(out_);
  last_length_ = text.size();
}

void ProgressLine::Finish() {
  if (!enabled_ || last_length_ == 0) return;
  std::fprintf(out_, "\r%*s\r", static_cast<int>(last_length_), "");
  std::fflush(out_);
  last_length_ = 0;
}

}  // namespace gradserve::load
