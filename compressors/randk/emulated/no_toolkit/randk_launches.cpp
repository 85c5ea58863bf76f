// random-k's kernel launch wrappers in a build without the CUDA toolkit, where
// randk_kernels.cu is not compiled: the emulated device is always active there, so each runs
// its CPU twin.
#include "compressors/randk/cuda/randk_kernels.h"

namespace gradzip::kernels::cuda {

void randk_gather(const float* d_in, std::size_t n, const RandkKey& key, std::size_t k,
                  bool half_values, std::byte* d_values_out, void* stream) {
  emulated::randk_gather(d_in, n, key, k, half_values, d_values_out, stream);
}
void randk_scatter_add(const std::byte* d_values, std::size_t k, bool half_values,
                       const RandkKey& key, std::size_t n, float* d_acc, void* stream) {
  emulated::randk_scatter_add(d_values, k, half_values, key, n, d_acc, stream);
}
void randk_scatter(const std::byte* d_values, std::size_t k, bool half_values,
                   const RandkKey& key, std::size_t n, float* d_out, void* stream) {
  emulated::randk_scatter(d_values, k, half_values, key, n, d_out, stream);
}
void randk_subtract_own(const std::byte* d_values, std::size_t k, bool half_values,
                        const RandkKey& key, std::size_t n, float* d_residual, void* stream) {
  emulated::randk_subtract_own(d_values, k, half_values, key, n, d_residual, stream);
}

}  // namespace gradzip::kernels::cuda
