// The fp16 and bf16 codecs' device path (compressors/cuda/device_codec_row.h): the payload is
// written and widened by the cast kernels (kernels/cuda/cast_cuda.h, shared with every codec's
// f16 / bf16 inputs and outputs); every message of n elements has the same header, and error
// feedback fuses into the encode when the payload is 2-byte aligned.
#include "kernels/device_api.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/wire_format.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/ef_cuda.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

// fp16 / bf16 payload from f32 values; through aligned scratch when the payload is not 2-byte
// aligned (the kernel stores 16-bit words).
void write_half_payload(const float* d_in, std::size_t count, bool bf16, std::byte* d_payload,
                        const std::string& op) {
  const std::size_t bytes = checked_product(count, 2, op);
  DeviceScratch staging(aligned(d_payload, 2) ? 0 : bytes, op);
  auto* target = aligned(d_payload, 2) ? reinterpret_cast<std::uint16_t*>(d_payload)
                                       : staging.as<std::uint16_t>();
  if (bf16) cuda::f32_to_bf16(d_in, target, count, work_stream());
  else cuda::f32_to_f16(d_in, target, count, work_stream());
  if (!aligned(d_payload, 2)) copy_on_device(d_payload, target, bytes, op);
}

// f32 values of an fp16 / bf16 payload, into d_out (4-byte aligned f32).
void widen_half_payload(const std::byte* d_payload, std::size_t count, bool bf16, float* d_out,
                        const std::string& op) {
  const std::size_t bytes = checked_product(count, 2, op);
  DeviceScratch staging(aligned(d_payload, 2) ? 0 : bytes, op);
  const std::uint16_t* source = reinterpret_cast<const std::uint16_t*>(d_payload);
  if (!aligned(d_payload, 2)) {
    copy_on_device(staging.as<std::uint16_t>(), d_payload, bytes, op);
    source = staging.as<std::uint16_t>();
  }
  if (bf16) cuda::bf16_to_f32(source, d_out, count, work_stream());
  else cuda::f16_to_f32(source, d_out, count, work_stream());
}

WireHeader encode_half(const float* d_in, std::size_t n, bool bf16, std::byte* d_payload,
                       const std::string& op) {
  write_half_payload(d_in, n, bf16, d_payload, op);
  return WireHeader{bf16 ? WireCodec::bf16 : WireCodec::fp16, 0, 0, n, n * 2, 0};
}
WireHeader encode_fp16(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  return encode_half(d_in, n, false, d_payload, op);
}
WireHeader encode_bf16(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  return encode_half(d_in, n, true, d_payload, op);
}

void decode_half(const WireHeader& header, const std::byte* d_payload, const DecodeTarget& target,
                 bool bf16, const std::string& op) {
  const std::size_t n = target.count;
  expected_element_payload(header, 2, op);
  if (!target.accumulate) {
    widen_half_payload(d_payload, n, bf16, target.data, op);
    return finish(op);
  }
  DeviceScratch widened(n * sizeof(float), op);
  widen_half_payload(d_payload, n, bf16, widened.as<float>(), op);
  cuda::ef_compensate(target.data, widened.as<float>(), target.data, n, work_stream());
  return finish(op);
}
void decode_fp16(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  decode_half(header, d_payload, target, false, op);
}
void decode_bf16(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  decode_half(header, d_payload, target, true, op);
}

std::optional<WireHeader> fixed_fp16(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::fp16, 0, 0, n, n * 2, 0};
}
std::optional<WireHeader> fixed_bf16(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::bf16, 0, 0, n, n * 2, 0};
}

// The casts (kernels/cuda/ef_cuda.h, ef_cast_fused): the kernel stores 16-bit words.
bool cast_fuses_feedback(const CompressionSpec&, std::size_t, const std::byte* d_payload) {
  return aligned(d_payload, 2);
}
WireHeader encode_cast_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                     float* d_residual, std::size_t n,
                                     const EncodeContext& /*ctx*/, std::byte* d_payload,
                                     const std::string& op) {
  const bool bf16 = spec.codec == CodecKind::bf16;
  const WireHeader header =
      required_fixed_header(bf16 ? fixed_bf16(spec, n) : fixed_fp16(spec, n), spec, op);
  cuda::ef_cast_fused(d_grad, d_residual, reinterpret_cast<std::uint16_t*>(d_payload), bf16, n,
                      work_stream());
  return header;
}

constexpr DeviceCodecRow kFp16Device{encode_fp16, decode_fp16, DType::f16, fixed_fp16,
                                     cast_fuses_feedback, encode_cast_with_feedback};
constexpr DeviceCodecRow kBf16Device{encode_bf16, decode_bf16, DType::bf16, fixed_bf16,
                                     cast_fuses_feedback, encode_cast_with_feedback};

}  // namespace

const DeviceCodecRow* const fp16_device_row = &kFp16Device;
const DeviceCodecRow* const bf16_device_row = &kBf16Device;

}  // namespace gradzip::compressors
