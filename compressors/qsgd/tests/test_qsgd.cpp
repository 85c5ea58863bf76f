// The qsgd codec (compressors/qsgd/qsgd_codec.cpp, compressors/qsgd/qsgd_math.h, compressors/qsgd/qsgd_cpu*.cpp):
// payload layout, codes equal to the element math, error bound, unbiasedness, determinism and
// chunking, NaN/Inf/zero/tiny/huge buckets, every ISA writing the same bytes, and decoders
// refusing every malformed message before writing anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <tuple>
#include <utility>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/philox_math.h"
#include "compressors/qsgd/qsgd_cpu.h"
#include "compressors/qsgd/qsgd_math.h"
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

constexpr int kAllBits[] = {1, 2, 3, 4, 5, 6, 7, 8};
constexpr int kMainBits[] = {1, 2, 3, 4, 8};
constexpr std::size_t kLargeCount = kTestCounts[std::size(kTestCounts) - 1];

std::unique_ptr<Codec> qsgd_codec(int bits, std::size_t bucket) {
  return make_codec("qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket));
}

EncodeContext context(std::uint32_t step = 11, std::uint64_t element_offset = 0) {
  EncodeContext ctx;
  ctx.seed = 0x5EED5EED12345678ull;
  ctx.step = step;
  ctx.tensor_id = 42;
  ctx.element_offset = element_offset;
  return ctx;
}

std::size_t num_buckets(std::size_t count, std::size_t bucket) { return (count + bucket - 1) / bucket; }

std::size_t expected_payload_bytes(std::size_t count, int bits, std::size_t bucket) {
  return 4 * num_buckets(count, bucket) + (count * static_cast<std::size_t>(bits) + 7) / 8;
}

// Readers of a message's payload, written from the documented layout (not the library's code).
float scale_of(const std::vector<std::byte>& message, std::size_t b) {
  float scale;
  std::memcpy(&scale, message.data() + kWireHeaderBytes + 4 * b, 4);
  return scale;
}

std::uint32_t code_of(const std::vector<std::byte>& message, std::size_t count, std::size_t bucket,
                      int bits, std::size_t i) {
  const std::byte* stream = message.data() + kWireHeaderBytes + 4 * num_buckets(count, bucket);
  std::uint32_t code = 0;
  for (int k = 0; k < bits; ++k) {
    const std::size_t bit = i * static_cast<std::size_t>(bits) + static_cast<std::size_t>(k);
    code |= ((std::to_integer<std::uint32_t>(stream[bit / 8]) >> (bit % 8)) & 1u) << k;
  }
  return code;
}

// max |x| over a bucket of finite values, with std::fabs.
float max_abs(const std::vector<float>& x, std::size_t begin, std::size_t end) {
  float result = 0.0f;
  for (std::size_t i = begin; i < end; ++i) result = std::max(result, std::fabs(x[i]));
  return result;
}

// The bound on |decode - x| for an element of a finite bucket with scale `scale`.
// bits >= 2: with step = scale / s, the encoder's y = |x| / step carries <= 2 roundings
// (relative 2^-23 together, so |y_f - y| <= s 2^-23 <= 2^-16), q = floor(fl(y_f + u)) is within
// 1 + 2^-17 of y_f (u < 1; the sum rounds by at most half an ulp <= 2^-17 below 128), so
// |q step - |x|| <= step (1 + 2^-15); the decoder's fl(scale / s) and fl(q * step) add
// <= 2^-22 scale, and the clamp to scale only moves toward |x| <= scale. Subnormal steps round
// absolutely: <= 128 ulps of 2^-149 in all, covered by 2^-140.
// bits == 1: decode is ±scale and |x| <= scale, so the error is at most 2 scale.
double error_bound(float scale, int bits) {
  if (bits == 1) return 2.0 * scale;
  const double step = static_cast<double>(scale) / kernels::qsgd_top_level(bits);
  return step * (1.0 + std::ldexp(1.0, -15)) + scale * std::ldexp(1.0, -22) + std::ldexp(1.0, -140);
}

// The whole payload as the element math of compressors/qsgd/qsgd_math.h defines it, element by element
// with philox_element(): independent of the library's tiles, vector paths and packing.
std::vector<std::byte> reference_payload(const std::vector<float>& x, int bits, std::size_t bucket,
                                         const EncodeContext& ctx) {
  const std::size_t count = x.size();
  std::vector<std::byte> payload(expected_payload_bytes(count, bits, bucket));
  std::byte* stream = payload.data() + 4 * num_buckets(count, bucket);
  for (std::size_t b = 0; b < num_buckets(count, bucket); ++b) {
    const std::size_t begin = b * bucket, end = std::min(count, begin + bucket);
    std::uint32_t abs_max = 0;
    for (std::size_t i = begin; i < end; ++i) abs_max = std::max(abs_max, kernels::qsgd_abs_bits(x[i]));
    const float scale = kernels::qsgd_scale_from_abs_max_bits(abs_max);
    std::memcpy(payload.data() + 4 * b, &scale, 4);
    const kernels::QsgdEncodeBucket constants = kernels::qsgd_encode_bucket(scale, bits);
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t word =
          kernels::philox_element(ctx.seed, ctx.step, ctx.tensor_id, ctx.element_offset + i);
      const std::uint32_t code = kernels::qsgd_encode_code(x[i], word, constants);
      for (int k = 0; k < bits; ++k) {
        const std::size_t bit = i * static_cast<std::size_t>(bits) + static_cast<std::size_t>(k);
        stream[bit / 8] |= static_cast<std::byte>(((code >> k) & 1u) << (bit % 8));
      }
    }
  }
  return payload;
}

