// Numerical edge cases of every codec, made through make_codec: all-zero
// tensors, denormal inputs, k rounding below 1 for top-k / random-k, and ties in top-k.
// Every expected value is stated exactly or as a bound derived in the comment above the check.
// Codecs under test: none, fp16, bf16, qsgd bits 1/2/4/8, sign, topk (exact, approx,
// values=fp16), randk (fp32 and fp16 values). Tests whose kernels have SIMD paths run once per
// ISA this CPU has (scalar, avx2, avx512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using kernels::cpu::Isa;
using testing::decode_to_f32;
using testing::encode_message;
using testing::HostTensor;
using testing::same_bits;
using testing::ScopedIsa;

using testing::kAllCodecs;

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Independent references of round-to-nearest-even into a format with `mantissa` stored bits
// and smallest normal exponent `min_exp` (f16: 10, -14; bf16: 7, -126), computed in double
// (every f32 and every rounded result is exact in double; std::nearbyint rounds half to even
// in the default rounding mode). The quantum is 2^(max(e, min_exp) - mantissa) for
// 2^e <= |x| < 2^(e+1). Overflow is not modelled (callers stay far below the format maximum).
float reference_round(float x, int mantissa, int min_exp) {
  if (x == 0.0f) return x;
  const double v = x;
  int e = 0;
  std::frexp(v, &e);  // v = f * 2^e, 0.5 <= |f| < 1, so 2^(e-1) <= |v| < 2^e
  const int exponent = std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, exponent - mantissa);
  const double rounded = std::nearbyint(v / quantum) * quantum;
  return static_cast<float>(std::copysign(rounded, v));  // rounding to 0 keeps the sign
}
float reference_f16(float x) { return reference_round(x, 10, -14); }
float reference_bf16(float x) { return reference_round(x, 7, -126); }

// -------------------------------------------------------------------------------------------
// All-zero tensors.
// -------------------------------------------------------------------------------------------

class EdgeCaseZerosOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(EdgeCaseZerosOnEachIsa);

// +0 in (any input dtype) decodes to bitwise +0 for every codec: casts copy the zero; qsgd's
// scale is 0, so inv = 0 and every code is 0, which decodes to +0 (bits >= 2: min(0 * step, 0)
// with no sign; bits = 1: 0 - 0 = +0); sign's scale is 0 and the sign bit of +0 is 0; top-k and
// random-k keep (some) zeros and write zeros elsewhere. No 0/0 anywhere, so no NaN. decode_add
// adds +0 to every accumulator element, which leaves it bit for bit (x + 0 == x for x != -0).
TEST_P(EdgeCaseZerosOnEachIsa, EveryCodecDecodesExactPositiveZeros) {
  const std::size_t counts[] = {1, 2, 7, 513, 1000, 4097};
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (const char* spec : kAllCodecs) {
      const auto codec = make_codec(spec);
      for (const DType dtype : testing::kTestDTypes) {
        for (const std::size_t n : counts) {
          SCOPED_TRACE(std::string(spec) + " " + std::string(dtype_name(dtype)) +
                       " n=" + std::to_string(n));
          const std::vector<float> zeros(n, 0.0f);
          const HostTensor in(dtype, zeros);
          const EncodeContext ctx{5, 3, 11, 0};
          const std::vector<std::byte> message = encode_message(*codec, in.view(), ctx);
          EXPECT_TRUE(same_bits(decode_to_f32(*codec, message, n), zeros));
          // Decoding into a 16-bit output: +0 in every format.
          for (const DType out_dtype : {DType::f16, DType::bf16}) {
            HostTensor out(out_dtype, std::vector<float>(n, 1.0f));
            codec->decode(message, out.view());
            EXPECT_TRUE(same_bits(out.to_f32(), zeros)) << dtype_name(out_dtype);
          }
          std::vector<float> acc(n);
          for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i) - 3.5f;
          const std::vector<float> before = acc;
          codec->decode_add(message, acc.data(), n);
          EXPECT_TRUE(same_bits(acc, before));
        }
      }
    }
  }
}

