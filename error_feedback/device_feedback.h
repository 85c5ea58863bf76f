// Error feedback on CUDA tensors: the device half of error_feedback/error_feedback_codec.h's
// decorator, which calls it for chunks in device memory. Built from error_feedback/cuda/ with
// CUDA, from error_feedback/no_cuda/ (ErrorCode::unsupported) without.
#pragma once

#include <cstddef>
#include <span>

#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::error_feedback {

// Error feedback on a CUDA chunk (ErrorFeedbackCodec::encode_chunk for device tensors): with
// the residual slice `d_residual` (chunk.count floats in the memory of the chunk's device:
// ResidualStore::device_residual), on the device:
//   c = chunk + residual;  message = codec.encode(c) into `out`;  d = D(message);
//   residual = c - d;  decoded = d when `decoded` is not empty (device memory of the chunk's
//   device, chunk.count floats).
// The same element operations as the host decorator, so the same message bytes and residual
// bits. Returns the message size. The residual is written only once the encode and decode
// succeeded; nothing crosses between host and device but the codec's own header traffic.
std::size_t device_feedback_encode(const Codec& codec, ConstTensorView chunk,
                                   float* d_residual, std::span<std::byte> out,
                                   const EncodeContext& ctx, std::span<float> decoded);

}  // namespace gradzip::error_feedback
