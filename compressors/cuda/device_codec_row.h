// A codec's device path (builds with device codecs): the row that compressors/cuda/device_codec.cpp
// routes a CUDA tensor's encode and decode through. Each codec defines `<name>_device_row`
// (declared below from gradzip/codec_list.h): a pointer to its row, or null for a codec without
// a device path (its CUDA tensors are refused with ErrorCode::unsupported). The codecs with a
// folder define it there (compressors/<codec>/cuda/), the others in cuda/device_codec.cpp.
//
// A device path writes the host codec's message layout: the header is built and checked on the
// host with compressors/wire_format.h, the payload is written and validated on the device on
// the thread's work stream (compressors/cuda/device_support.h has the helpers).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/codec_list.h"

namespace gradzip::compressors {

// Where a device decoder writes: f32 values (the output itself, or scratch widened into it).
struct DecodeTarget {
  float* data = nullptr;
  std::size_t count = 0;
  bool accumulate = false;  // out += D(in) instead of out = D(in)
};

// Writes the payload of `spec`'s message for the f32 values d_in[0, n) at d_payload (device
// memory) and returns the header (which the caller copies in front of it).
using DeviceEncoder = WireHeader (*)(const CompressionSpec& spec, const float* d_in, std::size_t n,
                                     const EncodeContext& ctx, std::byte* d_payload,
                                     const std::string& op);

// Checks the codec-specific header fields the host decoder checks, then decodes the payload into
// `target`. `prefix` holds the first bytes of the message: the header and the row's
// prefix_bytes after it (random-k's key).
// Returns with the work stream synchronised (each ends with its one wait), or in a
// stream-ordered call with the work queued.
using DeviceDecoder = void (*)(const WireHeader& header, std::span<const std::byte> prefix,
                               const std::byte* d_payload, const DecodeTarget& target,
                               const std::string& op);

// Error feedback fused into the encode (compressors/device_codec.h,
// device_encode_with_feedback): whether the codec's fused encoder takes `spec`'s message of n
// f32 values whose payload starts at d_payload (its alignment matters to some kernels). Pure
// host logic: nothing is queued.
using DeviceFeedbackCheck = bool (*)(const CompressionSpec& spec, std::size_t n,
                                     const std::byte* d_payload);

// Writes at d_payload the payload of `spec`'s message for c = d_grad + d_residual (n f32 values
// on the device) and sets d_residual = finite_or_zero(c - D(message)), in the bits of the general
// path (compensate, encode, decode, update); returns the header (which the caller writes in
// front of it). Called only where the row's DeviceFeedbackCheck said yes; the work is queued on
// the work stream, the caller finishes it.
using DeviceFeedbackEncoder = WireHeader (*)(const CompressionSpec& spec, const float* d_grad,
                                             float* d_residual, std::size_t n,
                                             const EncodeContext& ctx, std::byte* d_payload,
                                             const std::string& op);

// The most bytes after the header that a codec's decoder reads on the host with the header
// (DeviceCodecRow::prefix_bytes).
inline constexpr std::size_t kMaxDevicePrefixBytes = 32;

// A stream-ordered decode (out = D(in), n f32 values at d_out) of a message this rank encoded
// with `ctx` (compressors/device_codec.h, device_decode_own), for a codec whose decoder would
// otherwise read its prefix back to the host: the prefix that `spec` and `ctx` give is compared
// on the device instead (a mismatch fails the call's checks), and the values are decoded. The
// caller has checked the pointers and set the device; the work is queued, the caller finishes.
using DeviceOwnDecoder = void (*)(const CompressionSpec& spec, std::span<const std::byte> in,
                                  float* d_out, std::size_t n, const EncodeContext& ctx,
                                  const std::string& op);

struct DeviceCodecRow {
  DeviceEncoder encode = nullptr;
  DeviceDecoder decode = nullptr;
  // fp16 / bf16: a decode (not decode_add) into a tensor of this dtype copies the payload, as
  // the host codec does.
  std::optional<DType> copied_payload_dtype{};
  // The header of every message `spec` writes for n elements, when it follows from them alone
  // (the codecs whose message size is fixed): what a stream-ordered decode compares the received
  // header with on the device, and what the fused error-feedback encoders write. Null, or
  // nullopt for a spec, when the header travels in the message only (random-k's key,
  // approximate top-k's entry count).
  std::optional<WireHeader> (*fixed_header)(const CompressionSpec& spec, std::size_t n) = nullptr;
  // Error feedback in one pass (both set; the generic code in cuda/device_codec.cpp checks the
  // gradient's dtype and alignment, the output's size and device, and writes the header) or,
  // null, the general path's four passes.
  DeviceFeedbackCheck fuses_feedback = nullptr;
  DeviceFeedbackEncoder encode_with_feedback = nullptr;
  // Bytes after the header that the decoder reads on the host with it (random-k's index key),
  // handed to `decode` in its `prefix`; at most kMaxDevicePrefixBytes.
  std::size_t prefix_bytes = 0;
  // Null: device_decode_own runs the plain decode.
  DeviceOwnDecoder decode_own = nullptr;
};

#define GRADZIP_DECLARE_DEVICE_ROW(name, wire_id) \
  extern const DeviceCodecRow* const name##_device_row;
GRADZIP_CODECS(GRADZIP_DECLARE_DEVICE_ROW)
#undef GRADZIP_DECLARE_DEVICE_ROW

}  // namespace gradzip::compressors
