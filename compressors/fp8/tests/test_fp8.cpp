// The fp8 codec's own tests: the element math against the formats' definitions, the scale rule
// (smallest power of two, never a clipped element), the error bound, non-finite blocks, the
// message layout and the spec key. The generic checks (round trip within the row's bound, every
// ISA's bytes, f16 / bf16 tensors, malformed messages, decode_add) run for fp8 as for every
// codec in tests/unit/test_codec_conformance.cpp, from the row's example specs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "collectives/codec_table.h"
#include "compressors/fp8/fp8_codec.h"
#include "compressors/fp8/fp8_math.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::fp8::Format;
using compressors::fp8::kFp8Block;
namespace fp8 = compressors::fp8;

// The value of `code` by the formats' definitions (OCP 8-bit floating point), in double:
// e4m3 has no infinities and one NaN per sign (S.1111.111); e5m2 is IEEE-like.
double reference_value(std::uint8_t code, Format format) {
  const int m = format == Format::e4m3 ? 3 : 2;
  const int e = 7 - m;
  const int bias = format == Format::e4m3 ? 7 : 15;
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int field = (code >> m) & ((1 << e) - 1);
  const int mantissa = code & ((1 << m) - 1);
  if (format == Format::e4m3 && field == 15 && mantissa == 7) return std::nan("");
  if (format == Format::e5m2 && field == 31)
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity() : std::nan("");
  if (field == 0) return sign * std::ldexp(mantissa, 1 - bias - m);
  return sign * std::ldexp(1.0 + std::ldexp(mantissa, -m), field - bias);
}

double largest_finite(Format format) { return format == Format::e4m3 ? 448.0 : 57344.0; }

// The f32 bits, as the element math reads them.
using kernels::float_bits;

// The code of x / 2^s by brute force over every finite code: the nearest value, ties to the code
// with an even mantissa (the last bit of the code).
std::uint8_t reference_code(float x, int s, Format format) {
  const double target = std::fabs(static_cast<double>(x)) / std::ldexp(1.0, s);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 128; ++code) {
    const double value = reference_value(static_cast<std::uint8_t>(code), format);
    if (!std::isfinite(value)) continue;
    const double distance = std::fabs(value - target);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

class Fp8Formats : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8Formats, EveryCodeDecodesToItsDefinedValueAndEncodesBackToItself) {
  const Format format = GetParam();
  for (int s : {-127, -20, 0, 5, 100}) {
    for (int code = 0; code < 256; ++code) {
      SCOPED_TRACE(::testing::Message() << "code 0x" << std::hex << code << std::dec << " s " << s);
      const double expected = reference_value(static_cast<std::uint8_t>(code), format);
      const float decoded = fp8::decode_element(static_cast<std::uint8_t>(code), s, format);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(decoded));
        continue;
      }
      const double scaled = expected * std::ldexp(1.0, s);
      if (std::fabs(scaled) > std::numeric_limits<float>::max()) continue;  // not a value f32 holds
      ASSERT_EQ(static_cast<double>(decoded), scaled);  // exact, subnormal f32 results included
      ASSERT_EQ(std::signbit(decoded), (code & 0x80) != 0);
      if (!std::isfinite(expected)) continue;
      const std::uint32_t bits = float_bits(decoded);
      const auto back = static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                                  fp8::encode_magnitude(bits & 0x7fffffffu, s, format));
      // +0 and -0 are the two zero codes; every other value has one code.
      EXPECT_EQ(back, code);
    }
  }
}

TEST_P(Fp8Formats, EncodingRoundsToNearestWithTiesToEven) {
  const Format format = GetParam();
  std::mt19937 random(7);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(format == Format::e4m3 ? -12 : -19, 8);
  int ties = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    float x = static_cast<float>(mantissa(random) * std::ldexp(1.0, exponent(random)));
    if (trial % 4 == 0) {
      // Exactly halfway between two neighbouring codes.
      // Below the largest finite code, so both neighbours are finite.
      const auto code = static_cast<std::uint8_t>(random() % (format == Format::e4m3 ? 0x7e : 0x7b));
      x = static_cast<float>((reference_value(code, format) + reference_value(code + 1, format)) / 2);
      ++ties;
    }
    if (trial % 2 == 1) x = -x;
    if (std::fabs(x) > largest_finite(format)) continue;
    const std::uint32_t bits = float_bits(x);
    const auto code = static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                                fp8::encode_magnitude(bits & 0x7fffffffu, 0, format));
    ASSERT_EQ(code, reference_code(x, 0, format)) << "x = " << x;
  }
  EXPECT_GT(ties, 40000);
}

