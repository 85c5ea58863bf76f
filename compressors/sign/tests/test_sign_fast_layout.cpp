// The fast sign CUDA kernels' per-thread work (compressors/sign/sign_fast_layout.h), run on the CPU for
// every simulated thread of a launch, in the kernels' order of phases, against the CPU codec:
//   encode: the payload equals the CPU codec's byte for byte (so every scale has the canonical
//           order's bits), and every payload byte is written exactly once;
//   decode: decode / decode-accumulate equal the CPU codec's, every element written once.
// What the kernels do with a warp ballot (the 32 sign bits of a group) is an OR of the lanes'
// bits here; the staging copies, the lane folds, the scales, the byte masks and the runs go
// through the functions the kernels call. The staged buffer is followed by junk, so that a
// function reading past the staged elements fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "kernels/host_device.h"
#include "kernels/run_fast_layout.h"
#include "compressors/sign/sign_fast_layout.h"
#include "compressors/sign/sign_math.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::bits_float;
using kernels::FastPass;
using kernels::FastRunSpan;
using kernels::FastSegment;
using kernels::float_bits;
using kernels::kFastRun;
using kernels::kFastThreads;
using kernels::kSignLanes;
using kernels::SignFastPlan;

constexpr std::uint64_t kBuckets[] = {1, 2, 3, 7, 15, 16, 17, 100, 128, 255, 256, 512, 1000, 4095, 4096, 4097, 10000};

std::unique_ptr<Codec> sign_codec(std::uint64_t bucket) {
  return make_codec("sign:bucket=" + std::to_string(bucket));
}

using testing::ceil_div;

enum class Data { gaussian, wide_range, overflowing, nonfinite };

// N(0,1); times 2^k for k in [-24, 24] (wide_range: another summation order gives other
// bits); with runs of values near FLT_MAX whose sums overflow (the rescue); with +-0, Inf and
// NaNs of several payloads.
std::vector<float> make_values(std::size_t count, std::uint64_t seed, Data data) {
  std::vector<float> x = testing::gaussian(count, seed);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = (i * 0x9E3779B97F4A7C15ull + seed) >> 40;
    if (h % 23 == 0) x[i] = (h % 2 == 0) ? 0.0f : -0.0f;
    if (data == Data::wide_range) x[i] = std::ldexp(x[i], static_cast<int>(h % 49) - 24);
    if (data == Data::overflowing && (i / 300) % 3 == 1) x[i] = (h % 2 == 0 ? 1.0f : -1.0f) * (FLT_MAX / 1.5f);
    if (data == Data::nonfinite && h % 1999 == 3) x[i] = std::numeric_limits<float>::infinity() * (h % 2 ? 1.0f : -1.0f);
    if (data == Data::nonfinite && h % 2503 == 4) x[i] = bits_float((h % 2 ? 0xFFC00000u : 0x7FC00000u) | static_cast<std::uint32_t>(h & 0xFFu));
  }
  if (data == Data::nonfinite && count > 2 && count < 1000) {  // short tensors: one of each
    x[count / 2] = -std::numeric_limits<float>::infinity();
    x[count - 2] = bits_float(0xFFC00001u);
  }
  return x;
}

using Payload = testing::EmulatedPayload;

// x[first, end) as the kernel stages it, followed by junk that no function may read (negative,
// so that a stray sign bit or |x| shows).
std::vector<float> staged_copy(const std::vector<float>& x, std::uint64_t first, std::uint64_t end) {
  std::vector<float> staged(x.begin() + static_cast<std::ptrdiff_t>(first), x.begin() + static_cast<std::ptrdiff_t>(end));
  staged.resize(staged.size() + 64, -1.5f);
  return staged;
}

