// The terngrad codec (compressors/terngrad/terngrad_codec.cpp, compressors/terngrad/terngrad_math.h,
// compressors/terngrad/terngrad_cpu.cpp): the documented layout, trits equal to qsgd's 2-bit codes for
// the same draws (repacked here from the documented layouts, not with the library's code),
// values in {-scale, 0, +scale}, unbiasedness, chunking, non-finite buckets, every ISA writing the
// same bytes, and decoders refusing every malformed message before writing anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::cpu::Isa;
using testing::decode_to_f32;
using testing::encode_message;
using testing::gaussian;
using testing::HostTensor;

std::unique_ptr<Codec> terngrad_codec(std::size_t bucket) {
  return make_codec("terngrad:bucket=" + std::to_string(bucket));
}
std::unique_ptr<Codec> qsgd2_codec(std::size_t bucket) {
  return make_codec("qsgd:bits=2,bucket=" + std::to_string(bucket));
}

EncodeContext context(std::uint32_t step = 7, std::uint64_t element_offset = 0) {
  EncodeContext ctx;
  ctx.seed = 0x7E57C0DEull;
  ctx.step = step;
  ctx.tensor_id = 9;
  ctx.element_offset = element_offset;
  return ctx;
}

std::size_t num_buckets(std::size_t count, std::size_t bucket) { return (count + bucket - 1) / bucket; }

float scale_at(const std::vector<std::byte>& message, std::size_t b) {
  float scale;
  std::memcpy(&scale, message.data() + kWireHeaderBytes + 4 * b, 4);
  return scale;
}

// The payload terngrad documents, built from a qsgd:bits=2 message of the same values and
// context: its scales, then each element's 2-bit code (0 -> trit 0, 1 -> 1, 3 -> 2) as base-3
// digit i % 5 of byte i / 5.
std::vector<std::byte> repacked_qsgd_payload(const std::vector<std::byte>& qsgd_message,
                                             std::size_t count, std::size_t bucket) {
  const std::size_t scale_bytes = 4 * num_buckets(count, bucket);
  std::vector<std::byte> payload(scale_bytes + (count + 4) / 5);
  if (scale_bytes > 0) std::memcpy(payload.data(), qsgd_message.data() + kWireHeaderBytes, scale_bytes);
  const std::byte* codes = qsgd_message.data() + kWireHeaderBytes + scale_bytes;
  std::vector<unsigned> bytes((count + 4) / 5, 0);
  for (std::size_t i = count; i-- > 0;) {
    const unsigned code = (std::to_integer<unsigned>(codes[2 * i / 8]) >> (2 * i % 8)) & 3u;
    EXPECT_NE(code, 2u) << "qsgd wrote the code -0 at element " << i;
    const unsigned trit = code == 3u ? 2u : code;
    bytes[i / 5] = bytes[i / 5] * 3u + trit;  // digits from the highest element down
  }
  // bytes[j] was built from element 5j + 4 down to 5j: digit d is element 5j + d.
  for (std::size_t j = 0; j < bytes.size(); ++j) payload[scale_bytes + j] = std::byte(bytes[j]);
  return payload;
}

std::vector<float> test_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> x = gaussian(count, seed);
  for (std::size_t i = 0; i < count; i += 11) x[i] = 0.0f;
  return x;
}

TEST(Terngrad, HeaderAndPayloadSizeAreTheDocumentedOnes) {
  for (std::size_t bucket : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{512}}) {
    for (std::size_t count : testing::kTestCounts) {
      const auto codec = terngrad_codec(bucket);
      const std::size_t payload = 4 * num_buckets(count, bucket) + (count + 4) / 5;
      EXPECT_EQ(codec->max_encoded_bytes(count), kWireHeaderBytes + payload);
      const auto message = encode_message(*codec, host_view(test_values(count, 3).data(), count),
                                          context());
      ASSERT_EQ(message.size(), kWireHeaderBytes + payload) << count << " " << bucket;
      const compressors::WireHeader header = compressors::read_header(message, "test");
      EXPECT_EQ(header.codec, compressors::WireCodec::terngrad);
      EXPECT_EQ(static_cast<int>(message[5]), 8);
      EXPECT_EQ(header.flags, 0);
      EXPECT_EQ(header.small_param, 0);
      EXPECT_EQ(header.count, count);
      EXPECT_EQ(header.large_param, bucket);
    }
  }
  EXPECT_FALSE(terngrad_codec(8)->additive());
  EXPECT_FALSE(terngrad_codec(8)->sparse());
  EXPECT_EQ(testing::error_code_of([] { (void)make_codec("terngrad:bucket=0"); }),
            ErrorCode::invalid_spec);
  EXPECT_EQ(testing::error_code_of([] { (void)make_codec("terngrad:bits=2"); }),
            ErrorCode::invalid_spec);
}

