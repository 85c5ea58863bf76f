// The CPU twins of qsgd's kernels (cuda/qsgd_kernels.h): the CPU codec's loops (qsgd_cpu.h)
// and the element math (qsgd_math.h), each call queued as one operation on the emulated
// device's stream, with the wrappers' host-side refusals.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/qsgd/qsgd_cpu.h"
#include "compressors/qsgd/qsgd_math.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/ef_math.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/twin_support.h"
#include "kernels/host_device.h"

namespace gradzip::kernels::emulated {
namespace {

using cuda::KernelVariant;

// What qsgd_kernels.cu's validation leaves in *d_status: the largest offence code (a bad scale
// anywhere outranks a non-zero code of a non-finite bucket).
int qsgd_status(const std::byte* payload, std::size_t count, int bits, std::size_t bucket) {
  const std::size_t buckets = cuda::qsgd_buckets(count, bucket);
  for (std::size_t b = 0; b < buckets; ++b) {
    if (!qsgd_scale_is_valid(bits_float(load_u32(payload + b * sizeof(float)))))
      return cuda::kQsgdStatusBadScale;
  }
  cpu::QsgdPayloadProblem problem;
  if (cpu::qsgd_check_payload(payload, count, bits, bucket, problem)) return cuda::kQsgdStatusOk;
  return problem.nonzero_code ? cuda::kQsgdStatusNonzeroCode : cuda::kQsgdStatusBadScale;
}

}  // namespace

void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const cuda::QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream, KernelVariant /*variant*/) {
  constexpr const char* kOp = "cuda.qsgd_encode";
  cuda::check_qsgd_shape(kOp, count, bits, bucket);
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  const std::size_t payload_bytes = qsgd_payload_bytes(count, bits, bucket);
  const EncodeContext ctx{params.seed, params.step, params.tensor_id, params.element_offset};
  enqueue(stream, kOp, [d_in, count, bits, bucket, ctx, d_payload, payload_bytes] {
    require_device_range(d_in, count * sizeof(float), "cuda.qsgd_encode input");
    require_device_range(d_payload, payload_bytes, "cuda.qsgd_encode payload");
    cpu::qsgd_encode_payload(f32_view(d_in, count), bits, bucket, ctx, d_payload);
  });
}

// Error feedback's general path on the host (compressors/qsgd/qsgd_codec.cpp's fused encode gives the same
// bits): c into the residual, the encode of c, then e = finite_or_zero(c - D) block by block.
bool qsgd_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count, int bits,
                               std::size_t bucket, const cuda::QsgdEncodeParams& params,
                               std::byte* d_payload, void* stream) {
  constexpr const char* kOp = "cuda.qsgd_encode_with_feedback";
  cuda::check_qsgd_shape(kOp, count, bits, bucket);
  if (!cuda::qsgd_fuses_feedback(count, bits, bucket)) return false;
  require_feedback_buffers(kOp, d_grad, d_residual, d_payload, count);
  const std::size_t payload_bytes = qsgd_payload_bytes(count, bits, bucket);
  const EncodeContext ctx{params.seed, params.step, params.tensor_id, params.element_offset};
  enqueue(stream, kOp, [d_grad, d_residual, count, bits, bucket, ctx, d_payload, payload_bytes] {
    require_device_range(d_grad, count * sizeof(float), "cuda.qsgd_encode_with_feedback input");
    require_device_range(d_residual, count * sizeof(float), "cuda.qsgd_encode_with_feedback residual");
    require_device_range(d_payload, payload_bytes, "cuda.qsgd_encode_with_feedback payload");
    for (std::size_t i = 0; i < count; ++i) d_residual[i] = d_grad[i] + d_residual[i];
    cpu::qsgd_encode_payload(f32_view(d_residual, count), bits, bucket, ctx, d_payload);
    std::vector<float> decoded(count);
    cpu::qsgd_decode_payload(d_payload, count, bits, bucket, f32_view(decoded.data(), count));
    for (std::size_t i = 0; i < count; ++i)
      d_residual[i] = finite_or_zero(d_residual[i] - decoded[i]);
  });
  return true;
}

void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream,
                 KernelVariant /*variant*/) {
  constexpr const char* kOp = "cuda.qsgd_decode";
  cuda::check_qsgd_shape(kOp, count, bits, bucket);
  require_decode_buffers(kOp, d_payload, d_out, count);
  require_status(kOp, d_status);
  const std::size_t payload_bytes = qsgd_payload_bytes(count, bits, bucket);
  enqueue(stream, kOp,
          [d_payload, count, bits, bucket, d_out, accumulate, d_status, payload_bytes] {
    require_device_accessible_range(d_status, sizeof(int), "cuda.qsgd_decode status");
    store_status(d_status, cuda::kQsgdStatusOk);
    if (count == 0) return;
    require_device_range(d_payload, payload_bytes, "cuda.qsgd_decode payload");
    require_device_range(d_out, count * sizeof(float), "cuda.qsgd_decode output");
    const int status = qsgd_status(d_payload, count, bits, bucket);
    store_status(d_status, status);
    if (status != cuda::kQsgdStatusOk) return;
    if (accumulate) cpu::qsgd_decode_add_payload(d_payload, count, bits, bucket, d_out);
    else cpu::qsgd_decode_payload(d_payload, count, bits, bucket, f32_view(d_out, count));
  });
}

}  // namespace gradzip::kernels::emulated