// -0 inputs: every decoded value compares equal to 0 and none is NaN (casts and top-k/random-k
// keep the -0; qsgd and sign give +0 because the sign bit is taken from x < 0, false for -0).
TEST(EdgeCaseZeros, NegativeZerosDecodeToZeroWithoutNan) {
  for (const char* spec : kAllCodecs) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    const std::vector<float> zeros(777, -0.0f);
    const std::vector<std::byte> message = encode_message(*codec, host_view(zeros.data(), 777));
    for (const float v : decode_to_f32(*codec, message, 777)) {
      ASSERT_FALSE(std::isnan(v));
      ASSERT_EQ(v, 0.0f);
    }
  }
}

// -------------------------------------------------------------------------------------------
// Denormal inputs: casts.
// -------------------------------------------------------------------------------------------

struct CastCase {
  float in, f16, bf16;
};

// Hand-derived expectations. f16: subnormal quantum q = 2^-24 below 2^-14; bf16: quantum
// 2^-133 below 2^-126 (f32's own exponent range, 7 stored bits). Ties go to the even multiple;
// a value that rounds to zero keeps its sign.
const CastCase kCastCases[] = {
    {0x1p-24f, 0x1p-24f, 0x1p-24f},           // smallest f16 subnormal: exact in both
    {0x1p-25f, 0.0f, 0x1p-25f},               // q/2: tie between 0 and q -> 0 (even)
    {-0x1p-25f, -0.0f, -0x1p-25f},            // the same, sign kept
    {0x1.000002p-25f, 0x1p-24f, 0x1p-25f},    // just above q/2 -> q; bf16 drops the low bit
    {0x1.8p-25f, 0x1p-24f, 0x1.8p-25f},       // 0.75 q -> q
    {0x1p-26f, 0.0f, 0x1p-26f},               // q/4: flushed to +0
    {-0x1p-26f, -0.0f, -0x1p-26f},            // flushed to -0
    {0x1.8p-24f, 0x1p-23f, 0x1.8p-24f},       // 1.5 q -> 2q (even)
    {0x1.4p-23f, 0x1p-23f, 0x1.4p-23f},       // 2.5 q -> 2q (even)
    {0x1.cp-23f, 0x1p-22f, 0x1.cp-23f},       // 3.5 q -> 4q (even)
    {0x1.5p-20f, 0x1.5p-20f, 0x1.5p-20f},     // 21 q: exact
    {0x1.555554p-20f, 0x1.5p-20f, 0x1.56p-20f},  // 21.33 q -> 21 q; bf16: 8 significant bits
    {0x1.ff8p-15f, 0x1.ff8p-15f, 0x1.00p-14f},   // largest f16 subnormal 1023 q; bf16 rounds up
    {0x1.ffcp-15f, 0x1p-14f, 0x1p-14f},       // 1023.5 q -> 1024 q = smallest f16 normal
    {0x1p-14f, 0x1p-14f, 0x1p-14f},           // smallest f16 normal
    // f32 subnormals: far below the smallest f16 subnormal (flushed to a signed zero); bf16
    // keeps f32's exponent range, its subnormal quantum is 2^-133.
    {0x1p-149f, 0.0f, 0.0f},                  // smallest f32 subnormal, below 2^-134 -> 0
    {-0x1p-149f, -0.0f, -0.0f},
    {0x1p-133f, 0.0f, 0x1p-133f},             // smallest bf16 subnormal: exact
    {0x1p-134f, 0.0f, 0.0f},                  // half a bf16 quantum: tie -> 0
    {0x1.0002p-134f, 0.0f, 0x1p-133f},        // 2^-134 + 2^-149: just above the tie -> 2^-133
    {0x1.8p-133f, 0.0f, 0x1p-132f},           // 1.5 quanta -> 2 (even)
    {0x1.234p-130f, 0.0f, 0x1.2p-130f},       // 9.10 quanta -> 9
    {0x1.fcp-127f, 0.0f, 0x1.fcp-127f},       // largest bf16 subnormal (127 quanta): exact
    {0x1.fep-127f, 0.0f, 0x1p-126f},          // 127.5 quanta -> 128 = FLT_MIN (even)
    {-0x1p-126f, -0.0f, -0x1p-126f},          // FLT_MIN: exact in bf16, -0 in f16
};

class EdgeCaseDenormalsOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(EdgeCaseDenormalsOnEachIsa);

TEST_P(EdgeCaseDenormalsOnEachIsa, CastsRoundHandDerivedCasesExactly) {
  std::vector<float> in;
  std::vector<float> want16;
  std::vector<float> want_bf;
  for (const CastCase& c : kCastCases) {
    in.push_back(c.in);
    want16.push_back(c.f16);
    want_bf.push_back(c.bf16);
    // The hand table and the independent reference agree (a check of the table itself).
    EXPECT_EQ(bits_of(reference_f16(c.in)), bits_of(c.f16)) << std::hexfloat << c.in;
    EXPECT_EQ(bits_of(reference_bf16(c.in)), bits_of(c.bf16)) << std::hexfloat << c.in;
  }
  const auto fp16 = make_codec("fp16");
  const auto bf16 = make_codec("bf16");
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    const std::size_t n = in.size();
    EXPECT_TRUE(same_bits(decode_to_f32(*fp16, encode_message(*fp16, host_view(in.data(), n)), n),
                          want16));
    EXPECT_TRUE(same_bits(decode_to_f32(*bf16, encode_message(*bf16, host_view(in.data(), n)), n),
                          want_bf));
    // decode_add: acc = 0 + value; IEEE 0 + (-0) = +0, so compare values, not bits, for zeros.
    for (const auto* codec : {fp16.get(), bf16.get()}) {
      const std::vector<float>& want = codec == fp16.get() ? want16 : want_bf;
      std::vector<float> acc(n, 0.0f);
      codec->decode_add(encode_message(*codec, host_view(in.data(), n)), acc.data(), n);
      for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(acc[i], want[i]) << codec->name() << " " << i;
    }
  }
}

// A sweep of 2^16 values spread over f32 exponents -150 .. -10 (random mantissas and signs,
// f32 subnormals included, padded to an odd length so every SIMD tail runs): every element
// equals the independent reference rounding, bit for bit, through f32, f16 and bf16 inputs.
TEST_P(EdgeCaseDenormalsOnEachIsa, CastSweepMatchesIndependentReference) {
  std::mt19937 engine(1234);
  std::vector<float> in((std::size_t{1} << 16) + 5);
  for (float& v : in) {
    const int exponent = static_cast<int>(engine() % 141) - 150;
    const double mantissa = 1.0 + static_cast<double>(engine() % (1u << 23)) * 0x1p-23;
    v = static_cast<float>(std::ldexp(mantissa, exponent));  // f32 rounds subnormals once
    if (engine() & 1u) v = -v;
  }
  const auto fp16 = make_codec("fp16");
  const auto bf16 = make_codec("bf16");
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (const DType dtype : testing::kTestDTypes) {
      SCOPED_TRACE(dtype_name(dtype));
      const HostTensor tensor(dtype, in);  // f16/bf16 inputs: the values as that format holds them
      const std::vector<float> values = tensor.to_f32();
      std::vector<float> want16(values.size());
      std::vector<float> want_bf(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) {
        want16[i] = reference_f16(values[i]);
        want_bf[i] = reference_bf16(values[i]);
      }
      EXPECT_TRUE(same_bits(
          decode_to_f32(*fp16, encode_message(*fp16, tensor.view()), values.size()), want16));
      EXPECT_TRUE(same_bits(
          decode_to_f32(*bf16, encode_message(*bf16, tensor.view()), values.size()), want_bf));
    }
  }
}

// -------------------------------------------------------------------------------------------
// Denormal inputs: qsgd and sign.
// -------------------------------------------------------------------------------------------

