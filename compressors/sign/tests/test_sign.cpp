// The `sign` codec: every element decodes to exactly +-scale of its bucket, with the scale
// computed by an independent reference that follows the documented summation order
// (compressors/sign/sign_math.h), so these tests pin that order; the payload layout, every ISA giving
// the same bytes, the NaN/inf rules, and the refusal of every malformed message.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cpu/cpu_features.h"
#include "compressors/sign/sign_cpu.h"
#include "kernels/host_device.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::cpu::Isa;
using testing::decode_to_f32;
using testing::encode_message;
using testing::gaussian;
using testing::HostTensor;
using testing::kTestCounts;
using testing::kTestDTypes;


std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// The canonical sum of |x_j| * factor over x[0, len), written independently of
// compressors/sign/sign_math.h: lane l = j % 16 sums in increasing j from +0; then the lanes are halved
// in place (lane[l] += lane[l + w] for w = 8, 4, 2, 1).
float reference_sum(const float* x, std::size_t len, float factor) {
  std::array<float, 16> lane{};
  for (std::size_t j = 0; j < len; ++j) lane[j % 16] = lane[j % 16] + std::fabs(x[j]) * factor;
  for (std::size_t width = 8; width >= 1; width /= 2) {
    for (std::size_t l = 0; l < width; ++l) lane[l] = lane[l] + lane[l + width];
  }
  return lane[0];
}

// The documented scale of x[0, len): reference_sum / (float)len, NaN -> 0x7FC00000; when that
// is +inf, the overflow rescue: the sum of |x_j| * 2^-32, divided by len, times 2^32, at most
// FLT_MAX (+inf stays +inf).
float reference_scale(const float* x, std::size_t len) {
  const float scale = reference_sum(x, len, 1.0f) / static_cast<float>(len);
  if (std::isnan(scale)) return std::bit_cast<float>(0x7FC00000u);
  if (!std::isinf(scale)) return scale;
  const float rescued_sum = reference_sum(x, len, std::ldexp(1.0f, -32));
  if (std::isinf(rescued_sum)) return rescued_sum;
  return std::min(rescued_sum / static_cast<float>(len) * std::ldexp(1.0f, 32),
                  std::numeric_limits<float>::max());
}

float scale_in(const std::vector<std::byte>& message, std::size_t bucket_index) {
  float scale;
  std::memcpy(&scale, message.data() + kWireHeaderBytes + 4 * bucket_index, 4);
  return scale;
}

std::uint8_t byte_at(const std::vector<std::byte>& message, std::size_t offset) {
  return std::to_integer<std::uint8_t>(message.at(offset));
}


// A bucket's scale against the true mean |x| of its `len` elements. The canonical sum puts each
// |x| through at most m = ceil(len / 16) - 1 + 4 rounded additions (its lane, then the 4 tree
// levels), so |S - sum| <= gamma_m * sum with gamma_m = m u / (1 - m u), u = 2^-24; the
// division adds one more rounding and (float)len is exact here. Relative error <= (m + 1) u +
// O(u^2) < (m + 2) u. The overflow rescue has the same roundings (its * 2^-32 and * 2^32 are
// exact for |x| >= 2^-94, and its min with FLT_MAX only moves the scale towards the mean).
void expect_near_true_mean(const float* x, std::size_t len, float scale, std::size_t bucket_index) {
  double mean = 0.0;
  for (std::size_t j = 0; j < len; ++j) mean += std::fabs(static_cast<double>(x[j]));
  mean /= static_cast<double>(len);
  const double roundings = static_cast<double>(ceil_div(len, 16) + 3);
  EXPECT_LE(std::fabs(scale - mean), (roundings + 2) * std::ldexp(1.0, -24) * mean)
      << "bucket " << bucket_index;
}

// The value the codec must decode element i of `x` to in a bucket of `scale`.
float expected_value(float x, float scale) { return x < 0.0f ? -scale : scale; }

