// CUDA memory for the collectives (collectives/device_memory.h).
#include "collectives/device_memory.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "gradzip/error.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/cuda/scale_cuda.h"

namespace gradzip::collectives {
namespace {

using kernels::cuda::check_runtime;
using kernels::cuda::CurrentDevice;

void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, int device,
          std::string_view op) {
  if (bytes == 0) return;
  const CurrentDevice current(device, op);
  check_runtime(cudaMemcpy(to, from, bytes, kind), op,
                kind == cudaMemcpyDeviceToHost   ? "a copy to host memory"
                : kind == cudaMemcpyHostToDevice ? "a copy to the device"
                                                 : "a device-to-device copy");
}

}  // namespace

bool device_memory_built() noexcept { return true; }

void copy_device_to_host(void* host, const void* device_data, std::size_t bytes, int device,
                         std::string_view op) {
  copy(host, device_data, bytes, cudaMemcpyDeviceToHost, device, op);
}

void copy_host_to_device(void* device_data, const void* host, std::size_t bytes, int device,
                         std::string_view op) {
  copy(device_data, host, bytes, cudaMemcpyHostToDevice, device, op);
}

void zero_on_device(void* device_data, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const CurrentDevice current(device, "zero_on_device");
  check_runtime(cudaMemset(device_data, 0, bytes), "zero_on_device", "cudaMemset");
}

void copy_on_device(void* to, const void* from, std::size_t bytes, int device) {
  copy(to, from, bytes, cudaMemcpyDeviceToDevice, device, "copy_on_device");
}

void require_device_pointer(const void* pointer, int device, std::string_view op,
                            std::string_view what) {
  kernels::cuda::require_device_pointer(pointer, device, op, what);
}

void widen_on_device(const TensorView& tensor, std::size_t begin, std::size_t end, float* d_f32) {
  if (end <= begin) return;
  const CurrentDevice current(tensor.device.index, "widen_on_device");
  const std::size_t count = end - begin;
  if (tensor.dtype == DType::f32) {
    check_runtime(cudaMemcpy(d_f32 + begin, static_cast<const float*>(tensor.data) + begin,
                             count * sizeof(float), cudaMemcpyDeviceToDevice),
                  "widen_on_device", "a device copy");
    return;
  }
  const auto* half = static_cast<const std::uint16_t*>(tensor.data) + begin;
  if (tensor.dtype == DType::f16) kernels::cuda::f16_to_f32(half, d_f32 + begin, count, nullptr);
  else kernels::cuda::bf16_to_f32(half, d_f32 + begin, count, nullptr);
  check_runtime(cudaStreamSynchronize(nullptr), "widen_on_device", "the conversion");
}

void narrow_on_device(const float* d_f32, std::size_t begin, std::size_t end, const TensorView& tensor) {
  if (end <= begin) return;
  const CurrentDevice current(tensor.device.index, "narrow_on_device");
  const std::size_t count = end - begin;
  if (tensor.dtype == DType::f32) {
    check_runtime(cudaMemcpy(static_cast<float*>(tensor.data) + begin, d_f32 + begin,
                             count * sizeof(float), cudaMemcpyDeviceToDevice),
                  "narrow_on_device", "a device copy");
    return;
  }
  auto* half = static_cast<std::uint16_t*>(tensor.data) + begin;
  if (tensor.dtype == DType::f16) kernels::cuda::f32_to_f16(d_f32 + begin, half, count, nullptr);
  else kernels::cuda::f32_to_bf16(d_f32 + begin, half, count, nullptr);
  check_runtime(cudaStreamSynchronize(nullptr), "narrow_on_device", "the conversion");
}

void divide_on_device(float* d_data, std::size_t count, float divisor, int device) {
  if (count == 0) return;
  const CurrentDevice current(device, "divide_on_device");
  kernels::cuda::divide_f32(d_data, count, divisor, nullptr);
  check_runtime(cudaStreamSynchronize(nullptr), "divide_on_device", "the division");
}

DeviceAllocation::DeviceAllocation(std::size_t bytes, int device, std::string_view op)
    : bytes_(bytes), device_(device) {
  const CurrentDevice current(device, op);
  void* data = nullptr;
  check_runtime(cudaMalloc(&data, bytes == 0 ? 1 : bytes), op, "cudaMalloc of message buffers");
  data_ = static_cast<std::byte*>(data);
}

DeviceAllocation::~DeviceAllocation() {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != device_) cudaSetDevice(device_);
  cudaFree(data_);
  if (previous != device_) cudaSetDevice(previous);
}

}  // namespace gradzip::collectives