std::vector<std::byte> payload_bytes(const std::vector<std::byte>& message) {
  return std::vector<std::byte>(message.begin() + kWireHeaderBytes, message.end());
}

bool same_bits(float a, float b) { return kernels::float_bits(a) == kernels::float_bits(b); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](float x, float y) { return same_bits(x, y); });
}

// Gaussian data with a few exact zeros and repeated magnitudes mixed in.
std::vector<float> test_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> x = gaussian(count, seed);
  for (std::size_t i = 0; i < count; i += 13) x[i] = 0.0f;
  for (std::size_t i = 5; i < count; i += 29) x[i] = -x[i - 1];
  return x;
}

TEST(Qsgd, IsNeitherAdditiveNorSparse) {
  const auto codec = qsgd_codec(4, 512);
  EXPECT_FALSE(codec->additive());
  EXPECT_FALSE(codec->sparse());
}

TEST(Qsgd, RefusesBadSpecsAtConstruction) {
  CompressionSpec spec;
  spec.codec = CodecKind::qsgd;
  for (int bits : {0, 9, -1}) {
    spec.bits = bits;
    spec.bucket = 512;
    EXPECT_EQ(testing::error_code_of([&] { make_codec(spec); }), ErrorCode::invalid_spec) << bits;
  }
  spec.bits = 4;
  spec.bucket = 0;
  EXPECT_EQ(testing::error_code_of([&] { make_codec(spec); }), ErrorCode::invalid_spec);
}

TEST(Qsgd, HeaderAndPayloadSizeAreTheDocumentedOnes) {
  for (std::size_t count : kTestCounts) {
    for (int bits : kAllBits) {
      for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{512}}) {
        if (count == kLargeCount && bits != 8) continue;
        const auto codec = qsgd_codec(bits, bucket);
        const std::vector<float> x = test_values(count, 1);
        const auto message = encode_message(*codec, host_view(x.data(), count), context());
        const std::size_t payload = expected_payload_bytes(count, bits, bucket);
        ASSERT_EQ(message.size(), kWireHeaderBytes + payload) << count << " " << bits << " " << bucket;
        EXPECT_EQ(codec->max_encoded_bytes(count), kWireHeaderBytes + payload);
        const auto header = compressors::read_header(message, "test");
        EXPECT_EQ(header.codec, compressors::WireCodec::qsgd);
        EXPECT_EQ(header.flags, 0);
        EXPECT_EQ(header.small_param, bits);
        EXPECT_EQ(header.count, count);
        EXPECT_EQ(header.payload_bytes, payload);
        EXPECT_EQ(header.large_param, bucket);
      }
    }
  }
}

// A hand-checked message: 3 elements, bits=8, bucket=2 -> scales {2, 0.5} then 3 code bytes.
// 2.0 and -0.5 are their buckets' maxima: y = s = 127 exactly, so q = 127 whatever u is.
TEST(Qsgd, SmallMessageHasTheDocumentedBytes) {
  const std::vector<float> x = {2.0f, 1.0f, -0.5f};
  const auto message = encode_message(*qsgd_codec(8, 2), host_view(x.data(), 3), context());
  ASSERT_EQ(message.size(), kWireHeaderBytes + 8 + 3);
  EXPECT_EQ(scale_of(message, 0), 2.0f);
  EXPECT_EQ(scale_of(message, 1), 0.5f);
  EXPECT_EQ(std::to_integer<int>(message[kWireHeaderBytes + 8]), 127);         // +127
  EXPECT_EQ(std::to_integer<int>(message[kWireHeaderBytes + 10]), 0x80 | 127);  // -127
  // 1.0 of scale 2: y = 63.5, so q is 63 or 64.
  const int middle = std::to_integer<int>(message[kWireHeaderBytes + 9]);
  EXPECT_TRUE(middle == 63 || middle == 64) << middle;
  const auto decoded = decode_to_f32(*qsgd_codec(8, 2), message, 3);
  EXPECT_EQ(decoded[0], 2.0f);
  EXPECT_EQ(decoded[2], -0.5f);
  EXPECT_EQ(decoded[1], static_cast<float>(middle) * (2.0f / 127.0f));
}