// Tensors of f32 subnormals (random integer multiples of 2^-149 up to 2^20 of them, random
// signs), and of tiny normals (~1e-30, below qsgd's 2^-64 prescale threshold).
std::vector<float> subnormal_tensor(std::size_t n, std::uint32_t seed, bool tiny_normal) {
  std::mt19937 engine(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const double magnitude = tiny_normal ? 1e-30 * (1.0 + (engine() % 1000) / 1000.0)
                                         : static_cast<double>(1 + engine() % (1u << 20)) * 0x1p-149;
    x = static_cast<float>((engine() & 1u) ? -magnitude : magnitude);
  }
  return v;
}

// Derived bounds, per bucket with scale m = max |x| (exact, computed on bit patterns):
//   every decoded value is finite;
//   bits = 1: decoded = +m or -m exactly;
//   bits >= 2 (s = 2^(bits-1) - 1 levels): |decoded| <= m, decoded is 0 or has x's sign, and
//     |decoded - x| <= m / s + 2^-14 m + (s + 2) 2^-149: one step m / s (q is floor(y) or
//     floor(y) + 1 with y = |x| s / m), plus the relative f32 rounding of y (inv, the product and
//     y + u: a few units of 2^-24 of y <= s, i.e. < 2^-14 m after scaling by m / s) and of
//     decoding (step = m / s and q * step: 2 units of 2^-24 of m when normal); when m is
//     subnormal those two decode roundings are absolute, at most 2^-150 each per level, so
//     (s + 2) 2^-149 (0 for the tiny normals).
TEST_P(EdgeCaseDenormalsOnEachIsa, QsgdIsFiniteAndWithinItsBounds) {
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (const bool tiny_normal : {false, true}) {
      for (const std::size_t bucket : {std::size_t{4}, std::size_t{512}}) {
        for (const int bits : {1, 2, 4, 8}) {
          SCOPED_TRACE("bits=" + std::to_string(bits) + " bucket=" + std::to_string(bucket) +
                       (tiny_normal ? " tiny normals" : " subnormals"));
          const std::vector<float> x = subnormal_tensor(1001, 77u + bits, tiny_normal);
          const auto codec = make_codec("qsgd:bits=" + std::to_string(bits) +
                                        ",bucket=" + std::to_string(bucket));
          const std::vector<float> d = decode_to_f32(
              *codec, encode_message(*codec, host_view(x.data(), x.size()), {9, 1, 2, 0}),
              x.size());
          const double s = bits == 1 ? 1.0 : static_cast<double>((1 << (bits - 1)) - 1);
          for (std::size_t b = 0; b < x.size(); b += bucket) {
            const std::size_t end = std::min(x.size(), b + bucket);
            double m = 0;
            for (std::size_t i = b; i < end; ++i) m = std::max(m, std::fabs(double{x[i]}));
            const double bound = m / s + 0x1p-14 * m + (tiny_normal ? 0.0 : (s + 2) * 0x1p-149);
            for (std::size_t i = b; i < end; ++i) {
              ASSERT_TRUE(std::isfinite(d[i])) << i;
              if (bits == 1) {
                ASSERT_EQ(std::fabs(double{d[i]}), m) << i;
                continue;
              }
              ASSERT_LE(std::fabs(double{d[i]}), m) << i;
              if (d[i] != 0.0f) {
                ASSERT_EQ(std::signbit(d[i]), std::signbit(x[i])) << i;
              }
              ASSERT_LE(std::fabs(double{d[i]} - double{x[i]}), bound) << i;
            }
          }
        }
      }
    }
  }
}

