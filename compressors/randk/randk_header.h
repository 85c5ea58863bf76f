// The header of random-k's message (randk_codec.cpp documents the layout), shared by the host
// codec and the device path (cuda/randk_device.cpp), so that both write the same one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/wire_format.h"
#include "gradzip/compression_spec.h"

namespace gradzip::compressors {

// The header of `spec`'s message of n elements (values fp32 or fp16): it follows from the spec
// and n alone; the index key, which does not, is the payload's first kRandkKeyBytes.
inline WireHeader randk_header(const CompressionSpec& spec, std::size_t n) {
  const std::size_t k = spec.k_for(n);
  const bool half = spec.values == DType::f16;
  return WireHeader{WireCodec::randk, half ? kRandkHalfValues : std::uint8_t{0}, 0, n,
                    kRandkKeyBytes + k * (half ? 2 : 4), k};
}

}  // namespace gradzip::compressors