// Gaussian data with exact +0.0 and -0.0 mixed in (they must encode as bit 0).
std::vector<float> test_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values = gaussian(count, seed);
  for (std::size_t i = 0; i < count; i += 11) values[i] = (i % 22 == 0) ? 0.0f : -0.0f;
  return values;
}

std::unique_ptr<Codec> sign_codec(std::size_t bucket) {
  return make_codec("sign:bucket=" + std::to_string(bucket));
}

// ---- the codec's contract over every count x dtype x bucket --------------------------------

class SignRoundTrip : public ::testing::TestWithParam<std::tuple<DType, std::size_t>> {};

TEST_P(SignRoundTrip, DecodesToPlusMinusTheReferenceScaleExactly) {
  const auto [dtype, bucket] = GetParam();
  const auto codec = sign_codec(bucket);
  for (const std::size_t count : kTestCounts) {
    SCOPED_TRACE(::testing::Message()
                 << dtype_name(dtype) << " count " << count << " bucket " << bucket);
    const HostTensor input(dtype, test_values(count, count + 7));
    const std::vector<float> x = input.to_f32();  // the values the codec sees, exactly
    const auto message = encode_message(*codec, input.view());
    const std::size_t buckets = ceil_div(count, bucket);
    ASSERT_EQ(message.size(), kWireHeaderBytes + 4 * buckets + ceil_div(count, 8));
    EXPECT_EQ(message, encode_message(*codec, input.view())) << "encode is deterministic";

    const auto decoded = decode_to_f32(*codec, message, count);
    std::size_t mismatches = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      const std::size_t begin = b * bucket;
      const std::size_t len = std::min(bucket, count - begin);
      const float scale = reference_scale(x.data() + begin, len);
      ASSERT_EQ(kernels::float_bits(scale_in(message, b)), kernels::float_bits(scale)) << "scale of bucket " << b;

      expect_near_true_mean(x.data() + begin, len, scale, b);

      for (std::size_t i = begin; i < begin + len; ++i) {
        if (kernels::float_bits(decoded[i]) != kernels::float_bits(expected_value(x[i], scale)) && ++mismatches <= 5) {
          ADD_FAILURE() << "element " << i << ": x " << x[i] << " decoded " << decoded[i]
                        << " expected " << expected_value(x[i], scale);
        }
      }
    }
    EXPECT_EQ(mismatches, 0u);
    // Decoding into the input's dtype rounds the f32 values to nearest even.
    HostTensor decoded_in_dtype(dtype, count);
    codec->decode(message, decoded_in_dtype.view());
    EXPECT_EQ(decoded_in_dtype.to_f32(), HostTensor(dtype, decoded).to_f32());
  }
}