// Sign of subnormals. Exact cases: a bucket of +-d (d = 3 * 2^-149) has mean |x| = 16 d / 16 = d
// exactly (sums of multiples of 2^-149 below 2^-125 are exact), so it decodes to x bit for bit;
// a bucket {2^-149, -2^-148} has mean 1.5 * 2^-149, which rounds to even: 2^-148, so it decodes
// to {2^-148, -2^-148}. General subnormal data: decoded = +-scale with the sign of x < 0, finite,
// and |scale - mean| <= len * 2^-24 * mean + 2^-149 (len rounded f32 adds and one division).
TEST_P(EdgeCaseDenormalsOnEachIsa, SignIsExactOnExactMeansAndBoundedOtherwise) {
  const auto codec = make_codec("sign");
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    std::vector<float> x(16);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = (i % 3 == 0 ? -3 : 3) * 0x1p-149f;
    EXPECT_TRUE(same_bits(decode_to_f32(*codec, encode_message(*codec, host_view(x.data(), 16)), 16), x));

    const std::vector<float> pair = {0x1p-149f, -0x1p-148f};
    const std::vector<float> want = {0x1p-148f, -0x1p-148f};
    EXPECT_TRUE(same_bits(decode_to_f32(*codec, encode_message(*codec, host_view(pair.data(), 2)), 2), want));

    const std::vector<float> y = subnormal_tensor(1001, 5, false);
    const std::vector<float> d =
        decode_to_f32(*codec, encode_message(*codec, host_view(y.data(), y.size())), y.size());
    for (std::size_t b = 0; b < y.size(); b += 512) {
      const std::size_t end = std::min(y.size(), b + 512);
      double mean = 0;
      for (std::size_t i = b; i < end; ++i) mean += std::fabs(double{y[i]});
      mean /= static_cast<double>(end - b);
      const double scale = std::fabs(double{d[b]});
      EXPECT_LE(std::fabs(scale - mean), static_cast<double>(end - b) * 0x1p-24 * mean + 0x1p-149);
      for (std::size_t i = b; i < end; ++i) {
        ASSERT_TRUE(std::isfinite(d[i]));
        ASSERT_EQ(std::fabs(double{d[i]}), scale) << i;
        ASSERT_EQ(std::signbit(d[i]), y[i] < 0.0f) << i;
      }
    }
  }
}

// -------------------------------------------------------------------------------------------
// Denormal inputs: top-k selects by magnitude.
// -------------------------------------------------------------------------------------------

// The indices of a top-k message (header count at 8, entries m at 24; m u32 indices follow the
// 32-byte header for n <= 2^32).
std::vector<std::uint32_t> topk_indices(const std::vector<std::byte>& message) {
  std::uint64_t m = 0;
  std::memcpy(&m, message.data() + 24, 8);
  std::vector<std::uint32_t> indices(m);
  if (m != 0) std::memcpy(indices.data(), message.data() + 32, 4 * m);
  return indices;
}

// n = 300 distinct magnitudes (rank_of[i] + 1) * unit with alternating signs, rank_of a fixed
// permutation: exact top-k keeps exactly the 10 indices with rank_of >= 290; approx keeps the
// top m of that order for some 5 <= m <= 10. Units: 2^-149 (f32 subnormals) and 2^-24 (f16
// subnormals, fed as f32 and as f16). Decoded values: x for fp32 values; the f16 rounding of x
// for values=fp16 (so f32 subnormals decode to signed zeros, but the indices still carry the
// selection, which is checked on the message).
TEST_P(EdgeCaseDenormalsOnEachIsa, TopkSelectsSubnormalsByMagnitude) {
  constexpr std::size_t n = 300;
  constexpr std::size_t k = 10;
  std::vector<std::size_t> rank_of(n);
  std::iota(rank_of.begin(), rank_of.end(), std::size_t{0});
  std::mt19937 engine(99);
  std::shuffle(rank_of.begin(), rank_of.end(), engine);
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (const float unit : {0x1p-149f, 0x1p-24f}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i)
        x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(rank_of[i] + 1) * unit;
      for (const DType dtype : {DType::f32, DType::f16}) {
        if (dtype == DType::f16 && unit < 0x1p-24f) continue;  // not representable in f16
        for (const char* spec : {"topk:k=10", "topk:k=10,approx=on", "topk:k=10,values=fp16"}) {
          SCOPED_TRACE(std::string(spec) + " " + std::string(dtype_name(dtype)) +
                       (unit < 0x1p-24f ? " f32 subnormals" : " f16 subnormals"));
          const auto codec = make_codec(spec);
          const HostTensor in(dtype, x);  // f16 subnormal multiples are exact in f16
          const std::vector<std::byte> message = encode_message(*codec, in.view());
          const std::vector<std::uint32_t> kept = topk_indices(message);
          const bool approx = codec->spec().approx;
          const std::size_t m = kept.size();
          ASSERT_LE(m, k);
          ASSERT_GE(m, approx ? (k + 1) / 2 : k);
          for (const std::uint32_t i : kept) EXPECT_GE(rank_of[i], n - m) << "index " << i;
          const bool half = codec->spec().values == DType::f16;
          std::vector<float> want(n, 0.0f);
          for (const std::uint32_t i : kept) want[i] = half ? reference_f16(x[i]) : x[i];
          EXPECT_TRUE(same_bits(decode_to_f32(*codec, message, n), want));
        }
      }
    }
  }
}

