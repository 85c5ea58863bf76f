// The Reducer's layout (pipeline/bucket_layout.h): buckets in reverse registration order with
// the small first bucket, groups by rule, equal chunks, lanes round-robin, and a fingerprint
// that changes with anything the ranks must agree on.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "gradzip/error.h"
#include "pipeline/bucket_layout.h"

namespace gradzip::pipeline {
namespace {

// Registrations of the given element counts (no data is touched by the layout), named t0...
std::vector<RegisteredTensor> tensors_of(const std::vector<std::size_t>& counts,
                                         const std::vector<std::vector<std::size_t>>& shapes = {}) {
  static float dummy = 0.0f;
  std::vector<RegisteredTensor> tensors;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    RegisteredTensor tensor{detail::concat("t", i), TensorView{&dummy, counts[i], DType::f32, {}},
                            false, {}};
    if (i < shapes.size() && !shapes[i].empty()) {
      tensor.has_shape = true;
      tensor.shape = shapes[i];
    }
    tensors.push_back(tensor);
  }
  return tensors;
}

ModelSpec model_of(const char* text, bool default_rules = false) {
  return ModelSpec::parse(text, default_rules, CompressionSpec::parse("none"));
}

TEST(BucketLayout, ReverseOrderSmallFirstBucketThenBucketBytes) {
  // Bytes (f32): t0 400, t1 400, t2 800, t3 200, t4 100. First bucket 300 B, then 1000 B.
  const auto tensors = tensors_of({100, 100, 200, 50, 25});
  const LayoutOptions options{300, 1000, 1 << 20, 1};
  const auto layout = make_layout(tensors, model_of("none"), options);
  // Backward order t4, t3, t2, t1, t0: t4 + t3 = 300 fits the first bucket; t2 + t1 = 1200 >
  // 1000 so t2 alone; t1 + t0 = 800.
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_EQ(layout[0].tensors, (std::vector<std::size_t>{4, 3}));
  EXPECT_EQ(layout[1].tensors, (std::vector<std::size_t>{2}));
  EXPECT_EQ(layout[2].tensors, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(layout[0].bytes, 300u);
  EXPECT_EQ(layout[1].bytes, 800u);
  EXPECT_EQ(layout[2].bytes, 800u);
}

TEST(BucketLayout, TensorLargerThanABucketGetsItsOwn) {
  const auto tensors = tensors_of({10, 1000, 10});
  const auto layout = make_layout(tensors, model_of("none"), LayoutOptions{16, 100, 1 << 20, 1});
  ASSERT_EQ(layout.size(), 3u);
  EXPECT_EQ(layout[0].tensors, (std::vector<std::size_t>{2}));
  EXPECT_EQ(layout[1].tensors, (std::vector<std::size_t>{1}));
  EXPECT_EQ(layout[2].tensors, (std::vector<std::size_t>{0}));
}

TEST(BucketLayout, GroupsFollowRulesInOrderOfFirstAppearance) {
  // t0 matrix 64x64, t1 bias {64}, t2 matrix 32x16, t3 tiny matrix 2x2 (under min_bytes).
  const auto tensors = tensors_of({4096, 64, 512, 4}, {{64, 64}, {64}, {32, 16}, {2, 2}});
  const auto layout = make_layout(tensors, model_of("topk:ratio=0.1,min_bytes=64", true),
                                  LayoutOptions{1 << 20, 1 << 20, 1 << 20, 1});
  ASSERT_EQ(layout.size(), 1u);
  const auto& groups = layout[0].groups;
  // Bucket order t3, t2, t1, t0: t3 (16 B < 64) none by bytes<64; t2 topk; t1 none by dims<=1;
  // t0 topk.
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].tensors, (std::vector<std::size_t>{3}));
  EXPECT_EQ(groups[0].spec.codec, CodecKind::none);
  EXPECT_TRUE(groups[0].rule.starts_with("bytes<64->none")) << groups[0].rule;
  EXPECT_EQ(groups[1].tensors, (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(groups[1].spec.codec, CodecKind::topk);
  EXPECT_EQ(groups[1].rule, "model");
  EXPECT_EQ(groups[1].tensor_offsets, (std::vector<std::size_t>{0, 512}));
  EXPECT_EQ(groups[1].count, 4608u);
  EXPECT_EQ(groups[2].tensors, (std::vector<std::size_t>{1}));
  EXPECT_TRUE(groups[2].rule.starts_with("dims<=1->none")) << groups[2].rule;
}

TEST(BucketLayout, PowersgdVectorsFallBackToNone) {
  const auto tensors = tensors_of({600, 30, 90}, {{20, 30}, {30}, {}});
  const auto layout = make_layout(tensors, model_of("powersgd:rank=2"),
                                  LayoutOptions{1 << 20, 1 << 20, 1 << 20, 1});
  ASSERT_EQ(layout.size(), 1u);
  const auto& groups = layout[0].groups;
  // t2 (no shape) and t1 (1-D) are not matrices: none, with the rule marked.
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].tensors, (std::vector<std::size_t>{2, 1}));
  EXPECT_EQ(groups[0].spec.codec, CodecKind::none);
  EXPECT_FALSE(groups[0].spec.error_feedback);
  EXPECT_EQ(groups[0].rule, "model (not a matrix: none)");
  EXPECT_EQ(groups[1].tensors, (std::vector<std::size_t>{0}));
  EXPECT_EQ(groups[1].spec.codec, CodecKind::powersgd);
}