INSTANTIATE_TEST_SUITE_P(CountsDTypesBuckets, SignRoundTrip,
                         ::testing::Combine(::testing::ValuesIn(kTestDTypes),
                                            ::testing::Values(std::size_t{1}, std::size_t{7},
                                                              std::size_t{512}, std::size_t{4096})),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_bucket" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- layout ---------------------------------------------------------------------------------

TEST(SignCodec, PropertiesAndHeaderFields) {
  const auto codec = sign_codec(512);
  EXPECT_FALSE(codec->additive());
  EXPECT_FALSE(codec->sparse());
  EXPECT_EQ(codec->max_encoded_bytes(0), kWireHeaderBytes);
  EXPECT_EQ(codec->max_encoded_bytes(1), kWireHeaderBytes + 4 + 1);
  EXPECT_EQ(codec->max_encoded_bytes(1025), kWireHeaderBytes + 3 * 4 + 129);

  const std::vector<float> values = gaussian(1025, 3);
  const auto message = encode_message(*codec, host_view(values.data(), values.size()));
  const auto header = compressors::read_header(message, "test");
  EXPECT_EQ(header.codec, compressors::WireCodec::sign);
  EXPECT_EQ(header.flags, 0);
  EXPECT_EQ(header.small_param, 1);
  EXPECT_EQ(header.count, 1025u);
  EXPECT_EQ(header.payload_bytes, 3u * 4 + 129);
  EXPECT_EQ(header.large_param, 512u);

  const auto empty = encode_message(*codec, host_view(values.data(), 0));
  EXPECT_EQ(empty.size(), kWireHeaderBytes);
  EXPECT_TRUE(decode_to_f32(*codec, empty, 0).empty());
}

TEST(SignCodec, PacksBitsLsbFirstAfterTheScales) {
  // Buckets of 4: {-1, 2, -3, 4} -> 10/4, {0, -0, -5, 6} -> 11/4, {7, -8} -> 15/2, all exact.
  // Bits (x < 0): 1,0,1,0, 0,0,1,0 -> byte 0b01000101; 0,1 -> byte 0b00000010.
  const std::vector<float> values = {-1, 2, -3, 4, 0, -0.0f, -5, 6, 7, -8};
  const auto codec = sign_codec(4);
  const auto message = encode_message(*codec, host_view(values.data(), values.size()));
  std::vector<std::byte> expected(kWireHeaderBytes);
  compressors::write_header({compressors::WireCodec::sign, 0, 1, 10, 3 * 4 + 2, 4}, expected);
  for (const float scale : {2.5f, 2.75f, 7.5f}) {
    const auto bytes = std::bit_cast<std::array<std::byte, 4>>(scale);
    expected.insert(expected.end(), bytes.begin(), bytes.end());
  }
  expected.push_back(std::byte{0x45});
  expected.push_back(std::byte{0x02});
  EXPECT_EQ(message, expected);
  EXPECT_EQ(
      decode_to_f32(*codec, message, values.size()),
      (std::vector<float>{-2.5f, 2.5f, -2.5f, 2.5f, 2.75f, 2.75f, -2.75f, 2.75f, 7.5f, -7.5f}));
}

class SignCodecOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(SignCodecOnEachIsa);

TEST_P(SignCodecOnEachIsa, AllZeroInputHasScaleZeroAndDecodesToPositiveZeros) {
  for (const float zero : {0.0f, -0.0f}) {
    const std::vector<float> values(1000, zero);
    {
      const Isa isa = GetParam();
      testing::ScopedIsa forced(isa);
      const auto codec = sign_codec(64);
      const auto message = encode_message(*codec, host_view(values.data(), values.size()));
      for (std::size_t b = 0; b < ceil_div(values.size(), 64); ++b) {
        EXPECT_EQ(kernels::float_bits(scale_in(message, b)), 0u);
      }
      for (std::size_t i = kWireHeaderBytes + 4 * 16; i < message.size(); ++i) {
        EXPECT_EQ(byte_at(message, i), 0) << "sign byte at " << i;
      }
      for (const float value : decode_to_f32(*codec, message, values.size())) {
        ASSERT_EQ(kernels::float_bits(value), 0u) << "isa " << kernels::cpu::isa_name(isa);
      }
    }
  }
}

// ---- vector paths ---------------------------------------------------------------------------

struct IsaResults {
  std::vector<std::byte> message;
  std::vector<float> decoded;
  std::vector<float> accumulated;
  std::vector<float> decoded_bf16;
};

// Everything one ISA produces for `input` (which may start at any offset of its storage).
IsaResults run_with_isa(Isa isa, const Codec& codec, ConstTensorView input,
                        std::size_t message_offset) {
  testing::ScopedIsa forced(isa);
  IsaResults results;
  results.message = encode_message(codec, input);
  // A receive buffer holding the message at an odd offset.
  std::vector<std::byte> buffer(message_offset + results.message.size());
  std::memcpy(buffer.data() + message_offset, results.message.data(), results.message.size());
  const std::span<const std::byte> placed(buffer.data() + message_offset, results.message.size());
  results.decoded = decode_to_f32(codec, placed, input.count);
  results.accumulated = gaussian(input.count, 99);
  codec.decode_add(placed, results.accumulated.data(), input.count);
  HostTensor bf16(DType::bf16, input.count);
  codec.decode(placed, bf16.view());
  results.decoded_bf16 = bf16.to_f32();
  return results;
}

std::vector<std::uint32_t> bit_patterns(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits;
  for (const float value : values) bits.push_back(kernels::float_bits(value));
  return bits;
}

TEST(SignCodec, EveryIsaGivesIdenticalBytes) {
  // 12345 elements span 4 blocks of the encoder's 4096-element passes.
  const std::size_t counts[] = {0,  1,  5,   8,    15,   16,   17,   63,
                                64, 65, 127, 1000, 4095, 4096, 4097, 12345};
  const std::size_t buckets[] = {1,  2,  3,   7,   8,    15,   16,   17,
                                 31, 33, 100, 512, 4095, 4096, 4097, 5000};
  const std::vector<float> values = test_values(12345 + 16, 5);
  for (const std::size_t count : counts) {
    for (const std::size_t bucket : buckets) {
      for (const std::size_t input_offset : {0, 1, 5}) {
        SCOPED_TRACE(::testing::Message() << "count " << count << " bucket " << bucket
                                          << " input offset " << input_offset);
        const auto codec = sign_codec(bucket);
        const ConstTensorView input = host_view(values.data() + input_offset, count);
        const IsaResults scalar = run_with_isa(Isa::scalar, *codec, input, input_offset);
        for (const Isa isa : {Isa::avx2, Isa::avx512}) {
          SCOPED_TRACE(kernels::cpu::isa_name(isa));
          const IsaResults vector = run_with_isa(isa, *codec, input, 3);
          ASSERT_EQ(vector.message, scalar.message);
          ASSERT_EQ(bit_patterns(vector.decoded), bit_patterns(scalar.decoded));
          ASSERT_EQ(bit_patterns(vector.accumulated), bit_patterns(scalar.accumulated));
          ASSERT_EQ(bit_patterns(vector.decoded_bf16), bit_patterns(scalar.decoded_bf16));
        }
      }
    }
  }
}

TEST(SignCodec, EveryIsaGivesIdenticalBytesForHalfPrecisionInputs) {
  // f16/bf16 inputs go through 4096-element conversion blocks, which start mid-bucket.
  const std::vector<float> values = test_values(20000, 6);
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const HostTensor input(dtype, values);
    for (const std::size_t bucket : {1, 7, 100, 4097, 9000}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " bucket " << bucket);
      const auto codec = sign_codec(bucket);
      const IsaResults scalar = run_with_isa(Isa::scalar, *codec, input.view(), 0);
      for (const Isa isa : {Isa::avx2, Isa::avx512}) {
        const IsaResults vector = run_with_isa(isa, *codec, input.view(), 1);
        EXPECT_EQ(vector.message, scalar.message) << kernels::cpu::isa_name(isa);
        EXPECT_EQ(bit_patterns(vector.accumulated), bit_patterns(scalar.accumulated));
      }
    }
  }
}