// Scales are max |x| and every code and decoded value is the element math's, for every count,
// dtype and width (the largest count for a subset, to keep the run short).
TEST(Qsgd, PayloadIsTheElementMathAndErrorIsWithinOneStep) {
  for (std::size_t count : kTestCounts) {
    for (DType dtype : kTestDTypes) {
      for (int bits : kMainBits) {
        if (count == kLargeCount && !((dtype == DType::f32 && (bits == 1 || bits == 8)) ||
                                      (dtype == DType::bf16 && bits == 4))) {
          continue;
        }
        SCOPED_TRACE("count=" + std::to_string(count));
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " bits=" + std::to_string(bits));
        const std::size_t bucket = 512;
        const HostTensor input(dtype, test_values(count, 7 + count));
        const std::vector<float> x = input.to_f32();  // the exact input values
        const auto codec = qsgd_codec(bits, bucket);
        const EncodeContext ctx = context(3, 1000);
        const auto message = encode_message(*codec, input.view(), ctx);
        ASSERT_EQ(payload_bytes(message), reference_payload(x, bits, bucket, ctx));
        const auto decoded = decode_to_f32(*codec, message, count);
        for (std::size_t b = 0; b < num_buckets(count, bucket); ++b) {
          const std::size_t begin = b * bucket, end = std::min(count, begin + bucket);
          const float scale = scale_of(message, b);
          ASSERT_EQ(scale, max_abs(x, begin, end)) << "bucket " << b;
          const auto constants = kernels::qsgd_decode_bucket(scale, bits);
          const double bound = error_bound(scale, bits);
          for (std::size_t i = begin; i < end; ++i) {
            const float expected = kernels::qsgd_decode_code(code_of(message, count, bucket, bits, i),
                                                             constants, bits);
            ASSERT_TRUE(same_bits(decoded[i], expected)) << i;
            ASSERT_LE(std::fabs(static_cast<double>(decoded[i]) - x[i]), bound) << i << " x=" << x[i];
            ASSERT_LE(std::fabs(decoded[i]), scale) << i;
            if (bits == 1) {
              ASSERT_EQ(std::fabs(decoded[i]), scale) << i;
            }
          }
        }
      }
    }
  }
}

// Other widths and bucket sizes, including buckets that do not divide the count, buckets of one
// element and buckets longer than the encoder's tiles (2048 elements).
TEST(Qsgd, PayloadIsTheElementMathForEveryWidthAndBucket) {
  for (int bits : kAllBits) {
    for (std::size_t bucket : {std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{5000}}) {
      for (std::size_t count : {std::size_t{1}, std::size_t{67}, std::size_t{9000}}) {
        const std::vector<float> x = test_values(count, bits * 100 + bucket);
        const EncodeContext ctx = context(9, 3);
        const auto message = encode_message(*qsgd_codec(bits, bucket), host_view(x.data(), count), ctx);
        ASSERT_EQ(payload_bytes(message), reference_payload(x, bits, bucket, ctx))
            << "bits=" << bits << " bucket=" << bucket << " count=" << count;
      }
    }
  }
}

// An f16/bf16 input encodes to the bytes of its (exact) f32 values.
TEST(Qsgd, HalfInputsEncodeLikeTheirF32Values) {
  const std::size_t count = 10007;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (int bits : {1, 4, 8}) {
      for (std::size_t bucket : {std::size_t{100}, std::size_t{6000}}) {
        const HostTensor half(dtype, test_values(count, 3));
        const std::vector<float> widened = half.to_f32();
        const auto codec = qsgd_codec(bits, bucket);
        EXPECT_EQ(encode_message(*codec, half.view(), context()),
                  encode_message(*codec, host_view(widened.data(), count), context()))
            << dtype_name(dtype) << " bits=" << bits << " bucket=" << bucket;
      }
    }
  }
}

// E[decode] = x: the mean over 20000 steps of a fixed vector is within 5 standard deviations of
// x. A bits >= 2 element with y = |x| / step and f = y - floor(y) decodes to floor(y) or
// floor(y)+1 steps, variance f (1 - f) step^2; a 1-bit element decodes to ±scale with
// P(+) = p = (1 + x / scale) / 2, variance 4 p (1 - p) scale^2. The mean of N draws has variance
// var / N. On top, f32 rounding biases the mean by at most about 2^-15 steps (see error_bound:
// y is off by <= 2^-16, u has 24 bits, y + u rounds by <= 2^-17) plus 2^-22 |x|; we allow
// 2^-13 step + 2^-20 |x|.
TEST(Qsgd, DecodeIsUnbiasedOverManySteps) {
  const std::vector<float> x = {0.0f,   1.0f,    -1.0f,  0.3f,    -0.3f, 0.7071f, 0.001f,
                                -0.999f, 0.5f,   -0.25f, 0.12345f, 0.9f, -0.6f,   1e-6f,
                                3.0f,   -2.5f,   0.1f,   2.9999f, -1.5f, 0.77f,   -0.05f};
  const std::size_t count = x.size();
  const std::size_t bucket = 8;  // buckets of 8, 8 and 5 elements
  constexpr int kSteps = 20000;
  for (int bits : {1, 2, 4, 8}) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, bucket);
    std::vector<double> sum(count, 0.0);
    std::vector<float> decoded(count);
    for (int step = 0; step < kSteps; ++step) {
      const auto message = encode_message(*codec, host_view(x.data(), count),
                                          context(static_cast<std::uint32_t>(step)));
      codec->decode(message, host_view(decoded.data(), count));
      for (std::size_t i = 0; i < count; ++i) sum[i] += decoded[i];
    }
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t begin = i / bucket * bucket;
      const double scale = max_abs(x, begin, std::min(count, begin + bucket));
      double variance, step;
      if (bits == 1) {
        const double p = (1.0 + x[i] / scale) / 2.0;
        variance = 4.0 * p * (1.0 - p) * scale * scale;
        step = 2.0 * scale;
      } else {
        step = scale / kernels::qsgd_top_level(bits);
        const double y = std::fabs(x[i]) / step;
        const double f = y - std::floor(y);
        variance = f * (1.0 - f) * step * step;
      }
      const double tolerance = 5.0 * std::sqrt(variance / kSteps) + step * std::ldexp(1.0, -13) +
                               std::fabs(x[i]) * std::ldexp(1.0, -20);
      EXPECT_NEAR(sum[i] / kSteps, x[i], tolerance) << "element " << i;
    }
  }
}

