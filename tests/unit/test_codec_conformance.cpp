// The conformance suite: every element codec of the registry (compressors/codec_descriptor.h) is
// held to the same contract, read from its descriptor row rather than written per codec. The
// specs are the fuzz targets' list (tests/fuzz/fuzz_specs.h, which also generates the seed
// corpus), so a codec that joins the registry must join that list (RegistryIsCovered fails
// naming it) and is then swept here with no other edit:
//   - a round trip of N(0, 1) data errs by at most the row's error_bound for every element and
//     keeps at least the single-encode cosine floor of the row's cosine_estimate (so an all-zero
//     or a negated decode fails even for the codecs whose elementwise bound is loose);
//   - encode is deterministic for a context, fits max_encoded_bytes, and its header names the
//     row's codec byte and the count;
//   - every instruction set writes the same bytes and decodes to the same bits as the scalar
//     code (skipped, with the reason, on a CPU without that set);
//   - decode_add adds exactly the decode; subtract_decoded subtracts exactly the decode;
//   - f16 and bf16 tensors encode like their f32 widening and decode to the rounded f32 decode;
//   - malformed messages (every truncation of the header, a short or long payload, a bad magic,
//     another codec's byte, a wrong output count) are refused with malformed_message or
//     invalid_argument and leave the output untouched.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "compressors/codec_descriptor.h"
#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/fuzz/fuzz_specs.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::CodecDescriptor;
using testing::error_code_of;
using testing::same_bits;
using testing::ScopedIsa;

// Counts that reach the scalar tails, several buckets and the vector loops' main bodies.
constexpr std::size_t kCounts[] = {0, 1, 7, 1000, 65539};

std::vector<const CodecDescriptor*> element_codecs() {
  std::vector<const CodecDescriptor*> rows;
  for (const CodecDescriptor& row : compressors::codec_descriptors())
    if (row.wire) rows.push_back(&row);
  return rows;
}

EncodeContext context_for(std::size_t count, std::uint32_t step = 3) {
  return EncodeContext{0x5EED'0000'0000'0001ull + count, step, 0xABCDu, 0};
}

std::vector<float> input_for(std::size_t count) { return testing::gaussian(count, 1000 + count); }

std::vector<std::byte> encode(const Codec& codec, const std::vector<float>& values,
                              const EncodeContext& ctx) {
  return testing::encode_message(codec, host_view(values.data(), values.size()), ctx);
}

// decode and decode_add both refuse `message` for an output of `count` elements with an error
// (malformed_message, or invalid_argument for an output of the wrong size) and write nothing.
void expect_refused(const Codec& codec, const std::vector<std::byte>& message, std::size_t count,
                    const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<float> out(count, 7.0f), acc(count, 7.0f);
  const ErrorCode decode_error =
      error_code_of([&] { codec.decode(message, host_view(out.data(), out.size())); });
  EXPECT_TRUE(decode_error == ErrorCode::malformed_message ||
              decode_error == ErrorCode::invalid_argument)
      << "decode: error code " << static_cast<int>(decode_error);
  const ErrorCode add_error = error_code_of([&] { codec.decode_add(message, acc.data(), count); });
  EXPECT_TRUE(add_error == ErrorCode::malformed_message || add_error == ErrorCode::invalid_argument)
      << "decode_add: error code " << static_cast<int>(add_error);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }))
      << "decode wrote into its output";
  EXPECT_TRUE(std::all_of(acc.begin(), acc.end(), [](float v) { return v == 7.0f; }))
      << "decode_add wrote into its accumulator";
}

TEST(CodecConformance, RegistryIsCovered) {
  // fuzz_decode's spec index is one byte: the rows' example specs must stay addressable by it.
  EXPECT_LE(fuzz::kFuzzSpecCount, 256u);
  std::set<CodecKind> swept;
  for (const char* text : fuzz::kFuzzSpecs) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    const CodecDescriptor& row = compressors::codec_descriptor(spec.codec);
    EXPECT_TRUE(row.wire.has_value()) << text << ": not an element codec";
    EXPECT_NE(row.error_bound, nullptr) << text;
    EXPECT_NE(row.cosine_estimate, nullptr) << text;
    swept.insert(spec.codec);
  }
  for (const CodecDescriptor* row : element_codecs())
    EXPECT_TRUE(swept.count(row->kind)) << "codec '" << row->name
                                        << "' has no spec in tests/fuzz/fuzz_specs.h";
  // Without an element codec (powersgd) a row says why, and make_codec says it.
  for (const CodecDescriptor& row : compressors::codec_descriptors())
    if (!row.wire) {
      EXPECT_FALSE(row.why_no_element_codec.empty()) << row.name;
    }
}

class ConformanceOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(ConformanceOnEachIsa);

TEST_P(ConformanceOnEachIsa, RoundTripWithinTheRowsBoundsAndCosineFloor) {
  ScopedIsa isa(GetParam());
  for (const char* text : fuzz::kFuzzSpecs) {
    const std::unique_ptr<Codec> codec = make_codec(text);
    const CodecDescriptor& row = compressors::codec_descriptor(codec->spec().codec);
    for (const std::size_t count : kCounts) {
      SCOPED_TRACE(std::string(text) + ", " + std::to_string(count) + " elements");
      const std::vector<float> y = input_for(count);
      const std::vector<std::byte> message = encode(*codec, y, context_for(count));
      ASSERT_LE(message.size(), codec->max_encoded_bytes(count));
      ASSERT_GE(message.size(), compressors::kWireHeaderBytes);
      // The header as every decoder reads it (magic and version checked there).
      const compressors::WireHeader header = compressors::read_header(message, "conformance");
      EXPECT_EQ(header.codec, *row.wire);
      EXPECT_EQ(header.count, count);
      EXPECT_EQ(header.payload_bytes, message.size() - compressors::kWireHeaderBytes);
      const std::vector<float> decoded = testing::decode_to_f32(*codec, message, count);
      double y_max = 0;
      for (const float v : y) y_max = std::max(y_max, std::fabs(static_cast<double>(v)));
      const double bound = row.error_bound(codec->spec(), y_max);
      // The first element that is not finite or errs by more than the bound.
      const auto beyond = std::find_if(decoded.begin(), decoded.end(), [&](const float& v) {
        const std::size_t i = static_cast<std::size_t>(&v - decoded.data());
        return !std::isfinite(v) || std::fabs(static_cast<double>(v) - y[i]) > bound;
      });
      if (beyond != decoded.end()) {
        const std::size_t i = static_cast<std::size_t>(beyond - decoded.begin());
        ADD_FAILURE() << "element " << i << ": decoded " << decoded[i] << ", input " << y[i]
                      << ", bound " << bound;
      }
      if (count < compressors::kCosineMinElementsPerRank) continue;
      const double floor = compressors::allreduce_cosine_floor(row.cosine_estimate(codec->spec(), y), 1);
      const std::vector<double> exact(y.begin(), y.end());
      EXPECT_GT(floor, 0.0);
      EXPECT_GE(compressors::cosine_similarity(decoded, exact), floor);
    }
  }
}

TEST_P(ConformanceOnEachIsa, EncodeIsDeterministicAndEveryIsaWritesTheScalarBytes) {
  const kernels::cpu::Isa isa = GetParam();
  for (const char* text : fuzz::kFuzzSpecs) {
    const std::unique_ptr<Codec> codec = make_codec(text);
    for (const std::size_t count : kCounts) {
      SCOPED_TRACE(std::string(text) + ", " + std::to_string(count) + " elements");
      const std::vector<float> y = input_for(count);
      std::vector<std::byte> scalar_message;
      std::vector<float> scalar_decoded;
      {
        ScopedIsa scalar(kernels::cpu::Isa::scalar);
        scalar_message = encode(*codec, y, context_for(count));
        scalar_decoded = testing::decode_to_f32(*codec, scalar_message, count);
      }
      ScopedIsa forced(isa);
      const std::vector<std::byte> first = encode(*codec, y, context_for(count));
      EXPECT_EQ(first, encode(*codec, y, context_for(count))) << "same context, other bytes";
      EXPECT_EQ(first, scalar_message) << "other bytes than the scalar code's";
      EXPECT_TRUE(same_bits(testing::decode_to_f32(*codec, scalar_message, count), scalar_decoded));
    }
  }
}