TEST_P(SignCodecOnEachIsa, DecodeAddAddsTheDecodedValuesExactly) {
  const std::vector<float> values = test_values(10007, 8);
  const auto codec = sign_codec(100);
  const auto message = encode_message(*codec, host_view(values.data(), values.size()));
  const auto decoded = decode_to_f32(*codec, message, values.size());
  const std::vector<float> start = gaussian(values.size(), 9, 3.0f);
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    std::vector<float> acc = start;
    codec->decode_add(message, acc.data(), acc.size());
    for (std::size_t i = 0; i < acc.size(); ++i) {
      ASSERT_EQ(kernels::float_bits(acc[i]), kernels::float_bits(start[i] + decoded[i]))
          << "element " << i << " isa " << kernels::cpu::isa_name(isa);
    }
  }
}

class SignKernelsOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(SignKernelsOnEachIsa);

// The kernels under the codec take blocks and ranges the codec itself never produces.
TEST_P(SignKernelsOnEachIsa, EncoderGivesTheSameBytesForAnyBlocking) {
  const std::vector<float> values = test_values(9000, 11);
  // Block sizes (multiples of 8 except the last) that start blocks mid-bucket at every lane.
  const std::vector<std::size_t> blocks = {8, 24, 4104, 40, 16, 4096, 712};
  for (const std::size_t bucket : {1, 3, 7, 15, 16, 17, 100, 4097}) {
    const auto codec = sign_codec(bucket);
    const auto message = encode_message(*codec, host_view(values.data(), values.size()));
    {
      const Isa isa = GetParam();
      SCOPED_TRACE(::testing::Message()
                   << "bucket " << bucket << " isa " << kernels::cpu::isa_name(isa));
      testing::ScopedIsa forced(isa);
      std::vector<std::byte> payload(message.size() - kWireHeaderBytes, std::byte{0xEE});
      const std::size_t scale_bytes = 4 * ceil_div(values.size(), bucket);
      kernels::cpu::SignEncoder encoder(
          bucket, payload.data(), reinterpret_cast<std::uint8_t*>(payload.data() + scale_bytes));
      std::size_t begin = 0;
      for (const std::size_t block : blocks) {
        encoder.add(values.data() + begin, block);
        begin += block;
      }
      ASSERT_EQ(begin, values.size());
      encoder.finish();
      EXPECT_TRUE(std::equal(payload.begin(), payload.end(), message.begin() + kWireHeaderBytes));
    }
  }
}

