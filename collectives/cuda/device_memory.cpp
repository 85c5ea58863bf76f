// CUDA memory for the collectives (collectives/device_memory.h).
#include "collectives/device_memory.h"

#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/runtime_support.h"

namespace gradzip::collectives {
namespace {

using kernels::cuda::check_runtime;
using kernels::cuda::CurrentDevice;

void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, int device,
          std::string_view op) {
  if (bytes == 0) return;
  const CurrentDevice current(device, op);
  check_runtime(cudaMemcpy(to, from, bytes, kind), op,
        kind == cudaMemcpyDeviceToHost ? "copying the tensor to host memory"
                                       : "copying the result to the device");
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

void require_device_pointer(const void* pointer, int device, std::string_view op,
                            std::string_view what) {
  kernels::cuda::require_device_pointer(pointer, device, op, what);
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