// Subnormals never outrank normals: 7 small normals (2^-126 .. 2^-120) among 500 subnormals are
// exactly the top 7 (ties impossible: all magnitudes distinct).
TEST_P(EdgeCaseDenormalsOnEachIsa, TopkRanksNormalsAboveSubnormals) {
  std::vector<float> x(507);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = -static_cast<float>(i + 1) * 0x1p-149f * 1000.0f;  // up to 507000 * 2^-149 < 2^-126
  const std::size_t normals[] = {3, 50, 101, 250, 251, 400, 506};
  for (std::size_t j = 0; j < 7; ++j) x[normals[j]] = std::ldexp(1.0f, -126 + static_cast<int>(j));
  const auto codec = make_codec("topk:k=7");
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    const std::vector<std::byte> message = encode_message(*codec, host_view(x.data(), x.size()));
    EXPECT_EQ(topk_indices(message),
              std::vector<std::uint32_t>(std::begin(normals), std::end(normals)));
  }
}

// -------------------------------------------------------------------------------------------
// k rounding below 1.
// -------------------------------------------------------------------------------------------

// k_for(n) = ceil(ratio * n) clamped to [1, n] for n > 0, and 0 for n == 0: a ratio with
// ratio * n < 1 gives k = 1, never 0. 0.001 * 1000 rounds to exactly 1.0 in double, so
// k_for(1000) = 1; 0.001 * 1001 = 1.001 -> 2.
TEST(EdgeCaseKRounding, KForRoundsUpToOne) {
  for (const char* text : {"topk:ratio=0.001", "randk:ratio=0.001"}) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    EXPECT_EQ(spec.k_for(0), 0u) << text;
    EXPECT_EQ(spec.k_for(1), 1u) << text;
    EXPECT_EQ(spec.k_for(7), 1u) << text;
    EXPECT_EQ(spec.k_for(999), 1u) << text;
    EXPECT_EQ(spec.k_for(1000), 1u) << text;
    EXPECT_EQ(spec.k_for(1001), 2u) << text;
  }
  const CompressionSpec tiny = CompressionSpec::parse("topk:ratio=1e-300");
  EXPECT_EQ(tiny.k_for(1), 1u);
  EXPECT_EQ(tiny.k_for(std::size_t{1} << 40), 1u);
}

