// The HTML report of a load run (`gradserve load --html FILE`): one self-contained page with
// the run's figures, a latency histogram and a latency-over-time chart drawn as inline SVG. It
// uses no script and loads nothing from the network.

#ifndef GRADSERVE_CLIENT_LOAD_HTML_REPORT_H_
#define GRADSERVE_CLIENT_LOAD_HTML_REPORT_H_

#include <string>

#include "client/load/load_result.h"

namespace gradserve::load {

std::string HtmlReport(const LoadResult& result);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_HTML_REPORT_H_
