// The random streams of named tensors (collectives/random_streams.h): the key and counter word
// a name draws from, and the process-wide claim on keys.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "collectives/random_streams.h"
#include "kernels/fnv1a.h"

namespace gradzip {
namespace {

using collectives::random_stream_of;
using collectives::RandomStreamClaims;

// The names the DDP hook makes for its buckets and the Reducer for its groups, in bulk.
std::string bucket_name(std::size_t i) { return "ddp.bucket" + std::to_string(i) + ":layout" + std::to_string(i * 7919); }

TEST(RandomStreams, TheSeedEntersTheKeyAlone) {
  // key = seed ^ mix64(h), tensor_id = low half of h: changing the seed changes the key by
  // exactly the seed's bits and leaves the counter word alone.
  for (const char* name : {"", "fc.weight", "ddp.bucket0"}) {
    const collectives::RandomStream zero = random_stream_of(0, name);
    for (std::uint64_t seed : {1ULL, 12345ULL, 0x8000000000000000ULL, ~0ULL}) {
      const collectives::RandomStream seeded = random_stream_of(seed, name);
      EXPECT_EQ(seeded.key, zero.key ^ seed) << name;
      EXPECT_EQ(seeded.tensor_id, zero.tensor_id) << name;
    }
    EXPECT_EQ(zero.tensor_id, static_cast<std::uint32_t>(fnv1a64(name))) << name;
    // The key is a mix of the hash, not the hash itself (its high half would otherwise be the
    // only thing telling names with one low half apart).
    EXPECT_NE(zero.key, fnv1a64(name)) << name;
  }
}

TEST(RandomStreams, ManyNamesUnderOneSeedHaveDistinctKeysWhereA32BitIdCollides) {
  // 200,000 names: a 32-bit id shared by two of them is all but certain (expected pairs
  // n^2 / 2^33 = 4.7), distinct 64-bit keys are not in doubt (n^2 / 2^65 = 1e-9).
  constexpr std::size_t kNames = 200000;
  std::unordered_set<std::uint64_t> keys;
  std::unordered_set<std::uint32_t> ids;
  std::size_t shared_ids = 0;
  for (std::size_t i = 0; i < kNames; ++i) {
    const collectives::RandomStream stream = random_stream_of(7, bucket_name(i));
    EXPECT_TRUE(keys.insert(stream.key).second) << bucket_name(i);
    if (!ids.insert(stream.tensor_id).second) ++shared_ids;
  }
  EXPECT_EQ(keys.size(), kNames);
  EXPECT_GT(shared_ids, 0u) << "the check would not show a key that is only 32 bits wide";
}

TEST(RandomStreams, AKeyIsHeldByOneNameAcrossOwnersUntilEveryOwnerGivesItBack) {
  const std::string alpha = "claims.alpha", beta = "claims.beta";
  // seed_b makes beta's key equal alpha's key under seed 0.
  const std::uint64_t seed_b = random_stream_of(0, alpha).key ^ random_stream_of(0, beta).key;
  ASSERT_EQ(random_stream_of(seed_b, beta).key, random_stream_of(0, alpha).key);

  std::optional<RandomStreamClaims> first(std::in_place);
  RandomStreamClaims second;
  EXPECT_FALSE(first->claim(0, alpha, 1).has_value());
  EXPECT_FALSE(first->claim(0, alpha, 2).has_value());  // again: the same name
  EXPECT_FALSE(second.claim(0, alpha, 1).has_value());  // another owner, the same name
  EXPECT_EQ(second.claim(seed_b, beta, 1), std::optional<std::string>(alpha));
  EXPECT_EQ(first->claim(seed_b, beta, 3), std::optional<std::string>(alpha));
  EXPECT_FALSE(second.claim(0, beta, 1).has_value());  // beta's own key under seed 0 is free
  EXPECT_EQ(first->size(), 1u);
  EXPECT_EQ(second.size(), 2u);

  // One owner gives it back: the other still holds it.
  first.reset();
  EXPECT_EQ(second.claim(seed_b, beta, 2), std::optional<std::string>(alpha));
  // The window: alpha last used at 1, beta at 1 too; keep from 2 on gives both back.
  second.release_unused_before(2);
  EXPECT_EQ(second.size(), 0u);
  RandomStreamClaims third;
  EXPECT_FALSE(third.claim(seed_b, beta, 5).has_value());
  EXPECT_EQ(third.claim(0, alpha, 5), std::optional<std::string>(beta));
  // A later use keeps a claim past the window.
  third.release_unused_before(5);
  EXPECT_EQ(third.size(), 1u);
  third.release_unused_before(6);
  EXPECT_EQ(third.size(), 0u);
}

}  // namespace
}  // namespace gradzip
