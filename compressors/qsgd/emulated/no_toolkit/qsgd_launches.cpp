// qsgd's kernel launch wrappers in a build without the CUDA toolkit, where qsgd_kernels.cu is
// not compiled: the emulated device is always active there, so each runs its CPU twin. (The shape
// check and the payload size are host functions, defined in qsgd_kernels.h.)
#include "compressors/qsgd/cuda/qsgd_kernels.h"

namespace gradzip::kernels::cuda {

void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream, KernelVariant variant) {
  emulated::qsgd_encode(d_in, count, bits, bucket, params, d_payload, d_workspace,
                        workspace_bytes, stream, variant);
}
bool qsgd_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count, int bits,
                               std::size_t bucket, const QsgdEncodeParams& params,
                               std::byte* d_payload, void* stream) {
  return emulated::qsgd_encode_with_feedback(d_grad, d_residual, count, bits, bucket, params,
                                             d_payload, stream);
}
void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream,
                 KernelVariant variant) {
  emulated::qsgd_decode(d_payload, count, bits, bucket, d_out, accumulate, d_status, stream,
                        variant);
}

}  // namespace gradzip::kernels::cuda