// |x| = scale or 0 leaves nothing to chance: y = 1 always rounds to 1, y = 0 to 0.
TEST(Terngrad, SmallMessageHasTheDocumentedBytes) {
  const std::vector<float> x{4.0f, -4.0f, 0.0f, 4.0f, -4.0f, 0.0f, -0.0f};
  const auto codec = terngrad_codec(8);
  const auto message = encode_message(*codec, host_view(x.data(), x.size()), context());
  // scale 4.0f, then trits 1 2 0 1 2 | 0 0: 1 + 3*2 + 9*0 + 27*1 + 81*2 = 196, then 0.
  const std::vector<std::byte> expected_payload{std::byte{0x00}, std::byte{0x00}, std::byte{0x80},
                                                std::byte{0x40}, std::byte{196}, std::byte{0}};
  EXPECT_EQ(std::vector<std::byte>(message.begin() + kWireHeaderBytes, message.end()),
            expected_payload);
  const std::vector<float> decoded = decode_to_f32(*codec, message, x.size());
  const std::vector<float> expected{4.0f, -4.0f, 0.0f, 4.0f, -4.0f, 0.0f, 0.0f};
  EXPECT_TRUE(testing::same_bits(decoded, expected));
}

TEST(Terngrad, TritsAreQsgdTwoBitCodesAndDecodeToTheirBits) {
  for (DType dtype : testing::kTestDTypes) {
    for (std::size_t bucket : {std::size_t{1}, std::size_t{5}, std::size_t{64}, std::size_t{512}}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{5},
                                std::size_t{6}, std::size_t{999}, std::size_t{4103}}) {
        for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3}}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " bucket " << bucket
                                            << " count " << count << " offset " << offset);
          const HostTensor input(dtype, test_values(count, count + bucket));
          const EncodeContext ctx = context(5, offset);
          const auto terngrad = terngrad_codec(bucket);
          const auto qsgd = qsgd2_codec(bucket);
          const auto message = encode_message(*terngrad, input.view(), ctx);
          const auto qsgd_message = encode_message(*qsgd, input.view(), ctx);
          EXPECT_EQ(std::vector<std::byte>(message.begin() + kWireHeaderBytes, message.end()),
                    repacked_qsgd_payload(qsgd_message, count, bucket));
          EXPECT_TRUE(testing::same_bits(decode_to_f32(*terngrad, message, count),
                                         decode_to_f32(*qsgd, qsgd_message, count)));
          std::vector<float> acc = test_values(count, 77), qsgd_acc = acc;
          terngrad->decode_add(message, acc.data(), count);
          qsgd->decode_add(qsgd_message, qsgd_acc.data(), count);
          EXPECT_TRUE(testing::same_bits(acc, qsgd_acc));
        }
      }
    }
  }
}

TEST(Terngrad, ValuesAreMinusZeroOrPlusTheBucketScale) {
  const std::size_t count = 10007, bucket = 100;
  const std::vector<float> x = test_values(count, 41);
  const auto codec = terngrad_codec(bucket);
  const auto message = encode_message(*codec, host_view(x.data(), count), context());
  const std::vector<float> decoded = decode_to_f32(*codec, message, count);
  std::size_t zeros = 0, nonzeros = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t b = i / bucket;
    float scale = 0.0f;
    for (std::size_t j = b * bucket; j < std::min(count, (b + 1) * bucket); ++j)
      scale = std::max(scale, std::fabs(x[j]));
    ASSERT_EQ(scale_at(message, b), scale) << b;
    ASSERT_TRUE(decoded[i] == 0.0f || decoded[i] == scale || decoded[i] == -scale) << i;
    ASSERT_LE(std::fabs(decoded[i] - x[i]), scale) << i;  // |err| <= scale
    if (decoded[i] != 0.0f) {
      ASSERT_EQ(std::signbit(decoded[i]), std::signbit(x[i])) << i;  // never the wrong sign
      ++nonzeros;
    } else {
      ++zeros;
    }
    if (x[i] == 0.0f) {
      ASSERT_EQ(decoded[i], 0.0f) << i;
    }
  }
  // E[#nonzero] = sum |x| / scale: roughly 0.3 of Gaussian data in buckets of 100; both kinds occur.
  EXPECT_GT(nonzeros, count / 10);
  EXPECT_GT(zeros, count / 10);
}