TEST(Qsgd, SameContextGivesSameBytesAndOtherDrawsDiffer) {
  const std::size_t count = 1000;
  const std::vector<float> x = test_values(count, 5);
  for (int bits : kMainBits) {
    const auto codec = qsgd_codec(bits, 128);
    const auto view = host_view(x.data(), count);
    const EncodeContext base = context(7);
    const auto message = encode_message(*codec, view, base);
    EXPECT_EQ(encode_message(*codec, view, base), message);
    EncodeContext other_step = base, other_seed = base, other_tensor = base;
    other_step.step = 8;
    other_seed.seed ^= 1;
    other_tensor.tensor_id = 43;
    // 1000 Gaussian elements each round randomly unless they sit on a level: with so many
    // fractional positions, two independent draws cannot give identical codes.
    EXPECT_NE(encode_message(*codec, view, other_step), message) << bits;
    EXPECT_NE(encode_message(*codec, view, other_seed), message) << bits;
    EXPECT_NE(encode_message(*codec, view, other_tensor), message) << bits;
  }
}

// A tensor encoded in two chunks, the second with element_offset = the split (a multiple of the
// bucket), gives the scales and codes of the tensor encoded at once.
TEST(Qsgd, ChunksEncodeLikeTheWholeTensor) {
  const std::size_t count = 9001;
  const std::vector<float> x = test_values(count, 11);
  for (int bits : kAllBits) {
    for (std::size_t bucket : {std::size_t{7}, std::size_t{64}, std::size_t{1000}}) {
      for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{1} << 40}) {
        const std::size_t split = (count / 2) / bucket * bucket;
        const auto codec = qsgd_codec(bits, bucket);
        const auto whole = encode_message(*codec, host_view(x.data(), count), context(5, offset));
        const auto first = encode_message(*codec, host_view(x.data(), split), context(5, offset));
        const auto second = encode_message(*codec, host_view(x.data() + split, count - split),
                                           context(5, offset + split));
        SCOPED_TRACE("bits=" + std::to_string(bits) + " bucket=" + std::to_string(bucket) +
                     " offset=" + std::to_string(offset));
        for (std::size_t b = 0; b < num_buckets(count, bucket); ++b) {
          const float chunk_scale = b < split / bucket ? scale_of(first, b) : scale_of(second, b - split / bucket);
          ASSERT_EQ(scale_of(whole, b), chunk_scale) << "bucket " << b;
        }
        for (std::size_t i = 0; i < count; ++i) {
          const std::uint32_t chunk_code = i < split ? code_of(first, split, bucket, bits, i)
                                                     : code_of(second, count - split, bucket, bits, i - split);
          ASSERT_EQ(code_of(whole, count, bucket, bits, i), chunk_code) << "element " << i;
        }
      }
    }
  }
}

TEST(Qsgd, AllZeroInputDecodesToPositiveZeros) {
  const std::size_t count = 1000;
  const std::vector<float> zeros(count, 0.0f);
  std::vector<float> mixed_zeros(count, 0.0f);
  for (std::size_t i = 0; i < count; i += 2) mixed_zeros[i] = -0.0f;
  for (int bits : kAllBits) {
    const auto codec = qsgd_codec(bits, 64);
    for (const std::vector<float>* input : {&zeros, &std::as_const(mixed_zeros)}) {
      const auto message = encode_message(*codec, host_view(input->data(), count), context());
      for (std::size_t b = 0; b < num_buckets(count, 64); ++b) ASSERT_EQ(kernels::float_bits(scale_of(message, b)), 0u);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(code_of(message, count, 64, bits, i), 0u);
      const auto decoded = decode_to_f32(*codec, message, count);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(kernels::float_bits(decoded[i]), 0u) << bits;
      std::vector<float> acc(count, 1.5f);
      codec->decode_add(message, acc.data(), count);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(acc[i], 1.5f);
    }
  }
}

