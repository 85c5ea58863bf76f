// Grid-stride conversion kernels over kernels/cast_math.h.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/launch.cuh"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

__global__ void f32_to_f16_kernel(const float* d_in, std::uint16_t* d_out, std::size_t count) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    d_out[i] = f32_to_f16_bits(d_in[i]);
}

__global__ void f32_to_bf16_kernel(const float* d_in, std::uint16_t* d_out, std::size_t count) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    d_out[i] = f32_to_bf16_bits(d_in[i]);
}

__global__ void f16_to_f32_kernel(const std::uint16_t* d_in, float* d_out, std::size_t count) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    d_out[i] = f16_bits_to_f32(d_in[i]);
}

__global__ void bf16_to_f32_kernel(const std::uint16_t* d_in, float* d_out, std::size_t count) {
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    d_out[i] = bf16_bits_to_f32(d_in[i]);
}

template <typename In, typename Out>
void launch(void (*kernel)(const In*, Out*, std::size_t), const char* op, const In* d_in,
            Out* d_out, std::size_t count, void* stream) {
  if (count == 0) return;
  kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(d_in, d_out, count);
  check_launch(op, count);
}

}  // namespace

void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  launch(f32_to_f16_kernel, "cuda.f32_to_f16", d_in, d_out, count, stream);
}
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  launch(f32_to_bf16_kernel, "cuda.f32_to_bf16", d_in, d_out, count, stream);
}
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  launch(f16_to_f32_kernel, "cuda.f16_to_f32", d_in, d_out, count, stream);
}
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  launch(bf16_to_f32_kernel, "cuda.bf16_to_f32", d_in, d_out, count, stream);
}

int device_count(const char** reason) noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr) *reason = cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device present";
  return count;
}

}  // namespace gradzip::kernels::cuda
