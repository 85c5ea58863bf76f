// The CPU twins of sign's kernels (cuda/sign_kernels.h): the CPU codec's loops (sign_cpu.h)
// and the element math, each call queued as one operation on the emulated device's stream,
// with the wrappers' host-side refusals.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "compressors/sign/cuda/sign_kernels.h"
#include "compressors/sign/sign_cpu.h"
#include "gradzip/error.h"
#include "kernels/ef_math.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/twin_support.h"

namespace gradzip::kernels::emulated {
namespace {

using cuda::KernelVariant;

// compressors/sign/sign_codec.cpp's encode of `count` f32 values at `in` into the payload (the
// overflow rescue included); returns where its sign bits start.
std::uint8_t* encode_sign_payload(const float* in, std::size_t count, std::size_t bucket,
                                  std::byte* d_payload) {
  auto* const bits = reinterpret_cast<std::uint8_t*>(
      d_payload + cuda::sign_buckets(count, bucket) * sizeof(float));
  cpu::SignEncoder encoder(bucket, d_payload, bits);
  encoder.add(in, count);
  encoder.finish();
  if (encoder.any_scale_overflowed()) {
    cpu::sign_rescue_overflowed_scales(
        count, bucket, d_payload, [in](std::size_t begin, std::size_t) { return in + begin; });
  }
  return bits;
}

}  // namespace

void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream,
                 KernelVariant /*variant*/) {
  constexpr const char* kOp = "cuda.sign_encode";
  const std::size_t payload_bytes = sign_payload_bytes(count, bucket);  // validates bucket, size
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  enqueue(stream, kOp, [d_in, count, bucket, d_payload, payload_bytes] {
    require_device_range(d_in, count * sizeof(float), "cuda.sign_encode input");
    require_device_range(d_payload, payload_bytes, "cuda.sign_encode payload");
    encode_sign_payload(d_in, count, bucket, d_payload);
  });
}

// The CPU codec's fused encode (compressors/sign/sign_codec.cpp, encode_with_feedback) in one pass over the
// whole range: c into the residual, the encoder and the overflow rescue over c, then
// e = finite_or_zero(c - D) block by block; the general path's bits.
bool sign_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count,
                               std::size_t bucket, std::byte* d_payload, void* stream) {
  constexpr const char* kOp = "cuda.sign_encode_with_feedback";
  const std::size_t payload_bytes = sign_payload_bytes(count, bucket);  // validates bucket, size
  if (!cuda::sign_fuses_feedback(count, bucket)) return false;
  require_feedback_buffers(kOp, d_grad, d_residual, d_payload, count);
  enqueue(stream, kOp, [d_grad, d_residual, count, bucket, d_payload, payload_bytes] {
    require_device_range(d_grad, count * sizeof(float), "cuda.sign_encode_with_feedback input");
    require_device_range(d_residual, count * sizeof(float), "cuda.sign_encode_with_feedback residual");
    require_device_range(d_payload, payload_bytes, "cuda.sign_encode_with_feedback payload");
    for (std::size_t i = 0; i < count; ++i) d_residual[i] = d_grad[i] + d_residual[i];
    const std::uint8_t* const bits = encode_sign_payload(d_residual, count, bucket, d_payload);
    const cpu::SignPayload payload{d_payload, bits, count, bucket};
    constexpr std::size_t kBlock = 1024;
    float decoded[kBlock];
    for (std::size_t begin = 0; begin < count; begin += kBlock) {
      const std::size_t n = std::min(kBlock, count - begin);
      cpu::sign_decode(payload, begin, n, decoded);
      for (std::size_t i = 0; i < n; ++i)
        d_residual[begin + i] = finite_or_zero(d_residual[begin + i] - decoded[i]);
    }
  });
  return true;
}

void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream, KernelVariant /*variant*/) {
  constexpr const char* kOp = "cuda.sign_decode";
  const std::size_t payload_bytes = sign_payload_bytes(count, bucket);  // validates bucket, size
  require_decode_buffers(kOp, d_payload, d_out, count);
  require_status(kOp, d_status);
  enqueue(stream, kOp, [d_payload, count, bucket, d_out, accumulate, d_status, payload_bytes] {
    require_device_accessible_range(d_status, sizeof(int), "cuda.sign_decode status");
    store_status(d_status, cuda::kSignStatusOk);
    if (count == 0) return;
    require_device_range(d_payload, payload_bytes, "cuda.sign_decode payload");
    require_device_range(d_out, count * sizeof(float), "cuda.sign_decode output");
    const auto* bits = reinterpret_cast<const std::uint8_t*>(
        d_payload + cuda::sign_buckets(count, bucket) * sizeof(float));
    if (count % 8 != 0 && (bits[count / 8] >> (count % 8)) != 0) {
      store_status(d_status, cuda::kSignStatusUnusedBits);
      return;
    }
    const cpu::SignPayload payload{d_payload, bits, count, bucket};
    if (accumulate) cpu::sign_decode_add(payload, d_out);
    else cpu::sign_decode(payload, 0, count, d_out);
  });
}

}  // namespace gradzip::kernels::emulated
