// top-k's kernel launch wrappers in a build without the CUDA toolkit, where topk_kernels.cu is
// not compiled: the emulated device is always active there, so each runs its CPU twin (the
// workspace size included: the twin's answer, the .cu one's arithmetic).
#include "compressors/topk/cuda/topk_kernels.h"

namespace gradzip::kernels::cuda {

std::size_t topk_workspace_bytes(std::uint64_t n, std::uint64_t k, const TopkCudaOptions& options) {
  return emulated::topk_workspace_bytes(n, k, options);
}
void topk_select(const float* d_in, std::uint64_t n, std::uint64_t k,
                 const TopkCudaOptions& options, std::byte* d_payload,
                 std::uint64_t* d_entries_out, void* d_workspace, std::size_t* workspace_bytes,
                 void* stream) {
  emulated::topk_select(d_in, n, k, options, d_payload, d_entries_out, d_workspace,
                        workspace_bytes, stream);
}

}  // namespace gradzip::kernels::cuda
