// Philox 4x32-10 (kernels/philox_math.h): the known-answer vectors of the Random123
// distribution, gradzip's keying, the vectorised generators (kernels/cpu/philox_avx*.h behind
// kernels::cpu::philox_words) against the scalar one, and uniform_unit's range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "compressors/qsgd/qsgd_cpu.h"
#include "kernels/philox_math.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using kernels::Philox4x32;
using kernels::cpu::Isa;

void expect_words(const Philox4x32& got, std::uint32_t w0, std::uint32_t w1, std::uint32_t w2,
                  std::uint32_t w3) {
  EXPECT_EQ(got.v[0], w0);
  EXPECT_EQ(got.v[1], w1);
  EXPECT_EQ(got.v[2], w2);
  EXPECT_EQ(got.v[3], w3);
}

// Random123 1.14, examples/kat_vectors, the three philox4x32 10-round lines.
TEST(Philox, MatchesRandom123KnownAnswers) {
  expect_words(kernels::philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du,
               0xbc57ac4cu, 0x9b00dbd8u);
  expect_words(kernels::philox4x32_10(
                   Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu,
                   0xffffffffu),
               0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  expect_words(kernels::philox4x32_10(
                   Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u,
                   0x299f31d0u),
               0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

// gradzip's keying: key = seed halves, counter = (block halves, step, tensor id).
TEST(Philox, BlockKeyingIsTheDocumentedOne) {
  const std::uint64_t seed = 0x299f31d0a4093822ull;
  const std::uint64_t block = 0x85a308d3243f6a88ull;
  expect_words(kernels::philox_block(seed, 0x13198a2eu, 0x03707344u, block), 0xd16cfe09u,
               0x94fdccebu, 0x5001e420u, 0x24126ea1u);
  // Element e takes word e % 4 of block e / 4 (block high word included).
  const std::uint64_t other_block = 0x0000001234567890ull;
  const Philox4x32 words = kernels::philox_block(seed, 5, 6, other_block);
  for (std::uint64_t w = 0; w < 4; ++w) {
    EXPECT_EQ(kernels::philox_element(seed, 5, 6, other_block * 4 + w), words.v[w]);
  }
}

class PhiloxOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(PhiloxOnEachIsa);

// Every ISA's philox_words equals philox_block word for word: block ranges of every length
// 0..70 (all vector tails) at starts that make the low counter word wrap into the high one.
TEST_P(PhiloxOnEachIsa, VectorisedWordsEqualScalarWords) {
  const std::uint64_t starts[] = {0, 1, 13, 0xFFFFFFF0ull, 0xFFFFFFFFull - 3, 0x1234567890ull,
                                  ~std::uint64_t{0} - 20};
  const std::uint64_t seed = 0x0123456789ABCDEFull;
  const std::uint32_t step = 77, tensor_id = 0xDEADBEEFu;
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    for (std::uint64_t first_block : starts) {
      for (std::size_t num_blocks = 0; num_blocks <= 70; ++num_blocks) {
        // One sentinel word past the end must stay untouched.
        std::vector<std::uint32_t> words(4 * num_blocks + 1, 0xA5A5A5A5u);
        kernels::cpu::philox_words(seed, step, tensor_id, first_block, num_blocks, words.data());
        for (std::size_t b = 0; b < num_blocks; ++b) {
          const Philox4x32 expected = kernels::philox_block(seed, step, tensor_id, first_block + b);
          for (int w = 0; w < 4; ++w) {
            ASSERT_EQ(words[4 * b + static_cast<std::size_t>(w)], expected.v[w])
                << "block " << first_block + b << " word " << w << " of " << num_blocks;
          }
        }
        ASSERT_EQ(words.back(), 0xA5A5A5A5u) << "wrote past " << num_blocks << " blocks";
      }
    }
  }
}

TEST_P(PhiloxOnEachIsa, VectorisedWordsEqualScalarWordsOverManyCounters) {
  constexpr std::size_t kBlocks = 1 << 16;
  std::vector<std::uint32_t> reference(4 * kBlocks), words(4 * kBlocks);
  kernels::cpu::qsgd_kernels(Isa::scalar)
      .philox_words(42, 3, 9, 1000, kBlocks, reference.data());
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    SCOPED_TRACE(kernels::cpu::isa_name(isa));
    kernels::cpu::philox_words(42, 3, 9, 1000, kBlocks, words.data());
    EXPECT_EQ(words, reference);
  }
}

TEST(Philox, UniformUnitCoversZeroToJustBelowOne) {
  EXPECT_EQ(kernels::uniform_unit(0u), 0.0f);
  EXPECT_EQ(kernels::uniform_unit(0xFFu), 0.0f);  // the low 8 bits are dropped
  EXPECT_EQ(kernels::uniform_unit(0x100u), 1.0f / 16777216.0f);
  EXPECT_EQ(kernels::uniform_unit(0xFFFFFFFFu), 1.0f - 1.0f / 16777216.0f);  // largest, < 1
  EXPECT_EQ(kernels::uniform_unit(0x80000000u), 0.5f);
  // Over many generator outputs: always in [0, 1), mean 1/2 within 5 standard deviations
  // (the variance of a uniform on [0, 1) is 1/12).
  constexpr int kSamples = 1 << 18;
  double sum = 0;
  for (int i = 0; i < kSamples; ++i) {
    const float u = kernels::uniform_unit(kernels::philox_element(5, 6, 7, static_cast<std::uint64_t>(i)));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / kSamples, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / kSamples));
}

}  // namespace
}  // namespace gradzip
