// What the fp8 codec's host code (fp8_codec.cpp) and device path (cuda/fp8_device.cpp) share:
// the message layout (fp8_codec.cpp documents it), the header check, and the CPU loops over the
// element math of fp8_math.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "compressors/fp8/fp8_math.h"
#include "compressors/wire_format.h"
#include "gradzip/compression_spec.h"

namespace gradzip::compressors::fp8 {

// The most elements a message holds: its payload (n + n / 32 bytes) must fit a size_t with the
// header.
inline constexpr std::size_t kMaxCount = std::numeric_limits<std::size_t>::max() / 2;

inline Format format_of(const CompressionSpec& spec) noexcept {
  return spec.format == static_cast<std::uint8_t>(Format::e5m2) ? Format::e5m2 : Format::e4m3;
}

inline std::size_t block_count(std::size_t count) noexcept {
  return count / kFp8Block + (count % kFp8Block != 0);
}

inline std::size_t payload_bytes(std::size_t count) noexcept {
  return block_count(count) + count;
}

inline WireHeader header_for(Format format, std::size_t count) {
  return WireHeader{WireCodec::fp8, 0, static_cast<std::uint8_t>(format), count,
                    payload_bytes(count), kFp8Block};
}

// The bits of the largest |x_i| over x[0, n) (sign cleared): at least 0x7f800000 when the block
// holds a NaN or an infinity. What a block's scale is chosen from.
inline std::uint32_t block_amax_bits(const float* x, std::size_t n) noexcept {
  std::uint32_t amax = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t magnitude = kernels::float_bits(x[i]) & 0x7fffffffu;
    amax = magnitude > amax ? magnitude : amax;
  }
  return amax;
}

// Throws ErrorCode::malformed_message (naming `op`) unless `header` (already checked to be an fp8
// header for `count` elements) has flags 0, a known format, block 32 and payload_bytes(count).
void check_header(const WireHeader& header, std::size_t count, std::string_view op);

// Scales and codes of x[0, n) (n a multiple of 32 except at the message's end): scales[b] for
// block b, codes[i] for element i.
void encode_blocks(const float* x, std::size_t n, Format format, std::uint8_t* scales,
                   std::uint8_t* codes) noexcept;

// out[i - begin] = D(element i) for i in [begin, begin + n) (accumulate: +=).
void decode_range(const std::uint8_t* scales, const std::uint8_t* codes, std::size_t begin,
                  std::size_t n, Format format, float* out, bool accumulate) noexcept;

}  // namespace gradzip::compressors::fp8
