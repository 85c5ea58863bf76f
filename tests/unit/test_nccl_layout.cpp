// The NCCL transport's allgatherv layout (collectives/transport/nccl/nccl_layout.h): blocks
// padded to the largest, and the copies that strip the padding, checked on the host by
// running them over a simulated padded buffer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/transport/nccl/nccl_layout.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

using Copy = NcclAllgatherLayout::Copy;

NcclAllgatherLayout layout_of(const std::vector<std::size_t>& counts) {
  return nccl_allgather_layout(counts);
}

TEST(NcclLayout, NoRanks) {
  const NcclAllgatherLayout layout = layout_of({});
  EXPECT_EQ(layout.padded_block, 0u);
  EXPECT_EQ(layout.padded_total, 0u);
  EXPECT_EQ(layout.total, 0u);
  EXPECT_TRUE(layout.offsets.empty());
  EXPECT_TRUE(layout.copies.empty());
}

TEST(NcclLayout, OneRankIsOneCopy) {
  const NcclAllgatherLayout layout = layout_of({13});
  EXPECT_EQ(layout.padded_block, 13u);
  EXPECT_EQ(layout.padded_total, 13u);
  EXPECT_EQ(layout.total, 13u);
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0}));
  EXPECT_EQ(layout.copies, (std::vector<Copy>{{0, 0, 13}}));
}

TEST(NcclLayout, EmptyBlocksOnly) {
  const NcclAllgatherLayout layout = layout_of({0, 0, 0});
  EXPECT_EQ(layout.padded_block, 0u);
  EXPECT_EQ(layout.padded_total, 0u);
  EXPECT_EQ(layout.total, 0u);
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0, 0, 0}));
  EXPECT_TRUE(layout.copies.empty());
}

TEST(NcclLayout, UnequalCountsSkipEmptyBlocks) {
  const NcclAllgatherLayout layout = layout_of({3, 0, 7, 2});
  EXPECT_EQ(layout.padded_block, 7u);
  EXPECT_EQ(layout.padded_total, 28u);
  EXPECT_EQ(layout.total, 12u);
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0, 3, 3, 10}));
  // Rank 2's block is full (no padding), so rank 3's follows it on both sides: one copy.
  EXPECT_EQ(layout.copies, (std::vector<Copy>{{0, 0, 3}, {14, 3, 9}}));

  const NcclAllgatherLayout swapped = layout_of({3, 0, 2, 7});
  EXPECT_EQ(swapped.offsets, (std::vector<std::size_t>{0, 3, 3, 5}));
  EXPECT_EQ(swapped.copies, (std::vector<Copy>{{0, 0, 3}, {14, 3, 2}, {21, 5, 7}}));
}

TEST(NcclLayout, EqualCountsMergeIntoOneCopy) {
  const NcclAllgatherLayout layout = layout_of({4, 4, 4});
  EXPECT_EQ(layout.padded_block, 4u);
  EXPECT_EQ(layout.padded_total, 12u);
  EXPECT_EQ(layout.total, 12u);
  EXPECT_EQ(layout.offsets, (std::vector<std::size_t>{0, 4, 8}));
  EXPECT_EQ(layout.copies, (std::vector<Copy>{{0, 0, 12}}));
}

TEST(NcclLayout, OnlyAShortLastBlockStillMerges) {
  // The last block's padding lies after it: everything is contiguous on both sides.
  EXPECT_EQ(layout_of({5, 5, 2}).copies, (std::vector<Copy>{{0, 0, 12}}));
  // A short first block breaks the run; the full blocks after it merge.
  EXPECT_EQ(layout_of({2, 5, 5}).copies, (std::vector<Copy>{{0, 0, 2}, {5, 2, 10}}));
  // Leading empty blocks: the first copy starts at its rank's padded slot.
  EXPECT_EQ(layout_of({0, 0, 6, 6}).copies, (std::vector<Copy>{{12, 0, 12}}));
}

TEST(NcclLayout, OverflowThrows) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  try {
    layout_of({kMax / 2 + 1, 1});  // the padded total overflows, the compact total does not
    FAIL() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("padded blocks"), std::string::npos) << error.what();
  }
  try {
    layout_of({kMax, 1});  // the compact total overflows
    FAIL() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("add up"), std::string::npos) << error.what();
  }
}

// What the transport does, on the host: each rank's block at its padded slot (padding filled
// with a byte no block uses), then the copies; the output must be the blocks concatenated,
// and bytes past the total untouched.
TEST(NcclLayout, StrippingReproducesTheConcatenation) {
  std::mt19937_64 rng(20261129);
  std::uniform_int_distribution<int> ranks_of(1, 9);
  std::uniform_int_distribution<int> zero(0, 3);
  std::uniform_int_distribution<std::size_t> count_of(1, 40);
  for (int trial = 0; trial < 500; ++trial) {
    const std::size_t ranks = static_cast<std::size_t>(ranks_of(rng));
    std::vector<std::size_t> counts(ranks);
    for (std::size_t& count : counts) count = zero(rng) == 0 ? 0 : count_of(rng);
    if (trial % 5 == 0) counts.assign(ranks, counts[0]);  // equal counts too
    const NcclAllgatherLayout layout = nccl_allgather_layout(counts);

    std::vector<std::uint8_t> expected;
    std::vector<std::uint8_t> padded(layout.padded_total, 0xEE);
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t i = 0; i < counts[r]; ++i) {
        const auto value = static_cast<std::uint8_t>((r * 37 + i) % 200);
        expected.push_back(value);
        padded[r * layout.padded_block + i] = value;
      }
    }
    ASSERT_EQ(layout.total, expected.size());
    std::vector<std::uint8_t> output(layout.total + 3, 0xDD);
    std::size_t copied = 0;
    for (const Copy& copy : layout.copies) {
      ASSERT_GT(copy.bytes, 0u);
      ASSERT_LE(copy.source + copy.bytes, padded.size());
      ASSERT_LE(copy.destination + copy.bytes, layout.total);
      std::copy_n(padded.begin() + static_cast<std::ptrdiff_t>(copy.source), copy.bytes,
                  output.begin() + static_cast<std::ptrdiff_t>(copy.destination));
      copied += copy.bytes;
    }
    EXPECT_EQ(copied, layout.total) << "trial " << trial;
    const auto end = output.begin() + static_cast<std::ptrdiff_t>(layout.total);
    EXPECT_EQ(std::vector<std::uint8_t>(output.begin(), end), expected) << "trial " << trial;
    EXPECT_EQ(output[layout.total], 0xDD);
    EXPECT_EQ(output[layout.total + 2], 0xDD);
  }
}

}  // namespace
}  // namespace gradzip::collectives