// A NaN makes its bucket's scale the canonical NaN, an Inf (and no NaN) makes it +Inf; either
// way the bucket's codes are 0 and it decodes to NaN. Other buckets are unaffected.
TEST(Qsgd, NonFiniteBucketsDecodeToNaN) {
  const std::size_t bucket = 16, count = 6 * bucket + 5;
  std::vector<float> x = test_values(count, 13);
  x[bucket + 3] = kernels::bits_float(0xFFC12345u);  // negative NaN with a payload
  x[2 * bucket + 15] = INFINITY;
  x[3 * bucket] = -INFINITY;
  x[4 * bucket + 1] = INFINITY;
  x[4 * bucket + 2] = NAN;
  x[count - 1] = kernels::bits_float(0x7F800001u);  // signalling NaN
  const float quiet_nan_bits_scale = kernels::bits_float(kernels::kQsgdCanonicalNan);
  const std::vector<float> expected_scale = {max_abs(x, 0, bucket), quiet_nan_bits_scale, INFINITY,
                                             INFINITY, quiet_nan_bits_scale,
                                             max_abs(x, 5 * bucket, 6 * bucket), quiet_nan_bits_scale};
  for (int bits : kAllBits) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, bucket);
    const auto message = encode_message(*codec, host_view(x.data(), count), context());
    ASSERT_EQ(payload_bytes(message), reference_payload(x, bits, bucket, context()));
    const auto decoded = decode_to_f32(*codec, message, count);
    std::vector<float> acc(count, 1.0f);
    codec->decode_add(message, acc.data(), count);
    for (std::size_t b = 0; b < num_buckets(count, bucket); ++b) {
      ASSERT_TRUE(same_bits(scale_of(message, b), expected_scale[b])) << "bucket " << b;
      const bool finite = std::isfinite(expected_scale[b]);
      for (std::size_t i = b * bucket; i < std::min(count, (b + 1) * bucket); ++i) {
        if (finite) {
          ASSERT_LE(std::fabs(decoded[i] - x[i]), error_bound(expected_scale[b], bits)) << i;
          ASSERT_EQ(acc[i], 1.0f + decoded[i]) << i;
        } else {
          ASSERT_EQ(code_of(message, count, bucket, bits, i), 0u) << i;
          ASSERT_EQ(kernels::float_bits(decoded[i]), kernels::kQsgdCanonicalNan) << i;
          ASSERT_TRUE(std::isnan(acc[i])) << i;
        }
      }
    }
  }
}

// Subnormal and tiny scales (inv would overflow without the 2^64 prescale), and scales near
// FLT_MAX (q * step would round above FLT_MAX without the clamp): still within one step, finite,
// and never above the scale.
TEST(Qsgd, TinyAndHugeScalesStayWithinOneStep) {
  const float magnitudes[] = {1e-45f, 3e-42f, 1e-39f, std::ldexp(1.0f, -70), std::ldexp(1.0f, -64),
                              1e-30f, FLT_MIN, FLT_MAX, FLT_MAX / 3.0f, 1e38f};
  const std::size_t bucket = 64;
  std::vector<float> x;
  for (float magnitude : magnitudes) {
    const std::vector<float> noise = gaussian(bucket, static_cast<std::uint64_t>(x.size()) + 1);
    for (std::size_t i = 0; i < bucket; ++i) {
      // Values spread over [-magnitude, magnitude], the maximum itself included.
      const float fraction = std::min(1.0f, std::fabs(noise[i]) / 3.0f);
      x.push_back((i % 2 ? -1.0f : 1.0f) * (i == 0 ? magnitude : magnitude * fraction));
    }
  }
  const std::size_t count = x.size();
  for (int bits : kAllBits) {
    SCOPED_TRACE("bits=" + std::to_string(bits));
    const auto codec = qsgd_codec(bits, bucket);
    for (std::uint32_t step = 0; step < 20; ++step) {
      const auto message = encode_message(*codec, host_view(x.data(), count), context(step));
      ASSERT_EQ(payload_bytes(message), reference_payload(x, bits, bucket, context(step)));
      const auto decoded = decode_to_f32(*codec, message, count);
      for (std::size_t i = 0; i < count; ++i) {
        const float scale = scale_of(message, i / bucket);
        ASSERT_EQ(scale, std::fabs(x[i / bucket * bucket]));
        ASSERT_TRUE(std::isfinite(decoded[i])) << i;
        ASSERT_LE(std::fabs(decoded[i]), scale) << i;
        ASSERT_LE(std::fabs(static_cast<double>(decoded[i]) - x[i]), error_bound(scale, bits))
            << i << " x=" << x[i] << " decoded=" << decoded[i];
      }
    }
  }
}

class QsgdOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(QsgdOnEachIsa);

// Every ISA writes the same bytes and decodes to the same bits, across widths, bucket sizes,
// counts (vector tails, tiles) and element offsets (Philox blocks entered mid-way).
TEST_P(QsgdOnEachIsa, EveryIsaGivesTheSameBytes) {
  if (GetParam() == Isa::scalar) GTEST_SKIP() << "the scalar path is the reference the other ISAs must match";
  struct Case {
    std::size_t count;
    int bits;
    std::size_t bucket;
    std::uint64_t offset;
    DType dtype;
  };
  std::vector<Case> cases;
  for (int bits : kAllBits) {
    for (std::size_t count : {0, 1, 2, 7, 15, 16, 17, 31, 33, 63, 64, 65, 1000, 2048, 2055, 4096, 4103, 12345}) {
      for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{512},
                                 std::size_t{5000}}) {
        for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{6},
                                     std::uint64_t{67}}) {
          if (count > 1000 && bucket == 1) continue;  // slow on the scalar path, nothing new
          cases.push_back({count, bits, bucket, offset, DType::f32});
        }
      }
    }
  }
  for (int bits : {1, 2, 4, 8}) cases.push_back({kLargeCount, bits, 512, 5, DType::f32});
  cases.push_back({4103, 4, 100, 2, DType::f16});
  cases.push_back({4103, 3, 100, 2, DType::bf16});

  for (const Case& c : cases) {
    const HostTensor input(c.dtype, test_values(c.count, c.count + static_cast<std::size_t>(c.bits)));
    const auto codec = qsgd_codec(c.bits, c.bucket);
    const EncodeContext ctx = context(21, c.offset);
    // The message, its decode and a decode_add, on `isa`.
    const auto run = [&](Isa isa) {
      testing::ScopedIsa forced(isa);
      std::vector<std::byte> message = encode_message(*codec, input.view(), ctx);
      std::vector<float> decoded = decode_to_f32(*codec, message, c.count);
      std::vector<float> acc = test_values(c.count, 99);
      codec->decode_add(message, acc.data(), c.count);
      return std::tuple(std::move(message), std::move(decoded), std::move(acc));
    };
    const auto [reference_message, reference_decoded, reference_acc] = run(Isa::scalar);
    const auto [message, decoded, acc] = run(GetParam());
    ASSERT_EQ(message, reference_message)
        << "count=" << c.count << " bits=" << c.bits << " bucket=" << c.bucket << " offset=" << c.offset;
    ASSERT_TRUE(same_bits(decoded, reference_decoded)) << c.count;
    ASSERT_TRUE(same_bits(acc, reference_acc)) << c.count;
  }
}