TEST_P(Fp8Formats, TheScaleIsTheSmallestPowerOfTwoThatFitsTheBlockMaximum) {
  const Format format = GetParam();
  std::mt19937 random(11);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> exponent(-140, 127);
  for (int trial = 0; trial < 100000; ++trial) {
    const float amax = static_cast<float>(std::min<double>(
        mantissa(random) * std::ldexp(1.0, exponent(random)), std::numeric_limits<float>::max()));
    const int s = fp8::scale_exponent(float_bits(amax), format);
    ASSERT_GE(s, -127);
    ASSERT_LE(s, 127);
    // Fits at s; at s - 1 it would not (unless s is the floor): nothing is ever clipped, and no
    // resolution is given away.
    EXPECT_LE(static_cast<double>(amax), largest_finite(format) * std::ldexp(1.0, s)) << amax;
    if (s > -127) {
      EXPECT_GT(static_cast<double>(amax), largest_finite(format) * std::ldexp(1.0, s - 1)) << amax;
    }
  }
  EXPECT_EQ(fp8::scale_exponent(0, format), -127);
}

// One encode and decode of blocks spanning f32's whole range (f32 subnormals, blocks of mixed
// magnitudes, values at FLT_MAX) stays within fp8_error_bound of each block's maximum, and is
// not trivially so: the error is mostly nonzero and sometimes near the bound.
TEST_P(Fp8Formats, EachElementErrsByAtMostTheBoundOfItsBlock) {
  const Format format = GetParam();
  const CompressionSpec spec = CompressionSpec::parse(format == Format::e4m3 ? "fp8" : "fp8:format=e5m2");
  const auto codec = make_codec(spec);
  std::mt19937 random(3);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> exponent(-150, 127);
  std::vector<float> x(kFp8Block * 4000 + 5);
  for (std::size_t begin = 0; begin < x.size(); begin += kFp8Block) {
    const int top = exponent(random);
    for (std::size_t i = begin; i < std::min(x.size(), begin + kFp8Block); ++i) {
      const double v = mantissa(random) * std::ldexp(1.0, top - static_cast<int>(random() % 30));
      x[i] = static_cast<float>(std::clamp(v, -3.4e38, 3.4e38));
    }
  }
  x[0] = std::numeric_limits<float>::max();
  x[1] = -std::numeric_limits<float>::max();
  x[kFp8Block] = std::numeric_limits<float>::denorm_min();
  const std::vector<std::byte> message =
      testing::encode_message(*codec, ConstTensorView{x.data(), x.size(), DType::f32});
  std::vector<float> decoded(x.size());
  codec->decode(message, TensorView{decoded.data(), decoded.size(), DType::f32});
  double largest_share = 0;
  std::size_t nonzero_errors = 0;
  for (std::size_t begin = 0; begin < x.size(); begin += kFp8Block) {
    const std::size_t end = std::min(x.size(), begin + kFp8Block);
    double y_max = 0;
    for (std::size_t i = begin; i < end; ++i) y_max = std::max(y_max, std::fabs(static_cast<double>(x[i])));
    const double bound = fp8::fp8_error_bound(format, y_max);
    for (std::size_t i = begin; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(decoded[i])) << i;
      const double error = std::fabs(static_cast<double>(decoded[i]) - x[i]);
      ASSERT_LE(error, bound) << "element " << i << ": " << x[i] << " -> " << decoded[i];
      largest_share = std::max(largest_share, error / bound);
      nonzero_errors += error > 0;
    }
  }
  EXPECT_GT(largest_share, 0.5);
  EXPECT_GT(nonzero_errors, x.size() / 2);
}

TEST_P(Fp8Formats, ABlockWithANanOrInfinityDecodesToNanAndItsNeighboursAreUntouched) {
  const Format format = GetParam();
  const auto codec = make_codec(format == Format::e4m3 ? "fp8" : "fp8:format=e5m2");
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(3 * kFp8Block, 1.5f);
    x[kFp8Block + 7] = bad;
    const auto message = testing::encode_message(*codec, ConstTensorView{x.data(), x.size(), DType::f32});
    EXPECT_EQ(static_cast<std::uint8_t>(message[compressors::kWireHeaderBytes + 1]), fp8::kNonfiniteScale);
    std::vector<float> decoded(x.size());
    codec->decode(message, TensorView{decoded.data(), decoded.size(), DType::f32});
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (i / kFp8Block == 1) EXPECT_TRUE(std::isnan(decoded[i])) << i;
      else EXPECT_EQ(decoded[i], 1.5f) << i;
    }
  }
}

