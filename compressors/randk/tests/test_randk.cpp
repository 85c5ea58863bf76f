// The `randk` codec and its index rule (compressors/randk/randk_math.h): stratified indices
// drawn from the shared key, values carried bit-exactly (or rounded to nearest even with
// values=fp16), equal keys give equal indices whatever the input (what makes payloads additive), every ISA
// gives the same bytes, and every malformed message is refused before anything is written.
//
// The reference below recomputes the rule from its definition with unsigned __int128 and
// Philox directly, independently of the kernels' division-free strata walk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/cpu_features.h"
#include "compressors/randk/randk_cpu.h"
#include "kernels/philox_math.h"
#include "compressors/randk/randk_math.h"
#include "kernels/host_device.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

__extension__ typedef unsigned __int128 U128;

using compressors::kWireHeaderBytes;
using compressors::WireCodec;
using kernels::RandkKey;
using kernels::cpu::Isa;
using testing::HostTensor;

constexpr std::size_t kKeyBytes = 24;
constexpr std::uint8_t kFlagF16Values = 0x02;
constexpr std::uint64_t kTwo63 = std::uint64_t{1} << 63;
constexpr std::uint64_t kMax64 = ~std::uint64_t{0};

// ---- the rule, from its definition ---------------------------------------------------------

std::uint64_t reference_stratum_start(std::uint64_t j, std::uint64_t n, std::uint64_t k) {
  return static_cast<std::uint64_t>(static_cast<U128>(j) * n / k);
}

std::uint64_t reference_word(const RandkKey& key, std::uint64_t j) {
  const auto block =
      kernels::philox_block(key.seed, key.step, key.tensor_id, key.element_offset + j);
  return block.v[0] | (static_cast<std::uint64_t>(block.v[1]) << 32);
}

std::uint64_t reference_index(const RandkKey& key, std::uint64_t n, std::uint64_t k,
                              std::uint64_t j) {
  const std::uint64_t start = reference_stratum_start(j, n, k);
  const std::uint64_t length = reference_stratum_start(j + 1, n, k) - start;
  return start +
         static_cast<std::uint64_t>((static_cast<U128>(reference_word(key, j)) * length) >> 64);
}

std::vector<std::uint64_t> reference_indices(std::uint64_t n, std::uint64_t k,
                                             const RandkKey& key) {
  std::vector<std::uint64_t> indices(k);
  for (std::uint64_t j = 0; j < k; ++j) indices[j] = reference_index(key, n, k, j);
  return indices;
}

// ---- message plumbing ----------------------------------------------------------------------

template <typename T>
T read_at(std::span<const std::byte> bytes, std::size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}

template <typename T>
void write_at(std::vector<std::byte>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}



// ---- the 128-bit helpers -------------------------------------------------------------------

