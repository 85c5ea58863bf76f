// The fp8 codec's device kernels: the payload of compressors/fp8/fp8_codec.cpp's layout, written
// and read with the element math of fp8_math.h, so the bytes are the CPU codec's. Host-callable;
// no CUDA headers needed by includers (the stream is a cudaStream_t cast to void*). Asynchronous
// on `stream`, no allocation, no wait; count == 0 launches nothing. On the emulated device each
// runs its CPU twin (compressors/fp8/emulated/fp8_twins.cpp) as one operation on the stream.
// Launch failures: gradzip::Error(unsupported); null pointers with count > 0: invalid_argument.
#pragma once

#include <cstddef>

#include "compressors/fp8/fp8_math.h"

namespace gradzip::compressors::fp8 {

// The launch wrappers, declared once for the CUDA kernels (namespace cuda) and for their CPU
// twins on the emulated device (namespace emulated, compressors/fp8/emulated/fp8_twins.cpp;
// same contracts, queued on the emulated device's stream):
//   encode: writes the scales (ceil(count / 32) bytes) and then the codes (count bytes) of
//           d_in[0, count) at d_payload (any alignment).
//   decode: d_out[i] = D(element i) (accumulate: d_out[i] += D(element i)) for i < count, from
//           the payload at d_payload (any alignment; its header was checked on the host, and
//           every byte decodes).
#define GZ_FP8_KERNEL_DECLARATIONS                                                          \
  void encode(const float* d_in, std::size_t count, Format format, std::byte* d_payload,    \
              void* stream);                                                                \
  void decode(const std::byte* d_payload, std::size_t count, Format format, float* d_out, \
              bool accumulate, void* stream);
namespace cuda {
GZ_FP8_KERNEL_DECLARATIONS
}  // namespace cuda
namespace emulated {
GZ_FP8_KERNEL_DECLARATIONS
}  // namespace emulated
#undef GZ_FP8_KERNEL_DECLARATIONS

}  // namespace gradzip::compressors::fp8
