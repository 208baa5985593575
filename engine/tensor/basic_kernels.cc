#include "engine/tensor/basic_kernels.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/device/device_registry.h"

namespace gradserve {
namespace {

void CheckHost(const Tensor& t, const char* what) {
  if (!DeviceRegistry::Get().host_accessible(t.device())) {
    ThrowStatus(absl::InternalError(
        absl::StrCat(what, ": no host kernel for a tensor on ", DeviceName(t.device()))));
  }
}

void CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  GS_CHECK_ARG(a.shape() == b.shape(), what, ": shapes ", ShapeToString(a.shape()), " and ",
               ShapeToString(b.shape()), " differ");
}

template <typename To, typename From>
To Convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace

void Fill(const Tensor& dst, double value) {
  CheckHost(dst, "fill");
  DispatchDType(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = Convert<T>(value);
    T* out = dst.data<T>();
    if (dst.is_contiguous()) {
      const int64_t n = dst.numel();
      for (int64_t i = 0; i < n; ++i) out[i] = v;
    } else {
      ForEachStrided2(dst.shape(), dst.strides(), dst.strides(),
                      [&](int64_t o, int64_t) { out[o] = v; });
    }
  });
}

void CopyInto(const Tensor& dst, const Tensor& src) {
  CheckSameShape(dst, src, "copy");
  auto& registry = DeviceRegistry::Get();
  const bool host =
      registry.host_accessible(dst.device()) && registry.host_accessible(src.device());
  if (!host) {
    GS_CHECK_ARG(dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous(),
                 "copy between ", DeviceName(src.device()), " and ", DeviceName(dst.device()),
                 " needs contiguous tensors of one dtype");
    const Device other = dst.device().is_cpu() ? src.device() : dst.device();
    registry.backend(other.type)
        ->Copy(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
    return;
  }
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.nbytes() > 0) std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  DispatchDType(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    DispatchDType(src.dtype(), [&](auto stag) {
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
  CheckHost(dst, "accumulate");
  CheckHost(src, "accumulate");
  DispatchDType(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      ThrowStatus(absl::InvalidArgumentError("accumulate: bool tensors cannot be summed"));
    } else {
      T* out = dst.data<T>();
      const T* in = src.data<T>();
      if (dst.is_contiguous() && src.is_contiguous()) {
        const int64_t n = dst.numel();
        for (int64_t i = 0; i < n; ++i) out[i] += in[i];
      } else {
        ForEachStrided2(dst.shape(), dst.strides(), src.strides(),
                        [&](int64_t o, int64_t i) { out[o] += in[i]; });
      }
    }
  });
}

Tensor AddSameShape(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dtype() == DType::kBool || !a.is_contiguous() ||
      !b.is_contiguous() || a.shape() != b.shape()) {
    // The general case (and its errors): a packed copy, then the strided sum.
    Tensor out = a.Clone();
    AccumulateInto(out, b);
    return out;
  }
  CheckHost(a, "add");
  CheckHost(b, "add");
  // Both packed: one pass, out = a + b, instead of a copy and then a sum.
  Tensor out = a.EmptyLike();
  DispatchDType(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* x = a.data<T>();
      const T* y = b.data<T>();
      T* o = out.data<T>();
      const int64_t n = a.numel();
      for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
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
