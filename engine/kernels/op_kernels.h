// The machinery shared by the op implementations in elementwise.cc, reductions.cc, linalg.cc
// and broadcast.cc: PyTorch's dtype promotion, argument checks, the one strided walk over
// several operands, and the elementwise map and reduce kernels built on it. Autograd recording
// is the ops' own (engine/ops/record.h): nothing here knows of autograd.
//
// Errors: the checks throw StatusError(INVALID_ARGUMENT) whose message starts with the op's name
// and names the argument and shapes (Note [Errors inside the engine]); an invariant only a bug
// can break throws INTERNAL.
// Thread safety: stateless; every function is safe to call from any thread at once. The kernels
// write only into the output tensor they are given, which the caller owns.
//
// Note [Elementwise kernels]
// Every elementwise op runs MapKernel: a tight loop over contiguous memory when no operand is
// broadcast (the common case, and the only one for the one-element tensors of the chain_10k
// benchmark), otherwise ForEachRow's walk, which first merges dimensions that are contiguous for
// every operand and then runs the innermost row as a loop with per-operand steps (0 for a
// broadcast operand). The kernels are templates over the element types, so the functor inlines:
// no per-element indirect call. Reductions (ReduceKernel) use the same walk over the input, with
// the accumulator's strides 0 along the reduced dimensions.
//
// Note [Kernels for every device]
// MapKernel and ReduceKernel also run on GPUs: for a tensor on "cuda:N" they launch the CUDA
// kernels of engine/kernels/cuda/map_kernel.cuh and reduce_kernel.cuh with the same functors. So a
// functor given to them is a struct (not a lambda: nvcc cannot send a host lambda to the device)
// whose operator() is GS_HOST_DEVICE and which holds values only, and the files that call them
// are compiled by nvcc in a build with the CUDA backend (engine/CMakeLists.txt), where
// GS_CUDA_KERNELS is 1. A ReduceKernel's combine must also merge two accumulators
// (combine(AccT, AccT)), which the GPU does to join partial results and the CPU to join its
// lanes (Note [Reducing a row in lanes]). Elsewhere a GPU tensor
// reaching these kernels is an INTERNAL error, never a host read of device memory.

#ifndef GRADSERVE_ENGINE_KERNELS_OP_KERNELS_H_
#define GRADSERVE_ENGINE_KERNELS_OP_KERNELS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "engine/tensor/tensor.h"
#include "engine/tensor/working_buffer.h"
#include "engine/util/cancellation.h"
#include "engine/util/host_device.h"
#include "engine/util/parallel.h"

namespace gradserve::ops {

// --- Dtype promotion ---

// What kind of Python-like scalar takes part in an op (a "wrapped number" in PyTorch).
enum class ScalarKind { kNone, kBool, kInt, kFloat };

// PyTorch's promote_types: bool < int64 < float16, bfloat16 < float32 < float64, and float16
// with bfloat16 gives float32.
DType PromoteTypes(DType a, DType b);

// PyTorch's result_type: dimensioned tensors decide unless a 0-d tensor, and then a scalar, is
// of a higher category (bool < integer < floating); a float scalar counts as float32, PyTorch's
// default dtype. E.g. float32[3] and float64[] give float32; int64[3] and a float scalar give
// float32; float32[] and float64[] give float64. Undefined tensors are skipped.
DType ResultType(std::initializer_list<const Tensor*> tensors,
                 ScalarKind scalar = ScalarKind::kNone);

// ResultType of the floating tensors among `tensors` (others and undefined ones skipped), or
// nullopt if there is none.
std::optional<DType> FloatingResultType(absl::Span<const Tensor> tensors);

// --- Argument checks (each throws INVALID_ARGUMENT whose message starts with op) ---

void RequireDefined(const char* op, const char* arg, const Tensor& t);
// A floating dtype: "op: input must be floating (float32, float64, float16 or bfloat16), got
// int64".
void RequireFloating(const char* op, const char* arg, const Tensor& t);
// Not bool, for arithmetic PyTorch refuses on bool tensors (sub, neg, ...).
void RequireNotBool(const char* op, const char* arg, const Tensor& t);
// Both on one device.
void RequireSameDevice(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                       const Tensor& b);
// The broadcast shape of a and b, or "op: shapes [2, 3] and [4] cannot be broadcast".
Shape BroadcastShapesOrThrow(const char* op, absl::Span<const int64_t> a,
                             absl::Span<const int64_t> b);

// --- Dispatch ---

// As DispatchDType for float32, float64 and int64; bool is the caller's to have refused first
// (INTERNAL here).
template <typename Fn>
decltype(auto) DispatchNumeric(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt64:
      break;
    case DType::kBool:
      GS_CHECK_INTERNAL(false, "bool reached a numeric kernel");
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      GS_CHECK_INTERNAL(false, "a 16-bit float reached a float32 kernel");
      break;
  }
  return fn(int64_t{});
}