TEST_P(SignKernelsOnEachIsa, DecodeOfAnyRangeMatchesTheWholeDecode) {
  const std::vector<float> values = test_values(1000, 12);
  for (const std::size_t bucket : {1, 3, 7, 15, 16, 17, 100}) {
    const auto codec = sign_codec(bucket);
    const auto message = encode_message(*codec, host_view(values.data(), values.size()));
    const auto whole = decode_to_f32(*codec, message, values.size());
    const kernels::cpu::SignPayload payload{
        message.data() + kWireHeaderBytes,
        reinterpret_cast<const std::uint8_t*>(message.data() + kWireHeaderBytes +
                                              4 * ceil_div(values.size(), bucket)),
        values.size(), bucket};
    {
      const Isa isa = GetParam();
      testing::ScopedIsa forced(isa);
      for (const std::size_t begin : {0, 1, 5, 13, 16, 333}) {
        for (const std::size_t n : {0, 1, 7, 16, 17, 50, 600}) {
          std::vector<float> part(n);
          kernels::cpu::sign_decode(payload, begin, n, part.data());
          ASSERT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin))
              << "bucket " << bucket << " isa " << kernels::cpu::isa_name(isa) << " begin " << begin
              << " n " << n;
        }
      }
    }
  }
}

// ---- non-finite inputs ----------------------------------------------------------------------

