// The qsgd codec's device path (compressors/cuda/device_codec_row.h): the payload written and
// checked by the kernels of cuda/qsgd_kernels.h on the work stream, the header built and
// checked on the host as the host codec does. Every message of n elements has the same header
// (fixed_header), and error feedback fuses into the fast encoder where its segments allow.
#include "compressors/qsgd/cuda/qsgd_device.h"

#include "kernels/device_api.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::compressors {

namespace device {

std::string describe_qsgd_status(int status) {
  return status == kernels::cuda::kQsgdStatusNonzeroCode
             ? "a bucket with a non-finite scale holds a non-zero code (expected every code of "
               "such a bucket to be 0)"
             : "a bucket scale is not one encode writes (expected +0 .. +Inf or the quiet NaN "
               "0x7fc00000)";
}

}  // namespace device

namespace {

using namespace device;  // compressors/cuda/device_support.h

WireHeader encode_qsgd(const CompressionSpec& spec, const float* d_in, std::size_t n,
                       const EncodeContext& ctx, std::byte* d_payload, const std::string& /*op*/) {
  const cuda::QsgdEncodeParams params{ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset};
  const std::size_t payload = cuda::qsgd_payload_bytes(n, spec.bits, spec.bucket);
  cuda::qsgd_encode(d_in, n, spec.bits, spec.bucket, params, d_payload, nullptr, nullptr,
                    work_stream());
  return WireHeader{WireCodec::qsgd, 0, static_cast<std::uint8_t>(spec.bits), n, payload,
                    spec.bucket};
}

void decode_qsgd(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  GZ_REQUIRE(header.flags == 0, ErrorCode::malformed_message, op, ": flags 0x", std::hex,
             int{header.flags}, " (expected 0)");
  const int bits = qsgd_bits_of(header);
  GZ_REQUIRE(bits >= 1 && bits <= 8, ErrorCode::malformed_message, op, ": bits ", bits,
             " (expected 1..8)");
  GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
             ": bucket 0 (expected >= 1)");
  GZ_REQUIRE(n <= cuda::kQsgdCudaMaxCount, ErrorCode::malformed_message, op, ": count ", n,
             " exceeds the ", cuda::kQsgdCudaMaxCount, " a qsgd message can hold");
  const auto bucket = static_cast<std::size_t>(bucket_of(header));
  const std::size_t expected = cuda::qsgd_payload_bytes(n, bits, bucket);
  GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
             header.payload_bytes, " bytes for ", n, " elements, bits=", bits, ", bucket=",
             bucket, " (expected ", expected, ")");
  const StatusWords<1> status(op, {describe_qsgd_status});
  cuda::qsgd_decode(d_payload, n, bits, bucket, target.data, target.accumulate, status.word(0),
                    work_stream());
  status.check();  // synchronous calls: the one wait; stream-ordered: nothing
}

std::optional<WireHeader> fixed_qsgd(const CompressionSpec& spec, std::size_t n) {
  return WireHeader{WireCodec::qsgd, 0, static_cast<std::uint8_t>(spec.bits), n,
                    cuda::qsgd_payload_bytes(n, spec.bits, spec.bucket), spec.bucket};
}

// When the fast encoder's segments allow it (cuda/qsgd_kernels.h, qsgd_fuses_feedback).
bool qsgd_fuses(const CompressionSpec& spec, std::size_t n, const std::byte*) {
  return cuda::qsgd_fuses_feedback(n, spec.bits, spec.bucket);
}
WireHeader encode_qsgd_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                     float* d_residual, std::size_t n, const EncodeContext& ctx,
                                     std::byte* d_payload, const std::string& op) {
  const WireHeader header = required_fixed_header(fixed_qsgd(spec, n), spec, op);
  const cuda::QsgdEncodeParams params{ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset};
  GZ_REQUIRE(cuda::qsgd_encode_with_feedback(d_grad, d_residual, n, spec.bits, spec.bucket,
                                             params, d_payload, work_stream()),
             ErrorCode::internal, op, ": qsgd_fuses_feedback accepted ", n,
             " elements that the fused encoder refused");
  return header;
}

constexpr DeviceCodecRow kQsgdDevice{encode_qsgd, decode_qsgd, std::nullopt, fixed_qsgd,
                                     qsgd_fuses, encode_qsgd_with_feedback};

}  // namespace

const DeviceCodecRow* const qsgd_device_row = &kQsgdDevice;

}  // namespace gradzip::compressors