TEST(RandkMath, MultiplyHighAndDivisionMatch128BitIntegers) {
  const std::uint64_t edges[] = {0,
                                 1,
                                 2,
                                 3,
                                 0xFFFFFFFFu,
                                 std::uint64_t{1} << 32,
                                 (std::uint64_t{1} << 32) + 1,
                                 kTwo63 - 1,
                                 kTwo63,
                                 kTwo63 + 1,
                                 kMax64 - 1,
                                 kMax64};
  auto check = [](std::uint64_t a, std::uint64_t b) {
    const U128 product = static_cast<U128>(a) * b;
    const auto expected_hi = static_cast<std::uint64_t>(product >> 64);
    ASSERT_EQ(kernels::mulhi64_portable(a, b), expected_hi) << a << " * " << b;
    ASSERT_EQ(kernels::mulhi64(a, b), expected_hi) << a << " * " << b;
    // Divide the product by a divisor above its high word (the helpers' precondition).
    for (std::uint64_t divisor : {expected_hi + 1, a | 1, b | 1, kMax64}) {
      if (divisor <= expected_hi) continue;
      const auto expected_quotient = static_cast<std::uint64_t>(product / divisor);
      ASSERT_EQ(
          kernels::div128_by_64_portable(expected_hi, static_cast<std::uint64_t>(product), divisor),
          expected_quotient)
          << a << " * " << b << " / " << divisor;
      ASSERT_EQ(kernels::div128_by_64(expected_hi, static_cast<std::uint64_t>(product), divisor),
                expected_quotient);
    }
  };
  for (std::uint64_t a : edges)
    for (std::uint64_t b : edges) check(a, b);
  std::mt19937_64 engine(12345);
  for (int trial = 0; trial < 200000; ++trial) {
    // Mix full-width and short operands so every normalisation shift is exercised.
    const std::uint64_t a = engine() >> (engine() % 64);
    const std::uint64_t b = engine() >> (engine() % 64);
    check(a, b);
  }
  // Algorithm D corrects each estimated quotient digit at most twice; the second correction
  // needs the divisor's top digit just above 2^31 with a bottom digit near 2^32 and a
  // numerator just below the divisor (found by search: e.g. (0x8000008e130398c1 * 2^64 +
  // 0xe94ec2d2b9936849) / 0x8000008efffffffa). Divisors of that shape, shifted right by 0..40
  // bits so every normalisation shift sees them too.
  for (int trial = 0; trial < 200000; ++trial) {
    const std::uint64_t top = 0x80000000u + (engine() & 0xFF);
    const std::uint64_t bottom = 0xFFFFFFFFu - (engine() & 0xF);
    const std::uint64_t divisor = ((top << 32) | bottom) >> (engine() % 41);
    const std::uint64_t hi = divisor - 1 - ((engine() & 0xFFFFFFFFu) % divisor);
    const std::uint64_t lo = engine();
    const auto expected =
        static_cast<std::uint64_t>(((static_cast<U128>(hi) << 64) | lo) / divisor);
    ASSERT_EQ(kernels::div128_by_64_portable(hi, lo, divisor), expected)
        << hi << ":" << lo << " / " << divisor;
  }
  // Hand-checked values: (2^64-1)^2 = 2^128 - 2^65 + 1, high word 2^64 - 2.
  EXPECT_EQ(kernels::mulhi64_portable(kMax64, kMax64), kMax64 - 1);
  // (2^127 + 5) / (2^63 + 1) = 2^64 - 2 remainder 7 (2^127 + 5 = (2^64 - 2)(2^63 + 1) + 7).
  EXPECT_EQ(kernels::div128_by_64_portable(kTwo63, 5, kTwo63 + 1), kMax64 - 1);
}

TEST(RandkMath, LeadingZerosOfEveryBitPosition) {
  std::mt19937_64 engine(7);
  for (int bit = 0; bit < 64; ++bit) {
    const std::uint64_t top = std::uint64_t{1} << bit;
    EXPECT_EQ(kernels::leading_zeros64_portable(top), 63 - bit);
    EXPECT_EQ(kernels::leading_zeros64_portable(top | (engine() & (top - 1))), 63 - bit);
    EXPECT_EQ(kernels::leading_zeros64_portable(top | (top - 1)), 63 - bit);
  }
}

TEST(RandkMath, StrataNear2To63AreExact) {
  // Only the math helpers: no tensor of this size is allocated.
  const std::uint64_t sizes[] = {kTwo63 - 1, kTwo63, kTwo63 + 1, kTwo63 + 12345, kMax64};
  for (std::uint64_t n : sizes) {
    const std::uint64_t ks[] = {1,
                                2,
                                3,
                                7,
                                1000003,
                                0xFFFFFFFFu,
                                (std::uint64_t{1} << 32) + 1,
                                (std::uint64_t{1} << 62) + 3,
                                kTwo63 - 1,
                                n - 1,
                                n};
    for (std::uint64_t k : ks) {
      const std::uint64_t js[] = {0, 1, 2, k / 3, k / 2, k - 2, k - 1, k};
      for (std::uint64_t j : js) {
        if (j > k) continue;
        ASSERT_EQ(kernels::randk_stratum_start(j, n, k), reference_stratum_start(j, n, k))
            << "j=" << j << " n=" << n << " k=" << k;
      }
      EXPECT_EQ(kernels::randk_stratum_start(k, n, k), n);
      // The division-free walk from deep inside the range stays on the formula.
      const std::uint64_t from = k > 600 ? k - 600 : 0;
      kernels::RandkStrata strata = kernels::RandkStrata::at(from, n, k);
      const RandkKey key{99, 5, 3, kMax64 - 2};  // block numbers wrap past 2^64
      for (std::uint64_t j = from; j < k && j < from + 600; ++j) {
        const std::uint64_t start = strata.start;
        ASSERT_EQ(start, reference_stratum_start(j, n, k)) << "j=" << j << " n=" << n << " k=" << k;
        const std::uint64_t length = strata.advance();
        ASSERT_EQ(start + length, reference_stratum_start(j + 1, n, k));
        const std::uint64_t index = kernels::randk_index(key, n, k, j);
        ASSERT_EQ(index, reference_index(key, n, k, j));
        ASSERT_GE(index, start);
        ASSERT_LT(index - start, length);
      }
    }
  }
  // floor(2^63 / 3) = 3074457345618258602; floor(2 * 2^63 / 3) = 6148914691236517205.
  EXPECT_EQ(kernels::randk_stratum_start(1, kTwo63, 3), 3074457345618258602ull);
  EXPECT_EQ(kernels::randk_stratum_start(2, kTwo63, 3), 6148914691236517205ull);
}

