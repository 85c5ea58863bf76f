// The non-finite count every rank runs before a collective's call check
// (kernels/cpu/nonfinite_cpu.h), and the error-feedback residual guard (finite_or_zero,
// kernels/nonfinite_math.h): exact counts and first indices for f32, f16 and bf16 at every
// position of short tensors (every vector-tail length), at the ends of long ones, for every
// class of non-finite value (quiet / signalling NaN of both signs, +-Inf), with an offset into
// the tensor, and exhaustively over the 65536 f16 and bf16 bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast_math.h"
#include "kernels/cpu/nonfinite_cpu.h"
#include "kernels/ef_math.h"
#include "kernels/nonfinite_math.h"

namespace gradzip {
namespace {

using kernels::cpu::count_nonfinite;
using kernels::cpu::NonfiniteCount;

// The bit patterns of a tensor of one dtype: 32-bit words for f32, 16-bit ones otherwise.
struct Patterns {
  DType dtype;
  std::vector<std::uint32_t> finite;     // finite values, extreme ones included
  std::vector<std::uint32_t> nonfinite;  // one of each class
};

std::vector<Patterns> all_patterns() {
  return {
      {DType::f32,
       {0x00000000u, 0x80000000u, 0x00000001u, 0x3F800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x807FFFFFu},
       {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0xFFFFFFFFu, 0x7F800000u, 0xFF800000u}},
      {DType::f16,
       {0x0000u, 0x8000u, 0x0001u, 0x3C00u, 0x7BFFu, 0xFBFFu, 0x83FFu},
       {0x7E00u, 0xFE01u, 0x7C01u, 0xFFFFu, 0x7C00u, 0xFC00u}},
      {DType::bf16,
       {0x0000u, 0x8000u, 0x0001u, 0x3F80u, 0x7F7Fu, 0xFF7Fu, 0x807Fu},
       {0x7FC0u, 0xFFC1u, 0x7F81u, 0xFFFFu, 0x7F80u, 0xFF80u}},
  };
}

// A tensor of `n` elements of `dtype` holding the finite patterns in turn.
struct Tensor {
  DType dtype;
  std::vector<std::uint32_t> words32;
  std::vector<std::uint16_t> words16;

  Tensor(const Patterns& patterns, std::size_t n) : dtype(patterns.dtype) {
    if (dtype == DType::f32) words32.resize(n);
    else words16.resize(n);
    for (std::size_t i = 0; i < n; ++i) set(i, patterns.finite[i % patterns.finite.size()]);
  }
  void set(std::size_t i, std::uint32_t bits) {
    if (dtype == DType::f32) words32[i] = bits;
    else words16[i] = static_cast<std::uint16_t>(bits);
  }
  ConstTensorView view() const {
    if (dtype == DType::f32) return ConstTensorView(words32.data(), words32.size(), dtype);
    return ConstTensorView(words16.data(), words16.size(), dtype);
  }
};

void expect_count(const Tensor& tensor, std::size_t begin, std::size_t n, std::uint64_t count,
                  std::uint64_t first) {
  const NonfiniteCount found = count_nonfinite(tensor.view(), begin, n);
  EXPECT_EQ(found.count, count) << dtype_name(tensor.dtype) << " begin=" << begin << " n=" << n;
  EXPECT_EQ(found.first, first) << dtype_name(tensor.dtype) << " begin=" << begin << " n=" << n;
}

TEST(NonfiniteCount, FiniteTensorsCountZero) {
  for (const Patterns& patterns : all_patterns()) {
    for (const std::size_t n : {0u, 1u, 7u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 64u, 65u, 1000u}) {
      expect_count(Tensor(patterns, n), 0, n, 0, 0);
    }
  }
}

// One non-finite value of each class at every position of every length 1..70 (every tail of
// 8-, 16- and 32-lane vectors), and at the first, a middle and the last position of 1000.
TEST(NonfiniteCount, OneValueAtEveryPosition) {
  for (const Patterns& patterns : all_patterns()) {
    for (const std::uint32_t bad : patterns.nonfinite) {
      for (std::size_t n = 1; n <= 70; ++n) {
        for (std::size_t p = 0; p < n; ++p) {
          Tensor tensor(patterns, n);
          tensor.set(p, bad);
          expect_count(tensor, 0, n, 1, p);
        }
      }
      for (const std::size_t p : {0u, 1u, 499u, 998u, 999u}) {
        Tensor tensor(patterns, 1000);
        tensor.set(p, bad);
        expect_count(tensor, 0, 1000, 1, p);
      }
    }
  }
}

// Several non-finite values: the count is exact and `first` is the lowest index; a range that
// starts after some of them counts only its own, relative to its begin.
TEST(NonfiniteCount, SeveralValuesAndOffsets) {
  for (const Patterns& patterns : all_patterns()) {
    Tensor tensor(patterns, 1000);
    const std::size_t positions[] = {3, 64, 65, 511, 997};
    for (std::size_t j = 0; j < 5; ++j)
      tensor.set(positions[j], patterns.nonfinite[j % patterns.nonfinite.size()]);
    expect_count(tensor, 0, 1000, 5, 3);
    expect_count(tensor, 4, 996, 4, 60);     // 64, 65, 511, 997 counted from 4
    expect_count(tensor, 66, 400, 0, 0);     // [66, 466): none
    expect_count(tensor, 500, 500, 2, 11);   // 511 and 997
    expect_count(tensor, 997, 1, 1, 0);
    // Every element non-finite.
    for (std::size_t i = 0; i < 1000; ++i)
      tensor.set(i, patterns.nonfinite[i % patterns.nonfinite.size()]);
    expect_count(tensor, 0, 1000, 1000, 0);
    expect_count(tensor, 1, 999, 999, 0);
  }
}

// All 65536 patterns: exactly those with the exponent field all ones are counted (f16: 2 signs
// x 1024 fractions = 2048, the first at 0x7C00; bf16: 2 x 128 = 256, the first at 0x7F80).
TEST(NonfiniteCount, Every16BitPattern) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t bits = 0; bits < 65536; ++bits) all[bits] = static_cast<std::uint16_t>(bits);
  const NonfiniteCount f16 = count_nonfinite(ConstTensorView(all.data(), all.size(), DType::f16), 0, all.size());
  EXPECT_EQ(f16.count, 2048u);
  EXPECT_EQ(f16.first, 0x7C00u);
  const NonfiniteCount bf16 = count_nonfinite(ConstTensorView(all.data(), all.size(), DType::bf16), 0, all.size());
  EXPECT_EQ(bf16.count, 256u);
  EXPECT_EQ(bf16.first, 0x7F80u);
}

