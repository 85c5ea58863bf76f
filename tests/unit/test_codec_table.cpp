// collectives/codec_table.h: every codec has its row, and the facts derived from it are the
// ones the collectives promise (what algo=auto runs without the model, the wire types the
// overflow check guards, which messages vary in size).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "collectives/codec_table.h"

namespace gradzip::collectives {
namespace {

TEST(CodecTable, EveryCodecHasItsRowWithTheDefaultFirst) {
  for (const compressors::CodecDescriptor& descriptor : compressors::codec_descriptors()) {
    const CodecKind codec = descriptor.kind;
    SCOPED_TRACE(std::string(codec_kind_name(codec)));
    const CodecRow& row = codec_row(codec);
    EXPECT_EQ(row.codec, codec);
    // The traits are read from the compressors row itself, not from a copy.
    EXPECT_EQ(row.descriptor, &compressors::codec_descriptor(codec));
    ASSERT_FALSE(row.runnable.empty());
    ASSERT_FALSE(row.auto_choices.empty());
    EXPECT_EQ(row.runnable.front(), row.default_path);
    EXPECT_EQ(row.auto_choices.front(), row.default_path);
    for (const AlgorithmId choice : row.auto_choices) {  // auto never picks what cannot run
      EXPECT_NE(std::find(row.runnable.begin(), row.runnable.end(), choice), row.runnable.end());
    }
    EXPECT_EQ(row.element_codec, codec != CodecKind::powersgd);
    EXPECT_EQ(row.shared_indices, codec == CodecKind::randk);
  }
}

TEST(CodecTable, DefaultPathsAreTheDocumentedOnes) {
  EXPECT_EQ(default_path_name(CodecKind::none), "ring");
  EXPECT_EQ(default_path_name(CodecKind::fp16), "ring");
  EXPECT_EQ(default_path_name(CodecKind::bf16), "ring");
  EXPECT_EQ(default_path_name(CodecKind::qsgd), "sra");
  EXPECT_EQ(default_path_name(CodecKind::sign), "sra");
  EXPECT_EQ(default_path_name(CodecKind::terngrad), "sra");
  EXPECT_EQ(default_path_name(CodecKind::topk), "sparse");
  EXPECT_EQ(default_path_name(CodecKind::randk), "randk");
  EXPECT_EQ(default_flat_algorithm(CodecKind::qsgd), Algorithm::sra);
  EXPECT_EQ(default_flat_algorithm(CodecKind::topk), Algorithm::sparse);
  EXPECT_EQ(default_flat_algorithm(CodecKind::fp16), Algorithm::ring);
  EXPECT_EQ(default_flat_algorithm(CodecKind::randk), Algorithm::ring);  // its path is not flat
}

TEST(CodecTable, WireValueTypesAndVaryingSizes) {
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("fp16")), DType::f16);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("bf16")), DType::bf16);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("none")), DType::f32);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("sign")), DType::f32);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("qsgd:bits=4")), DType::f32);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("topk:ratio=0.01")), DType::f32);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("topk:ratio=0.01,values=fp16")), DType::f16);
  EXPECT_EQ(wire_value_type(CompressionSpec::parse("randk:ratio=0.01,values=fp16")), DType::f16);
  EXPECT_TRUE(message_size_varies(CompressionSpec::parse("topk:ratio=0.01,approx=on")));
  EXPECT_FALSE(message_size_varies(CompressionSpec::parse("topk:ratio=0.01")));
  EXPECT_FALSE(message_size_varies(CompressionSpec::parse("sign")));
}

}  // namespace
}  // namespace gradzip::collectives
