// sign's kernel launch wrappers in a build without the CUDA toolkit, where sign_kernels.cu is
// not compiled: the emulated device is always active there, so each runs its CPU twin. (The payload
// size is host arithmetic, defined in sign_kernels.h.)
#include "compressors/sign/cuda/sign_kernels.h"

namespace gradzip::kernels::cuda {

void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream,
                 KernelVariant variant) {
  emulated::sign_encode(d_in, count, bucket, d_payload, d_workspace, workspace_bytes, stream,
                        variant);
}
bool sign_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count,
                               std::size_t bucket, std::byte* d_payload, void* stream) {
  return emulated::sign_encode_with_feedback(d_grad, d_residual, count, bucket, d_payload, stream);
}
void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream, KernelVariant variant) {
  emulated::sign_decode(d_payload, count, bucket, d_out, accumulate, d_status, stream, variant);
}

}  // namespace gradzip::kernels::cuda
