// The fp8 codec's device path (compressors/cuda/device_codec_row.h): the header built and
// checked on the host as the host codec does (fp8_codec.h), the payload by the kernels of
// fp8_kernels.h on the work stream. Every message of n elements has the same header, so a
// stream-ordered decode compares it on the device (fixed_header).
#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/fp8/cuda/fp8_kernels.h"
#include "compressors/fp8/fp8_codec.h"

namespace gradzip::compressors {
namespace {

WireHeader encode_fp8(const CompressionSpec& spec, const float* d_in, std::size_t n,
                      const EncodeContext& /*ctx*/, std::byte* d_payload,
                      const std::string& /*op*/) {
  const fp8::Format format = fp8::format_of(spec);
  fp8::cuda::encode(d_in, n, format, d_payload, device::work_stream());
  return fp8::header_for(format, n);
}

void decode_fp8(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  fp8::check_header(header, target.count, op);
  fp8::cuda::decode(d_payload, target.count, static_cast<fp8::Format>(header.small_param),
                    target.data, target.accumulate, device::work_stream());
  device::finish(op);  // synchronous calls: the one wait; stream-ordered: nothing
}

std::optional<WireHeader> fixed_fp8(const CompressionSpec& spec, std::size_t n) {
  return fp8::header_for(fp8::format_of(spec), n);
}

constexpr DeviceCodecRow kFp8Device{encode_fp8, decode_fp8, std::nullopt, fixed_fp8};

}  // namespace

const DeviceCodecRow* const fp8_device_row = &kFp8Device;

}  // namespace gradzip::compressors