// The residual guard: NaN and Inf of both signs become +0; every finite value, extreme,
// denormal and -0 included, passes bit for bit.
TEST(ResidualGuard, FiniteOrZero) {
  for (const std::uint32_t bits : {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F800000u, 0xFF800000u}) {
    EXPECT_EQ(kernels::float_bits(kernels::finite_or_zero(kernels::bits_float(bits))), 0u) << std::hex << bits;
  }
  for (const std::uint32_t bits : {0x00000000u, 0x80000000u, 0x00000001u, 0x3F800000u, 0x7F7FFFFFu, 0xFF7FFFFFu}) {
    EXPECT_EQ(kernels::float_bits(kernels::finite_or_zero(kernels::bits_float(bits))), bits) << std::hex << bits;
  }
}

// The fused cast update (the CUDA error-feedback kernel's element math) on finite values past
// the 16-bit format's range: the payload saturates and the residual is the finite difference
// (fp16: 1e6 - 65504; bf16: FLT_MAX - largest bf16, exact in f32); a NaN gradient leaves a
// zero residual.
TEST(ResidualGuard, FusedCastUpdateStaysFinite) {
  float e = 0.0f;
  EXPECT_EQ(kernels::ef_cast_element(1.0e6f, e, /*bf16=*/false), 0x7BFFu);
  EXPECT_EQ(e, 1.0e6f - 65504.0f);
  e = 0.0f;
  const float max = std::numeric_limits<float>::max();
  EXPECT_EQ(kernels::ef_cast_element(-max, e, /*bf16=*/true), 0xFF7Fu);
  EXPECT_EQ(e, -max + kernels::bf16_bits_to_f32(0x7F7Fu));
  EXPECT_TRUE(std::isfinite(e));
  e = 5.0f;
  kernels::ef_cast_element(std::numeric_limits<float>::quiet_NaN(), e, /*bf16=*/false);
  EXPECT_EQ(kernels::float_bits(e), 0u);
  e = 1.0f;
  EXPECT_EQ(kernels::ef_cast_element(std::numeric_limits<float>::infinity(), e, /*bf16=*/true), 0x7F80u);
  EXPECT_EQ(kernels::float_bits(e), 0u);
}

// count_nonfinite_and_beyond against a scalar reference, for every 16-bit pattern (f16, bf16)
// and f32 values around the limits: beyond = finite and |x| > limit, exactly at the boundary
// (the limit itself is not beyond; the next representable value is), and the non-finite count
// unchanged by the second count.
std::uint64_t reference_beyond(const std::vector<float>& values, float limit) {
  std::uint64_t n = 0;
  for (float v : values) n += (std::isfinite(v) && std::fabs(v) > limit) ? 1 : 0;
  return n;
}