// Each vector kernel against the scalar one, called directly, output buffers compared byte for
// byte with guard bytes after them (a write past the end differs too): every width; every
// length from 0 to past four vectors of either ISA (whole vectors, masked or scalar tails,
// packing steps) and a few longer; unaligned pointers; NaN, Inf, -0, subnormal and huge values
// at the head, middle and tail of abs_max_bits's input; buckets of zeros, subnormals, tiny
// scales (the 2^64 prescale), ordinary and huge ones (up to FLT_MAX); random and extreme Philox
// words; every code value, the -0 code (sign bit, level 0) included.
TEST_P(QsgdOnEachIsa, EveryKernelMatchesTheScalarKernelByteForByte) {
  if (GetParam() == Isa::scalar) GTEST_SKIP() << "the scalar kernels are the reference";
  const kernels::cpu::QsgdKernels& simd = kernels::cpu::qsgd_kernels(GetParam());
  const kernels::cpu::QsgdKernels& scalar = kernels::cpu::qsgd_kernels(Isa::scalar);
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 140; ++n) lengths.push_back(n);
  for (std::size_t n : {191, 192, 193, 255, 256, 257, 1000, 2047, 2048}) lengths.push_back(n);
  constexpr std::size_t kGuard = 80;  // more than a vector of floats or of bytes
  const auto random_word = [](std::size_t i, std::uint32_t stream) {
    return kernels::philox_element(0xC0DE, stream, 7, i);
  };

  // abs_max_bits: plain data, and each special value planted at the head, middle and tail.
  const std::uint32_t specials[] = {0x7FC00000u, 0x7F800001u, 0xFFC00001u, 0x7F800000u, 0xFF800000u,
                                    0x7F7FFFFFu, 0xFF7FFFFFu, 0x80000000u, 0x00000001u, 0x80400000u,
                                    0x71800000u};
  for (std::size_t n : lengths) {
    for (std::size_t offset : {0, 1}) {
      std::vector<float> x = gaussian(n + offset + kGuard, n);
      float* const data = x.data() + offset;
      ASSERT_EQ(simd.abs_max_bits(data, n), scalar.abs_max_bits(data, n)) << "n=" << n;
      for (std::uint32_t special : specials) {
        for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
          if (at >= n) continue;
          const float saved = data[at];
          data[at] = kernels::bits_float(special);
          ASSERT_EQ(simd.abs_max_bits(data, n), scalar.abs_max_bits(data, n))
              << "n=" << n << " special=" << std::hex << special << std::dec << " at " << at;
          data[at] = saved;
        }
      }
    }
  }

  // quantize, dequantize and dequantize_add over buckets of each magnitude; pack and unpack.
  const float magnitudes[] = {0.0f, 1e-40f, 0x1p-70f, 1.0f, 0x1p100f, 2e37f};
  for (int bits : kAllBits) {
    const std::uint32_t code_mask = (1u << bits) - 1u;
    for (std::size_t n : lengths) {
      for (std::size_t offset : {0, 1}) {
        SCOPED_TRACE("bits=" + std::to_string(bits) + " n=" + std::to_string(n) +
                     " offset=" + std::to_string(offset));
        for (float magnitude : magnitudes) {
          // A finite bucket: |x| <= scale = max |x|, with exact zeros, -0 and the maximum itself.
          std::vector<float> x = gaussian(n + offset + kGuard, n + static_cast<std::size_t>(bits));
          for (std::size_t i = 0; i < x.size(); ++i) x[i] *= magnitude;
          for (std::size_t i = offset; i < offset + n; i += 11) x[i] = i % 2 == 0 ? 0.0f : -0.0f;
          if (magnitude == 2e37f && n > 0) x[offset + n / 2] = -FLT_MAX;  // q * step overflows
          const float* const data = x.data() + offset;
          const float scale = kernels::qsgd_scale_from_abs_max_bits(scalar.abs_max_bits(data, n));
          ASSERT_TRUE(kernels::qsgd_scale_is_finite(scale));
          std::vector<std::uint32_t> words(n + offset + kGuard);
          for (std::size_t i = 0; i < words.size(); ++i) {
            words[i] = i % 17 == 3 ? 0xFFFFFFFFu : i % 17 == 5 ? 0u : random_word(i, 1);
          }
          const kernels::QsgdEncodeBucket encode = kernels::qsgd_encode_bucket(scale, bits);
          std::vector<std::uint8_t> reference_codes(n + offset + kGuard, 0xA5);
          std::vector<std::uint8_t> codes = reference_codes;
          scalar.quantize(data, words.data() + offset, n, encode, reference_codes.data() + offset);
          simd.quantize(data, words.data() + offset, n, encode, codes.data() + offset);
          ASSERT_EQ(codes, reference_codes) << "scale=" << scale;

          // Every code value, not just those quantize wrote for this bucket.
          for (std::size_t i = 0; i < codes.size(); ++i) {
            codes[i] = static_cast<std::uint8_t>(random_word(i, 2) & code_mask);
          }
          const kernels::QsgdDecodeBucket decode = kernels::qsgd_decode_bucket(scale, bits);
          std::vector<float> reference_out(n + offset + kGuard, kernels::bits_float(0x7FA5A5A5u));
          std::vector<float> out = reference_out;
          scalar.dequantize(codes.data() + offset, n, decode, bits, reference_out.data() + offset);
          simd.dequantize(codes.data() + offset, n, decode, bits, out.data() + offset);
          ASSERT_TRUE(same_bits(out, reference_out)) << "dequantize, scale=" << scale;
          std::vector<float> reference_acc = gaussian(n + offset + kGuard, 3);
          std::vector<float> acc = reference_acc;
          const std::uint8_t* const code_data = codes.data() + offset;
          scalar.dequantize_add(code_data, n, decode, bits, reference_acc.data() + offset);
          simd.dequantize_add(code_data, n, decode, bits, acc.data() + offset);
          ASSERT_TRUE(same_bits(acc, reference_acc)) << "dequantize_add, scale=" << scale;
        }

        std::vector<std::uint8_t> codes(n + offset + kGuard);
        for (std::size_t i = 0; i < codes.size(); ++i) {
          codes[i] = static_cast<std::uint8_t>(random_word(i, 3) & code_mask);
        }
        const std::size_t stream_bytes = (n * static_cast<std::size_t>(bits) + 7) / 8;
        std::vector<std::byte> reference_stream(stream_bytes + offset + kGuard, std::byte{0xA5});
        std::vector<std::byte> stream = reference_stream;
        scalar.pack_codes(codes.data() + offset, n, bits, reference_stream.data() + offset);
        simd.pack_codes(codes.data() + offset, n, bits, stream.data() + offset);
        ASSERT_EQ(stream, reference_stream) << "pack_codes";

        // Random stream bytes: the unused high bits of the last byte are ignored.
        for (std::size_t i = 0; i < stream.size(); ++i) {
          stream[i] = static_cast<std::byte>(random_word(i, 4));
        }
        std::vector<std::uint8_t> reference_unpacked(n + offset + kGuard, 0xA5);
        std::vector<std::uint8_t> unpacked = reference_unpacked;
        scalar.unpack_codes(stream.data() + offset, n, bits, reference_unpacked.data() + offset);
        simd.unpack_codes(stream.data() + offset, n, bits, unpacked.data() + offset);
        ASSERT_EQ(unpacked, reference_unpacked) << "unpack_codes";
      }
    }
  }
}

