// The sign codec's device path (compressors/cuda/device_codec_row.h): the payload written and
// checked by the kernels of cuda/sign_kernels.h on the work stream, the header built and
// checked on the host as the host codec does. Every message of n elements has the same header
// (fixed_header), and error feedback fuses into the fast encoder where its segments allow.
#include "kernels/device_api.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/sign/cuda/sign_kernels.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

WireHeader encode_sign(const CompressionSpec& spec, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload,
                       const std::string& /*op*/) {
  const std::size_t payload = cuda::sign_payload_bytes(n, spec.bucket);
  cuda::sign_encode(d_in, n, spec.bucket, d_payload, nullptr, nullptr, work_stream());
  return WireHeader{WireCodec::sign, 0, 1, n, payload, spec.bucket};
}

std::string describe_sign_status(int /*status*/) {
  return "an unused bit above the last element of the sign bits is set";
}

void decode_sign(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  GZ_REQUIRE(header.flags == 0 && header.small_param == 1, ErrorCode::malformed_message, op,
             ": flags 0x", std::hex, int{header.flags}, ", small_param ", std::dec,
             int{header.small_param}, " (expected 0 and 1)");
  GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
             ": bucket (large_param) is 0 (expected >= 1)");
  const auto bucket = static_cast<std::size_t>(bucket_of(header));
  const std::size_t expected = cuda::sign_payload_bytes(n, bucket);
  GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
             header.payload_bytes, " bytes for ", n, " elements, bucket=", bucket,
             " (expected ", expected, ")");
  const StatusWords<1> status(op, {describe_sign_status});
  cuda::sign_decode(d_payload, n, bucket, target.data, target.accumulate, status.word(0),
                    work_stream());
  status.check();  // synchronous calls: the one wait; stream-ordered: nothing
}

std::optional<WireHeader> fixed_sign(const CompressionSpec& spec, std::size_t n) {
  return WireHeader{WireCodec::sign, 0, 1, n, cuda::sign_payload_bytes(n, spec.bucket),
                    spec.bucket};
}

// When the fast encoder's segments allow it (cuda/sign_kernels.h, sign_fuses_feedback).
bool sign_fuses(const CompressionSpec& spec, std::size_t n, const std::byte*) {
  return cuda::sign_fuses_feedback(n, spec.bucket);
}
WireHeader encode_sign_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                     float* d_residual, std::size_t n,
                                     const EncodeContext& /*ctx*/, std::byte* d_payload,
                                     const std::string& op) {
  const WireHeader header = required_fixed_header(fixed_sign(spec, n), spec, op);
  GZ_REQUIRE(cuda::sign_encode_with_feedback(d_grad, d_residual, n, spec.bucket, d_payload,
                                             work_stream()),
             ErrorCode::internal, op, ": sign_fuses_feedback accepted ", n,
             " elements that the fused encoder refused");
  return header;
}

constexpr DeviceCodecRow kSignDevice{encode_sign, decode_sign, std::nullopt, fixed_sign,
                                     sign_fuses, encode_sign_with_feedback};

}  // namespace

const DeviceCodecRow* const sign_device_row = &kSignDevice;

}  // namespace gradzip::compressors