// The CPU loops (fast paths for the common scales, the element math elsewhere) write and read
// exactly what the element math says, for blocks at every scale and every code: the device
// kernels run the element math itself, so this is what makes the host's bytes the device's.
TEST_P(Fp8Formats, TheCpuLoopsGiveTheElementMathsBitsAtEveryScale) {
  const Format format = GetParam();
  std::mt19937 random(5);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::vector<float> x;
  for (int top = -150; top <= 127; ++top) {
    for (std::size_t i = 0; i < kFp8Block; ++i) {
      const double v = mantissa(random) * std::ldexp(1.0, top - static_cast<int>(random() % 40));
      x.push_back(static_cast<float>(std::clamp(v, -3.4e38, 3.4e38)));
    }
  }
  const std::size_t blocks = fp8::block_count(x.size());
  std::vector<std::uint8_t> scales(blocks), codes(x.size());
  fp8::encode_blocks(x.data(), x.size(), format, scales.data(), codes.data());
  std::set<int> scales_seen;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::uint32_t amax = 0;
    for (std::size_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i)
      amax = std::max(amax, float_bits(x[i]) & 0x7fffffffu);
    const int s = fp8::scale_exponent(amax, format);
    scales_seen.insert(s);
    ASSERT_EQ(scales[b], s + 127) << "block " << b;
    for (std::size_t i = b * kFp8Block; i < (b + 1) * kFp8Block; ++i) {
      const std::uint32_t bits = float_bits(x[i]);
      const auto expected = static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                                      fp8::encode_magnitude(bits & 0x7fffffffu, s, format));
      ASSERT_EQ(codes[i], expected) << "element " << i << " = " << x[i] << ", s = " << s;
    }
  }
  // Scales from the floor through the fast range [-100, 100] to beyond it.
  EXPECT_GT(scales_seen.size(), 150u);
  EXPECT_TRUE(scales_seen.count(-127));
  EXPECT_GT(*scales_seen.rbegin(), 105);
  // Every code under every scale byte, decoded and accumulated.
  std::vector<std::uint8_t> all_scales(256), all_codes(256 * kFp8Block);
  for (int b = 0; b < 256; ++b) {
    all_scales[b] = static_cast<std::uint8_t>(b);
    for (std::size_t j = 0; j < kFp8Block; ++j)
      all_codes[b * kFp8Block + j] = static_cast<std::uint8_t>((b * 7 + j * 8 + j / 4) & 0xff);
  }
  std::vector<float> decoded(all_codes.size()), accumulated(all_codes.size(), 0.75f);
  fp8::decode_range(all_scales.data(), all_codes.data(), 0, all_codes.size(), format, decoded.data(), false);
  fp8::decode_range(all_scales.data(), all_codes.data(), 0, all_codes.size(), format, accumulated.data(), true);
  std::vector<float> expected(all_codes.size()), expected_sum(all_codes.size());
  for (std::size_t i = 0; i < all_codes.size(); ++i) {
    const int scale = all_scales[i / kFp8Block];
    expected[i] = scale == fp8::kNonfiniteScale ? std::numeric_limits<float>::quiet_NaN()
                                                : fp8::decode_element(all_codes[i], scale - 127, format);
    expected_sum[i] = 0.75f + expected[i];
  }
  EXPECT_TRUE(testing::same_bits(decoded, expected));
  EXPECT_TRUE(testing::same_bits(accumulated, expected_sum));
  // A code past FLT_MAX (never written by the encoder) decodes to an infinity of its sign.
  const std::uint8_t largest = format == Format::e4m3 ? 0x7e : 0x7b;
  EXPECT_EQ(fp8::decode_element(largest, 127, format), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8::decode_element(largest | 0x80, 127, format), -std::numeric_limits<float>::infinity());
}

INSTANTIATE_TEST_SUITE_P(Fp8, Fp8Formats, ::testing::Values(Format::e4m3, Format::e5m2),
                         [](const auto& info) {
                           return std::string(info.param == Format::e4m3 ? "e4m3" : "e5m2");
                         });

