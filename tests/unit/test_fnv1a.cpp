// kernels/fnv1a.h: FNV-1a 64 against the published test vectors (a different hash would change
// every tensor id and make saved checkpoints fail their checksum), and the incremental form
// against the one-shot one.
#include <gtest/gtest.h>

#include <string_view>

#include "collectives/call_check.h"
#include "kernels/fnv1a.h"

namespace gradzip {
namespace {

TEST(Fnv1a64, PublishedTestVectors) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(Fnv1a64, IncrementalEqualsOneShotAndTheCallCheckUsesIt) {
  const std::string_view text = "layer1.weight/ddp.bucket0";
  for (std::size_t split = 0; split <= text.size(); ++split) {
    Fnv1a64 hash;
    hash.update(text.data(), split);
    hash.update(text.data() + split, text.size() - split);
    EXPECT_EQ(hash.value(), fnv1a64(text)) << split;
  }
  EXPECT_EQ(collectives::fingerprint64(text), fnv1a64(text));
}

}  // namespace
}  // namespace gradzip
