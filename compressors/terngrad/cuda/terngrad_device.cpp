// The terngrad codec's device path (compressors/cuda/device_codec_row.h): qsgd's 2-bit codes
// drawn by qsgd's kernels into a qsgd payload in scratch and repacked as trit bytes by
// terngrad's (cuda/terngrad_kernels.h); decoded the other way round, so qsgd_decode checks and
// decodes the codes. Every message of n elements has the same header (fixed_header), and error
// feedback fuses into qsgd's encoder where its segments allow.
#include "kernels/device_api.h"

#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/qsgd/cuda/qsgd_device.h"
#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/terngrad/cuda/terngrad_kernels.h"
#include "compressors/terngrad/terngrad_math.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

static_assert(kernels::kTerngradMaxCount == cuda::kQsgdCudaMaxCount,
              "terngrad's codes are drawn by qsgd's kernels: its count limit is theirs");

// A terngrad payload from the qsgd payload of its 2-bit codes: the scales as they are, the codes
// repacked as trit bytes.
void terngrad_payload_from_qsgd(const std::byte* d_qsgd, std::size_t n,
                                const kernels::TerngradLayout& layout, std::byte* d_payload,
                                const std::string& op) {
  if (layout.scale_bytes > 0) copy_on_device(d_payload, d_qsgd, layout.scale_bytes, op);
  cuda::terngrad_trits_from_codes(d_qsgd + layout.scale_bytes, n, d_payload + layout.scale_bytes,
                                  work_stream());
}

// qsgd's 2-bit codes (drawn into a qsgd payload in scratch), repacked as trit bytes.
WireHeader encode_terngrad(const CompressionSpec& spec, const float* d_in, std::size_t n,
                           const EncodeContext& ctx, std::byte* d_payload, const std::string& op) {
  const int bits = kernels::kTerngradCodeBits;
  GZ_REQUIRE(kernels::terngrad_layout_fits(n, spec.bucket), ErrorCode::invalid_argument, op, ": ",
             n, " elements exceed the ", kernels::kTerngradMaxCount,
             " a terngrad message can hold");
  const kernels::TerngradLayout layout = kernels::terngrad_layout(n, spec.bucket);
  const std::size_t payload = layout.payload_bytes();
  const std::size_t qsgd_bytes = cuda::qsgd_payload_bytes(n, bits, spec.bucket);
  DeviceScratch qsgd(qsgd_bytes, op);
  const cuda::QsgdEncodeParams params{ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset};
  cuda::qsgd_encode(d_in, n, bits, spec.bucket, params, qsgd.as<std::byte>(), nullptr, nullptr,
                    work_stream());
  terngrad_payload_from_qsgd(qsgd.as<std::byte>(), n, layout, d_payload, op);
  return WireHeader{WireCodec::terngrad, 0, 0, n, payload, spec.bucket};
}

std::string describe_trit_status(int /*status*/) {
  return "a trit byte is not one encode writes (expected five trits below 243, the digits after "
         "the last element 0)";
}
std::string describe_terngrad_scale_status(int status) {
  return status == cuda::kQsgdStatusNonzeroCode
             ? "a bucket with a non-finite scale holds a non-zero trit (expected every trit of "
               "such a bucket to be 0)"
             : describe_qsgd_status(status);
}

// The trit bytes become a qsgd 2-bit payload in scratch, which qsgd_decode checks and decodes.
// A bad trit byte poisons the scratch's first scale, so qsgd_decode writes nothing either.
void decode_terngrad(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                     const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  GZ_REQUIRE(header.flags == 0 && header.small_param == 0, ErrorCode::malformed_message, op,
             ": flags 0x", std::hex, int{header.flags}, ", small_param ", std::dec,
             int{header.small_param}, " (expected 0 and 0)");
  GZ_REQUIRE(bucket_of(header) >= 1, ErrorCode::malformed_message, op,
             ": bucket 0 (expected >= 1)");
  GZ_REQUIRE(n <= kernels::kTerngradMaxCount, ErrorCode::malformed_message, op, ": count ", n,
             " exceeds the ", kernels::kTerngradMaxCount, " a terngrad message can hold");
  const auto bucket = static_cast<std::size_t>(bucket_of(header));
  const kernels::TerngradLayout layout = kernels::terngrad_layout(n, bucket);
  const std::size_t scale_bytes = layout.scale_bytes;
  const std::size_t expected = layout.payload_bytes();
  GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
             header.payload_bytes, " bytes for ", n, " elements, bucket=", bucket, " (expected ",
             expected, ")");
  const int bits = kernels::kTerngradCodeBits;
  DeviceScratch qsgd(cuda::qsgd_payload_bytes(n, bits, bucket), op);
  // [0]: the trit check, [1]: qsgd_decode's.
  const StatusWords<2> status(op, {describe_trit_status, describe_terngrad_scale_status});
  if (scale_bytes > 0) copy_on_device(qsgd.as<std::byte>(), d_payload, scale_bytes, op);
  cuda::terngrad_codes_from_trits(d_payload + scale_bytes, n, qsgd.as<std::byte>() + scale_bytes,
                                  status.word(0), qsgd.as<std::byte>(), work_stream());
  cuda::qsgd_decode(qsgd.as<std::byte>(), n, bits, bucket, target.data, target.accumulate,
                    status.word(1), work_stream());
  status.check();  // synchronous calls: the one wait; stream-ordered: nothing
}

std::optional<WireHeader> fixed_terngrad(const CompressionSpec& spec, std::size_t n) {
  if (!kernels::terngrad_layout_fits(n, spec.bucket)) return std::nullopt;
  return WireHeader{WireCodec::terngrad, 0, 0, n,
                    kernels::terngrad_layout(n, spec.bucket).payload_bytes(), spec.bucket};
}

// Terngrad's codes are qsgd's 2-bit codes (decoding to the same values), repacked.
bool terngrad_fuses(const CompressionSpec& spec, std::size_t n, const std::byte*) {
  return kernels::terngrad_layout_fits(n, spec.bucket) &&
         cuda::qsgd_fuses_feedback(n, kernels::kTerngradCodeBits, spec.bucket);
}
WireHeader encode_terngrad_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                         float* d_residual, std::size_t n,
                                         const EncodeContext& ctx, std::byte* d_payload,
                                         const std::string& op) {
  const WireHeader header = required_fixed_header(fixed_terngrad(spec, n), spec, op);
  const int bits = kernels::kTerngradCodeBits;
  DeviceScratch codes(cuda::qsgd_payload_bytes(n, bits, spec.bucket), op);
  const cuda::QsgdEncodeParams params{ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset};
  GZ_REQUIRE(cuda::qsgd_encode_with_feedback(d_grad, d_residual, n, bits, spec.bucket, params,
                                             codes.as<std::byte>(), work_stream()),
             ErrorCode::internal, op, ": qsgd_fuses_feedback accepted ", n,
             " elements that the fused encoder refused");
  terngrad_payload_from_qsgd(codes.as<std::byte>(), n, kernels::terngrad_layout(n, spec.bucket),
                             d_payload, op);
  return header;
}

constexpr DeviceCodecRow kTerngradDevice{encode_terngrad, decode_terngrad, std::nullopt,
                                         fixed_terngrad, terngrad_fuses,
                                         encode_terngrad_with_feedback};

}  // namespace

const DeviceCodecRow* const terngrad_device_row = &kTerngradDevice;

}  // namespace gradzip::compressors
