// The CancellationToken's old home: it moved to engine/util/cancellation.h, below the kernels,
// so that they can check it too. The autograd and graph headers that take a token include this
// one, so code that spells it autograd::CancellationToken (the server, tests) keeps working.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_CANCELLATION_H_
#define GRADSERVE_ENGINE_AUTOGRAD_CANCELLATION_H_

#include "engine/util/cancellation.h"

namespace gradserve::autograd {

using CancellationToken = ::gradserve::CancellationToken;

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_CANCELLATION_H_