TEST_P(SignCodecOnEachIsa, NanAndInfFollowTheDocumentedRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float signalling = std::bit_cast<float>(0x7F800001u);
  const float negative_nan = std::bit_cast<float>(0xFFC12345u);
  // Buckets of 4: a NaN bucket (NaN of any sign gives bit 0; the scale is the canonical NaN
  // 0x7FC00000), an inf bucket (scale +inf), a bucket whose sum overflows (the rescue's finite
  // scale), and a finite one that the others leave alone; the last bucket holds a signalling
  // NaN.
  const std::vector<float> values = {
      1,     nan,   -2,     negative_nan,  // NaN bucket
      inf,   -1,    0,      -inf,          // inf bucket
      3e38f, 3e38f, -3e38f, 1,             // overflowing sum
      1,     -1,    1,      -1,            // finite bucket
      -2,    signalling};                  // signalling NaN, last and shorter bucket
  const std::uint32_t kNan = 0x7FC00000u;
  const std::uint32_t kMinusNan = 0xFFC00000u;
  const std::uint32_t kInf = 0x7F800000u;
  const std::uint32_t kMinusInf = 0xFF800000u;
  // The overflowing bucket's rescued scale, worked by hand: the terms 3e38 * 2^-32 (three
  // times) and 2^-32 go to lanes 0-3, the tree adds (l0 + l2) + (l1 + l3), the 2^-32 vanishes
  // in the rounding, and the mean of 9e38 / 4 comes back times 2^32: 2.25e38 in f32.
  const float rescued = ((3e38f * 0x1p-32f + 3e38f * 0x1p-32f) + (3e38f * 0x1p-32f + 0x1p-32f)) /
                        4.0f * 0x1p32f;
  ASSERT_NEAR(rescued, 2.25e38, 2.25e38 * 1e-6);
  const std::uint32_t kRescued = kernels::float_bits(rescued);
  const std::uint32_t kMinusRescued = kernels::float_bits(-rescued);
  const std::vector<std::uint32_t> expected_scales = {kNan, kInf, kRescued, kernels::float_bits(1.0f), kNan};
  const std::vector<std::uint32_t> expected = {
      kNan,          kNan,           kMinusNan,     kNan,
      kInf,          kMinusInf,      kInf,          kMinusInf,
      kRescued,      kRescued,       kMinusRescued, kRescued,
      kernels::float_bits(1.0f), kernels::float_bits(-1.0f), kernels::float_bits(1.0f), kernels::float_bits(-1.0f),
      kMinusNan,     kNan};
  {
    const Isa isa = GetParam();
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    testing::ScopedIsa forced(isa);
    const auto codec = sign_codec(4);
    const auto message = encode_message(*codec, host_view(values.data(), values.size()));
    for (std::size_t b = 0; b < expected_scales.size(); ++b) {
      EXPECT_EQ(kernels::float_bits(scale_in(message, b)), expected_scales[b]) << "bucket " << b;
    }
    EXPECT_EQ(bit_patterns(decode_to_f32(*codec, message, values.size())), expected);
  }
}

TEST_P(SignCodecOnEachIsa, NanAndInfRulesHoldOnEveryVectorPath) {
  // Short buckets (3: the across-bucket bodies) and long ones (40: the 16-lane bodies), with
  // NaNs of both signs, a signalling NaN and infinities in some buckets: those buckets get the
  // canonical NaN / +inf, every other bucket its reference scale.
  for (const std::size_t bucket : {3, 40}) {
    std::vector<float> values = test_values(64 * bucket, 13);
    values[5 * bucket + 1] = std::bit_cast<float>(0xFFC00001u);
    values[9 * bucket] = std::bit_cast<float>(0x7F800001u);
    values[20 * bucket + 2] = -std::numeric_limits<float>::infinity();
    values[33 * bucket] = std::numeric_limits<float>::infinity();
    {
      const Isa isa = GetParam();
      SCOPED_TRACE(::testing::Message()
                   << "bucket " << bucket << " isa " << kernels::cpu::isa_name(isa));
      testing::ScopedIsa forced(isa);
      const auto codec = sign_codec(bucket);
      const auto message = encode_message(*codec, host_view(values.data(), values.size()));
      for (std::size_t b = 0; b < 64; ++b) {
        const std::uint32_t expected =
            (b == 5 || b == 9)     ? 0x7FC00000u
            : (b == 20 || b == 33) ? 0x7F800000u
                                   : kernels::float_bits(reference_scale(values.data() + b * bucket, bucket));
        EXPECT_EQ(kernels::float_bits(scale_in(message, b)), expected) << "bucket " << b;
      }
    }
  }
}

