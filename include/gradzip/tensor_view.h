// Non-owning views of gradient buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/dtype.h"

namespace gradzip {

enum class DeviceKind : std::uint8_t { cpu = 0, cuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU
};

// A contiguous, writable buffer of `count` elements of `dtype` on `device`.
// gradzip never owns or frees the memory behind a view.
struct TensorView {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device{};

  std::size_t size_bytes() const noexcept { return count * dtype_size(dtype); }
};

// A read-only view; every TensorView converts to one.
struct ConstTensorView {
  const void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  Device device{};

  ConstTensorView() = default;
  ConstTensorView(const void* data_, std::size_t count_, DType dtype_, Device device_ = {})
      : data(data_), count(count_), dtype(dtype_), device(device_) {}
  ConstTensorView(const TensorView& view)  // NOLINT(google-explicit-constructor): views widen to const
      : data(view.data), count(view.count), dtype(view.dtype), device(view.device) {}

  std::size_t size_bytes() const noexcept { return count * dtype_size(dtype); }
};

// Convenience constructors for host f32 buffers, the common case in tests and examples.
inline TensorView host_view(float* data, std::size_t count) {
  return TensorView{data, count, DType::f32, Device{}};
}
inline ConstTensorView host_view(const float* data, std::size_t count) {
  return ConstTensorView{data, count, DType::f32, Device{}};
}

}  // namespace gradzip