// --- The strided walk ---

// Strides that read a tensor of shape `from` as if broadcast to `to` (0 along broadcast and new
// leading dims). `from` must broadcast to `to`.
Strides BroadcastStrides(absl::Span<const int64_t> from_shape,
                         absl::Span<const int64_t> from_strides, absl::Span<const int64_t> to);

// Walks `shape` row by row for N operands with the given strides (in elements), calling
//   fn(const std::array<int64_t, N>& offsets, const std::array<int64_t, N>& steps, int64_t count)
// for each row: element j of the row is at offsets[k] + j * steps[k] in operand k. Dimensions
// of size 1 are dropped and neighbours that are contiguous for every operand are merged first,
// so a contiguous or simply broadcast tensor is walked in few, long rows. Nothing is called for
// an empty shape; a 0-d shape is one row of one element.
template <size_t N, typename Fn>
void ForEachRow(absl::Span<const int64_t> shape,
                const std::array<absl::Span<const int64_t>, N>& strides, Fn&& fn) {
  using Dims = absl::InlinedVector<int64_t, 6>;
  // An empty shape first, before any dim's stride is multiplied by its size: an empty tensor's
  // other dims may be of any size (2^63 - 1, found by the request fuzzer), and their strides
  // reach no memory.
  for (int64_t size : shape) {
    if (size == 0) return;
  }
  Dims sizes;
  std::array<Dims, N> steps;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = steps[k].back() == strides[k][d] * shape[d];
    }
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) steps[k].back() = strides[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) steps[k].push_back(strides[k][d]);
    }
  }
  std::array<int64_t, N> offsets{};
  std::array<int64_t, N> inner{};
  if (sizes.empty()) {
    fn(offsets, inner, int64_t{1});
    return;
  }
  const int64_t rank = static_cast<int64_t>(sizes.size());
  const int64_t count = sizes[rank - 1];
  for (size_t k = 0; k < N; ++k) inner[k] = steps[k][rank - 1];
  Dims index(rank, 0);
  while (true) {
    fn(offsets, inner, count);
    int64_t d = rank - 2;
    for (; d >= 0; --d) {
      if (++index[d] < sizes[d]) {
        for (size_t k = 0; k < N; ++k) offsets[k] += steps[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) offsets[k] -= steps[k][d] * (sizes[d] - 1);
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// out[0, n) = value, shared with idle helper threads for a long range (Note [Intra-op
// parallelism]) and counted in meter: the fills of Note [A gradient of one value].
template <typename T>
void FillShared(T* out, int64_t n, T value, WorkMeter& meter) {
  ForEachBlockShared(n, meter,
                     [&](int64_t begin, int64_t end) { std::fill(out + begin, out + end, value); });
}

// --- Elementwise map ---

// Throws INTERNAL: a GPU tensor reached a kernel in a file nvcc did not compile
// (Note [Kernels for every device]).
[[noreturn]] void ThrowNoDeviceKernel(const char* kernel, Device device);

}  // namespace gradserve::ops

#if GS_CUDA_KERNELS
#include "engine/kernels/cuda/map_kernel.cuh"
#include "engine/kernels/cuda/reduce_kernel.cuh"
#endif

namespace gradserve::ops {

namespace internal {
template <typename>
using TensorRef = const Tensor&;

template <typename OutT, typename... InTs, typename Fn, size_t... I>
void MapKernelImpl(const Tensor& out, Fn& fn, std::index_sequence<I...>, TensorRef<InTs>... ins) {
  if (out.device().type == DeviceType::kCUDA) {
#if GS_CUDA_KERNELS
    cuda_kernels::LaunchMap<OutT, InTs...>(out, fn, ins...);
    return;
#else
    ThrowNoDeviceKernel("MapKernel", out.device());
#endif
  }
  OutT* const o = out.data<OutT>();
  const std::tuple<const InTs*...> in{ins.template data<InTs>()...};
  const int64_t n = out.numel();
  WorkMeter meter;  // Note [Stopping a running op]
  // The flat loop needs out packed too: an in-place op writes into a strided view (Note
  // [Views written in place]) from a packed copy of its old values.
  if (out.is_contiguous() && ((ins.numel() == n && ins.is_contiguous()) && ...)) {
    if (n <= kWorkPerCheck) {  // never checked: the plain loop, for the many small tensors
      for (int64_t i = 0; i < n; ++i) o[i] = fn(std::get<I>(in)[i]...);
      return;
    }
    // Note [Intra-op parallelism]: a long loop is shared with idle helper threads.
    ForEachBlockShared(n, meter, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o[i] = fn(std::get<I>(in)[i]...);
    });
    return;
  }
  constexpr size_t N = 1 + sizeof...(InTs);
  [[maybe_unused]] const std::array<Strides, N - 1> bs{
      BroadcastStrides(ins.shape(), ins.strides(), out.shape())...};
  const std::array<absl::Span<const int64_t>, N> spans{absl::Span<const int64_t>(out.strides()),
                                                       absl::Span<const int64_t>(bs[I])...};
  ForEachRow<N>(
      out.shape(), spans,
      [&](const std::array<int64_t, N>& off, const std::array<int64_t, N>& step, int64_t count) {
        OutT* const row = o + off[0];
        const std::tuple<const InTs*...> rows{std::get<I>(in) + off[I + 1]...};
        // A long row (a broadcast operand's, as a sum's gradient) is shared too.
        if (step[0] == 1 && ((step[I + 1] == 0) && ...)) {
          // Every input holds one value along the row (a sum's gradient, expanded): fn runs
          // once and the row is filled, at the speed of a store where the strided loop below
          // reread the one value for each element.
          FillShared(row, count, static_cast<OutT>(fn(std::get<I>(rows)[0]...)), meter);
        } else if (step[0] == 1 && ((step[I + 1] == 1) && ...)) {
          ForEachBlockShared(count, meter, [&](int64_t begin, int64_t end) {
            for (int64_t j = begin; j < end; ++j) row[j] = fn(std::get<I>(rows)[j]...);
          });
        } else {
          ForEachBlockShared(count, meter, [&](int64_t begin, int64_t end) {
            for (int64_t j = begin; j < end; ++j) {
              row[j * step[0]] = fn(std::get<I>(rows)[j * step[I + 1]]...);
            }
          });
        }
      });
}
}  // namespace internal

// out[i] = fn(ins[i]...) for every element of out, where each input (of C++ element type InTs,
// matching its dtype) broadcasts to out's shape. out must be contiguous and either freshly
// allocated or an input of out's shape (each element is read before it is written, at the same
// index); all tensors on one device. See Note [Elementwise kernels] and
// Note [Kernels for every device]. On the host it checks the current cancellation token between
// blocks of elements (Note [Stopping a running op] in engine/util/cancellation.h) and may throw
// its status with out partly written.
template <typename OutT, typename... InTs, typename Fn>
void MapKernel(const Tensor& out, Fn&& fn, internal::TensorRef<InTs>... ins) {
  internal::MapKernelImpl<OutT, InTs...>(out, fn, std::index_sequence_for<InTs...>{}, ins...);
}

// --- Reduction ---

// Strides of a contiguous tensor of shape input_shape with the reduced dims set to size 1, and
// then stride 0 along those dims: where each input element's accumulator lives in a contiguous
// output, whether the output keeps the reduced dims (as 1) or drops them.
Strides ReducedOutputStrides(absl::Span<const int64_t> input_shape, absl::Span<const bool> reduced);

// Note [Reducing a row in lanes]
// A reduction into one accumulator (a sum of a whole tensor, a row's max) is a chain of
// dependent combines: each waits for the one before, so a float32 sum of 16M elements took
// 28 ms, a fifth of a 64 MiB request's time in the server, at one element per add's latency.
// ReduceRow instead combines element j into lane j % kReduceLanes, kReduceLanes independent
// accumulators that the CPU updates at once, then merges the lanes pairwise (lane l with
// l + 4, then with l + 2, then l + 1) and combines the result into the accumulator: 5 ms for
// that sum. Rows shorter than 2 * kReduceLanes keep the single chain. The order depends only on
// the row's length, so a reduction gives the same bits on every run. Float sums accumulate in
// double (ReduceKernel's AccT), where the lanes change a float32 sum's result only when the
// double sums round differently; PyTorch splits its sums too, in its own order. A row of
// kParallelMinUnits or more is first cut into chunks (Note [Intra-op parallelism]), each reduced
// in lanes to one partial result, and the partial results are combined in chunk order: an
// order that again depends on the row's length alone.
inline constexpr int64_t kReduceLanes = 8;

// combine(acc, x) over the count elements x of a row at row[j * step], in lanes (Note
// [Reducing a row in lanes]). init is the reduction's identity, which starts each lane. The
// elements are counted in meter, which checks the current token between blocks of a long row
// (Note [Stopping a running op]); the blocks are whole groups of lanes, so the order of the
// combines is the same as without them.
template <typename AccT, typename T, typename Combine>
AccT ReduceRow(AccT acc, const T* row, int64_t step, int64_t count, AccT init, Combine& combine,
               WorkMeter& meter) {
  if (count >= kParallelMinUnits) {
    // Note [Intra-op parallelism]: each chunk's lanes give one partial result, and the partial
    // results are combined in chunk order, so the bits do not depend on the threads.
    std::vector<AccT> partial(static_cast<size_t>(ParallelChunks(count)), init);
    ParallelBlocks(count, [&](int64_t chunk, int64_t first, int64_t last) {
      WorkMeter chunk_meter;
      partial[chunk] =
          ReduceRow(init, row + first * step, step, last - first, init, combine, chunk_meter);
    });
    for (const AccT& p : partial) acc = combine(acc, p);
    return acc;
  }
  if (count < 2 * kReduceLanes) {
    for (int64_t j = 0; j < count; ++j) acc = combine(acc, row[j * step]);
    meter.Add(count);
    return acc;
  }
  std::array<AccT, kReduceLanes> lanes;
  lanes.fill(init);
  static_assert(kWorkPerCheck % kReduceLanes == 0, "blocks must be whole groups of lanes");
  const int64_t grouped = count - count % kReduceLanes;
  ForEachBlock(grouped, meter, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; j += kReduceLanes) {
      for (int64_t l = 0; l < kReduceLanes; ++l) {
        lanes[l] = combine(lanes[l], row[(j + l) * step]);
      }
    }
  });
  for (int64_t j = grouped, l = 0; j < count; ++j, ++l) {
    lanes[l] = combine(lanes[l], row[j * step]);
  }
  for (int64_t width = kReduceLanes / 2; width > 0; width /= 2) {
    for (int64_t l = 0; l < width; ++l) lanes[l] = combine(lanes[l], lanes[l + width]);
  }
  return combine(acc, lanes[0]);
}