TEST(RandkMath, StrataWalkIsTheFormulaForEverySmallShape) {
  for (std::uint64_t n = 1; n <= 64; ++n) {
    for (std::uint64_t k = 1; k <= n; ++k) {
      kernels::RandkStrata strata = kernels::RandkStrata::at(0, n, k);
      for (std::uint64_t j = 0; j < k; ++j) {
        ASSERT_EQ(strata.start, reference_stratum_start(j, n, k)) << n << " " << k << " " << j;
        const std::uint64_t length = strata.advance();
        // Every stratum is floor(n/k) or ceil(n/k) long.
        ASSERT_TRUE(length == n / k || length == (n + k - 1) / k) << n << " " << k << " " << j;
      }
      ASSERT_EQ(strata.start, n);
    }
  }
}

// ---- the codec -----------------------------------------------------------------------------

const char* const kSpecs[] = {"randk:ratio=0.01", "randk:ratio=0.5", "randk:ratio=1.0",
                              "randk:k=1"};

TEST(RandkCodec, KeepsStratifiedIndicesWithExactValues) {
  const EncodeContext ctx{0x0123456789ABCDEFull, 17, 4, 0};
  const RandkKey key = kernels::cpu::randk_key(ctx);
  for (const char* base : kSpecs) {
    for (const bool f16_values : {false, true}) {
      const std::string text = std::string(base) + (f16_values ? ",values=fp16" : "");
      const auto codec = make_codec(text);
      EXPECT_TRUE(codec->additive());
      EXPECT_FALSE(codec->sparse());
      const std::size_t value_bytes = f16_values ? 2 : 4;
      for (std::size_t n : testing::kTestCounts) {
        const auto data = testing::gaussian(n, 7 + n);
        for (DType dtype : testing::kTestDTypes) {
          SCOPED_TRACE(text + " n=" + std::to_string(n) + " " + std::string(dtype_name(dtype)));
          const HostTensor input(dtype, data);
          const auto message = testing::encode_message(*codec, input.view(), ctx);
          const std::size_t k = codec->spec().k_for(n);

          // Header and key.
          ASSERT_EQ(message.size(), kWireHeaderBytes + kKeyBytes + k * value_bytes);
          ASSERT_EQ(message.size(), codec->max_encoded_bytes(n));
          const auto header = compressors::read_header_for(message, WireCodec::randk, n, "test");
          EXPECT_EQ(header.flags, f16_values ? kFlagF16Values : 0);
          EXPECT_EQ(header.small_param, 0);
          EXPECT_EQ(header.large_param, k);
          EXPECT_EQ(read_at<std::uint64_t>(message, 32), ctx.seed);
          EXPECT_EQ(read_at<std::uint32_t>(message, 40), ctx.step);
          EXPECT_EQ(read_at<std::uint32_t>(message, 44), ctx.tensor_id);
          EXPECT_EQ(read_at<std::uint64_t>(message, 48), ctx.element_offset);

          // Indices: the reference rule, strictly increasing, one per stratum.
          const auto indices = kernels::cpu::randk_indices(n, k, ctx);
          ASSERT_EQ(indices, reference_indices(n, k, key));
          for (std::size_t j = 0; j < k; ++j) {
            ASSERT_GE(indices[j], reference_stratum_start(j, n, k));
            ASSERT_LT(indices[j], reference_stratum_start(j + 1, n, k));
            if (j > 0) {
              ASSERT_GT(indices[j], indices[j - 1]);
            }
          }
          if (k == n) {
            for (std::size_t j = 0; j < k; ++j) ASSERT_EQ(indices[j], j);
          }

          // Values on the wire: the input's bits (f16: rounded to nearest even).
          std::vector<std::uint32_t> expected_bits(k);
          for (std::size_t j = 0; j < k; ++j) {
            const float value = input.at(indices[j]);
            const std::size_t offset = kWireHeaderBytes + kKeyBytes + j * value_bytes;
            if (f16_values) {
              expected_bits[j] = kernels::float_bits(kernels::f16_bits_to_f32(kernels::f32_to_f16_bits(value)));
              ASSERT_EQ(read_at<std::uint16_t>(message, offset), kernels::f32_to_f16_bits(value))
                  << j;
            } else {
              expected_bits[j] = kernels::float_bits(value);
              ASSERT_EQ(read_at<std::uint32_t>(message, offset), kernels::float_bits(value)) << j;
            }
          }

          // Decode: kept values at their indices, +0.0 everywhere else.
          const auto decoded = testing::decode_to_f32(*codec, message, n);
          std::size_t next = 0;
          for (std::size_t i = 0; i < n; ++i) {
            if (next < k && indices[next] == i) {
              ASSERT_EQ(kernels::float_bits(decoded[i]), expected_bits[next]) << i;
              ++next;
            } else {
              ASSERT_EQ(kernels::float_bits(decoded[i]), 0u) << i;
            }
          }
        }
      }
    }
  }
}