// The sign bytes of a segment: each owned group's ballot (an OR of the lanes' bits here).
template <class Load>
void write_sign_bytes(Payload& payload, std::uint64_t scale_bytes, const FastSegment& segment,
                      std::uint64_t lo, std::uint64_t hi, Load&& load) {
  const kernels::SignFastBytes bytes = kernels::sign_fast_owned_bytes(segment);
  for (std::uint64_t group = kernels::sign_fast_first_group(bytes); group < kernels::sign_fast_end_group(bytes); ++group) {
    std::uint32_t word = 0;
    for (unsigned lane = 0; lane < 32; ++lane) word |= kernels::sign_fast_lane_bit(group, lane, lo, hi, load) << lane;
    const std::uint32_t mask = kernels::sign_fast_group_mask(group, bytes);
    for (unsigned m = 0; m < 4; ++m) {
      if ((mask >> m & 1u) != 0u) payload.write(scale_bytes + 4 * group + m, word >> (8 * m));
    }
  }
}

// The fast encode launch, thread by thread.
Payload emulate_encode(const std::vector<float>& x, std::uint64_t bucket) {
  const std::uint64_t count = x.size();
  const std::uint64_t scale_bytes = 4 * ceil_div(count, bucket);
  Payload payload(scale_bytes + ceil_div(count, 8));
  const SignFastPlan plan = kernels::sign_fast_plan(count, bucket);
  for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
    const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
    const std::uint64_t staged_end = kernels::sign_fast_staged_end(segment, count);
    const std::uint64_t first_bucket = s * plan.segment_buckets;
    if (plan.resident) {
      EXPECT_LE(staged_end - segment.begin, kernels::kSignFastStaged);
      const std::vector<float> staged = staged_copy(x, segment.begin, staged_end);
      const std::uint64_t buckets = kernels::sign_fast_segment_buckets(plan, segment, bucket);
      const bool lane_sums = bucket >= kSignLanes;
      std::vector<float> lanes(buckets * kSignLanes, bits_float(0x7FC0BAD0u));
      if (lane_sums) {
        EXPECT_LE(buckets, kernels::kSignFastMaxLaneBuckets);
        for (std::uint64_t p = 0; p < buckets * kSignLanes; ++p) {
          const std::uint64_t b = p / kSignLanes;
          lanes[p] = kernels::sign_fast_lane_fold(0.0f, staged.data() + b * bucket,
                                                  kernels::sign_fast_bucket_length(segment, bucket, b),
                                                  static_cast<unsigned>(p % kSignLanes));
        }
      }
      for (std::uint64_t b = 0; b < buckets; ++b) {
        const float* xb = staged.data() + b * bucket;
        const std::uint64_t len = kernels::sign_fast_bucket_length(segment, bucket, b);
        const float scale = lane_sums ? kernels::sign_fast_scale_from_lanes(lanes.data() + b * kSignLanes, xb, len)
                                      : kernels::sign_bucket_scale(xb, len);
        payload.write_scale(first_bucket + b, scale);
      }
      write_sign_bytes(payload, scale_bytes, segment, segment.begin, staged_end,
                       [&](std::uint64_t i) { return staged.at(i - segment.begin); });
    } else {
      float sums[kSignLanes] = {};
      for (std::uint64_t first = segment.begin; first < segment.end; first += kernels::kFastResidentAligned) {
        const std::uint64_t end = std::min(segment.end, first + kernels::kFastResidentAligned);
        const std::vector<float> chunk = staged_copy(x, first, end);
        for (unsigned l = 0; l < kSignLanes; ++l) sums[l] = kernels::sign_fast_lane_fold(sums[l], chunk.data(), end - first, l);
      }
      payload.write_scale(first_bucket, kernels::sign_fast_scale_from_lanes(sums, x.data() + segment.begin,
                                                                            segment.end - segment.begin));
      write_sign_bytes(payload, scale_bytes, segment, segment.begin, staged_end,
                       [&](std::uint64_t i) { return x.at(i); });
    }
  }
  return payload;
}

