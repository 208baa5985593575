#include "client/load/load_result.h"

namespace gradserve::load {

double LoadResult::rate() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(count) / seconds : 0;
}

double LoadResult::bytes_per_second() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<double>(bytes_up + bytes_down) / seconds : 0;
}

}  // namespace gradserve::load
