// The fp8 codec's header check and CPU loops (compressors/fp8/fp8_codec.h). One loop for every
// ISA (the compiler's, no hand-written vector path yet), so the codes are the same bytes
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

namespace {

// Blocks whose scale lies in [-kFastScaleMin, kFastScaleMax] take the fast loops below; the
// others (scales near f32's ends: subnormal results, FLT_MAX's rounding guard) the element math
// of fp8_math.h as it is. The fast loops give the same bits (tests/test_fp8.cpp compares them
// over every scale).
constexpr int kFastScaleMin = -100;
constexpr int kFastScaleMax = 100;

// The code of x / 2^s for a block with s in the fast range: an f32 subnormal x becomes a signed
// zero (|x| / 2^s < 2^-26, below half of either format's smallest subnormal); a value that
// lands in the format's normal range is rounded to nearest even on its f32 bits (exponent and
// mantissa together, so that a carry moves into the exponent); the rest, the format's
// subnormals, go through encode_magnitude.
inline std::uint8_t fast_code(std::uint32_t bits, int s, Format format, const FormatParams& p) {
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude < 0x00800000u) return static_cast<std::uint8_t>(sign);
  const int exponent = static_cast<int>(magnitude >> 23) - 127 - s;
  if (exponent < 1 - p.bias)
    return static_cast<std::uint8_t>(sign | encode_magnitude(magnitude, s, format));
  // |x| / 2^s is a normal f32 (its exponent is within [1 - B, emax]): its bits are |x|'s with
  // the exponent lowered by s.
  const auto scaled = static_cast<std::uint32_t>(static_cast<std::int64_t>(magnitude) -
                                                 (static_cast<std::int64_t>(s) << 23));
  const int shift = 23 - p.mantissa_bits;
  const std::uint32_t rounded =
      (scaled + ((1u << (shift - 1)) - 1u) + ((scaled >> shift) & 1u)) >> shift;
  const std::uint32_t rebias = static_cast<std::uint32_t>(127 - p.bias) << p.mantissa_bits;
  return static_cast<std::uint8_t>(sign | (rounded - rebias));
}

// The f32 value of each code at scale 2^0, per format (decode_element's, 256 entries).
struct DecodeTables {
  float e4m3[256];
  float e5m2[256];
};

const DecodeTables& decode_tables() {
  static const DecodeTables tables = [] {
    DecodeTables t{};
    for (int code = 0; code < 256; ++code) {
      t.e4m3[code] = decode_element(static_cast<std::uint8_t>(code), 0, Format::e4m3);
      t.e5m2[code] = decode_element(static_cast<std::uint8_t>(code), 0, Format::e5m2);
    }
    return t;
  }();
  return tables;
}

}  // namespace

void encode_blocks(const float* x, std::size_t n, Format format, std::uint8_t* scales,
                   std::uint8_t* codes) noexcept {
  for (std::size_t begin = 0, block = 0; begin < n; begin += kFp8Block, ++block) {
    const std::size_t end = std::min(n, begin + kFp8Block);
    const std::uint32_t amax = block_amax_bits(x + begin, end - begin);
    if (amax >= 0x7f800000u) {  // a NaN or an infinity: the whole block decodes to NaN
      scales[block] = kNonfiniteScale;
      std::fill(codes + begin, codes + end, std::uint8_t{0});
      continue;
    }
    const int s = scale_exponent(amax, format);
    scales[block] = static_cast<std::uint8_t>(s + kScaleBias);
    if (s >= kFastScaleMin && s <= kFastScaleMax) {
      const FormatParams p = params_of(format);
      for (std::size_t i = begin; i < end; ++i)
        codes[i] = fast_code(kernels::float_bits(x[i]), s, format, p);
      continue;
    }
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t bits = kernels::float_bits(x[i]);
      codes[i] = static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                           encode_magnitude(bits & 0x7fffffffu, s, format));
    }
  }
}

void decode_range(const std::uint8_t* scales, const std::uint8_t* codes, std::size_t begin,
                  std::size_t n, Format format, float* out, bool accumulate) noexcept {
  const float* table = format == Format::e4m3 ? decode_tables().e4m3 : decode_tables().e5m2;
  std::size_t i = begin;
  while (i < begin + n) {
    // The elements of one block from i on.
    const std::size_t block = i / kFp8Block;
    const std::size_t stop = std::min(begin + n, (block + 1) * kFp8Block);
    const std::uint8_t scale = scales[block];
    float* const target = out + (i - begin);
    const std::size_t count = stop - i;
    if (scale == kNonfiniteScale) {
      for (std::size_t j = 0; j < count; ++j) {
        const float nan = kernels::bits_float(0x7fc00000u);
        target[j] = accumulate ? target[j] + nan : nan;
      }
    } else if (const int s = static_cast<int>(scale) - kScaleBias; s >= kFastScaleMin) {
      // table value x 2^s: both normal f32, the product exact (decode_element's value, or an
      // infinity past FLT_MAX as decode_element gives) and normal, so no flush-to-zero mode
      // can change it.
      const float factor = kernels::bits_float(static_cast<std::uint32_t>(s + 127) << 23);
      const std::uint8_t* const c = codes + i;
      if (accumulate) {
        for (std::size_t j = 0; j < count; ++j) target[j] += table[c[j]] * factor;
      } else {
        for (std::size_t j = 0; j < count; ++j) target[j] = table[c[j]] * factor;
      }
    } else {
      for (std::size_t j = 0; j < count; ++j) {
        const float value = decode_element(codes[i + j], s, format);
        target[j] = accumulate ? target[j] + value : value;
      }
    }
    i = stop;
  }
}

}  // namespace gradzip::compressors::fp8