void check_encode(const std::vector<float>& x, std::uint64_t bucket) {
  SCOPED_TRACE("count=" + std::to_string(x.size()) + " bucket=" + std::to_string(bucket));
  const std::vector<std::byte> message = testing::encode_message(*sign_codec(bucket), host_view(x.data(), x.size()));
  const Payload payload = emulate_encode(x, bucket);
  if (::testing::Test::HasFatalFailure()) return;
  const std::size_t scale_bytes = 4 * ceil_div(x.size(), bucket);
  ASSERT_TRUE(testing::matches_message_payload(payload, message, scale_bytes, "sign"));
}

// ---- decode ------------------------------------------------------------------------------------

void emulate_decode(const std::byte* payload, std::uint64_t count, std::uint64_t bucket, bool accumulate,
                    std::vector<float>& out) {
  const std::uint64_t bit_bytes = ceil_div(count, 8);
  const std::byte* bits = payload + 4 * ceil_div(count, bucket);
  const SignFastPlan plan = kernels::sign_fast_plan(count, bucket);
  std::vector<int> writes(count, 0);
  for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
    const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
    const std::uint64_t buckets = kernels::sign_fast_segment_buckets(plan, segment, bucket);
    ASSERT_LE(buckets, kernels::kFastResidentAligned);
    std::vector<float> scales(buckets);
    std::memcpy(scales.data(), payload + 4 * s * plan.segment_buckets, 4 * buckets);
    for (std::uint64_t p = 0; p < kernels::fast_pass_count(segment); ++p) {
      const FastPass pass = kernels::fast_pass(segment, p);
      for (unsigned t = 0; t < pass.runs; ++t) {
        const std::uint64_t k = pass.first + t;
        std::uint32_t run_bits = std::to_integer<std::uint32_t>(bits[2 * k]);
        if (bit_bytes - 2 * k >= 2) run_bits |= std::to_integer<std::uint32_t>(bits[2 * k + 1]) << 8;
        const FastRunSpan span = kernels::fast_run_span(k, segment, bucket, plan.segment_buckets == 1);
        float values[kFastRun];
        kernels::sign_fast_decode_run(run_bits, span, scales.data(), values);
        for (unsigned r = span.first; r < span.end; ++r) {
          const std::uint64_t i = k * kFastRun + r;
          ASSERT_LT(i, count);
          out[i] = accumulate ? out[i] + values[r] : values[r];
          ++writes[i];
        }
      }
    }
  }
  for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(writes[i], 1) << "element " << i;
}

void check_decode(const std::vector<std::byte>& message, std::uint64_t count, std::uint64_t bucket) {
  SCOPED_TRACE("decode count=" + std::to_string(count) + " bucket=" + std::to_string(bucket));
  const auto codec = sign_codec(bucket);
  const std::byte* payload = message.data() + kWireHeaderBytes;
  std::vector<float> want(count), got(count, bits_float(0xEEEEEEEEu));
  codec->decode(message, host_view(want.data(), count));
  emulate_decode(payload, count, bucket, false, got);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(testing::same_bits(got, want));
  std::vector<float> want_acc = testing::gaussian(count, 99), got_acc = want_acc;
  codec->decode_add(message, want_acc.data(), count);
  emulate_decode(payload, count, bucket, true, got_acc);
  if (::testing::Test::HasFatalFailure()) return;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (std::isnan(want_acc[i]) && std::isnan(got_acc[i])) continue;  // NaN payloads may differ
    ASSERT_EQ(float_bits(got_acc[i]), float_bits(want_acc[i])) << "accumulated element " << i;
  }
}

void check_both(const std::vector<float>& x, std::uint64_t bucket) {
  check_encode(x, bucket);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<std::byte> message = testing::encode_message(*sign_codec(bucket), host_view(x.data(), x.size()));
  check_decode(message, x.size(), bucket);
}

// ---- tests -------------------------------------------------------------------------------------