TEST(RandkCodec, EqualKeysGiveEqualIndicesSoPayloadsAdd) {
  const std::size_t n = 100003;
  const EncodeContext ctx{42, 9, 2, 0};
  for (const char* text : {"randk:ratio=0.01", "randk:ratio=0.3"}) {
    SCOPED_TRACE(text);
    const auto codec = make_codec(text);
    const auto a = testing::gaussian(n, 1);
    const auto b = testing::gaussian(n, 2, 3.0f);
    const auto message_a = testing::encode_message(*codec, host_view(a.data(), n), ctx);
    const auto message_a_again = testing::encode_message(*codec, host_view(a.data(), n), ctx);
    const auto message_b = testing::encode_message(*codec, host_view(b.data(), n), ctx);
    EXPECT_EQ(message_a, message_a_again);
    // Header and key agree byte for byte; only the values differ.
    ASSERT_EQ(message_a.size(), message_b.size());
    EXPECT_EQ(std::memcmp(message_a.data(), message_b.data(), kWireHeaderBytes + kKeyBytes), 0);
    EXPECT_NE(message_a, message_b);

    // Summing the payload values (what a reduction of an additive codec does) decodes to the
    // sum of the decodes, exactly: the same f32 additions at the same positions.
    auto summed = message_a;
    const std::size_t k = codec->spec().k_for(n);
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t offset = kWireHeaderBytes + kKeyBytes + 4 * j;
      write_at<float>(summed, offset,
                      read_at<float>(message_a, offset) + read_at<float>(message_b, offset));
    }
    const auto decoded_a = testing::decode_to_f32(*codec, message_a, n);
    const auto decoded_b = testing::decode_to_f32(*codec, message_b, n);
    const auto decoded_sum = testing::decode_to_f32(*codec, summed, n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(kernels::float_bits(decoded_sum[i]), kernels::float_bits(decoded_a[i] + decoded_b[i])) << i;
    }
  }
}

TEST(RandkCodec, OtherStepSeedOrTensorDrawsOtherIndices) {
  // n = 1000, k = 10: strata of 100 elements. Two independent keys pick the same element of a
  // stratum with probability at most 1/100 + 2^-64 (mulhi64 hits each element with
  // floor or ceil of 2^64/100 of the 2^64 words), so all 10 agree with probability
  // <= (0.01 + 2^-64)^10 < 1.01e-20; over the 30 comparisons below, < 3.1e-19.
  const std::size_t n = 1000;
  const std::size_t k = 10;
  const EncodeContext base{5, 100, 7, 0};
  const auto base_indices = kernels::cpu::randk_indices(n, k, base);
  for (std::uint32_t delta = 1; delta <= 10; ++delta) {
    EncodeContext other_step = base, other_seed = base, other_tensor = base;
    other_step.step += delta;
    other_seed.seed += delta;
    other_tensor.tensor_id += delta;
    EXPECT_NE(kernels::cpu::randk_indices(n, k, other_step), base_indices) << "step +" << delta;
    EXPECT_NE(kernels::cpu::randk_indices(n, k, other_seed), base_indices) << "seed +" << delta;
    EXPECT_NE(kernels::cpu::randk_indices(n, k, other_tensor), base_indices) << "tensor +" << delta;
  }
}

