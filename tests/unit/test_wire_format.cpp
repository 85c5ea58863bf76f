// The message header and the `none` codec: round trips are exact, and every malformed
// header is refused with malformed_message before any payload is read.
#include <gtest/gtest.h>

#include <cstring>

#include "compressors/codec_descriptor.h"
#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using compressors::read_header;
using compressors::WireCodec;
using compressors::WireHeader;
using compressors::write_header;

std::vector<std::byte> message_with(const WireHeader& header) {
  std::vector<std::byte> message(kWireHeaderBytes + header.payload_bytes);
  write_header(header, message);
  return message;
}

TEST(WireHeader, RoundTripsEveryField) {
  const WireHeader header{WireCodec::topk, 0x5A, 7, (std::uint64_t{1} << 33) + 5, 24,
                          0x0123456789ABCDEFull};
  const auto message = message_with(header);
  const WireHeader parsed = read_header(message, "test");
  EXPECT_EQ(parsed.codec, WireCodec::topk);
  EXPECT_EQ(parsed.flags, 0x5A);
  EXPECT_EQ(parsed.small_param, 7);
  EXPECT_EQ(parsed.count, (std::uint64_t{1} << 33) + 5);
  EXPECT_EQ(parsed.payload_bytes, 24u);
  EXPECT_EQ(parsed.large_param, 0x0123456789ABCDEFull);
}

TEST(WireHeader, LayoutIsTheDocumentedOne) {
  const auto message = message_with(WireHeader{WireCodec::qsgd, 1, 4, 10, 0, 512});
  const unsigned char expected[kWireHeaderBytes] = {
      'G', 'D', 'Z', 'P', 1, 4, 1, 4,  10, 0, 0, 0, 0, 0, 0, 0,
      0,   0,   0,   0,   0, 0, 0, 0,  0,  2, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(message.data(), expected, kWireHeaderBytes), 0);
}

TEST(WireHeader, RejectsShortMessage) {
  std::vector<std::byte> message(kWireHeaderBytes - 1);
  EXPECT_EQ(testing::error_code_of([&] { read_header(message, "test"); }), ErrorCode::malformed_message);
  EXPECT_EQ(testing::error_code_of([&] { read_header({}, "test"); }), ErrorCode::malformed_message);
}

TEST(WireHeader, RejectsBadMagicVersionAndCodec) {
  const WireHeader header{WireCodec::none, 0, 0, 2, 8, 0};
  auto bad_magic = message_with(header);
  bad_magic[0] = std::byte{'X'};
  EXPECT_EQ(testing::error_code_of([&] { read_header(bad_magic, "test"); }), ErrorCode::malformed_message);
  auto bad_version = message_with(header);
  bad_version[4] = std::byte{2};
  EXPECT_EQ(testing::error_code_of([&] { read_header(bad_version, "test"); }), ErrorCode::malformed_message);
  // Every byte no codec of gradzip/codec_list.h sends is refused (0 among them: a codec
  // without messages has it); the listed ones are read.
  int refused = 0;
  for (int codec = 0; codec < 256; ++codec) {
    auto message = message_with(header);
    message[5] = std::byte{static_cast<std::uint8_t>(codec)};
    if (compressors::find_wire_descriptor(static_cast<std::uint8_t>(codec)) != nullptr) {
      EXPECT_EQ(static_cast<int>(read_header(message, "test").codec), codec);
      continue;
    }
    ++refused;
    EXPECT_EQ(testing::error_code_of([&] { read_header(message, "test"); }), ErrorCode::malformed_message)
        << "codec id " << codec;
  }
  EXPECT_GE(refused, 256 - 64);
  EXPECT_EQ(compressors::find_wire_descriptor(0), nullptr);
}

TEST(WireHeader, RejectsPayloadSizeDisagreeingWithTheMessage) {
  auto message = message_with(WireHeader{WireCodec::none, 0, 0, 4, 16, 0});
  auto shorter = message;
  shorter.resize(shorter.size() - 1);
  EXPECT_EQ(testing::error_code_of([&] { read_header(shorter, "test"); }), ErrorCode::malformed_message);
  auto longer = message;
  longer.push_back(std::byte{0});
  EXPECT_EQ(testing::error_code_of([&] { read_header(longer, "test"); }), ErrorCode::malformed_message);
  // A payload size near 2^64 must not wrap the bounds check.
  auto huge = message_with(WireHeader{WireCodec::none, 0, 0, 4, 0, 0});
  const std::uint64_t wrapped = ~std::uint64_t{0} - 7;
  std::memcpy(huge.data() + 16, &wrapped, 8);
  EXPECT_EQ(testing::error_code_of([&] { read_header(huge, "test"); }), ErrorCode::malformed_message);
}