TEST(Fp8Codec, TheMessageIsOneScaleBytePerBlockThenOneCodeBytePerElement) {
  const auto codec = make_codec("fp8:format=e5m2");
  // Block 0: max 3.0 -> s = ceil(log2(3 / 57344)) = -14 (3 <= 1.75 * 2^(15 - 14) = 3.5);
  // block 1 (two elements): max 0.5 -> s = -16 (0.5 <= 1.75 * 2^-1).
  std::vector<float> x(kFp8Block + 2, 0.0f);
  x[0] = 3.0f;
  x[1] = -1.0f;
  x[kFp8Block] = 0.5f;
  x[kFp8Block + 1] = -0.0f;
  const auto message = testing::encode_message(*codec, ConstTensorView{x.data(), x.size(), DType::f32});
  ASSERT_EQ(message.size(), compressors::kWireHeaderBytes + 2 + x.size());
  const auto byte = [&](std::size_t i) {
    return static_cast<int>(message[compressors::kWireHeaderBytes + i]);
  };
  EXPECT_EQ(byte(0), -14 + 127);
  EXPECT_EQ(byte(1), -16 + 127);
  // 3 / 2^-14 = 49152 = 1.5 * 2^15: field 30, mantissa 0b10 -> 0x7a; -1 / 2^-14 = -2^14: 0xf4.
  EXPECT_EQ(byte(2), 0x7a);
  EXPECT_EQ(byte(3), 0xf4);
  // 0.5 / 2^-16 = 2^15: field 30 -> 0x78; -0 keeps its sign.
  EXPECT_EQ(byte(2 + kFp8Block), 0x78);
  EXPECT_EQ(byte(2 + kFp8Block + 1), 0x80);
  EXPECT_EQ(static_cast<int>(message[4]), 1);  // version
  EXPECT_EQ(static_cast<int>(message[7]), 1);  // small_param: e5m2
}

// The pipelined ring and SRA cut chunks where the row says (collectives/segment_plan.h): whole
// blocks of 32 whatever the spec's unrelated bucket field holds, and two messages cut there carry
// exactly the scales and codes of the whole chunk's one message.
TEST(Fp8Codec, SegmentsAreCutOnWholeBlocksAndCarryTheWholeMessagesBytes) {
  CompressionSpec spec = CompressionSpec::parse("fp8:format=e5m2");
  for (const std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{512}}) {
    spec.bucket = bucket;
    EXPECT_EQ(collectives::segment_granularity(spec), kFp8Block) << "bucket " << bucket;
  }
  const auto codec = make_codec(spec);
  const std::vector<float> x = testing::gaussian(5 * kFp8Block + 9, 17);
  const std::size_t cut = 3 * kFp8Block;
  const auto whole = testing::encode_message(*codec, ConstTensorView{x.data(), x.size(), DType::f32});
  const auto first = testing::encode_message(*codec, ConstTensorView{x.data(), cut, DType::f32});
  const auto second = testing::encode_message(*codec, ConstTensorView{x.data() + cut, x.size() - cut, DType::f32});
  const std::size_t h = compressors::kWireHeaderBytes;
  const std::size_t blocks = fp8::block_count(x.size());
  std::vector<std::byte> scales(first.begin() + h, first.begin() + h + 3);
  scales.insert(scales.end(), second.begin() + h, second.begin() + h + 3);
  std::vector<std::byte> codes(first.begin() + h + 3, first.end());
  codes.insert(codes.end(), second.begin() + h + 3, second.end());
  EXPECT_EQ(scales, std::vector<std::byte>(whole.begin() + h, whole.begin() + h + blocks));
  EXPECT_EQ(codes, std::vector<std::byte>(whole.begin() + h + blocks, whole.end()));
}

TEST(Fp8Codec, HeaderFieldsOtherThanTheCodecWritesAreRefused) {
  const auto codec = make_codec("fp8");
  const std::vector<float> x(70, 0.25f);
  const auto message = testing::encode_message(*codec, ConstTensorView{x.data(), x.size(), DType::f32});
  testing::expect_malformed(*codec, testing::with_byte(message, 6, 1), x.size(), "flags");
  testing::expect_malformed(*codec, testing::with_byte(message, 7, 2), x.size(), "format");
  testing::expect_malformed(*codec, testing::with_byte(message, 24, 16), x.size(), "block");
}

TEST(Fp8Codec, TheFormatKeyParsesPrintsAndRefusesOtherValues) {
  EXPECT_EQ(CompressionSpec::parse("fp8").format, 0);
  EXPECT_EQ(CompressionSpec::parse("fp8:format=e5m2").format, 1);
  EXPECT_EQ(CompressionSpec::parse("fp8").to_string().rfind("fp8:format=e4m3,ef=off,", 0), 0u);
  const CompressionSpec spec = CompressionSpec::parse("fp8:format=e5m2,algo=ring");
  EXPECT_EQ(CompressionSpec::parse(spec.to_string()), spec);
  std::string message;
  EXPECT_EQ(testing::error_code_of([] { (void)CompressionSpec::parse("fp8:format=e3m4"); }, &message),
            ErrorCode::invalid_spec);
  EXPECT_NE(message.find("one of: e4m3, e5m2"), std::string::npos) << message;
  EXPECT_EQ(testing::error_code_of([] { (void)CompressionSpec::parse("qsgd:format=e5m2"); }),
            ErrorCode::invalid_spec);
}

}  // namespace
}  // namespace gradzip
