// Device kernels of the `qsgd` codec: they write exactly the payload bytes of the CPU codec
// (compressors/qsgd/qsgd_codec.cpp documents the layout; the element math is compressors/qsgd/qsgd_math.h, shared
// with the CPU loops) and decode a payload to the CPU decoder's bits. Host-callable; no CUDA
// headers needed by includers (the stream is an opaque cudaStream_t cast to void*, nullptr =
// the default stream). Every call is asynchronous on `stream`, allocates nothing and never
// synchronises.
//
// Two implementations (`variant`, kernels/cuda/kernel_variant.h): KernelVariant::fast (the
// default: one pass over each bucket, compressors/qsgd/qsgd_fast_layout.h) and KernelVariant::reference
// (the first kernels). Every contract below holds for both, byte for byte; the reference stays
// until a GPU run has shown the fast kernels identical (tests/gpu/test_qsgd_cuda.cpp checks both).
//
// Payload (the bytes after the 32-byte header; any alignment):
//   [0, 4 * num_buckets)            f32 scale of each bucket, num_buckets = ceil(count / bucket)
//   [4 * num_buckets, +code_bytes)  codes, an LSB-first bit stream: element i occupies stream
//                                   bits [i * bits, (i + 1) * bits); code_bytes =
//                                   ceil(count * bits / 8); unused high bits of the last byte 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/qsgd/qsgd_fast_layout.h"
#include "compressors/qsgd/qsgd_math.h"
#include "gradzip/error.h"
#include "kernels/cuda/kernel_variant.h"
#include "kernels/run_fast_layout.h"

namespace gradzip::kernels::cuda {

// What the CPU codec's EncodeContext carries (gradzip/codec.h needs C++20, which nvcc is not
// given): the Philox key and counters. Element i of the chunk draws the word of the global
// element element_offset + i.
struct QsgdEncodeParams {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t tensor_id = 0;
  std::uint64_t element_offset = 0;
};

// Counts above this are refused (the CPU codec's kQsgdMaxCount, 2^60).
inline constexpr std::size_t kQsgdCudaMaxCount = std::size_t{1} << 60;

// Values qsgd_decode() writes to *d_status. When a payload has several offences, the largest
// code is reported.
inline constexpr int kQsgdStatusOk = 0;
// A non-finite bucket (scale +Inf or the canonical NaN) holds a non-zero code.
inline constexpr int kQsgdStatusNonzeroCode = 1;
// A scale encode never writes: negative, -0, or a NaN other than 0x7FC00000.
inline constexpr int kQsgdStatusBadScale = 2;

// The wrappers' shape check, host-side and shared with their twins: throws
// gradzip::Error(invalid_argument) naming `op` when bits is outside 1..8, bucket is 0 or count
// exceeds kQsgdCudaMaxCount.
inline void check_qsgd_shape(const char* op, std::size_t count, int bits, std::size_t bucket) {
  GZ_REQUIRE(bits >= kQsgdMinBits && bits <= kQsgdMaxBits, ErrorCode::invalid_argument, op,
             ": bits=", bits, " is outside 1..8");
  GZ_REQUIRE(bucket >= 1, ErrorCode::invalid_argument, op, ": bucket=0 (expected >= 1)");
  GZ_REQUIRE(count <= kQsgdCudaMaxCount, ErrorCode::invalid_argument, op, ": ", count,
             " elements exceed the ", kQsgdCudaMaxCount, " a qsgd message can hold");
}

// Buckets of a payload, ceil(count / bucket), and bytes of its code stream,
// ceil(count * bits / 8), for a checked shape.
inline std::size_t qsgd_buckets(std::size_t count, std::size_t bucket) {
  return count / bucket + (count % bucket != 0 ? 1 : 0);
}
inline std::size_t qsgd_code_bytes(std::size_t count, int bits) {
  return (count * static_cast<std::size_t>(bits) + 7) / 8;
}

// 4 * ceil(count / bucket) + ceil(count * bits / 8): the payload size, equal to the CPU codec's.
// Throws gradzip::Error(invalid_argument) when bits is outside 1..8, bucket is 0 or count
// exceeds kQsgdCudaMaxCount.
inline std::size_t qsgd_payload_bytes(std::size_t count, int bits, std::size_t bucket) {
  check_qsgd_shape("cuda.qsgd_payload_bytes", count, bits, bucket);
  return qsgd_buckets(count, bucket) * sizeof(float) + qsgd_code_bytes(count, bits);
}

// Encodes the `count` f32 values at d_in (device memory) into the payload at d_payload (device
// memory, qsgd_payload_bytes() bytes, any alignment): the bytes the CPU codec writes after the
// header for the same values, bits, bucket and context.
// Two-phase workspace: the encoder needs none. With d_workspace == nullptr and
// workspace_bytes != nullptr it only sets *workspace_bytes = 0 and launches nothing (the query);
// it runs when d_workspace != nullptr or workspace_bytes == nullptr.
// Throws gradzip::Error(invalid_argument) for bad bits / bucket / count or null pointers with
// count > 0, and gradzip::Error(unsupported) when a launch fails.
void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream,
                 KernelVariant variant = KernelVariant::fast);

