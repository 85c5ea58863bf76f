// The fp8 kernels' launch wrappers in a build without the CUDA toolkit, where fp8_kernels.cu is
// not compiled: the emulated device is always active there, so each runs its CPU twin.
#include "compressors/fp8/cuda/fp8_kernels.h"

namespace gradzip::compressors::fp8::cuda {

void encode(const float* d_in, std::size_t count, Format format, std::byte* d_payload,
            void* stream) {
  emulated::encode(d_in, count, format, d_payload, stream);
}

void decode(const std::byte* d_payload, std::size_t count, Format format, float* d_out,
            bool accumulate, void* stream) {
  emulated::decode(d_payload, count, format, d_out, accumulate, stream);
}

}  // namespace gradzip::compressors::fp8::cuda