TEST(RandkCodec, RatioOneKeepsEveryElement) {
  const auto codec = make_codec("randk:ratio=1.0");
  for (std::size_t n : testing::kTestCounts) {
    const auto data = testing::gaussian(n, 3);
    const auto message = testing::encode_message(*codec, host_view(data.data(), n), {8, 1, 1, 0});
    const auto decoded = testing::decode_to_f32(*codec, message, n);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(kernels::float_bits(decoded[i]), kernels::float_bits(data[i])) << n << " " << i;
    const auto indices = kernels::cpu::randk_indices(n, n, EncodeContext{8, 1, 1, 0});
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(indices[i], i);
  }
}

TEST(RandkCodec, EachElementIsKeptWithProbabilityKOverN) {
  // n = 100, k = 10 (evenly divisible): strata of 10, each element kept with probability
  // p = 1/10 per step (up to the 2^-64 bias of mulhi64). Over S = 20000 steps an element's
  // count X is Binomial(S, p): mean 2000, variance S p (1 - p) = 1800. Bernstein's inequality
  // P(|X - 2000| >= a) <= 2 exp(-a^2 / (2 (1800 + a / 3))) gives, for a = 300,
  // 2 exp(-23.68) < 1.1e-10 per element, < 1.1e-8 for any of the 100 (treating Philox words as
  // independent uniform draws).
  constexpr std::size_t n = 100, k = 10, steps = 20000;
  std::vector<std::uint64_t> counts(n, 0);
  std::uint64_t indices[k];
  for (std::uint32_t step = 0; step < steps; ++step) {
    kernels::cpu::randk_indices(n, k, RandkKey{77, step, 3, 0}, indices);
    for (std::uint64_t index : indices) ++counts[index];
  }
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_GE(counts[i], 2000u - 300u) << "element " << i;
    EXPECT_LE(counts[i], 2000u + 300u) << "element " << i;
    total += counts[i];
  }
  EXPECT_EQ(total, steps * k);
  // Stratification: each stratum of 10 is hit exactly once per step.
  for (std::size_t stratum = 0; stratum < k; ++stratum) {
    std::uint64_t hits = 0;
    for (std::size_t i = 0; i < 10; ++i) hits += counts[10 * stratum + i];
    EXPECT_EQ(hits, steps) << "stratum " << stratum;
  }
}

TEST(RandkCodec, ChunksDrawFromTheirOwnCounters) {
  // One tensor of 1777 elements sent as chunk A = [0, 1000) and chunk B = [1000, 1777).
  // Documented: each chunk keeps k_for(its length) of its own elements, and chunk B (offset
  // 1000) draws Philox blocks 1000 .. 1000+kB-1, disjoint from A's 0 .. kA-1.
  const auto codec = make_codec("randk:ratio=0.01");
  const auto tensor = testing::gaussian(1777, 11);
  const EncodeContext ctx_a{3, 4, 5, 0};
  const EncodeContext ctx_b{3, 4, 5, 1000};
  const std::size_t k_a = codec->spec().k_for(1000), k_b = codec->spec().k_for(777);
  ASSERT_EQ(k_a, 10u);
  ASSERT_EQ(k_b, 8u);
  EXPECT_LE(ctx_a.element_offset + k_a, ctx_b.element_offset);  // A's counters end before B's

  const auto message_b =
      testing::encode_message(*codec, host_view(tensor.data() + 1000, 777), ctx_b);
  EXPECT_EQ(read_at<std::uint64_t>(message_b, 48), 1000u);
  const auto indices_b = kernels::cpu::randk_indices(777, k_b, ctx_b);
  // Block numbers 1000 + j, indices local to the chunk.
  for (std::size_t j = 0; j < k_b; ++j) {
    const std::uint64_t start = reference_stratum_start(j, 777, k_b);
    const std::uint64_t length = reference_stratum_start(j + 1, 777, k_b) - start;
    const auto block = kernels::philox_block(3, 4, 5, 1000 + j);
    const std::uint64_t word = block.v[0] | (static_cast<std::uint64_t>(block.v[1]) << 32);
    ASSERT_EQ(indices_b[j],
              start + static_cast<std::uint64_t>((static_cast<U128>(word) * length) >> 64));
  }
  // The same chunk at offset 0 draws other blocks, so (almost surely) other indices: strata of
  // 97 or 98 elements, all 8 agree with probability <= (1/97 + 2^-64)^8 < 1.3e-16.
  EXPECT_NE(kernels::cpu::randk_indices(777, k_b, EncodeContext{3, 4, 5, 0}), indices_b);

  // Chunk B decodes on its own: its values land at its local indices.
  const auto decoded_b = testing::decode_to_f32(*codec, message_b, 777);
  std::size_t next = 0;
  for (std::size_t i = 0; i < 777; ++i) {
    if (next < k_b && indices_b[next] == i) {
      ASSERT_EQ(kernels::float_bits(decoded_b[i]), kernels::float_bits(tensor[1000 + i]));
      ++next;
    } else {
      ASSERT_EQ(kernels::float_bits(decoded_b[i]), 0u);
    }
  }
  ASSERT_EQ(next, k_b);
}

