// The none codec's device path (compressors/cuda/device_codec_row.h): the payload is the f32
// values, copied on the device; every message of n elements has the same header.
#include "kernels/device_api.h"

#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/wire_format.h"
#include "kernels/cuda/ef_cuda.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

WireHeader encode_none(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  const std::size_t bytes = checked_product(n, sizeof(float), op);
  copy_on_device(d_payload, d_in, bytes, op);
  return WireHeader{WireCodec::none, 0, 0, n, bytes, 0};
}

void decode_none(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  expected_element_payload(header, sizeof(float), op);
  if (!target.accumulate) {
    copy_on_device(target.data, d_payload, n * sizeof(float), op);
    return finish(op);
  }
  DeviceScratch staging(aligned(d_payload, 4) ? 0 : n * sizeof(float), op);
  const float* values = reinterpret_cast<const float*>(d_payload);
  if (!aligned(d_payload, 4)) {
    copy_on_device(staging.as<float>(), d_payload, n * sizeof(float), op);
    values = staging.as<float>();
  }
  cuda::ef_compensate(target.data, values, target.data, n, work_stream());  // acc + value
  return finish(op);
}

std::optional<WireHeader> fixed_none(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::none, 0, 0, n, n * sizeof(float), 0};
}

constexpr DeviceCodecRow kNoneDevice{encode_none, decode_none, std::nullopt, fixed_none};

}  // namespace

const DeviceCodecRow* const none_device_row = &kNoneDevice;

}  // namespace gradzip::compressors