TEST(Qsgd, DecodeAddAddsTheDecodedValuesAndHalfOutputsRound) {
  const std::size_t count = 5003;
  const std::vector<float> x = test_values(count, 17);
  for (int bits : kMainBits) {
    const auto codec = qsgd_codec(bits, 100);
    const auto message = encode_message(*codec, host_view(x.data(), count), context());
    const auto decoded = decode_to_f32(*codec, message, count);
    std::vector<float> acc = test_values(count, 18);
    const std::vector<float> before = acc;
    codec->decode_add(message, acc.data(), count);
    for (std::size_t i = 0; i < count; ++i) ASSERT_TRUE(same_bits(acc[i], before[i] + decoded[i])) << i;
    HostTensor as_f16(DType::f16, count), as_bf16(DType::bf16, count);
    codec->decode(message, as_f16.view());
    codec->decode(message, as_bf16.view());
    for (std::size_t i = 0; i < count; ++i) {
      // A decode writes a tensor: IEEE rounding (kernels/cast_math.h).
      ASSERT_EQ(as_f16.at(i), kernels::f16_bits_to_f32(kernels::f32_to_f16_bits_ieee(decoded[i]))) << i;
      ASSERT_EQ(as_bf16.at(i), kernels::bf16_bits_to_f32(kernels::f32_to_bf16_bits_ieee(decoded[i]))) << i;
    }
  }
}

TEST(Qsgd, EncodeRefusesAShortOutputBuffer) {
  const std::vector<float> x = test_values(100, 1);
  const auto codec = qsgd_codec(4, 16);
  std::vector<std::byte> out(codec->max_encoded_bytes(100) - 1);
  EXPECT_EQ(testing::error_code_of([&] { codec->encode(host_view(x.data(), 100), out, context()); }),
            ErrorCode::invalid_argument);
}

// ---- malformed messages ------------------------------------------------------------------------

class QsgdMalformed : public ::testing::Test {
 protected:
  static constexpr std::size_t kCount = 37;
  static constexpr std::size_t kBucket = 8;
  static constexpr int kBits = 4;

