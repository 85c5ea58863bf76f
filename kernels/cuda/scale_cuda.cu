#include "kernels/cuda/scale_cuda.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"

namespace gradzip::kernels::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;

__global__ void divide_kernel(float* data, std::size_t count, float divisor) {
  for (std::uint64_t i = global_thread(); i < count; i += grid_threads())
    data[i] = __fdiv_rn(data[i], divisor);
}

}  // namespace

void divide_f32(float* d_data, std::size_t count, float divisor, void* stream) {
  if (emulated::active()) return emulated::divide_f32(d_data, count, divisor, stream);
  if (count == 0) return;
  GZ_REQUIRE(d_data != nullptr, ErrorCode::invalid_argument, "cuda.divide_f32: null data for ",
             count, " elements");
  divide_kernel<<<detail::grid_for(count), detail::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      d_data, count, divisor);
  detail::check_launch("cuda.divide_f32", count);
}

}  // namespace gradzip::kernels::cuda