TEST_P(ConformanceOnEachIsa, DecodeAddAndSubtractDecodedApplyExactlyTheDecode) {
  ScopedIsa isa(GetParam());
  for (const char* text : fuzz::kFuzzSpecs) {
    const std::unique_ptr<Codec> codec = make_codec(text);
    for (const std::size_t count : kCounts) {
      SCOPED_TRACE(std::string(text) + ", " + std::to_string(count) + " elements");
      const std::vector<float> y = input_for(count);
      const std::vector<std::byte> message = encode(*codec, y, context_for(count));
      const std::vector<float> decoded = testing::decode_to_f32(*codec, message, count);
      const std::vector<float> start = testing::gaussian(count, 77 + count, 0.5f);
      std::vector<float> added = start, expected_sum(count), subtracted = start,
                         expected_difference(count);
      for (std::size_t i = 0; i < count; ++i) {
        expected_sum[i] = start[i] + decoded[i];
        expected_difference[i] = start[i] - decoded[i];
      }
      codec->decode_add(message, added.data(), count);
      EXPECT_TRUE(same_bits(added, expected_sum)) << "decode_add";
      codec->subtract_decoded(message, subtracted.data(), count);
      EXPECT_TRUE(same_bits(subtracted, expected_difference)) << "subtract_decoded";
    }
  }
}

// f16 and bf16 tensors encode to the bytes of their exact f32 widening, and decode into an f16 /
// bf16 output rounds the f32 decode to nearest even (HostTensor's rounding).
TEST_P(ConformanceOnEachIsa, HalfTensorsEncodeLikeTheirWideningAndDecodeRounded) {
  ScopedIsa isa(GetParam());
  for (const char* text : fuzz::kFuzzSpecs) {
    const std::unique_ptr<Codec> codec = make_codec(text);
    for (const DType dtype : {DType::f16, DType::bf16}) {
      for (const std::size_t count : {std::size_t{7}, std::size_t{65539}}) {
        SCOPED_TRACE(std::string(text) + ", " + std::string(dtype_name(dtype)) + ", " +
                     std::to_string(count) + " elements");
        const testing::HostTensor half(dtype, input_for(count));
        const std::vector<float> widened = half.to_f32();
        const std::vector<std::byte> message =
            testing::encode_message(*codec, half.view(), context_for(count));
        EXPECT_EQ(message, encode(*codec, widened, context_for(count)));
        testing::HostTensor out(dtype, count);
        codec->decode(message, out.view());
        const testing::HostTensor expected(dtype, testing::decode_to_f32(*codec, message, count));
        EXPECT_TRUE(same_bits(out.to_f32(), expected.to_f32()));
      }
    }
  }
}

TEST(CodecConformance, MalformedMessagesAreRefusedWithTheOutputUntouched) {
  // Another element codec's byte, for the "codec byte of another codec" case.
  const std::vector<const CodecDescriptor*> rows = element_codecs();
  for (const char* text : fuzz::kFuzzSpecs) {
    const std::unique_ptr<Codec> codec = make_codec(text);
    const CodecDescriptor& row = compressors::codec_descriptor(codec->spec().codec);
    const std::size_t count = 1000;
    SCOPED_TRACE(text);
    const std::vector<std::byte> message = encode(*codec, input_for(count), context_for(count));
    for (std::size_t length = 0; length < compressors::kWireHeaderBytes; ++length)
      expect_refused(*codec, std::vector<std::byte>(message.begin(), message.begin() + length),
                     count, "header cut to " + std::to_string(length) + " bytes");
    expect_refused(*codec, std::vector<std::byte>(message.begin(), message.end() - 1), count,
                   "payload one byte short");
    std::vector<std::byte> longer = message;
    longer.push_back(std::byte{0});
    expect_refused(*codec, longer, count, "one trailing byte");
    expect_refused(*codec, testing::with_byte(message, 0, 0x00), count, "bad magic");
    expect_refused(*codec, testing::with_byte(message, 4, 0xEE), count, "unknown version");
    for (const CodecDescriptor* other : rows) {
      if (other->kind == row.kind) continue;
      expect_refused(*codec, testing::with_byte(message, 5, static_cast<std::uint8_t>(*other->wire)),
                     count, std::string("codec byte of ") + std::string(other->name));
    }
    expect_refused(*codec, message, count + 1, "an output one element longer");
    expect_refused(*codec, message, count - 1, "an output one element shorter");
  }
}

}  // namespace
}  // namespace gradzip