// Each element's decode is scale * sign * Bernoulli(|x| / scale): over T independent steps the
// mean's standard deviation is at most scale / (2 sqrt T). The values keep |x| >= 0.25 scale, so
// an all-zero or negated decoder misses by far more than the 6-sigma bound.
TEST(Terngrad, DecodeIsUnbiasedOverManySteps) {
  const std::size_t count = 64, bucket = 16;
  std::vector<float> x(count);
  for (std::size_t i = 0; i < count; ++i) {
    const float magnitude = 0.25f + 0.75f * static_cast<float>(i % bucket) / (bucket - 1);
    x[i] = (i % 3 == 0) ? -magnitude : magnitude;  // every bucket's max |x| is 1
  }
  const auto codec = terngrad_codec(bucket);
  const int steps = 4000;
  std::vector<double> sum(count, 0.0);
  for (int t = 0; t < steps; ++t) {
    const auto message = encode_message(*codec, host_view(x.data(), count),
                                        context(static_cast<std::uint32_t>(t)));
    const std::vector<float> decoded = decode_to_f32(*codec, message, count);
    for (std::size_t i = 0; i < count; ++i) sum[i] += decoded[i];
  }
  const double bound = 6.0 * 1.0 / (2.0 * std::sqrt(static_cast<double>(steps)));
  for (std::size_t i = 0; i < count; ++i) {
    EXPECT_NEAR(sum[i] / steps, x[i], bound) << "element " << i;
  }
}

TEST(Terngrad, ChunksAtBucketBoundariesDecodeLikeTheWholeTensor) {
  const std::size_t count = 3001, bucket = 64, chunk = 640;
  const std::vector<float> x = test_values(count, 5);
  const auto codec = terngrad_codec(bucket);
  const std::vector<float> whole =
      decode_to_f32(*codec, encode_message(*codec, host_view(x.data(), count), context()), count);
  std::vector<float> chunked;
  for (std::size_t begin = 0; begin < count; begin += chunk) {
    const std::size_t n = std::min(chunk, count - begin);
    const auto part = decode_to_f32(
        *codec, encode_message(*codec, host_view(x.data() + begin, n), context(7, begin)), n);
    chunked.insert(chunked.end(), part.begin(), part.end());
  }
  EXPECT_TRUE(testing::same_bits(chunked, whole));
}

TEST(Terngrad, NonFiniteBucketsDecodeToNaNAndZerosToPlusZero) {
  std::vector<float> x(24, 0.0f);
  x[8] = 1.0f;
  x[9] = INFINITY;  // bucket 1: scale +Inf
  x[17] = NAN;      // bucket 2: scale NaN
  x[3] = -0.0f;
  const auto codec = terngrad_codec(8);
  const auto message = encode_message(*codec, host_view(x.data(), x.size()), context());
  const std::vector<float> decoded = decode_to_f32(*codec, message, x.size());
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(kernels::float_bits(decoded[i]), 0u) << i;  // +0.0 exactly
  }
  for (std::size_t i = 8; i < 24; ++i) {
    EXPECT_EQ(kernels::float_bits(decoded[i]), 0x7FC00000u) << i;
  }
}

class TerngradOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(TerngradOnEachIsa);

TEST_P(TerngradOnEachIsa, EveryIsaGivesTheSameBytes) {
  if (GetParam() == Isa::scalar) GTEST_SKIP() << "the scalar path is the reference the other ISAs must match";
  for (std::size_t count : {std::size_t{1}, std::size_t{33}, std::size_t{2055}, std::size_t{12345}}) {
    for (std::size_t bucket : {std::size_t{7}, std::size_t{512}}) {
      const std::vector<float> x = test_values(count, count);
      const auto codec = terngrad_codec(bucket);
      // The message and its decode on `isa`.
      const auto run = [&](Isa isa) {
        testing::ScopedIsa forced(isa);
        std::vector<std::byte> message = encode_message(*codec, host_view(x.data(), count), context(3, 1));
        std::vector<float> decoded = decode_to_f32(*codec, message, count);
        return std::pair(std::move(message), std::move(decoded));
      };
      const auto [reference, reference_decoded] = run(Isa::scalar);
      const auto [message, decoded] = run(GetParam());
      ASSERT_EQ(message, reference) << count << " " << bucket;
      ASSERT_TRUE(testing::same_bits(decoded, reference_decoded));
    }
  }
}

