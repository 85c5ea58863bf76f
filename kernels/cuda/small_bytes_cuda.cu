// write_small_bytes (kernels/cuda/small_bytes_cuda.h): one thread per byte, the bytes passed by
// value in the kernel's parameter space.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"

namespace gradzip::kernels::cuda {
namespace {

struct SmallBytes {
  unsigned char bytes[kSmallBytesMax];
};

__global__ void write_small_bytes_kernel(unsigned char* out, SmallBytes value, unsigned count) {
  if (threadIdx.x < count) out[threadIdx.x] = value.bytes[threadIdx.x];
}

}  // namespace

void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::write_small_bytes(d_out, host, count, stream);
  constexpr const char* kOp = "cuda.write_small_bytes";
  if (count == 0) return;
  GZ_REQUIRE(count <= kSmallBytesMax, ErrorCode::invalid_argument, kOp, ": ", count,
             " bytes (at most ", kSmallBytesMax, ")");
  GZ_REQUIRE(d_out != nullptr && host != nullptr, ErrorCode::invalid_argument, kOp,
             ": null pointer for ", count, " bytes");
  SmallBytes value{};
  for (std::size_t i = 0; i < count; ++i) value.bytes[i] = static_cast<unsigned char>(host[i]);
  write_small_bytes_kernel<<<1, static_cast<unsigned>(kSmallBytesMax), 0,
                             static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<unsigned char*>(d_out), value, static_cast<unsigned>(count));
  detail::check_launch(kOp, count, "bytes");
}

}  // namespace gradzip::kernels::cuda