// For each element of the contiguous out: acc = init, then acc = combine(acc, x) over the input
// elements that reduce into it (`reduced` marks the reduced dims of input), then
// out = finalize(acc). T is the input's element type, OutT the output's; AccT the
// accumulator's (double for float32 sums, which keeps them accurate). On the host it checks the
// current cancellation token between blocks of elements, as MapKernel does.
template <typename T, typename AccT, typename OutT, typename Combine, typename Finalize>
void ReduceKernel(const Tensor& input, absl::Span<const bool> reduced, const Tensor& out, AccT init,
                  Combine&& combine, Finalize&& finalize) {
  if (out.device().type == DeviceType::kCUDA) {
#if GS_CUDA_KERNELS
    cuda_kernels::LaunchReduce<T, AccT, OutT>(input, reduced, out, init, combine, finalize);
    return;
#else
    ThrowNoDeviceKernel("ReduceKernel", out.device());
#endif
  }
  const int64_t n_out = out.numel();
  OutT* const o = out.data<OutT>();
  // Accumulate in out itself when it has the accumulator's type; otherwise in a buffer charged
  // to the request's budget (Note [Working buffers]).
  WorkingBuffer<AccT> buffer;
  AccT* a;
  if constexpr (std::is_same_v<AccT, OutT>) {
    a = o;
  } else {
    buffer = WorkingBuffer<AccT>(n_out);
    a = buffer.data();
  }
  WorkMeter meter;  // Note [Stopping a running op]
  ForEachBlock(n_out, meter, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) a[i] = init;
  });
  const Strides acc_strides = ReducedOutputStrides(input.shape(), reduced);
  const T* const in = input.data<T>();
  ForEachRow<2>(
      input.shape(), {absl::Span<const int64_t>(acc_strides), input.strides()},
      [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& step, int64_t count) {
        const T* const row = in + off[1];
        if (step[0] == 0) {
          a[off[0]] = ReduceRow(a[off[0]], row, step[1], count, init, combine, meter);
        } else {
          ForEachBlock(count, meter, [&](int64_t begin, int64_t end) {
            for (int64_t j = begin; j < end; ++j) {
              AccT& r = a[off[0] + j * step[0]];
              r = combine(r, row[j * step[1]]);
            }
          });
        }
      });
  ForEachBlock(n_out, meter, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) o[i] = finalize(a[i]);
  });
}

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_KERNELS_OP_KERNELS_H_
