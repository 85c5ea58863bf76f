// The small kernels of a stream-ordered call's completion (kernels/cuda/small_bytes_cuda.h):
// write_rank_flags writes one rank's flags and zeroes every other slot in one launch, and
// words_from_flags turns the all-reduced flags back into status words. Skips without a CUDA
// device (or the emulated one).
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "gpu_test_support.h"
#include "gradzip/error.h"
#include "kernels/cuda/small_bytes_cuda.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;
using gpu_test::StreamTest;
using kernels::cuda::FlagWords;

class CudaRankFlags : public StreamTest {};

// Rank 2 of 4 with three flags each: slots 6, 7, 8 are this rank's; every other slot, whatever
// it held, becomes 0.0f. A group is flagged when any of its words is non-zero, wherever that
// word sits (the last of many: the block's threads must all be heard).
TEST_F(CudaRankFlags, OneLaunchWritesThisRanksFlagsAndZeroesTheRest) {
  std::vector<int> checks(1000, 0);
  checks.back() = 4;
  DeviceArray<int> d_checks(checks);
  DeviceArray<int> d_clear(std::vector<int>{0, 0});
  DeviceArray<int> d_counted(std::vector<int>{0, 3});
  DeviceArray<float> d_flags(std::vector<float>(12, 7.0f));
  const FlagWords groups[3] = {{d_checks.get(), checks.size()}, {d_clear.get(), 2}, {d_counted.get(), 2}};
  kernels::cuda::write_rank_flags(groups, 3, d_flags.get(), 12, 6, stream());
  const std::vector<float> want = {0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0};
  EXPECT_EQ(d_flags.download(), want);

  // One flag of one rank (a call without a deferred input check at one rank): no checks failed.
  DeviceArray<float> d_one(std::vector<float>{7.0f});
  const FlagWords none[1] = {{d_clear.get(), 2}};
  kernels::cuda::write_rank_flags(none, 1, d_one.get(), 1, 0, stream());
  EXPECT_EQ(d_one.download(), std::vector<float>{0.0f});

  // Back into words: 1 where any rank's sum is non-zero.
  DeviceArray<int> d_words(std::vector<int>(12, -1));
  kernels::cuda::words_from_flags(d_flags.get(), 12, d_words.get(), stream());
  EXPECT_EQ(d_words.download(), (std::vector<int>{0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0}));
}

TEST_F(CudaRankFlags, FlagsOutsideTheArrayOrNullWordsAreRefused) {
  DeviceArray<float> d_flags(4);
  DeviceArray<int> d_words(std::vector<int>{1});
  const FlagWords groups[4] = {{d_words.get(), 1}, {d_words.get(), 1}, {d_words.get(), 1}, {d_words.get(), 1}};
  EXPECT_THROW(kernels::cuda::write_rank_flags(groups, 2, d_flags.get(), 4, 3, stream()), Error);
  EXPECT_THROW(kernels::cuda::write_rank_flags(groups, 4, d_flags.get(), 8, 0, stream()), Error);
  const FlagWords null_words[1] = {{nullptr, 2}};
  EXPECT_THROW(kernels::cuda::write_rank_flags(null_words, 1, d_flags.get(), 4, 0, stream()), Error);
  EXPECT_THROW(kernels::cuda::write_rank_flags(groups, 1, nullptr, 4, 0, stream()), Error);
}

}  // namespace
}  // namespace gradzip
