// collectives/segment_plan.h and the codec table's segment granularity: where a pipelined
// algorithm may cut a chunk, how many segments a message size asks for, and that the segments'
// messages hold exactly the chunk message's payload (the bytes pipelining must not change).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/codec_table.h"
#include "collectives/segment_plan.h"
#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "tests/unit/test_support.h"

namespace gradzip::collectives {
namespace {

constexpr std::size_t kHeader = compressors::kWireHeaderBytes;

TEST(SegmentPlan, GranularityIsWholeBucketsAndWholeCodeBytes) {
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("none")), 1u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("fp16")), 1u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("bf16")), 1u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("sign")), 512u);             // lcm(512, 8)
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("sign:bucket=100")), 200u);  // lcm(100, 8)
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("qsgd:bits=3,bucket=77")), 616u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("terngrad")), 2560u);         // lcm(512, 5)
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("terngrad:bucket=7")), 35u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("topk")), 0u);  // selects over the chunk
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("randk")), 0u);
  EXPECT_EQ(segment_granularity(CompressionSpec::parse("powersgd")), 0u);
  CompressionSpec huge = CompressionSpec::parse("sign");
  huge.bucket = (std::size_t{1} << 31) + 1;  // only settable in code: never cut
  EXPECT_EQ(segment_granularity(huge), 0u);
}

TEST(SegmentPlan, SegmentCountKeepsMessagesNearTheTarget) {
  const auto sign = make_codec("sign");
  // A chunk of 2^22 elements: 2^19 sign bytes + 2^13 scales * 4 = 557,056 payload bytes; at
  // 65,536 bytes a message (65,504 of payload) that is ceil(8.5) = 9 segments.
  const std::vector<std::size_t> chunks{std::size_t{1} << 22, (std::size_t{1} << 22) - 1};
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 65536), 9u);
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 0), 1u);        // segment=0: no pipelining
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 1u << 30), 1u);  // already one message
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 1), kMaxSegmentsPerChunk);  // capped
  // f32 `none`: 2^20 elements, 4 MiB of payload, 64 KiB messages: 65 segments (4 MiB / 65,504).
  const auto none = make_codec("none");
  EXPECT_EQ(segments_per_chunk(*none, std::vector<std::size_t>{std::size_t{1} << 20}, 65536), 65u);
  // A caller's cap (the ring's) lowers the count, never raises it.
  EXPECT_EQ(segments_per_chunk(*none, std::vector<std::size_t>{std::size_t{1} << 20}, 65536,
                               kMaxRingSegmentsPerChunk),
            kMaxRingSegmentsPerChunk);
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 65536, kMaxRingSegmentsPerChunk), 8u);
  EXPECT_EQ(segments_per_chunk(*sign, chunks, 65536, 100), 9u);
  // The smallest chunk limits the count to its granules (no empty segment): 3 granules of 512.
  EXPECT_EQ(segments_per_chunk(*sign, std::vector<std::size_t>{1u << 20, 1500}, 64), 3u);
  EXPECT_EQ(segments_per_chunk(*sign, std::vector<std::size_t>{1u << 20, 0}, 64), 1u);
  // Codecs that may not be cut never are.
  EXPECT_EQ(segments_per_chunk(*make_codec("topk"), chunks, 64), 1u);
  EXPECT_EQ(segments_per_chunk(*make_codec("randk"), chunks, 64), 1u);
}

TEST(SegmentPlan, BoundsAreWholeGranulesSpreadEvenly) {
  const auto codec = make_codec("sign:bucket=100");  // granularity 200
  for (const std::size_t count : {std::size_t{200}, std::size_t{1000}, std::size_t{100003}}) {
    const std::size_t granules = (count + 199) / 200;
    for (std::size_t segments : {std::size_t{1}, std::size_t{2}, std::size_t{3}, granules}) {
      if (segments > granules) continue;
      SCOPED_TRACE("count " + std::to_string(count) + ", " + std::to_string(segments) + " segments");
      const std::vector<std::size_t> bounds = segment_bounds(*codec, count, segments);
      ASSERT_EQ(bounds.size(), segments + 1);
      EXPECT_EQ(bounds.front(), 0u);
      EXPECT_EQ(bounds.back(), count);
      std::size_t smallest = count, largest = 0;
      for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
        EXPECT_LT(bounds[k], bounds[k + 1]);  // never empty
        if (k > 0) {
          EXPECT_EQ(bounds[k] % 200, 0u) << "boundary " << k;
        }
        const std::size_t whole = (bounds[k + 1] - bounds[k] + 199) / 200;
        smallest = std::min(smallest, whole);
        largest = std::max(largest, whole);
      }
      EXPECT_LE(largest - smallest, 1u);  // granules spread as evenly as possible
    }
  }
  EXPECT_EQ(testing::error_code_of([&] { segment_bounds(*codec, 1000, 6); }), ErrorCode::internal);
  EXPECT_EQ(testing::error_code_of([&] { segment_bounds(*codec, 1000, 0); }), ErrorCode::internal);
}

// The payload bytes of a chunk's one message, cut at the plan's boundaries: the segments'
// messages carry the same payload bytes in total and decode to the same values. Not byte for
// byte the same stream (each segment's scales come before its own codes), but the same scales
// and the same codes, so the result of any algorithm is unchanged.
TEST(SegmentPlan, SegmentMessagesDecodeToTheChunkMessagesValuesWithOnlyMoreHeaders) {
  for (const char* spec : {"sign", "sign:bucket=100", "qsgd:bits=3,bucket=77", "qsgd:bits=4",
                           "terngrad:bucket=7", "terngrad", "fp16", "bf16", "none"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    const std::size_t count = 50021;
    const std::vector<float> x = testing::gaussian(count, 17);
    EncodeContext ctx{5, 3, 9, 1000};  // the chunk starts at tensor element 1000
    const std::vector<std::byte> whole = testing::encode_message(*codec, host_view(x.data(), count), ctx);
    const std::vector<float> expected = testing::decode_to_f32(*codec, whole, count);
    const std::size_t granularity = segment_granularity(codec->spec());
    const std::size_t segments = std::min<std::size_t>(7, (count + granularity - 1) / granularity);
    ASSERT_GT(segments, 1u);
    const std::vector<std::size_t> bounds = segment_bounds(*codec, count, segments);
    std::vector<float> decoded(count);
    std::size_t total = 0;
    for (std::size_t k = 0; k < segments; ++k) {
      EncodeContext segment_ctx = ctx;
      segment_ctx.element_offset += bounds[k];
      const std::size_t n = bounds[k + 1] - bounds[k];
      const auto message = testing::encode_message(*codec, host_view(x.data() + bounds[k], n), segment_ctx);
      EXPECT_EQ(message.size(), codec->max_encoded_bytes(n));
      total += message.size();
      const auto values = testing::decode_to_f32(*codec, message, n);
      std::copy(values.begin(), values.end(), decoded.begin() + static_cast<std::ptrdiff_t>(bounds[k]));
    }
    EXPECT_EQ(total, whole.size() + (segments - 1) * kHeader);
    EXPECT_TRUE(testing::same_bits(decoded, expected));
  }
}

}  // namespace
}  // namespace gradzip::collectives
