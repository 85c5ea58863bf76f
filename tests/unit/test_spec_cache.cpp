// collectives/spec_cache.h: every answer is the one CompressionSpec::parse and to_string give
// for the spec asked for, whether it comes from the kept texts, the last-spec shortcut, or a
// fresh parse after the cache started over; a text that does not parse throws as parse does and
// leaves nothing behind.
#include <gtest/gtest.h>

#include <string>

#include "collectives/spec_cache.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

TEST(SpecCache, ParseGivesTheParsersSpecAndCanonicalTextAndKeepsThem) {
  SpecCache cache;
  const SpecCache::Parsed& first = cache.parse("qsgd:bits=4");
  EXPECT_EQ(first.spec, CompressionSpec::parse("qsgd:bits=4"));
  EXPECT_EQ(first.canonical, CompressionSpec::parse("qsgd:bits=4").to_string());
  EXPECT_NE(first.canonical, "qsgd:bits=4");  // canonical: the defaults spelled out
  EXPECT_EQ(&cache.parse("qsgd:bits=4"), &first);  // kept, not parsed again
  const SpecCache::Parsed& other = cache.parse("topk:ratio=0.1,approx=on");
  EXPECT_EQ(other.spec, CompressionSpec::parse("topk:ratio=0.1,approx=on"));
  EXPECT_EQ(other.canonical, CompressionSpec::parse("topk:ratio=0.1,approx=on").to_string());
  // Two spellings of one spec: each kept under its own text, both with the one canonical text.
  EXPECT_EQ(cache.parse("qsgd:bits=4,bucket=512").canonical, first.canonical);
}

TEST(SpecCache, ATextThatDoesNotParseThrowsAsParseDoesAndIsNotKept) {
  SpecCache cache;
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cache.parse("qsgd:bits=9");
      FAIL() << "qsgd:bits=9 parsed";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::invalid_spec);
      EXPECT_NE(std::string(error.what()).find("bits"), std::string::npos) << error.what();
    }
  }
  EXPECT_THROW(cache.parse("nosuchcodec"), Error);
  EXPECT_EQ(cache.parse("sign").spec, CompressionSpec::parse("sign"));
}

TEST(SpecCache, StartsOverWhenFullAndStillAnswersEveryText) {
  SpecCache cache;
  for (int round = 0; round < 2; ++round) {
    for (std::size_t bucket = 1; bucket <= SpecCache::kMaxCachedTexts + 3; ++bucket) {
      const std::string text = "qsgd:bits=2,bucket=" + std::to_string(bucket);
      const CompressionSpec expected = CompressionSpec::parse(text);
      EXPECT_EQ(cache.parse(text).spec, expected) << text;
      EXPECT_EQ(cache.parse(text).canonical, expected.to_string()) << text << ", asked again";
    }
  }
}

TEST(SpecCache, CanonicalTextIsAlwaysTheTextOfTheSpecAskedFor) {
  SpecCache cache;
  const CompressionSpec qsgd = CompressionSpec::parse("qsgd:bits=4");
  const CompressionSpec sign = CompressionSpec::parse("sign:bucket=128");
  EXPECT_EQ(cache.canonical_text(qsgd), qsgd.to_string());
  EXPECT_EQ(cache.canonical_text(qsgd), qsgd.to_string());  // the shortcut
  EXPECT_EQ(cache.canonical_text(sign), sign.to_string());  // another spec right after
  EXPECT_EQ(cache.canonical_text(qsgd), qsgd.to_string());
  // A spec that differs in one field only prints its own text.
  CompressionSpec qsgd_ring = qsgd;
  qsgd_ring.algo = Algorithm::ring;
  EXPECT_NE(qsgd_ring.to_string(), qsgd.to_string());
  EXPECT_EQ(cache.canonical_text(qsgd_ring), qsgd_ring.to_string());
  CompressionSpec qsgd_no_ef = qsgd;
  qsgd_no_ef.error_feedback = !qsgd.error_feedback;
  EXPECT_EQ(cache.canonical_text(qsgd_no_ef), qsgd_no_ef.to_string());
}

}  // namespace
}  // namespace gradzip::collectives