// Whether qsgd_encode_with_feedback runs for this shape: the fast encoder's segments are
// resident, hold whole 16-element runs and own whole code bytes (e.g. the default bucket of 512
// at every bit width), and count > 0.
inline bool qsgd_fuses_feedback(std::size_t count, int bits, std::size_t bucket) {
  if (count == 0 || bucket == 0 || bits < 1 || bits > 8 || count > kQsgdCudaMaxCount) return false;
  const QsgdFastPlan plan = qsgd_fast_plan(count, bits, bucket);
  return plan.resident && !plan.boundary_bytes && plan.segment_elements % kFastRun == 0;
}

// Error feedback fused into the fast encode, one pass: with c = d_grad[i] + d_residual[i] (f32
// add), writes the payload qsgd_encode writes for c under `params` and sets d_residual[i] =
// finite_or_zero(c - D(payload)[i]): the bits of error feedback's general path. Returns false,
// launching nothing, when !qsgd_fuses_feedback(count, bits, bucket). d_grad and d_residual:
// `count` floats of device memory, not overlapping each other or the payload. Asynchronous.
bool qsgd_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count, int bits,
                               std::size_t bucket, const QsgdEncodeParams& params,
                               std::byte* d_payload, void* stream);

// Decodes the payload at d_payload (device memory, qsgd_payload_bytes() bytes) into d_out
// (device memory, `count` floats): d_out[i] = value, or d_out[i] += value when `accumulate`.
// Validates first, like the CPU decoder: sets *d_status (device int) to kQsgdStatusOk, then to
// a kQsgdStatus* code when a scale is not one encode writes or a non-finite bucket holds a
// non-zero code; the decode pass writes d_out only when *d_status is still kQsgdStatusOk. The
// caller reads *d_status after synchronising with `stream`. Bits written: those of the CPU
// codec's decode (NaN buckets give 0x7FC00000); accumulate adds with one f32 add per element
// like decode_add (NaN results may carry a different NaN payload than on the CPU).
// Throws gradzip::Error(invalid_argument) for bad bits / bucket / count or null pointers, and
// gradzip::Error(unsupported) when a launch fails.
void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream,
                 KernelVariant variant = KernelVariant::fast);

}  // namespace gradzip::kernels::cuda

namespace gradzip::kernels::emulated {

// The CPU twins of the launch wrappers above (compressors/qsgd/emulated/qsgd_twins.cpp): the
// same contracts, each call's device work queued as one operation on the emulated device's
// stream (kernels/emulated/kernel_twins.h states what a twin is). The shape check and the
// payload size are the host functions above.
using cuda::qsgd_payload_bytes;
void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const cuda::QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream,
                 cuda::KernelVariant variant = cuda::KernelVariant::fast);
bool qsgd_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count, int bits,
                               std::size_t bucket, const cuda::QsgdEncodeParams& params,
                               std::byte* d_payload, void* stream);
void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream,
                 cuda::KernelVariant variant = cuda::KernelVariant::fast);

}  // namespace gradzip::kernels::emulated