TEST_P(SignCodecOnEachIsa, SumsOverflowingF32GetAFiniteRescuedScaleOnEveryPath) {
  const float max = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  // Bucket 0: FLT_MAX everywhere; bucket 1: +-FLT_MAX; both have the mean |x| FLT_MAX, which
  // the rescue gives exactly for lengths 4 and 16 (one term per lane: every sum is of equal
  // powers-of-two multiples, so exact) and within the round-trip test's bound otherwise.
  // Bucket 2: one FLT_MAX and zeros, whose sum does not overflow: the plain FLT_MAX / len.
  // Bucket 3: an inf among FLT_MAX values: +inf, as documented.
  {
    const Isa isa = GetParam();
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    testing::ScopedIsa forced(isa);
    for (const std::size_t bucket : {3, 4, 16, 40, 512}) {
      SCOPED_TRACE(::testing::Message() << "bucket " << bucket);
      std::vector<float> values(4 * bucket, 0.0f);
      for (std::size_t i = 0; i < 2 * bucket; ++i) values[i] = (i % 2 == 0 || i < bucket) ? max : -max;
      values[2 * bucket] = max;
      values[3 * bucket] = -inf;
      values[3 * bucket + 1] = -max;
      values[3 * bucket + 2] = max;
      const auto codec = sign_codec(bucket);
      const auto message = encode_message(*codec, host_view(values.data(), values.size()));
      for (const std::size_t b : {0, 1}) {
        const float scale = scale_in(message, b);
        EXPECT_EQ(kernels::float_bits(scale), kernels::float_bits(reference_scale(values.data() + b * bucket, bucket)));
        if (bucket == 4 || bucket == 16) {
          EXPECT_EQ(scale, max) << "bucket " << b;
        }
        expect_near_true_mean(values.data() + b * bucket, bucket, scale, b);
      }
      EXPECT_EQ(scale_in(message, 2), max / static_cast<float>(bucket));
      EXPECT_EQ(scale_in(message, 3), inf);
      const auto decoded = decode_to_f32(*codec, message, values.size());
      for (std::size_t i = bucket; i < 2 * bucket; ++i) {
        ASSERT_EQ(decoded[i], values[i] < 0.0f ? -scale_in(message, 1) : scale_in(message, 1)) << i;
      }
    }
  }
  // Mixed magnitudes near FLT_MAX, f32 and bf16 inputs (bf16 reaches 3.39e38 too; its
  // conversion blocks start mid-bucket), short and long buckets: every overflowing bucket gets
  // the reference's rescued scale, finite, within the bound of the round-trip test of the true
  // mean (the rescue's roundings are those of the plain sum, plus the * 2^-32 of elements below
  // 2^-94, none here); the others keep their plain scale.
  std::vector<float> values = test_values(20000, 21);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i % 4000 < 700) values[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (1e38f + 1e34f * static_cast<float>(i % 97));
  }
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const HostTensor input(dtype, values);
    const std::vector<float> x = input.to_f32();
    for (const std::size_t bucket : {7, 100, 512, 4097}) {
      std::size_t rescued = 0;
      {
        const Isa isa = GetParam();
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " bucket " << bucket << " isa "
                                          << kernels::cpu::isa_name(isa));
        testing::ScopedIsa forced(isa);
        const auto codec = sign_codec(bucket);
        const auto message = encode_message(*codec, input.view());
        rescued = 0;
        for (std::size_t b = 0; b < ceil_div(x.size(), bucket); ++b) {
          const std::size_t begin = b * bucket;
          const std::size_t len = std::min(bucket, x.size() - begin);
          const float scale = scale_in(message, b);
          ASSERT_EQ(kernels::float_bits(scale), kernels::float_bits(reference_scale(x.data() + begin, len)))
              << "bucket " << b;
          ASSERT_TRUE(std::isfinite(scale)) << "bucket " << b;
          if (std::isinf(reference_sum(x.data() + begin, len, 1.0f))) {
            ++rescued;
            expect_near_true_mean(x.data() + begin, len, scale, b);
          }
        }
      }
      // bucket 7: 7 * 1e38 overflows; the others hold 700 large elements in a row.
      EXPECT_GT(rescued, 0u) << "no bucket overflowed: the test data do not exercise the rescue";
    }
  }
}

// ---- malformed messages ---------------------------------------------------------------------

// Runs decode and decode_add on `message` for `count` elements: both must throw
// malformed_message naming the op, and leave their outputs untouched (testing::expect_malformed).
void expect_refused(const Codec& codec, const std::vector<std::byte>& message, std::size_t count,
                    const std::string& what) {
  SCOPED_TRACE(what);
  testing::expect_malformed(codec, message, count, /*field=*/"");
}

void put_u64(std::vector<std::byte>& message, std::size_t offset, std::uint64_t value) {
  std::memcpy(message.data() + offset, &value, 8);
}