TEST(RangeCount, Every16BitPatternAgainstTheScalarComparison) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  for (const float limit : {65504.0f, 65504.0f / 3.0f, 1.0f, 0.1f, 32752.0f, 3.0e38f}) {
    SCOPED_TRACE(limit);
    for (const DType dtype : {DType::f16, DType::bf16}) {
      std::vector<float> widened(all.size());
      for (std::size_t i = 0; i < all.size(); ++i)
        widened[i] = dtype == DType::f16 ? kernels::f16_bits_to_f32(all[i]) : kernels::bf16_bits_to_f32(all[i]);
      const ConstTensorView view(all.data(), all.size(), dtype);
      const kernels::cpu::RangeCount found =
          kernels::cpu::count_nonfinite_and_beyond(view, 0, all.size(), limit);
      EXPECT_EQ(found.beyond, reference_beyond(widened, limit)) << dtype_name(dtype);
      EXPECT_EQ(found.nonfinite.count, count_nonfinite(view, 0, all.size()).count);
    }
  }
}

TEST(RangeCount, F32AtTheBoundaryAndAmongNonFiniteValues) {
  const float limit = 65504.0f;
  const float above = std::nextafter(limit, std::numeric_limits<float>::infinity());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {limit, -limit, above, -above, 1e30f, -3.4e38f, inf, -inf,
                                     std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1.0f};
  const kernels::cpu::RangeCount found = kernels::cpu::count_nonfinite_and_beyond(
      ConstTensorView(values.data(), values.size(), DType::f32), 0, values.size(), limit);
  EXPECT_EQ(found.beyond, 4u);  // above, -above, 1e30, -3.4e38; not the limit, not Inf / NaN
  EXPECT_EQ(found.nonfinite.count, 3u);
  EXPECT_EQ(found.nonfinite.first, 6u);
  // A sub-range: [2, 5) holds above, -above, 1e30.
  const kernels::cpu::RangeCount part = kernels::cpu::count_nonfinite_and_beyond(
      ConstTensorView(values.data(), values.size(), DType::f32), 2, 3, limit);
  EXPECT_EQ(part.beyond, 3u);
  EXPECT_EQ(part.nonfinite.count, 0u);
}

// The bit tests that the CPU count and the CUDA kernel share (kernels/nonfinite_math.h), with
// the threshold from beyond_threshold_bits: the first pattern above the limit, and nothing at
// the limit, at infinity or NaN.
TEST(RangeCount, SharedBitTestsAtTheThreshold) {
  const std::uint32_t f32_above = kernels::cpu::beyond_threshold_bits(DType::f32, 65504.0f);
  EXPECT_EQ(f32_above, kernels::float_bits(65504.0f) + 1);
  EXPECT_FALSE(kernels::f32_bits_beyond(kernels::float_bits(65504.0f), f32_above));
  EXPECT_TRUE(kernels::f32_bits_beyond(kernels::float_bits(65504.0f) + 1, f32_above));
  EXPECT_TRUE(kernels::f32_bits_beyond(kernels::float_bits(-70000.0f), f32_above));
  EXPECT_FALSE(kernels::f32_bits_beyond(0x7F800000u, f32_above));  // +Inf
  EXPECT_FALSE(kernels::f32_bits_beyond(0xFFC00000u, f32_above));  // NaN
  // No finite f16 exceeds 65504: the threshold is the infinity pattern, nothing is beyond.
  const auto f16_max = static_cast<std::uint16_t>(kernels::cpu::beyond_threshold_bits(DType::f16, 65504.0f));
  EXPECT_EQ(f16_max, 0x7C00u);
  EXPECT_FALSE(kernels::f16_bits_beyond(0x7BFFu, f16_max));
  // f16 at 100: 100 is 0x5640, the next pattern 0x5641 (100.0625) is the first beyond.
  const auto f16_100 = static_cast<std::uint16_t>(kernels::cpu::beyond_threshold_bits(DType::f16, 100.0f));
  EXPECT_EQ(f16_100, 0x5641u);
  EXPECT_FALSE(kernels::f16_bits_beyond(0x5640u, f16_100));
  EXPECT_TRUE(kernels::f16_bits_beyond(0xD641u, f16_100));  // -100.0625
  EXPECT_FALSE(kernels::f16_bits_beyond(0xFC00u, f16_100));  // -Inf
  const auto bf16_1 = static_cast<std::uint16_t>(kernels::cpu::beyond_threshold_bits(DType::bf16, 1.0f));
  EXPECT_EQ(bf16_1, 0x3F81u);  // 1.0 is 0x3F80
  EXPECT_TRUE(kernels::bf16_bits_beyond(0xBF81u, bf16_1));
  EXPECT_FALSE(kernels::bf16_bits_beyond(0x7FC0u, bf16_1));  // NaN
}

}  // namespace
}  // namespace gradzip