TEST(RandkCodec, DecodeAddTouchesOnlyTheKeptElements) {
  const std::size_t n = 5003;
  const auto data = testing::gaussian(n, 21);
  for (const char* text : {"randk:ratio=0.1", "randk:ratio=0.1,values=fp16"}) {
    SCOPED_TRACE(text);
    const auto codec = make_codec(text);
    const auto message = testing::encode_message(*codec, host_view(data.data(), n), {1, 2, 3, 0});
    const auto decoded = testing::decode_to_f32(*codec, message, n);
    const auto indices =
        kernels::cpu::randk_indices(n, codec->spec().k_for(n), EncodeContext{1, 2, 3, 0});
    auto acc = testing::gaussian(n, 22);
    for (std::size_t i = 0; i < n; i += 3) acc[i] = -0.0f;  // would turn +0.0 if zeros were added
    const auto before = acc;
    codec->decode_add(message, acc.data(), n);
    std::size_t next = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool kept = next < indices.size() && indices[next] == i;
      const float expected = kept ? before[i] + decoded[i] : before[i];
      ASSERT_EQ(kernels::float_bits(acc[i]), kernels::float_bits(expected)) << i << (kept ? " kept" : " not kept");
      if (kept) ++next;
    }
  }
}

TEST(RandkCodec, DecodesIntoHalfPrecisionOutputs) {
  const std::size_t n = 1000;
  const auto data = testing::gaussian(n, 5, 1000.0f);  // wide range: exercises the rounding
  const auto codec = make_codec("randk:ratio=0.05");
  const auto message = testing::encode_message(*codec, host_view(data.data(), n), {9, 9, 9, 0});
  const auto decoded = testing::decode_to_f32(*codec, message, n);
  for (DType dtype : {DType::f16, DType::bf16}) {
    HostTensor out(dtype, n);
    codec->decode(message, out.view());
    for (std::size_t i = 0; i < n; ++i) {
      // A decode writes a tensor: IEEE rounding (kernels/cast_math.h).
      const float expected = dtype == DType::f16
                                 ? kernels::f16_bits_to_f32(kernels::f32_to_f16_bits_ieee(decoded[i]))
                                 : kernels::bf16_bits_to_f32(kernels::f32_to_bf16_bits_ieee(decoded[i]));
      ASSERT_EQ(kernels::float_bits(out.at(i)), kernels::float_bits(expected)) << dtype_name(dtype) << " " << i;
    }
  }
}

TEST(RandkCodec, NanAndInfAreCarriedAsValues) {
  // Indices never depend on the values; values are copied (f32) or rounded by the
  // integer-only RNE cast (f16): NaN stays a quiet NaN, Inf stays Inf, finite |x| >= 65520
  // saturates to +-65504 (0x7BFF / 0xFBFF).
  const float nan = kernels::bits_float(0x7FC00001u);
  const std::vector<float> data = {nan,     INFINITY, -INFINITY, 1.0e6f,
                                   -1.0e6f, 65519.0f, 65520.0f,  -0.0f};
  const std::size_t n = data.size();
  const auto f32_codec = make_codec("randk:ratio=1.0");
  const auto f32_message = testing::encode_message(*f32_codec, host_view(data.data(), n), {});
  const auto f32_decoded = testing::decode_to_f32(*f32_codec, f32_message, n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(kernels::float_bits(f32_decoded[i]), kernels::float_bits(data[i])) << i;

  const auto f16_codec = make_codec("randk:ratio=1.0,values=fp16");
  const auto f16_message = testing::encode_message(*f16_codec, host_view(data.data(), n), {});
  const std::uint16_t expected_f16[] = {0x7E00, 0x7C00, 0xFC00, 0x7BFF,
                                        0xFBFF, 0x7BFF, 0x7BFF, 0x8000};
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(read_at<std::uint16_t>(f16_message, kWireHeaderBytes + kKeyBytes + 2 * i),
              expected_f16[i])
        << i;
  }
}

class RandkCodecOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(RandkCodecOnEachIsa);

TEST_P(RandkCodecOnEachIsa, EveryIsaGivesTheSameBytes) {
  struct Case {
    const char* spec;
    std::size_t n;
    EncodeContext ctx;
  };
  const Case cases[] = {
      {"randk:ratio=0.5", (std::size_t{1} << 20) + 3, {1, 2, 3, 0}},
      {"randk:ratio=0.01,values=fp16", 1000, {4, 5, 6, 0}},
      {"randk:k=13", 29, {7, 8, 9, 0xFFFFFFFFull - 5}},  // block numbers cross 2^32 in a vector
      {"randk:k=21", 21, {7, 8, 9, kMax64 - 10}},        // and wrap past 2^64
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + " n=" + std::to_string(c.n));
    const auto codec = make_codec(c.spec);
    const auto data = testing::gaussian(c.n, 31);
    // The message and its decode on `isa`.
    const auto run = [&](Isa isa) {
      testing::ScopedIsa forced(isa);
      std::vector<std::byte> message = testing::encode_message(*codec, host_view(data.data(), c.n), c.ctx);
      std::vector<float> decoded = testing::decode_to_f32(*codec, message, c.n);
      return std::pair(std::move(message), std::move(decoded));
    };
    if (GetParam() == Isa::scalar) {
      // The scalar path follows the reference rule; the other ISAs must match it.
      testing::ScopedIsa forced(Isa::scalar);
      const RandkKey key = kernels::cpu::randk_key(c.ctx);
      const std::size_t k = codec->spec().k_for(c.n);
      EXPECT_EQ(kernels::cpu::randk_indices(c.n, k, c.ctx), reference_indices(c.n, k, key));
      continue;
    }
    const auto [first_message, first_decoded] = run(Isa::scalar);
    const auto [message, decoded] = run(GetParam());
    EXPECT_EQ(message, first_message) << kernels::cpu::isa_name(GetParam());
    EXPECT_EQ(decoded, first_decoded) << kernels::cpu::isa_name(GetParam());
  }
}

TEST(RandkCodec, DecodesMessagesAtAnyAlignment) {
  const std::size_t n = 777;
  const auto data = testing::gaussian(n, 8);
  for (const char* text : {"randk:ratio=0.2", "randk:ratio=0.2,values=fp16"}) {
    const auto codec = make_codec(text);
    const auto message = testing::encode_message(*codec, host_view(data.data(), n), {3, 3, 3, 3});
    const auto reference = testing::decode_to_f32(*codec, message, n);
    std::vector<float> acc_reference(n, 1.0f);
    codec->decode_add(message, acc_reference.data(), n);
    for (std::size_t shift = 1; shift < 8; ++shift) {
      std::vector<std::byte> buffer(message.size() + shift);
      std::memcpy(buffer.data() + shift, message.data(), message.size());
      const std::span<const std::byte> shifted(buffer.data() + shift, message.size());
      EXPECT_EQ(testing::decode_to_f32(*codec, shifted, n), reference)
          << text << " shift " << shift;
      std::vector<float> acc(n, 1.0f);
      codec->decode_add(shifted, acc.data(), n);
      EXPECT_EQ(acc, acc_reference) << text << " shift " << shift;
    }
  }
}

TEST(RandkCodec, EmptyChunkIsAHeaderAndAKey) {
  const auto codec = make_codec("randk:ratio=0.01");
  const EncodeContext ctx{1, 2, 3, 4};
  const auto message =
      testing::encode_message(*codec, ConstTensorView{nullptr, 0, DType::f32}, ctx);
  ASSERT_EQ(message.size(), kWireHeaderBytes + kKeyBytes);
  EXPECT_EQ(compressors::read_header(message, "test").large_param, 0u);
  EXPECT_EQ(read_at<std::uint64_t>(message, 48), 4u);
  codec->decode(message, TensorView{nullptr, 0, DType::f32});
  codec->decode_add(message, nullptr, 0);
}

