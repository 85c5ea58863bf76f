// Terngrad's kernel launch wrappers in a build without the CUDA toolkit, where
// terngrad_kernels.cu is not compiled: the emulated device is always active there, so each runs
// its CPU twin.
#include "compressors/terngrad/cuda/terngrad_kernels.h"

namespace gradzip::kernels::cuda {

void terngrad_trits_from_codes(const std::byte* d_codes, std::size_t count, std::byte* d_trits,
                               void* stream) {
  emulated::terngrad_trits_from_codes(d_codes, count, d_trits, stream);
}
void terngrad_codes_from_trits(const std::byte* d_trits, std::size_t count, std::byte* d_codes,
                               int* d_status, std::byte* d_poison_scale, void* stream) {
  emulated::terngrad_codes_from_trits(d_trits, count, d_codes, d_status, d_poison_scale, stream);
}

}  // namespace gradzip::kernels::cuda
