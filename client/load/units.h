// Human-readable figures for the load tester's reports and progress line.

#ifndef GRADSERVE_CLIENT_LOAD_UNITS_H_
#define GRADSERVE_CLIENT_LOAD_UNITS_H_

#include <cstdint>
#include <string>

namespace gradserve::load {

// "850 ns", "123.4 us", "1.234 ms", "2.50 s".
std::string FormatLatency(int64_t ns);
// "512 B", "1.50 KiB", "64.00 MiB", "1.20 GiB".
std::string FormatBytes(double bytes);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_UNITS_H_