TEST(Terngrad, HalfOutputsRoundTheF32Decode) {
  const std::size_t count = 1003;
  const std::vector<float> x = test_values(count, 8);
  const auto codec = terngrad_codec(32);
  const auto message = encode_message(*codec, host_view(x.data(), count), context());
  const std::vector<float> decoded = decode_to_f32(*codec, message, count);
  for (DType dtype : {DType::f16, DType::bf16}) {
    HostTensor out(dtype, count);
    codec->decode(message, out.view());
    const HostTensor rounded(dtype, decoded);
    EXPECT_TRUE(testing::same_bits(out.to_f32(), rounded.to_f32())) << dtype_name(dtype);
  }
}

// ---- malformed messages ------------------------------------------------------------------------

class TerngradMalformed : public ::testing::Test {
 protected:
  static constexpr std::size_t kCount = 37;  // 8 trit bytes, the last holding 2 elements
  static constexpr std::size_t kBucket = 8;  // 5 buckets: 20 scale bytes
  static constexpr std::size_t kTrits = kWireHeaderBytes + 20;

  void SetUp() override {
    x_ = test_values(kCount, 23);
    x_[9] = NAN;  // bucket 1 is non-finite: scale NaN, trits 0
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

  std::unique_ptr<Codec> codec_ = terngrad_codec(kBucket);
  std::vector<float> x_;
  std::vector<std::byte> message_;
};

TEST_F(TerngradMalformed, RejectsHeaderFields) {
  expect_rejected(with_byte(6, 1), "flags");
  expect_rejected(with_byte(7, 2), "small_param 2");
  auto bucket0 = message_;
  std::memset(bucket0.data() + 24, 0, 8);
  expect_rejected(bucket0, "bucket 0");
  auto bucket4 = message_;
  bucket4[24] = std::byte{4};  // 10 buckets of 4: 40 scale bytes, so the payload size is wrong
  expect_rejected(bucket4, "payload of");
  expect_rejected(with_byte(5, 4), "qsgd");  // another codec's id
  expect_rejected(message_, "holds 37 elements", kCount + 1);
  auto truncated = message_;
  truncated.pop_back();
  expect_rejected(truncated, "payload");
}

TEST_F(TerngradMalformed, RejectsTritBytesEncodeNeverWrites) {
  expect_rejected(with_byte(kTrits + 0, 243), "trit byte 0 is 243");
  expect_rejected(with_byte(kTrits + 3, 255), "trit byte 3 is 255");
  // The last byte holds elements 35 and 36: at most 3^2 - 1 = 8.
  expect_rejected(with_byte(kTrits + 7, 9), "trit byte 7 is 9 (expected at most 8");
  auto valid_last = with_byte(kTrits + 7, 8);
  std::vector<float> out(kCount);
  codec_->decode(valid_last, host_view(out.data(), kCount));
  EXPECT_EQ(out[35], -scale_at(message_, 4));  // trit 2
  EXPECT_EQ(out[36], -scale_at(message_, 4));
}

TEST_F(TerngradMalformed, RejectsBadScalesAndTritsInNonFiniteBuckets) {
  ASSERT_EQ(kernels::float_bits(scale_at(message_, 1)), 0x7FC00000u);
  auto negative = message_;
  const float minus_one = -1.0f;
  std::memcpy(negative.data() + kWireHeaderBytes + 4 * 2, &minus_one, 4);
  expect_rejected(negative, "bucket 2 has scale 0xbf800000");
  // Element 10 (bucket 1, byte 2, digit 0) made non-zero.
  auto trit = message_;
  const unsigned byte = std::to_integer<unsigned>(trit[kTrits + 2]);
  ASSERT_EQ(byte % 3u, 0u);
  trit[kTrits + 2] = std::byte(byte + 1u);
  expect_rejected(trit, "bucket 1 has the non-finite scale 0x7fc00000 and a non-zero trit");
}

}  // namespace
}  // namespace gradzip
