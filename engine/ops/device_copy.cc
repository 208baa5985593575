#include "engine/ops/device_copy.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/autograd/node.h"
#include "engine/device/device_registry.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/record.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {
namespace {

// The backward of a device move: the gradient goes back to the input's device (PyTorch's
// ToCopyBackward0). Under create_graph the move back is itself recorded, through to().
class ToDeviceBackward final : public autograd::Node {
 public:
  explicit ToDeviceBackward(Device input_device) : input_device_(input_device) {}
  TensorList apply(TensorList&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {Tensor()};
    return {to(grads[0], input_device_)};
  }
  std::string name() const override { return "ToCopyBackward0"; }

 private:
  const Device input_device_;
};

}  // namespace

Tensor to(const Tensor& input, Device device) {
  RequireDefined("to", "input", input);
  if (absl::Status s = DeviceRegistry::Get().Validate(device); !s.ok()) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat("to: ", s.message())));
  }
  if (input.device() == device) return input;
  Tensor out = input.To(device);
  if (IsFloating(input.dtype())) {
    RecordOp<ToDeviceBackward>(out, {input}, input.device());
  }
  return out;
}

void RegisterDeviceCopyOps(OpRegistry& registry) {
  OpSchema schema;
  schema.name = "to";
  schema.doc =
      "input converted to dtype and/or moved to device (Tensor.to); the gradient goes back to "
      "the input's dtype and device";
  schema.input_names = {"input"};
  schema.attrs = {
      {"device", AttrType::kString, false,
       "target device: 'cpu', 'sim:N', 'cuda:N' (default: the input's)"},
      {"dtype", AttrType::kString, false,
       "target dtype: 'float32', 'float64', 'float16', 'bfloat16', 'int64' or 'bool' (default: the "
       "input's)"},
  };
  schema.dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool};
  schema.run = [](const TensorList& in, const Attrs& attrs) {
    GS_CHECK_ARG(attrs.has("device") || attrs.has("dtype"),
                 "to: give attribute device, dtype or both");
    std::optional<Device> device;
    if (attrs.has("device")) {
      const std::string name = attrs.GetString("device");
      absl::StatusOr<Device> parsed = ParseDevice(name);
      GS_CHECK_ARG(parsed.ok(), "to: attribute device: ", parsed.status().message());
      device = *parsed;
      if (absl::Status s = DeviceRegistry::Get().Validate(*device); !s.ok()) {
        throw StatusError(
            absl::InvalidArgumentError(absl::StrCat("to: attribute device: ", s.message())));
      }
    }
    Tensor out = in[0];
    if (attrs.has("dtype")) {
      const std::string name = attrs.GetString("dtype");
      std::optional<DType> dtype = ParseDType(name);
      GS_CHECK_ARG(dtype.has_value(), "to: attribute dtype ", Quote(name),
                   " is not one of float32, float64, int64, bool");
      out = to(out, *dtype);
    }
    if (device) out = to(out, *device);
    return TensorList{out};
  };
  registry.Add(std::move(schema));
}

}  // namespace gradserve::ops
