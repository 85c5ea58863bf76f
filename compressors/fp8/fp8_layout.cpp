// The fp8 codec's header check and CPU loops (compressors/fp8/fp8_codec.h). One scalar loop for
// every ISA: the element math is integer work per element, and the codes are the same bytes
// whichever ISA the dispatcher picked.
#include "compressors/fp8/fp8_codec.h"

#include <algorithm>
#include <ios>

#include "gradzip/error.h"

namespace gradzip::compressors::fp8 {

void check_header(const WireHeader& header, std::size_t count, std::string_view op) {
  GZ_REQUIRE(header.flags == 0, ErrorCode::malformed_message, op, ": flags are 0x", std::hex,
             int{header.flags}, " (expected 0)");
  GZ_REQUIRE(header.small_param <= static_cast<std::uint8_t>(Format::e5m2),
             ErrorCode::malformed_message, op, ": format (small_param) is ",
             int{header.small_param}, " (expected 0: e4m3 or 1: e5m2)");
  GZ_REQUIRE(header.large_param == kFp8Block, ErrorCode::malformed_message, op,
             ": block (large_param) is ", header.large_param, " (expected ", kFp8Block, ")");
  const std::size_t expected = payload_bytes(count);
  GZ_REQUIRE(header.payload_bytes == expected, ErrorCode::malformed_message, op, ": payload of ",
             header.payload_bytes, " bytes for ", count, " elements (expected ", expected, ": ",
             block_count(count), " scale bytes + ", count, " code bytes)");
}

void encode_blocks(const float* x, std::size_t n, Format format, std::uint8_t* scales,
                   std::uint8_t* codes) noexcept {
  for (std::size_t begin = 0, block = 0; begin < n; begin += kFp8Block, ++block) {
    const std::size_t end = std::min(n, begin + kFp8Block);
    std::uint32_t amax = 0;
    for (std::size_t i = begin; i < end; ++i)
      amax = std::max(amax, kernels::float_bits(x[i]) & 0x7fffffffu);
    if (amax >= 0x7f800000u) {  // a NaN or an infinity: the whole block decodes to NaN
      scales[block] = kNonfiniteScale;
      std::fill(codes + begin, codes + end, std::uint8_t{0});
      continue;
    }
    const int s = scale_exponent(amax, format);
    scales[block] = static_cast<std::uint8_t>(s + kScaleBias);
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t bits = kernels::float_bits(x[i]);
      codes[i] = static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                           encode_magnitude(bits & 0x7fffffffu, s, format));
    }
  }
}

void decode_range(const std::uint8_t* scales, const std::uint8_t* codes, std::size_t begin,
                  std::size_t n, Format format, float* out, bool accumulate) noexcept {
  for (std::size_t i = begin; i < begin + n; ++i) {
    const std::uint8_t scale = scales[i / kFp8Block];
    const float value =
        scale == kNonfiniteScale
            ? kernels::bits_float(0x7fc00000u)
            : decode_element(codes[i], static_cast<int>(scale) - kScaleBias, format);
    if (accumulate) out[i - begin] += value;
    else out[i - begin] = value;
  }
}

}  // namespace gradzip::compressors::fp8
