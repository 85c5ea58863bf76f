// Device kernels of the `sign` codec: they write exactly the payload bytes of the CPU codec
// (compressors/sign/sign_codec.cpp documents the layout; the element math and the canonical order of the
// per-bucket |x| sums are compressors/sign/sign_math.h, shared with the CPU loops) and decode a payload
// to the CPU decoder's bits. Host-callable; no CUDA headers needed by includers (the stream is
// an opaque cudaStream_t cast to void*, nullptr = the default stream). Every call is
// asynchronous on `stream`, allocates nothing and never synchronises.
//
// Two implementations (`variant`, kernels/cuda/kernel_variant.h): KernelVariant::fast (the
// default: one pass over each bucket, compressors/sign/sign_fast_layout.h) and KernelVariant::reference
// (the first kernels). Every contract below holds for both, byte for byte; the reference stays
// until a GPU run has shown the fast kernels identical (tests/gpu/test_sign_cuda.cpp checks both).
//
// Payload (the bytes after the 32-byte header; any alignment):
//   [0, 4 * B)                f32 scale (mean |x|) of each bucket, B = ceil(count / bucket)
//   [4 * B, + ceil(count/8))  sign bits: element i at bit i % 8 of byte i / 8 (LSB first);
//                             the unused high bits of the last byte are 0.
#pragma once

#include <cstddef>
#include <limits>

#include "compressors/sign/sign_fast_layout.h"
#include "gradzip/error.h"
#include "kernels/cuda/kernel_variant.h"

namespace gradzip::kernels::cuda {

// Values sign_decode() writes to *d_status.
inline constexpr int kSignStatusOk = 0;
// A bit above the last element in the last byte of the sign bits is set.
inline constexpr int kSignStatusUnusedBits = 1;

// Buckets of a payload: ceil(count / bucket), bucket >= 1.
inline std::size_t sign_buckets(std::size_t count, std::size_t bucket) {
  return count / bucket + (count % bucket != 0 ? 1 : 0);
}
// Bytes of the sign bits: ceil(count / 8).
inline std::size_t sign_bit_bytes(std::size_t count) {
  return count / 8 + (count % 8 != 0 ? 1 : 0);
}

// 4 * ceil(count / bucket) + ceil(count / 8): the payload size, equal to the CPU codec's.
// Throws gradzip::Error(invalid_argument) when bucket is 0 or the size does not fit a size_t.
// Host-side, shared by the wrappers below and their twins (every one of them checks its shape
// with it first).
inline std::size_t sign_payload_bytes(std::size_t count, std::size_t bucket) {
  GZ_REQUIRE(bucket >= 1, ErrorCode::invalid_argument,
             "cuda.sign_payload_bytes: bucket=0 (expected >= 1)");
  const std::size_t buckets = sign_buckets(count, bucket);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  GZ_REQUIRE(buckets <= (kMax - sign_bit_bytes(count)) / sizeof(float), ErrorCode::invalid_argument,
             "cuda.sign_payload_bytes: the payload of ", count, " elements in buckets of ", bucket,
             " does not fit a size_t");
  return buckets * sizeof(float) + sign_bit_bytes(count);
}

// Encodes the `count` f32 values at d_in (device memory) into the payload at d_payload (device
// memory, sign_payload_bytes() bytes, any alignment): the bytes the CPU codec writes after the
// header for the same values and bucket (the sign codec draws no random numbers, so it takes no
// context). Each scale is the canonical-order mean of compressors/sign/sign_math.h.
// Two-phase workspace: the encoder needs none. With d_workspace == nullptr and
// workspace_bytes != nullptr it only sets *workspace_bytes = 0 and launches nothing (the query);
// it runs when d_workspace != nullptr or workspace_bytes == nullptr.
// Throws gradzip::Error(invalid_argument) for bucket 0 or null pointers with count > 0, and
// gradzip::Error(unsupported) when a launch fails.
void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream,
                 KernelVariant variant = KernelVariant::fast);

// Whether sign_encode_with_feedback runs for this shape: the fast encoder's segments are staged
// whole and end on sign-byte boundaries (bucket <= 4096 and its segment a multiple of 8
// elements, e.g. every power-of-two bucket up to 4096), and count > 0.
inline bool sign_fuses_feedback(std::size_t count, std::size_t bucket) {
  if (bucket == 0 || count == 0) return false;
  const SignFastPlan plan = sign_fast_plan(count, bucket);
  return plan.resident && plan.segment_elements % 8 == 0;
}

// Error feedback fused into the fast encode, one pass per segment: with c = d_grad[i] +
// d_residual[i] (f32 add), writes the payload sign_encode writes for c and sets d_residual[i] =
// finite_or_zero(c - D(payload)[i]): the bits of error feedback's general path. Returns false,
// launching nothing, when !sign_fuses_feedback(count, bucket). d_grad and d_residual: `count`
// floats of device memory, not overlapping each other or the payload. Asynchronous on `stream`.
bool sign_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count,
                               std::size_t bucket, std::byte* d_payload, void* stream);

// Decodes the payload at d_payload (device memory, sign_payload_bytes() bytes) into d_out
// (device memory, `count` floats): d_out[i] = bit ? -scale : +scale, or d_out[i] += that when
// `accumulate`. Validates first, like the CPU decoder: sets *d_status (device int) to
// kSignStatusOk, then to kSignStatusUnusedBits when an unused bit of the last byte is set; the
// decode pass writes d_out only when *d_status is still kSignStatusOk. Scales may hold any
// bits (as on the CPU). The caller reads *d_status after synchronising with `stream`. Bits
// written: those of the CPU codec's decode; accumulate adds with one f32 add per element like
// decode_add (NaN results may carry a different NaN payload than on the CPU).
// Throws gradzip::Error(invalid_argument) for bucket 0 or null pointers, and
// gradzip::Error(unsupported) when a launch fails.
void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream,
                 KernelVariant variant = KernelVariant::fast);

}  // namespace gradzip::kernels::cuda

namespace gradzip::kernels::emulated {

// The CPU twins of the launch wrappers above (compressors/sign/emulated/sign_twins.cpp): the
// same contracts, each call's device work queued as one operation on the emulated device's
// stream (kernels/emulated/kernel_twins.h states what a twin is). The payload size is the
// host function above.
using cuda::sign_payload_bytes;
void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream,
                 cuda::KernelVariant variant = cuda::KernelVariant::fast);
bool sign_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count,
                               std::size_t bucket, std::byte* d_payload, void* stream);
void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream,
                 cuda::KernelVariant variant = cuda::KernelVariant::fast);

}  // namespace gradzip::kernels::emulated