TEST(BucketLayout, EqualChunksCoverTheGroupAndLanesRoundRobin) {
  // 1001 elements, chunk_bytes 400 (100 elements): 11 chunks of 91 elements each.
  const auto tensors = tensors_of({1001, 7});
  const auto layout = make_layout(tensors, model_of("none"), LayoutOptions{28, 1 << 20, 400, 3});
  ASSERT_EQ(layout.size(), 2u);
  const auto& first = layout[0].groups.at(0);  // t1, 7 elements: one chunk, lane 0
  ASSERT_EQ(first.chunks.size(), 1u);
  EXPECT_EQ(first.chunks[0].count, 7u);
  EXPECT_EQ(first.chunks[0].lane, 0);
  EXPECT_EQ(first.chunks[0].name, "bucket0/group0/chunk0");
  const auto& second = layout[1].groups.at(0);
  ASSERT_EQ(second.chunks.size(), 11u);
  std::size_t next = 0;
  for (std::size_t c = 0; c < second.chunks.size(); ++c) {
    EXPECT_EQ(second.chunks[c].group_begin, next);
    EXPECT_EQ(second.chunks[c].count, 91u);
    EXPECT_EQ(second.chunks[c].lane, static_cast<int>((c + 1) % 3));  // chunk 0 of bucket 0 had lane 0
    EXPECT_EQ(second.chunks[c].name, detail::concat("bucket1/group0/chunk", c));
    next += second.chunks[c].count;
  }
  EXPECT_EQ(next, 1001u);
}

TEST(BucketLayout, UnevenChunksDifferByAtMostOne) {
  const auto tensors = tensors_of({1000003});
  const auto layout = make_layout(tensors, model_of("none"), LayoutOptions{1, 1, 4 << 20, 2});
  const auto& chunks = layout.at(0).groups.at(0).chunks;
  ASSERT_EQ(chunks.size(), 1u);  // 4 MiB holds 1048576 elements
  const auto small = make_layout(tensors, model_of("none"), LayoutOptions{1, 1, 4096, 2});
  const auto& many = small.at(0).groups.at(0).chunks;
  ASSERT_EQ(many.size(), (1000003u + 1023u) / 1024u);
  std::size_t total = 0, smallest = SIZE_MAX, largest = 0;
  for (const auto& chunk : many) {
    total += chunk.count;
    smallest = std::min(smallest, chunk.count);
    largest = std::max(largest, chunk.count);
  }
  EXPECT_EQ(total, 1000003u);
  EXPECT_LE(largest - smallest, 1u);
  EXPECT_LE(largest, 1024u);
}

TEST(BucketLayout, EmptyTensorsMakeNoChunks) {
  const auto layout = make_layout(tensors_of({0, 0}), model_of("none"), LayoutOptions{4, 4, 4, 1});
  ASSERT_EQ(layout.size(), 1u);  // 0 + 0 bytes fit the first bucket
  EXPECT_EQ(layout[0].groups.at(0).count, 0u);
  EXPECT_TRUE(layout[0].groups[0].chunks.empty());
}

TEST(BucketLayout, FingerprintChangesWithWhatRanksMustShare) {
  const LayoutOptions options{1024, 4096, 512, 2};
  const auto model = model_of("fp16");
  const auto base = layout_fingerprint(tensors_of({10, 20}, {{2, 5}, {}}), model, options);
  EXPECT_EQ(base, layout_fingerprint(tensors_of({10, 20}, {{2, 5}, {}}), model, options));
  EXPECT_NE(base, layout_fingerprint(tensors_of({10, 21}, {{2, 5}, {}}), model, options));
  EXPECT_NE(base, layout_fingerprint(tensors_of({10, 20}, {{5, 2}, {}}), model, options));
  EXPECT_NE(base, layout_fingerprint(tensors_of({10, 20}, {{}, {}}), model, options));
  EXPECT_NE(base, layout_fingerprint(tensors_of({10, 20}, {{2, 5}, {}}), model_of("bf16"), options));
  EXPECT_NE(base, layout_fingerprint(tensors_of({10, 20}, {{2, 5}, {}}), model,
                                     LayoutOptions{1024, 4096, 512, 3}));
  auto renamed = tensors_of({10, 20}, {{2, 5}, {}});
  renamed[1].name = "other";
  EXPECT_NE(base, layout_fingerprint(renamed, model, options));
}

}  // namespace
}  // namespace gradzip::pipeline
