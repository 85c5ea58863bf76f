// compressors/codec_descriptor.h: one row per codec, in CodecKind order, and the parser,
// make_codec and the wire format answer from it (names, keys, error-feedback defaults, codec
// bytes, the element-codec factory).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "compressors/codec_descriptor.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::CodecDescriptor;
using compressors::codec_descriptor;
using compressors::codec_descriptors;
using compressors::find_codec_descriptor;
using compressors::find_wire_descriptor;
using compressors::WireCodec;
using testing::error_code_of;

// gradzip/codec_list.h, read by the test itself: each codec's name and codec byte, in order.
struct ListedCodec {
  std::string_view name;
  int wire_id;
};
#define GRADZIP_LISTED_CODEC(name, wire_id) ListedCodec{#name, wire_id},
constexpr ListedCodec kListedCodecs[] = {GRADZIP_CODECS(GRADZIP_LISTED_CODEC)};
#undef GRADZIP_LISTED_CODEC

TEST(CodecDescriptor, OneRowPerCodecInEnumOrder) {
  // Row i is the list's line i, with the list's name and codec byte (0: no messages).
  ASSERT_EQ(codec_descriptors().size(), std::size(kListedCodecs));
  std::set<std::string_view> names;
  std::set<int> wire_ids;
  for (std::size_t i = 0; i < std::size(kListedCodecs); ++i) {
    const CodecDescriptor& row = codec_descriptors()[i];
    SCOPED_TRACE(std::string(row.name));
    EXPECT_EQ(static_cast<std::size_t>(row.kind), i);
    EXPECT_EQ(row.name, kListedCodecs[i].name);
    EXPECT_EQ(row.wire ? static_cast<int>(*row.wire) : 0, kListedCodecs[i].wire_id);
    EXPECT_EQ(&codec_descriptor(row.kind), &row);
    EXPECT_EQ(find_codec_descriptor(row.name), &row);
    EXPECT_EQ(codec_kind_name(row.kind), row.name);
    EXPECT_TRUE(names.insert(row.name).second) << "a name used twice";
    // An element codec has both a codec byte and a factory; a matrix codec neither, and says why.
    EXPECT_EQ(row.wire.has_value(), row.make_host != nullptr);
    EXPECT_EQ(row.why_no_element_codec.empty(), row.make_host != nullptr);
    if (row.wire) {
      EXPECT_TRUE(wire_ids.insert(static_cast<int>(*row.wire)).second) << "a codec byte used twice";
      EXPECT_EQ(find_wire_descriptor(static_cast<std::uint8_t>(*row.wire)), &row);
      EXPECT_EQ(compressors::wire_codec_name(*row.wire), row.name);
    }
  }
  EXPECT_EQ(find_codec_descriptor("TopK"), nullptr);
  EXPECT_EQ(find_codec_descriptor(""), nullptr);
  EXPECT_EQ(find_wire_descriptor(0), nullptr);
  EXPECT_EQ(find_wire_descriptor(255), nullptr);
  EXPECT_EQ(compressors::wire_codec_name(static_cast<WireCodec>(200)), "unknown");
  EXPECT_EQ(error_code_of([] { (void)codec_descriptor(static_cast<CodecKind>(200)); }),
            ErrorCode::internal);
}

TEST(CodecDescriptor, TheParserTakesNamesKeysAndDefaultsFromTheRows) {
  for (const CodecDescriptor& row : codec_descriptors()) {
    SCOPED_TRACE(std::string(row.name));
    const CompressionSpec spec = CompressionSpec::parse(row.name);
    EXPECT_EQ(spec.codec, row.kind);
    EXPECT_EQ(spec.error_feedback, row.error_feedback_default);
    // The accepted keys listed for an unknown one are the row's, then the shared ones.
    std::string message;
    EXPECT_EQ(error_code_of([&] { (void)CompressionSpec::parse(std::string(row.name) + ":nokey=1"); },
                            &message),
              ErrorCode::invalid_spec);
    std::string expected = "accepted keys: ";
    for (const compressors::CodecKey& key : row.keys) expected += std::string(key.name) + ", ";
    expected += "ef, ef_resize";
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    // to_string writes the row's keys in the row's order, before the shared ones.
    const std::string canonical = spec.to_string();
    std::size_t at = canonical.find(':');
    for (const compressors::CodecKey& key : row.keys) {
      if (key.name == "k") continue;  // written instead of ratio only when given
      const std::size_t found = canonical.find(std::string(key.name) + "=", at);
      ASSERT_NE(found, std::string::npos) << canonical;
      at = found;
    }
    EXPECT_LT(at, canonical.find("ef="));
  }
}

TEST(CodecDescriptor, MakeCodecBuildsTheRowsCodecOrSaysWhyNot) {
  for (const CodecDescriptor& row : codec_descriptors()) {
    SCOPED_TRACE(std::string(row.name));
    const CompressionSpec spec = CompressionSpec::parse(row.name);
    if (row.make_host == nullptr) {
      std::string message;
      EXPECT_EQ(error_code_of([&] { (void)make_codec(spec); }, &message), ErrorCode::unsupported);
      EXPECT_NE(message.find(row.why_no_element_codec), std::string::npos) << message;
      continue;
    }
    const auto codec = make_codec(spec);
    EXPECT_EQ(codec->spec(), spec);
    // Its messages carry the row's codec byte (offset 5 of the header).
    const std::vector<float> values{1.0f, -2.0f, 0.5f, 4.0f};
    std::vector<std::byte> message(codec->max_encoded_bytes(values.size()));
    const std::size_t bytes = codec->encode(
        ConstTensorView{values.data(), values.size(), DType::f32}, message, EncodeContext{});
    ASSERT_GE(bytes, compressors::kWireHeaderBytes);
    EXPECT_EQ(static_cast<int>(message[5]), static_cast<int>(*row.wire));
  }
}

}  // namespace
}  // namespace gradzip
