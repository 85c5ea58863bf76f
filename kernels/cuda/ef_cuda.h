// Device side of error feedback (error_feedback/error_feedback_codec.h):
//   c = g + e;  message = C(c);  e = c - D(message)
// as two elementwise kernels around any codec's device encode/decode (ef_compensate before the
// encode, ef_update after the decode), and in one pass for the cast codecs (fp16, bf16), whose
// D(C(c)) is the widening of c's rounding: ef_cast_fused writes the message payload and the
// new residual from g and e alone.
//
// Every element is computed by the GZ_HOST_DEVICE functions of kernels/ef_math.h with plain IEEE f32
// operations (no FMA: the build passes --fmad=false) and kernels/cast_math.h, the operations
// the CPU ErrorFeedbackCodec performs, so the GPU gives the CPU's bits for every finite input.
// (NaN payloads may differ: a NaN that an f32 add or subtract produces or propagates is the
// canonical 0x7FFFFFFF on the GPU but x86's quiet NaN of the operand, or 0xFFC00000, on the
// CPU. Both are NaN.)
//
// Host-callable; no CUDA headers needed by includers (the stream is a cudaStream_t cast to
// void*, nullptr = the default stream). Asynchronous, no allocation, no workspace needed.
// count == 0 launches nothing. Launch failures: gradzip::Error(unsupported).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ef_math.h"

namespace gradzip::kernels::cuda {

// d_out[i] = d_grad[i] + d_residual[i] (the codec's input c). d_out may be d_grad or
// d_residual itself (each element is read before it is written, by the same thread).
void ef_compensate(const float* d_grad, const float* d_residual, float* d_out, std::size_t count,
                   void* stream);

// d_residual[i] = d_compensated[i] - d_decoded[i] (e = c - D(C(c))). d_residual may be
// d_compensated or d_decoded itself.
void ef_update(const float* d_compensated, const float* d_decoded, float* d_residual,
               std::size_t count, void* stream);

// ef_compensate that also flags a non-finite sum, for the in-place error feedback of the sparse
// codecs (top-k, random-k): when some d_out[i] is NaN or +-Inf, *d_flag is set to 1 (it is never
// cleared here: the caller zeroes it first). d_out may be d_grad or d_residual itself.
void ef_compensate_flagging(const float* d_grad, const float* d_residual, float* d_out,
                            std::size_t count, int* d_flag, void* stream);

// When *d_flag != 0: d_residual[i] = finite_or_zero(d_residual[i]) for every i (the sweep that
// gives an in-place update the general path's finite_or_zero(c - D) where some c was not finite).
// When *d_flag == 0 nothing is written and the data are not read: each thread block reads the
// flag and returns, so the common case costs a launch, not a pass over memory.
void ef_zero_nonfinite_if_flagged(float* d_residual, std::size_t count, const int* d_flag,
                                  void* stream);

// Fused update for the fp16 / bf16 codecs, per element i:
//   c = d_grad[i] + d_residual[i];  d_half_out[i] = RNE f16/bf16 bits of c;
//   d_residual[i] = c - widen(d_half_out[i]).
// d_half_out is the message payload (2 bytes per element, 2-byte aligned) and gets the bytes
// the CPU fp16/bf16 codec writes for c; d_residual gets what ErrorFeedbackCodec leaves in the
// residual. d_half_out must not overlap d_grad or d_residual.
void ef_cast_fused(const float* d_grad, float* d_residual, std::uint16_t* d_half_out, bool bf16,
                   std::size_t count, void* stream);

}  // namespace gradzip::kernels::cuda
