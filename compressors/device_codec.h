// Codecs on CUDA tensors (internal): what every Codec does when a TensorView says
// DeviceKind::cuda. make_codec() wraps each host codec so that its encode / decode /
// decode_add send CUDA views here (gradzip/codec.h states the public contract: messages in
// device memory, legacy default stream, synchronous, same bytes as the host codec).
//
// A build with CUDA implements these in compressors/cuda/device_codec.cpp with the kernels of
// kernels/cuda/; a build without CUDA (and the host-only sanitized test library) links
// compressors/no_cuda/device_codec.cpp, which refuses with ErrorCode::unsupported.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "gradzip/codec.h"

namespace gradzip::compressors {

// True in builds that run codecs on CUDA tensors.
bool device_codecs_built() noexcept;

// `codec`'s encode of the CUDA tensor `in` into `out` (device memory on in's device, at least
// codec.max_encoded_bytes(in.count) bytes): the bytes the host codec writes for the same values,
// spec and context. Returns the message size.
std::size_t device_encode(const Codec& codec, ConstTensorView in, std::span<std::byte> out,
                          const EncodeContext& ctx);

// `codec`'s decode (accumulate = false: out = D(in)) or decode_add (accumulate = true, out must
// be f32: out += D(in)) of the message `in` (device memory on out's device). The message is
// validated like on the host: its header on the host, its payload on the device; a malformed
// message throws ErrorCode::malformed_message and leaves `out` untouched.
void device_decode(const Codec& codec, std::span<const std::byte> in, TensorView out,
                   bool accumulate);

// The decode (out = D(in)) of a message this rank encoded with `ctx` (error feedback decodes the
// message it just wrote; random-k's shared-index all-reduce its own message after summing the
// values): device_decode, except in a stream-ordered call (kernels/cuda/stream_ordered_call.h)
// for a codec whose device row has `decode_own` (random-k, compressors/cuda/device_codec_row.h):
// its header and key are not read back but compared on the device with the ones the spec and
// ctx give for out.count elements (a mismatch fails the call's checks) while the values are
// scattered.
void device_decode_own(const Codec& codec, std::span<const std::byte> in, TensorView out,
                         const EncodeContext& ctx);

// Error feedback fused into the encode, for the codecs whose device row has a fused encoder
// (compressors/cuda/device_codec_row.h: fuses_feedback, encode_with_feedback) and the shapes it
// takes: one pass over g and e (today fp16 and bf16: kernels/cuda/ef_cuda.h, ef_cast_fused;
// sign, qsgd and terngrad (qsgd's 2-bit codes) when the fast encoders' segments allow it), or in
// place (top-k and random-k: c = g + e formed in the residual's memory, encoded from there, and
// the residual updated at the message's entries only, with a finite_or_zero sweep only when
// some c was not finite): writes into `out` the message `codec` writes for c = g + e and sets
// e = finite_or_zero(c - D(message)), the bits of the general path (c, encode, decode, update)
// and of the host's fused encode. g: f32 on its device; d_residual: g.count floats there.
// nullopt, with nothing queued, for the other codecs and shapes (and an f16 / bf16 g or a cast
// payload the kernel cannot store to): the caller runs the general path.
std::optional<std::size_t> device_encode_with_feedback(const Codec& codec, ConstTensorView g,
                                                       float* d_residual, std::span<std::byte> out,
                                                       const EncodeContext& ctx);

// Throws unless `view` can be worked on as a CUDA tensor here: ErrorCode::unsupported without
// CUDA (build or device), invalid_argument when its memory is not device memory of its device.
// What callers check before they change any state for a CUDA tensor.
void require_device_tensor(ConstTensorView view, std::string_view op);

}  // namespace gradzip::compressors