// The accessors the collectives read headers through: top-k's index bytes from its k and wide
// flag (what the stats split off as index bytes), and the announced payload size of a message at
// the start of concatenated bytes (how halving/doubling frames what it gathered).
TEST(WireHeader, IndexBytesAndAnnouncedPayload) {
  WireHeader topk{WireCodec::topk, 0, 0, 1000, 10 * 8, 10};
  EXPECT_EQ(compressors::index_bytes(topk), 40u);
  topk.flags = compressors::kTopkWideIndices | compressors::kTopkHalfValues;
  EXPECT_EQ(compressors::index_bytes(topk), 80u);
  EXPECT_EQ(compressors::index_bytes(WireHeader{WireCodec::randk, 0, 0, 1000, 24 + 40, 10}), 0u);
  EXPECT_EQ(compressors::index_bytes(WireHeader{WireCodec::sign, 0, 0, 1000, 129, 512}), 0u);

  std::vector<std::byte> two(2 * kWireHeaderBytes + 7 + 3);
  write_header(WireHeader{WireCodec::none, 0, 0, 0, 7, 0}, two);
  write_header(WireHeader{WireCodec::none, 0, 0, 0, 3, 0},
               std::span<std::byte>(two).subspan(kWireHeaderBytes + 7));
  EXPECT_EQ(compressors::announced_payload_bytes(two), 7u);
  EXPECT_EQ(compressors::announced_payload_bytes(std::span<const std::byte>(two).subspan(kWireHeaderBytes + 7)), 3u);
  EXPECT_EQ(compressors::announced_payload_bytes(std::span<const std::byte>(two).first(kWireHeaderBytes - 1)), 0u);
}

TEST(WireHeader, ErrorNamesTheOperationAndTheField) {
  std::vector<std::byte> message(kWireHeaderBytes);
  try {
    read_header(message, "qsgd.decode");
    FAIL() << "an all-zero header was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("qsgd.decode"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("magic"), std::string::npos) << error.what();
  }
}

class NoneCodecTest : public ::testing::TestWithParam<std::tuple<std::size_t, DType>> {};

TEST_P(NoneCodecTest, RoundTripIsExactAndDecodeAddAccumulates) {
  const auto [count, dtype] = GetParam();
  const auto codec = make_codec("none");
  const testing::HostTensor input(dtype, testing::gaussian(count, 11));
  const auto message = testing::encode_message(*codec, input.view());
  EXPECT_EQ(message.size(), kWireHeaderBytes + 4 * count);
  EXPECT_EQ(message.size(), codec->max_encoded_bytes(count));

  testing::HostTensor output(dtype, count);
  codec->decode(message, output.view());
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(output.at(i), input.at(i)) << "element " << i;

  std::vector<float> acc(count, 0.5f);
  codec->decode_add(message, acc.data(), count);
  for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(acc[i], 0.5f + input.at(i)) << "element " << i;
  EXPECT_TRUE(codec->additive());
  EXPECT_FALSE(codec->sparse());
}

INSTANTIATE_TEST_SUITE_P(CountsAndDTypes, NoneCodecTest,
                         ::testing::Combine(::testing::ValuesIn(testing::kTestCounts),
                                            ::testing::ValuesIn(testing::kTestDTypes)));

TEST(NoneCodec, RejectsCountMismatchAndTooSmallOutput) {
  const auto codec = make_codec("none");
  const std::vector<float> values = {1, 2, 3};
  const auto message = testing::encode_message(*codec, host_view(values.data(), 3));
  std::vector<float> two(2), four(4);
  EXPECT_EQ(testing::error_code_of([&] { codec->decode(message, host_view(two.data(), 2)); }),
            ErrorCode::malformed_message);
  EXPECT_EQ(testing::error_code_of([&] { codec->decode_add(message, four.data(), 4); }),
            ErrorCode::malformed_message);
  std::vector<std::byte> small(codec->max_encoded_bytes(3) - 1);
  EXPECT_EQ(testing::error_code_of([&] { codec->encode(host_view(values.data(), 3), small, {}); }),
            ErrorCode::invalid_argument);
}

TEST(NoneCodec, DecodesFromAnUnalignedBuffer) {
  const auto codec = make_codec("none");
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const auto message = testing::encode_message(*codec, host_view(values.data(), 3));
  std::vector<std::byte> shifted(message.size() + 1);
  std::memcpy(shifted.data() + 1, message.data(), message.size());
  const auto decoded = testing::decode_to_f32(
      *codec, std::span<const std::byte>(shifted).subspan(1), 3);
  EXPECT_EQ(decoded, values);
}

TEST(NoneCodec, RefusesAnotherCodecsMessage) {
  const auto codec = make_codec("none");
  const auto message = message_with(WireHeader{WireCodec::fp16, 0, 0, 2, 4, 0});
  std::vector<float> out(2);
  EXPECT_EQ(testing::error_code_of([&] { codec->decode(message, host_view(out.data(), 2)); }),
            ErrorCode::malformed_message);
}

}  // namespace
}  // namespace gradzip
