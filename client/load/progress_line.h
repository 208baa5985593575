// ProgressLine: the one live line a load run keeps redrawn on stderr (with \r): elapsed time,
// calls done, rate, errors and p99 so far.

#ifndef GRADSERVE_CLIENT_LOAD_PROGRESS_LINE_H_
#define GRADSERVE_CLIENT_LOAD_PROGRESS_LINE_H_

#include <cstdio>
#include <string>

#include "absl/time/time.h"
#include "client/load/result_recorder.h"

namespace gradserve::load {

// Thread safety: none; one thread draws (RunLoad's progress callback runs on its caller's).
class ProgressLine {
 public:
  // Draws on out only if enabled; see ShouldShow.
  ProgressLine(FILE* out, bool enabled) : out_(out), enabled_(enabled) {}

  // Whether to draw on stderr: it is a terminal and --quiet was not given.
  static bool ShouldShow(bool quiet);
  // The line's text (no \r), also for tests.
  static std::string Text(absl::Duration elapsed, const ProgressSnapshot& p);

  void Update(absl::Duration elapsed, const ProgressSnapshot& p);
  // Erases the line, so that the report starts on a clean one.
  void Finish();

 private:
  FILE* const out_;
  const bool enabled_;
  size_t last_length_ = 0;
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_PROGRESS_LINE_H_