TEST(SignCodec, RejectsMalformedMessages) {
  constexpr std::size_t kCount = 1001;  // 2 buckets of 512, 126 bytes of bits, 7 unused bits
  const auto codec = sign_codec(512);
  const std::vector<float> values = gaussian(kCount, 10);
  const auto good = encode_message(*codec, host_view(values.data(), kCount));
  ASSERT_EQ(decode_to_f32(*codec, good, kCount).size(), kCount);

  auto wrong_codec = good;
  wrong_codec[5] = std::byte{static_cast<std::uint8_t>(compressors::WireCodec::qsgd)};
  expect_refused(*codec, wrong_codec, kCount, "codec id qsgd");
  const auto none_message = encode_message(*make_codec("none"), host_view(values.data(), kCount));
  expect_refused(*codec, none_message, kCount, "a none message");

  expect_refused(*codec, good, kCount - 1, "count one less than the message's");
  expect_refused(*codec, good, kCount + 1, "count one more than the message's");

  auto one_byte_more = good;
  one_byte_more.push_back(std::byte{0});
  put_u64(one_byte_more, 16, good.size() - kWireHeaderBytes + 1);
  expect_refused(*codec, one_byte_more, kCount, "payload one byte longer, header agreeing");
  auto one_byte_less = good;
  one_byte_less.pop_back();
  put_u64(one_byte_less, 16, good.size() - kWireHeaderBytes - 1);
  expect_refused(*codec, one_byte_less, kCount, "payload one byte shorter, header agreeing");

  auto bucket_zero = good;
  put_u64(bucket_zero, 24, 0);
  expect_refused(*codec, bucket_zero, kCount, "bucket 0");
  auto other_bucket = good;
  put_u64(other_bucket, 24, 256);  // 4 scales expected, the payload has 2
  expect_refused(*codec, other_bucket, kCount, "bucket 256 with a payload sized for 512");
  auto huge_bucket = good;
  put_u64(huge_bucket, 24, std::numeric_limits<std::uint64_t>::max());  // 1 scale expected
  expect_refused(*codec, huge_bucket, kCount, "bucket 2^64-1 with a payload sized for 512");

  auto two_bits = good;
  two_bits[7] = std::byte{2};
  expect_refused(*codec, two_bits, kCount, "small_param 2");
  auto flagged = good;
  flagged[6] = std::byte{1};
  expect_refused(*codec, flagged, kCount, "flags 1");

  const std::size_t last_byte = kWireHeaderBytes + 2 * 4 + 125;  // holds element 1000 at bit 0
  ASSERT_EQ(last_byte, good.size() - 1);
  for (int unused_bit = 1; unused_bit < 8; ++unused_bit) {
    auto padded = good;
    padded[last_byte] ^= std::byte{static_cast<std::uint8_t>(1u << unused_bit)};
    expect_refused(*codec, padded, kCount, "unused bit " + std::to_string(unused_bit) + " set");
  }

  for (const std::size_t size :
       {std::size_t{0}, std::size_t{5}, kWireHeaderBytes - 1, kWireHeaderBytes, good.size() - 1}) {
    const std::vector<std::byte> truncated(good.begin(), good.begin() + size);
    expect_refused(*codec, truncated, kCount, "truncated to " + std::to_string(size) + " bytes");
  }
}

TEST(SignCodec, RefusesBadArguments) {
  CompressionSpec spec = CompressionSpec::parse("sign");
  spec.bucket = 0;
  try {
    make_codec(spec);
    ADD_FAILURE() << "bucket 0 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument) << error.what();
  }
  const auto codec = sign_codec(8);
  const std::vector<float> values(17, 1.0f);
  std::vector<std::byte> out(codec->max_encoded_bytes(values.size()) - 1);
  try {
    codec->encode(host_view(values.data(), values.size()), out, {});
    ADD_FAILURE() << "a short output buffer was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument) << error.what();
  }
}

}  // namespace
}  // namespace gradzip