TEST(RandkCodec, DecoderRejectsMalformedMessages) {
  const std::size_t n = 1000;
  const auto data = testing::gaussian(n, 4);
  const auto codec = make_codec("randk:ratio=0.01");
  const auto good = testing::encode_message(*codec, host_view(data.data(), n), {6, 6, 6, 0});
  const std::size_t k = 10;
  ASSERT_EQ(good.size(), kWireHeaderBytes + kKeyBytes + 4 * k);

  // `with(edit)`: a copy of the good message, edited. resize_payload keeps the header's
  // payload_bytes equal to the bytes after the header, so only the field under test is wrong.
  auto with = [&](const std::function<void(std::vector<std::byte>&)>& edit) {
    auto message = good;
    edit(message);
    return message;
  };
  auto resize_payload = [](std::vector<std::byte>& message, std::size_t payload) {
    message.resize(kWireHeaderBytes + payload);
    write_at<std::uint64_t>(message, 16, payload);
  };
  struct BadCase {
    std::string what;
    std::vector<std::byte> message;
    std::size_t count;
  };
  std::vector<BadCase> cases = {
      {"k > count", with([&](auto& m) {
         write_at<std::uint64_t>(m, 24, n + 1);
         resize_payload(m, kKeyBytes + 4 * (n + 1));
       }),
       n},
      {"k == 0 for count > 0", with([&](auto& m) {
         write_at<std::uint64_t>(m, 24, 0);
         resize_payload(m, kKeyBytes);
       }),
       n},
      {"flags bit 0", with([](auto& m) { m[6] = std::byte{0x01}; }), n},
      {"flags bit 2", with([](auto& m) { m[6] = std::byte{0x04}; }), n},
      {"flags bit 7 with f16", with([](auto& m) { m[6] = std::byte{0x82}; }), n},
      {"small_param", with([](auto& m) { m[7] = std::byte{1}; }), n},
      {"f16 flag on f32 values", with([](auto& m) { m[6] = std::byte{kFlagF16Values}; }), n},
      {"payload longer than k values",
       with([&](auto& m) { resize_payload(m, kKeyBytes + 4 * k + 4); }), n},
      {"payload without the key", with([&](auto& m) { resize_payload(m, 4 * k); }), n},
      {"k disagrees with payload", with([](auto& m) { write_at<std::uint64_t>(m, 24, 11); }), n},
      {"wrong codec (topk)",
       with([](auto& m) { m[5] = std::byte{static_cast<std::uint8_t>(WireCodec::topk)}; }), n},
      {"wrong codec (none)",
       with([](auto& m) { m[5] = std::byte{static_cast<std::uint8_t>(WireCodec::none)}; }), n},
      {"count mismatch (smaller output)", good, n - 1},
      {"count mismatch (larger output)", good, n + 1},
      {"truncated by one byte", std::vector<std::byte>(good.begin(), good.end() - 1), n},
      {"truncated inside the header", std::vector<std::byte>(good.begin(), good.begin() + 20), n},
      {"bad magic", with([](auto& m) { m[0] = std::byte{'X'}; }), n},
  };
  // count == 0 must carry k == 0.
  {
    const auto empty = testing::encode_message(*codec, ConstTensorView{nullptr, 0, DType::f32}, {});
    auto bad = empty;
    write_at<std::uint64_t>(bad, 24, 1);
    resize_payload(bad, kKeyBytes + 4);
    cases.push_back({"k == 1 for count 0", bad, 0});
  }
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.what);
    testing::expect_malformed(*codec, bad.message, bad.count, /*field=*/"");
  }
}

TEST(RandkCodec, EncodeAndDecodeCheckTheirArguments) {
  const auto codec = make_codec("randk:ratio=0.5");
  const auto data = testing::gaussian(100, 1);
  std::vector<std::byte> small(codec->max_encoded_bytes(100) - 1);
  EXPECT_EQ(testing::error_code_of([&] { codec->encode(host_view(data.data(), 100), small, {}); }),
            ErrorCode::invalid_argument);
  const ConstTensorView on_gpu{data.data(), 100, DType::f32, Device{DeviceKind::cuda, 0}};
  std::vector<std::byte> out(codec->max_encoded_bytes(100));
  EXPECT_EQ(testing::error_code_of([&] { codec->encode(on_gpu, out, {}); }), testing::fake_cuda_view_error());
  const auto message = testing::encode_message(*codec, host_view(data.data(), 100), {});
  EXPECT_EQ(testing::error_code_of([&] { codec->decode_add(message, nullptr, 100); }),
            ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace gradzip
