#include "engine/kernels/basic_kernels.h"

#include <cmath>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "engine/device/device_registry.h"
#include "engine/kernels/functors.h"
#include "engine/kernels/op_kernels.h"
#include "engine/tensor/tensor_kernels.h"
#include "engine/util/host_device.h"

namespace gradserve {

// Functors of the GPU paths below (Note [Kernels for every device] in engine/kernels/op_kernels.h):
// namespace-scope structs holding values only, so nvcc can instantiate them as CUDA kernels.
namespace basic_kernels_internal {

// Every element set to value (a MapKernel without inputs).
template <typename T>
struct FillWith {
  T value;
  GS_HOST_DEVICE T operator()() const { return value; }
};

// a + b (AccumulateInto, AddSameShape).
template <typename T>
struct AddPair {
  GS_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};

// The NaN check as a reduction in T: the accumulator is NaN once any element was (x != x is
// true only for NaN), and 0 otherwise; combining two accumulators keeps a NaN.
template <typename T>
struct KeepNaN {
  GS_HOST_DEVICE T operator()(T acc, T v) const {
    if (acc != acc) return acc;
    return v != v ? v : T(0);
  }
};
template <typename T>
struct IsNaN {
  GS_HOST_DEVICE bool operator()(T acc) const { return acc != acc; }
};

}  // namespace basic_kernels_internal

namespace {

using namespace basic_kernels_internal;  // NOLINT(build/namespaces)

bool OnGpu(const Tensor& t) { return t.device().type == DeviceType::kCUDA; }

void CheckHost(const Tensor& t, const char* what) {
  if (!DeviceRegistry::Get().host_accessible(t.device())) {
    ThrowStatus(absl::InternalError(
        absl::StrCat(what, ": no host kernel for a tensor on ", DeviceName(t.device()))));
  }
}

void CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  GS_CHECK_ARG(SameShape(a.shape(), b.shape()), what, ": shapes ", ShapeToString(a.shape()),
               " and ", ShapeToString(b.shape()), " differ");
}

template <typename To, typename From>
To Convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return ops::CastTo<To>{}(v);  // floats to integers: Note [Integer tensors wrap around]
  }
}

}  // namespace

void Fill(const Tensor& dst, double value) {
#if GS_CUDA_KERNELS
  // Only where GPU kernels exist: elsewhere a GPU tensor cannot be made, and the CPU half of a
  // MapKernel without inputs is never used.
  if (OnGpu(dst)) {
    DispatchStorage(dst.dtype(), [&](auto tag) {
      using T = decltype(tag);
      ops::MapKernel<T>(dst, FillWith<T>{Convert<T>(value)});
    });
    return;
  }
#endif
  CheckHost(dst, "fill");
  DispatchStorage(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = Convert<T>(value);
    T* out = dst.data<T>();
    if (dst.is_contiguous()) {
      WorkMeter meter;
      ops::FillShared(out, dst.numel(), v, meter);
    } else {
      ForEachStrided2(dst.shape(), dst.strides(), dst.strides(),
                      [&](int64_t o, int64_t) { out[o] = v; });
    }
  });
}

void CopyInto(const Tensor& dst, const Tensor& src) {
  CheckSameShape(dst, src, "copy");
  auto& registry = DeviceRegistry::Get();
  const bool dst_host = registry.host_accessible(dst.device());
  const bool src_host = registry.host_accessible(src.device());
  if (!dst_host || !src_host) {
    if (dst.device() == src.device()) {
      // On one GPU: a strided copy with conversion, as one kernel on the device.
      DispatchStorage(dst.dtype(), [&](auto dtag) {
        using D = decltype(dtag);
        DispatchStorage(src.dtype(), [&](auto stag) {
          using S = decltype(stag);
          ops::MapKernel<D, S>(dst, ops::CastTo<D>{}, src);
        });
      });
      return;
    }
    // Between devices the backends move the bytes of contiguous tensors of one dtype, so src is
    // converted and packed on its own device first, and a strided dst is filled on its device
    // from a packed copy after.
    const Tensor from = src.To(dst.dtype()).contiguous();
    const Tensor to =
        dst.is_contiguous() ? dst : Tensor::Empty(dst.shape(), dst.dtype(), dst.device());
    const Device other = dst_host ? src.device() : dst.device();
    registry.backend(other.type)
        ->Copy(to.raw_data(), to.device(), from.raw_data(), from.device(), to.nbytes());
    if (!to.is_same(dst)) CopyInto(dst, to);
    return;
  }
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    char* const to = static_cast<char*>(dst.raw_data());
    const char* const from = static_cast<const char*>(src.raw_data());
    const int64_t element = static_cast<int64_t>(ElementSize(dst.dtype()));
    WorkMeter meter;
    ForEachBlock(dst.numel(), meter, [&](int64_t begin, int64_t end) {
      std::memcpy(to + begin * element, from + begin * element, (end - begin) * element);
    });
    return;
  }
  if (src.repeats_one_value() && dst.is_contiguous()) {
    // Note [A gradient of one value]: packing a tensor of one value is a fill, shared out like
    // a map; the value is read before the fill, which may write over it.
    DispatchStorage(dst.dtype(), [&](auto dtag) {
      using D = decltype(dtag);
      DispatchStorage(src.dtype(), [&](auto stag) {
        using S = decltype(stag);
        WorkMeter meter;
        ops::FillShared(dst.data<D>(), dst.numel(), Convert<D>(*src.data<S>()), meter);
      });
    });
    return;
  }
  DispatchStorage(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    DispatchStorage(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* out = dst.data<D>();
      const S* in = src.data<S>();
      ForEachStrided2(dst.shape(), dst.strides(), src.strides(),
                      [&](int64_t o, int64_t i) { out[o] = Convert<D>(in[i]); });
    });
  });
}

