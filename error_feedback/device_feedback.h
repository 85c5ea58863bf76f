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
// the residual slice `residual` in host memory (the residual store, so checkpoints keep
// working), on the device:
//   c = chunk + residual;  message = codec.encode(c) into `out`;  d = D(message);
//   residual = c - d (copied back to the host);  decoded = d when `decoded` is not empty
//   (device memory of the chunk's device, chunk.count floats).
// The same element operations as the host decorator, so the same message bytes and residual
// bits. Returns the message size. The residual is written only once everything succeeded.
std::size_t device_feedback_encode(const Codec& codec, ConstTensorView chunk,
                                   std::span<float> residual, std::span<std::byte> out,
                                   const EncodeContext& ctx, std::span<float> decoded);

}  // namespace gradzip::error_feedback