  void SetUp() override {
    x_ = test_values(kCount, 23);
    x_[9] = NAN;  // bucket 1 is non-finite: scale NaN, codes 0
    message_ = encode_message(*codec_, host_view(x_.data(), kCount), context());
    codec_->decode(message_, host_view(std::vector<float>(kCount).data(), kCount));  // valid
  }

  void expect_rejected(const std::vector<std::byte>& message, const std::string& field,
                       std::size_t count = kCount) {
    testing::expect_malformed(*codec_, message, count, field);
  }

  std::vector<std::byte> with_byte(std::size_t offset, std::uint8_t value) const {
    return testing::with_byte(message_, offset, value);
  }

  template <typename T>
  std::vector<std::byte> with_field(std::size_t offset, T value) const {
    auto message = message_;
    std::memcpy(message.data() + offset, &value, sizeof value);
    return message;
  }

  std::unique_ptr<Codec> codec_ = qsgd_codec(kBits, kBucket);
  std::vector<float> x_;
  std::vector<std::byte> message_;
};

TEST_F(QsgdMalformed, RejectsBitsOutsideOneToEight) {
  expect_rejected(with_byte(7, 0), "bits 0");
  expect_rejected(with_byte(7, 9), "bits 9");
  expect_rejected(with_byte(7, 255), "bits 255");
}

TEST_F(QsgdMalformed, RejectsBucketZero) { expect_rejected(with_field<std::uint64_t>(24, 0), "bucket 0"); }

TEST_F(QsgdMalformed, RejectsPayloadSizeNotMatchingCountBitsAndBucket) {
  // Another width or bucket with the same payload size field: the size no longer matches.
  expect_rejected(with_byte(7, 5), "payload");
  expect_rejected(with_field<std::uint64_t>(24, 16), "payload");
  // A payload one byte longer, with the header saying so.
  auto longer = message_;
  longer.push_back(std::byte{0});
  const std::uint64_t payload = longer.size() - kWireHeaderBytes;
  std::memcpy(longer.data() + 16, &payload, 8);
  expect_rejected(longer, "payload");
}

TEST_F(QsgdMalformed, RejectsTruncatedMessages) {
  for (std::size_t size : {std::size_t{0}, std::size_t{31}, std::size_t{32}, message_.size() - 1}) {
    const std::vector<std::byte> truncated(message_.begin(), message_.begin() + static_cast<std::ptrdiff_t>(size));
    expect_rejected(truncated, "qsgd.decode");
  }
}

TEST_F(QsgdMalformed, RejectsAnotherCodecsMessage) {
  expect_rejected(with_byte(5, static_cast<std::uint8_t>(compressors::WireCodec::sign)), "sign");
}

TEST_F(QsgdMalformed, RejectsCountMismatch) {
  expect_rejected(message_, "elements", kCount + 1);
  expect_rejected(message_, "elements", kCount - 1);
}

TEST_F(QsgdMalformed, RejectsNonZeroFlags) { expect_rejected(with_byte(6, 1), "flags"); }

TEST_F(QsgdMalformed, RejectsScalesEncodeCannotWrite) {
  const std::size_t scale0 = kWireHeaderBytes;
  expect_rejected(with_field<float>(scale0, -1.0f), "scale");
  expect_rejected(with_field<float>(scale0, -0.0f), "scale");
  expect_rejected(with_field<std::uint32_t>(scale0, 0x7FC00001u), "scale");  // another NaN
  expect_rejected(with_field<std::uint32_t>(scale0, 0xFF800000u), "scale");  // -Inf
  // Bucket 1 (all codes 0) decodes to NaN with the canonical NaN encode wrote and with +Inf.
  const std::size_t scale1 = kWireHeaderBytes + 4;
  ASSERT_EQ(kernels::float_bits(scale_of(message_, 1)), kernels::kQsgdCanonicalNan);
  std::vector<float> out(kCount);
  codec_->decode(with_field<float>(scale1, INFINITY), host_view(out.data(), kCount));
  for (std::size_t i = kBucket; i < 2 * kBucket; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;
  EXPECT_FALSE(std::isnan(out[0]));
}

// The sign bit with magnitude 0 is never encoded but carries no magnitude: it is accepted and
// decodes to -0.0 (compressors/qsgd/qsgd_codec.cpp documents this).
TEST_F(QsgdMalformed, AcceptsTheNegativeZeroCodeAsMinusZero) {
  const std::size_t codes = kWireHeaderBytes + 4 * num_buckets(kCount, kBucket);
  const std::uint8_t high_nibble = std::to_integer<std::uint8_t>(message_[codes]) & 0xF0u;
  std::vector<float> out(kCount);
  codec_->decode(with_byte(codes, high_nibble | 0x8u), host_view(out.data(), kCount));
  EXPECT_EQ(kernels::float_bits(out[0]), 0x80000000u);
}

TEST_F(QsgdMalformed, RejectsNonZeroCodeInANonFiniteBucket) {
  // Bucket 1 (elements 8..15) has the NaN scale; element 12's 4-bit code is the low nibble of
  // code byte 6.
  const std::size_t codes = kWireHeaderBytes + 4 * num_buckets(kCount, kBucket);
  ASSERT_TRUE(std::isnan(scale_of(message_, 1)));
  ASSERT_EQ(std::to_integer<int>(message_[codes + 6]), 0);
  expect_rejected(with_byte(codes + 6, 0x01), "non-zero code");
}

}  // namespace
}  // namespace gradzip
