// collectives/codec_cache.h: the codec handed out is always the one of the spec asked for,
// whether it comes from the last-call shortcut, the map, or a fresh make_codec after the cache
// started over; equal specs share one codec.
#include <gtest/gtest.h>

#include <string>

#include "collectives/codec_cache.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

TEST(CodecCache, EqualSpecsShareOneCodecAndEachCallGetsItsOwnSpec) {
  CodecCache cache;
  const CompressionSpec qsgd = CompressionSpec::parse("qsgd:bits=4");
  const CompressionSpec sign = CompressionSpec::parse("sign:bucket=128");
  const Codec& first = cache.codec_for(qsgd);
  EXPECT_EQ(first.spec(), qsgd);
  EXPECT_EQ(&cache.codec_for(qsgd), &first);  // the last-call shortcut
  const Codec& other = cache.codec_for(sign);  // a different spec right after: not the shortcut
  EXPECT_EQ(other.spec(), sign);
  EXPECT_NE(&other, &first);
  EXPECT_EQ(&cache.codec_for(qsgd), &first);  // from the map, after another spec
  EXPECT_EQ(&cache.codec_for(CompressionSpec::parse("qsgd:bits=4,bucket=512")), &first);
  // A spec that differs only in a field the codec ignores still gets a codec of its own spec.
  CompressionSpec qsgd_ring = qsgd;
  qsgd_ring.algo = Algorithm::ring;
  EXPECT_EQ(cache.codec_for(qsgd_ring).spec(), qsgd_ring);
}

TEST(CodecCache, StartsOverWhenFullAndStillAnswersEverySpec) {
  CodecCache cache;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t bucket = 1; bucket <= CodecCache::kMaxCachedCodecs + 3; ++bucket) {
      const CompressionSpec spec =
          CompressionSpec::parse("qsgd:bits=4,bucket=" + std::to_string(bucket));
      EXPECT_EQ(cache.codec_for(spec).spec(), spec) << "bucket " << bucket;
      EXPECT_EQ(cache.codec_for(spec).spec(), spec) << "bucket " << bucket << ", asked again";
    }
  }
}

TEST(CodecCache, AFailedMakeLeavesNoStaleShortcut) {
  CodecCache cache;
  const CompressionSpec qsgd = CompressionSpec::parse("qsgd:bits=4");
  for (std::size_t bucket = 1; bucket < CodecCache::kMaxCachedCodecs; ++bucket)
    cache.codec_for(CompressionSpec::parse("sign:bucket=" + std::to_string(bucket)));
  cache.codec_for(qsgd);  // the 64th: the cache is full, qsgd is the last answer
  // powersgd has no element codec: make_codec throws after the full cache started over.
  EXPECT_THROW(cache.codec_for(CompressionSpec::parse("powersgd")), Error);
  EXPECT_EQ(cache.codec_for(qsgd).spec(), qsgd);  // made again, not the freed codec
}

}  // namespace
}  // namespace gradzip::collectives
