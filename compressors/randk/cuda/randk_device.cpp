// The random-k codec's device path (compressors/cuda/device_codec_row.h): the key written from
// the host into the payload, the values gathered and scattered by cuda/randk_kernels.h on the
// work stream. The key travels in the message, so there is no fixed header: the decoder reads
// the key on the host with the header (prefix_bytes), and a rank's own message in a
// stream-ordered call is checked on the device instead (decode_own). Error feedback fuses into
// the encode (any shape).
#include "kernels/device_api.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/randk/cuda/randk_kernels.h"
#include "compressors/randk/randk_cpu.h"
#include "compressors/randk/randk_header.h"
#include "compressors/randk/randk_math.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"
#include "kernels/cuda/small_bytes_cuda.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

WireHeader encode_randk(const CompressionSpec& spec, const float* d_in, std::size_t n,
                        const EncodeContext& ctx, std::byte* d_payload,
                        const std::string& /*op*/) {
  const WireHeader header = randk_header(spec, n);
  const kernels::RandkKey key = kernels::cpu::randk_key(ctx);
  std::array<std::byte, kRandkKeyBytes> key_bytes{};
  kernels::randk_write_key(key, key_bytes.data());
  cuda::write_small_bytes(d_payload, key_bytes.data(), key_bytes.size(), work_stream());
  cuda::randk_gather(d_in, n, key, entry_count_of(header), has_half_values(header),
                     d_payload + kRandkKeyBytes, work_stream());
  return header;
}

void decode_randk(const WireHeader& header, std::span<const std::byte> prefix,
                  const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  GZ_REQUIRE((header.flags & ~kRandkHalfValues) == 0 && header.small_param == 0,
             ErrorCode::malformed_message, op, ": flags 0x", std::hex, int{header.flags},
             ", small_param ", std::dec, int{header.small_param},
             " (expected flags 0 or 0x2, small_param 0)");
  const std::uint64_t k = entry_count_of(header);
  GZ_REQUIRE(n == 0 ? k == 0 : (k >= 1 && k <= n), ErrorCode::malformed_message, op, ": k = ",
             k, " for ", n, " elements (expected 1 <= k <= n, or 0 for an empty message)");
  const bool half = has_half_values(header);
  const std::uint64_t expected = kRandkKeyBytes + k * (half ? 2 : 4);
  GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
             header.payload_bytes, " bytes for k = ", k, " (expected ", expected, ")");
  const kernels::RandkKey key = kernels::randk_read_key(prefix.data() + kWireHeaderBytes);
  const std::byte* values = d_payload + kRandkKeyBytes;
  if (target.accumulate) {
    cuda::randk_scatter_add(values, k, half, key, n, target.data, work_stream());
  } else {
    cuda::randk_scatter(values, k, half, key, n, target.data, work_stream());
  }
  return finish(op);
}

// Error feedback in place (device_support.h, begin/end_sparse_feedback): encode from e, then
// subtract the message's values at its indices.
bool randk_fuses_feedback(const CompressionSpec&, std::size_t, const std::byte*) { return true; }
WireHeader encode_randk_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                      float* d_residual, std::size_t n, const EncodeContext& ctx,
                                      std::byte* d_payload, const std::string& op) {
  const DeviceScratch flag(sizeof(int), op);
  begin_sparse_feedback(d_grad, d_residual, n, flag.as<int>(), op);
  const WireHeader header = encode_randk(spec, d_residual, n, ctx, d_payload, op);
  cuda::randk_subtract_own(d_payload + kRandkKeyBytes, entry_count_of(header),
                           has_half_values(header), kernels::cpu::randk_key(ctx), n, d_residual,
                           work_stream());
  end_sparse_feedback(d_residual, n, flag.as<int>());
  return header;
}

std::string describe_randk_prefix_mismatch(int /*status*/) {
  return "the message header or key is not the one the call's spec and random stream give "
         "(its parameters, element count, k or key differ)";
}

// Random-k's own message in a stream-ordered call: the header and key this spec and ctx give,
// compared on the device with the message's, then the values scattered.
void decode_own_randk(const CompressionSpec& spec, std::span<const std::byte> in, float* d_out,
                      std::size_t n, const EncodeContext& ctx, const std::string& op) {
  const WireHeader header = randk_header(spec, n);
  const std::uint64_t expected_bytes = kWireHeaderBytes + header.payload_bytes;
  GZ_REQUIRE(in.size() == expected_bytes, ErrorCode::malformed_message, op, ": message of ",
             in.size(), " bytes for ", n, " elements (expected ", expected_bytes, ")");
  const kernels::RandkKey key = kernels::cpu::randk_key(ctx);
  std::array<std::byte, kWireHeaderBytes + kRandkKeyBytes> prefix{};
  write_header(header, std::span<std::byte>(prefix).first(kWireHeaderBytes));
  kernels::randk_write_key(key, prefix.data() + kWireHeaderBytes);
  const StatusWords<1> prefix_check(op, {describe_randk_prefix_mismatch});
  cuda::compare_small_bytes(in.data(), prefix.data(), prefix.size(), 1, prefix_check.word(0),
                            work_stream());
  prefix_check.check();
  cuda::randk_scatter(in.data() + prefix.size(), entry_count_of(header), has_half_values(header),
                      key, n, d_out, work_stream());
}

constexpr DeviceCodecRow kRandkDevice{.encode = encode_randk,
                                      .decode = decode_randk,
                                      .fuses_feedback = randk_fuses_feedback,
                                      .encode_with_feedback = encode_randk_with_feedback,
                                      .prefix_bytes = kRandkKeyBytes,
                                      .decode_own = decode_own_randk};
static_assert(kRandkKeyBytes <= kMaxDevicePrefixBytes);

}  // namespace

const DeviceCodecRow* const randk_device_row = &kRandkDevice;

}  // namespace gradzip::compressors