// ratio * n < 1 through the codecs: message sizes are the k = 1 sizes (top-k 32 + 4 + value
// bytes; random-k 32 + 24 + value bytes); top-k keeps the single largest |x| (index 4 of 7,
// unique), approx too (ceil(1/2) = 1 <= m <= 1); random-k keeps exactly one element, its value
// x[j] (f16-rounded for values=fp16). n = 0 keeps nothing (k = 0).
TEST(EdgeCaseKRounding, CodecsKeepExactlyOneElement) {
  const std::vector<float> x = {0.5f, -1.25f, 2.0f, -0.75f, -3.1f, 1.0f, 0.1f};
  const std::size_t n = x.size();
  struct Case {
    const char* spec;
    std::size_t bytes;
  };
  const Case cases[] = {{"topk:ratio=0.01", 32 + 4 + 4},
                        {"topk:ratio=0.01,approx=on", 32 + 4 + 4},
                        {"topk:ratio=0.01,values=fp16", 32 + 4 + 2},
                        {"randk:ratio=0.01", 32 + 24 + 4},
                        {"randk:ratio=0.01,values=fp16", 32 + 24 + 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const auto codec = make_codec(c.spec);
    EXPECT_EQ(codec->max_encoded_bytes(n), c.bytes);
    const bool half = codec->spec().values == DType::f16;
    for (std::uint32_t step = 0; step < 20; ++step) {
      const std::vector<std::byte> message =
          encode_message(*codec, host_view(x.data(), n), {1, step, 2, 0});
      ASSERT_EQ(message.size(), c.bytes);
      const std::vector<float> d = decode_to_f32(*codec, message, n);
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (d[i] == 0.0f) continue;
        ++nonzero;
        EXPECT_EQ(d[i], half ? reference_f16(x[i]) : x[i]) << i;
        if (codec->spec().codec == CodecKind::topk) {
          EXPECT_EQ(i, 4u);
        }
      }
      EXPECT_EQ(nonzero, 1u);
    }
    // n == 0: the header-only (top-k) or key-only (random-k) message, nothing decoded.
    const std::vector<std::byte> empty = encode_message(*codec, host_view(x.data(), 0));
    EXPECT_EQ(empty.size(), codec->spec().codec == CodecKind::topk ? 32u : 32u + 24u);
    EXPECT_TRUE(decode_to_f32(*codec, empty, 0).empty());
  }
}

// -------------------------------------------------------------------------------------------
// Ties in top-k.
// -------------------------------------------------------------------------------------------

class EdgeCaseTiesOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(EdgeCaseTiesOnEachIsa);

// Equal magnitudes (+-1 alternating, 1001 elements, k = 10): exact keeps indices 0..9, approx a
// prefix 0..m-1 with 5 <= m <= 10. One larger element (5 at index 500) is always kept and the
// other k - 1 (exact) are the lowest indices 0..8. Encoding twice gives the same bytes.
TEST_P(EdgeCaseTiesOnEachIsa, LowestIndicesWinDeterministically) {
  std::vector<float> x(1001);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 2 ? -1.0f : 1.0f;
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (const char* spec : {"topk:k=10", "topk:k=10,approx=on", "topk:k=10,values=fp16"}) {
      SCOPED_TRACE(spec);
      const auto codec = make_codec(spec);
      const bool approx = codec->spec().approx;
      std::vector<float> y = x;
      for (const bool with_peak : {false, true}) {
        if (with_peak) y[500] = 5.0f;
        const std::vector<std::byte> a = encode_message(*codec, host_view(y.data(), y.size()));
        const std::vector<std::byte> b = encode_message(*codec, host_view(y.data(), y.size()));
        EXPECT_EQ(a, b);
        const std::vector<std::uint32_t> kept = topk_indices(a);
        const std::size_t m = kept.size();
        ASSERT_LE(m, 10u);
        ASSERT_GE(m, approx ? 5u : 10u);
        std::vector<std::uint32_t> want(with_peak ? m - 1 : m);
        std::iota(want.begin(), want.end(), 0u);
        if (with_peak) want.push_back(500);
        EXPECT_EQ(kept, want) << (with_peak ? "with peak" : "all ties");
      }
    }
  }
}

// All magnitudes equal including zeros of both signs: +0 and -0 have the same key (0), so with
// k = 3 out of {-0, +0, -0, +0} the kept indices are 0, 1, 2.
TEST(EdgeCaseTies, SignedZerosTieByIndex) {
  const std::vector<float> x = {-0.0f, 0.0f, -0.0f, 0.0f};
  const auto codec = make_codec("topk:k=3");
  EXPECT_EQ(topk_indices(encode_message(*codec, host_view(x.data(), 4))),
            (std::vector<std::uint32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace gradzip