TEST(SignFastLayout, PlanCutsWholeBucketsIntoResidentSegments) {
  for (std::uint64_t bucket : kBuckets) {
    const SignFastPlan plan = kernels::sign_fast_plan(100000, bucket);
    SCOPED_TRACE("bucket=" + std::to_string(bucket));
    EXPECT_EQ(plan.segment_elements, plan.segment_buckets * bucket);
    EXPECT_EQ(plan.num_segments, ceil_div(100000, plan.segment_elements));
    EXPECT_EQ(plan.resident, bucket <= 4096);
    if (plan.resident) {
      EXPECT_LE(plan.segment_elements, kernels::kFastResidentAligned);
      EXPECT_GT(plan.segment_elements + bucket, kernels::kFastResidentAligned) << "as many buckets as fit";
      if (bucket >= kSignLanes) {
        EXPECT_LE(plan.segment_buckets, kernels::kSignFastMaxLaneBuckets);
      }
    } else {
      EXPECT_EQ(plan.segment_buckets, 1u);
    }
  }
  EXPECT_EQ(kernels::sign_fast_plan(0, 512).num_segments, 0u);
}

TEST(SignFastLayout, OwnedSignBytesCoverTheStreamOnce) {
  for (std::uint64_t bucket : kBuckets) {
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{9}, std::uint64_t{12289}, std::uint64_t{40007}}) {
      const SignFastPlan plan = kernels::sign_fast_plan(count, bucket);
      std::vector<int> owner(ceil_div(count, 8), 0);
      for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
        const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
        const kernels::SignFastBytes bytes = kernels::sign_fast_owned_bytes(segment);
        const std::uint64_t staged_end = kernels::sign_fast_staged_end(segment, count);
        for (std::uint64_t byte = bytes.begin; byte < bytes.end; ++byte) {
          ASSERT_LT(byte, owner.size());
          ++owner[byte];
          // All of the byte's elements are at hand.
          ASSERT_GE(8 * byte, segment.begin);
          ASSERT_LE(std::min(8 * byte + 8, count), staged_end);
        }
      }
      for (std::size_t byte = 0; byte < owner.size(); ++byte) ASSERT_EQ(owner[byte], 1) << "byte " << byte;
    }
  }
}

// Sizes 0, 1, 7, 8, 9 and a few around a run and a lane group, every bucket, all kinds of data.
TEST(SignFastLayout, SmallCountsEncodeAndDecodeLikeTheCpuCodec) {
  for (std::size_t count : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100}) {
    for (Data data : {Data::gaussian, Data::wide_range, Data::overflowing, Data::nonfinite}) {
      const std::vector<float> x = make_values(count, count + 1, data);
      for (std::uint64_t bucket : kBuckets) {
        check_both(x, bucket);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Counts that span several segments (launch blocks) and leave partial buckets, runs and bytes;
// data whose scales depend on the summation order, overflow, or hold Inf / NaN.
TEST(SignFastLayout, CountsOverSeveralBlocksEncodeAndDecodeLikeTheCpuCodec) {
  for (std::size_t count : {4099, 12289, 70001}) {
    for (Data data : {Data::gaussian, Data::wide_range, Data::overflowing, Data::nonfinite}) {
      const std::vector<float> x = make_values(count, count, data);
      for (std::uint64_t bucket : kBuckets) {
        check_both(x, bucket);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Scales of any bits decode as on the CPU (the decoder does not validate them).
TEST(SignFastLayout, AnyScaleBitsDecodeLikeTheCpuCodec) {
  const std::size_t count = 1003;
  for (std::uint64_t bucket : {std::uint64_t{3}, std::uint64_t{10}, std::uint64_t{512}}) {
    const std::vector<float> x = make_values(count, 12, Data::gaussian);
    std::vector<std::byte> message = testing::encode_message(*sign_codec(bucket), host_view(x.data(), count));
    const std::uint32_t odd_scales[] = {0x80000000u, 0xBF800000u, 0xFFC01234u, 0x7F800001u, 0xFF800000u, 0x00000001u};
    for (std::size_t k = 0; k < std::size(odd_scales); ++k) {
      const std::size_t b = std::min<std::size_t>(k * 13, ceil_div(count, bucket) - 1);
      std::memcpy(message.data() + kWireHeaderBytes + 4 * b, &odd_scales[k], 4);
    }
    check_decode(message, count, bucket);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace gradzip