void AccumulateInto(const Tensor& dst, const Tensor& src) {
  CheckSameShape(dst, src, "accumulate");
  GS_CHECK_ARG(dst.dtype() == src.dtype(), "accumulate: dtypes ", DTypeName(dst.dtype()), " and ",
               DTypeName(src.dtype()), " differ");
  if (OnGpu(dst) || OnGpu(src)) {
    GS_CHECK_ARG(dst.device() == src.device(), "accumulate: tensors on ", DeviceName(dst.device()),
                 " and ", DeviceName(src.device()));
    DispatchStorage(dst.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        ThrowStatus(absl::InvalidArgumentError("accumulate: bool tensors cannot be summed"));
      } else {
        // dst is read and written at the same index, which MapKernel allows.
        ops::MapKernel<T, T, T>(dst, AddPair<T>{}, dst, src);
      }
    });
    return;
  }
  CheckHost(dst, "accumulate");
  CheckHost(src, "accumulate");
  DispatchStorage(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ThrowStatus(absl::InvalidArgumentError("accumulate: bool tensors cannot be summed"));
    } else {
      T* out = dst.data<T>();
      const T* in = src.data<T>();
      if (dst.is_contiguous() && src.is_contiguous()) {
        WorkMeter meter;
        ForEachBlock(dst.numel(), meter, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) out[i] += in[i];
        });
      } else {
        ForEachStrided2(dst.shape(), dst.strides(), src.strides(),
                        [&](int64_t o, int64_t i) { out[o] += in[i]; });
      }
    }
  });
}

Tensor AddSameShape(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dtype() == DType::kBool || !a.is_contiguous() ||
      !b.is_contiguous() || !SameShape(a.shape(), b.shape())) {
    // The general case (and its errors): a packed copy, then the strided sum.
    Tensor out = a.Clone();
    AccumulateInto(out, b);
    return out;
  }
  // Both packed: one pass, out = a + b, instead of a copy and then a sum.
  if (OnGpu(a) || OnGpu(b)) {
    GS_CHECK_ARG(a.device() == b.device(), "add: tensors on ", DeviceName(a.device()), " and ",
                 DeviceName(b.device()));
    Tensor out = a.EmptyLike();
    DispatchStorage(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) ops::MapKernel<T, T, T>(out, AddPair<T>{}, a, b);
    });
    return out;
  }
  CheckHost(a, "add");
  CheckHost(b, "add");
  Tensor out = a.EmptyLike();
  DispatchStorage(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* x = a.data<T>();
      const T* y = b.data<T>();
      T* o = out.data<T>();
      WorkMeter meter;
      ForEachBlock(a.numel(), meter, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) o[i] = x[i] + y[i];
      });
    }
  });
  return out;
}

bool OwnedExclusively(const Tensor& t) {
  return t.use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous() &&
         !t.requires_grad();
}

bool HasNaN(const Tensor& t) {
  if (!IsFloating(t.dtype())) return false;
  // A 16-bit NaN is a NaN in float32; the check is the anomaly mode's, off the fast path.
  if (IsHalfFloating(t.dtype())) return HasNaN(t.To(DType::kFloat32));
  if (OnGpu(t)) {
    // A reduction over every element into one bool on the device; only that value is copied
    // back (Tensor::To waits for the kernel).
    const Tensor flag = Tensor::Empty({}, DType::kBool, t.device());
    const absl::InlinedVector<bool, 6> all(t.dim(), true);
    DispatchFloating(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      ops::ReduceKernel<T, T, bool>(t, all, flag, T(0), KeepNaN<T>{}, IsNaN<T>{});
    });
    return *flag.To(kCPU).data<bool>();
  }
  CheckHost(t, "nan check");
  bool found = false;
  DispatchFloating(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = t.data<T>();
    ForEachStrided2(t.shape(), t.strides(), t.strides(), [&](int64_t o, int64_t) {
      if (std::isnan(in[o])) found = true;
    });
  });
  return found;
}

}  // namespace gradserve

namespace gradserve {
namespace {

// Note [Tensor's kernels]: installed before main() runs.
[[maybe_unused]] const bool kTensorKernelsInstalled =
    (SetTensorKernels({.fill = &Fill, .copy = &CopyInto}), true);

}  // namespace
}  // namespace gradserve
