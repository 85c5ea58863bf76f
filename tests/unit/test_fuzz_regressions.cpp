// Fuzzing (tests/fuzz/, scripts/fuzz.sh) in the ordinary unit-test build:
//   - the checked-in seed corpora are what tests/fuzz/fuzz_specs.h says they are: every decode
//     seed is a valid message of its spec and count (decode succeeds under the forced ISA), and
//     every wire-header seed passes read_header;
//   - each decode seed cut short by one byte, or grown by one, is refused with
//     malformed_message and leaves the output untouched (the contract fuzz_decode checks on
//     random bytes);
//   - inputs on which a fuzz target once crashed: decoding them must throw malformed_message.
//     Add each new crash here as {spec index, count, message bytes}.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/fuzz/fuzz_specs.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using fuzz::kFuzzDecodePrefixBytes;
using fuzz::kFuzzSpecCount;
using fuzz::kFuzzSpecs;
using testing::error_code_of;

const std::filesystem::path kCorpus =
    std::filesystem::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus";

std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// A fuzz_decode input split into its fields (tests/fuzz/fuzz_specs.h).
struct DecodeInput {
  std::size_t spec = 0;
  std::size_t count = 0;
  kernels::cpu::Isa isa = kernels::cpu::Isa::scalar;
  std::vector<std::byte> message;
};

DecodeInput split(const std::vector<std::byte>& input) {
  DecodeInput split;
  split.spec = std::to_integer<std::size_t>(input.at(0)) % kFuzzSpecCount;
  split.count = (std::to_integer<std::size_t>(input.at(1)) |
                 (std::to_integer<std::size_t>(input.at(2)) << 8)) % (fuzz::kFuzzMaxCount + 1);
  split.isa = static_cast<kernels::cpu::Isa>(std::to_integer<int>(input.at(3)) % 3);
  split.message.assign(input.begin() + kFuzzDecodePrefixBytes, input.end());
  return split;
}

// Decodes `message` into a sentinel-filled f32 output; returns the error code (internal when
// it succeeded) and fails when a throwing decode changed the output.
ErrorCode decode_error(const Codec& codec, const std::vector<std::byte>& message, std::size_t count) {
  std::vector<float> out(count, -7.25f);
  try {
    codec.decode(message, host_view(out.data(), count));
  } catch (const Error& error) {
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == -7.25f; }))
        << "a refused message changed the output";
    return error.code();
  }
  return ErrorCode::internal;
}

TEST(FuzzSeedCorpus, DecodeSeedsAreValidMessages) {
  const auto files = files_in(kCorpus / "decode");
  // write_seed_corpus writes six counts per spec.
  ASSERT_EQ(files.size(), 6 * kFuzzSpecCount) << "corpus folder " << kCorpus / "decode";
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    const DecodeInput input = split(read_bytes(path));
    const auto codec = make_codec(kFuzzSpecs[input.spec]);
    testing::ScopedIsa isa(input.isa);
    std::vector<float> out(input.count);
    EXPECT_NO_THROW(codec->decode(input.message, host_view(out.data(), input.count)));
  }
}

TEST(FuzzSeedCorpus, WireHeaderSeedsParse) {
  const auto files = files_in(kCorpus / "wire_header");
  // Counts 0 and 7 of every spec.
  ASSERT_EQ(files.size(), 2 * kFuzzSpecCount) << "corpus folder " << kCorpus / "wire_header";
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    const auto message = read_bytes(path);
    const auto header = compressors::read_header(message, "test");
    EXPECT_TRUE(header.count == 0 || header.count == 7) << header.count;
  }
}

TEST(FuzzSeedCorpus, SeedsOneByteShortOrLongAreMalformed) {
  const auto files = files_in(kCorpus / "decode");
  ASSERT_FALSE(files.empty());
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    DecodeInput input = split(read_bytes(path));
    const auto codec = make_codec(kFuzzSpecs[input.spec]);
    auto longer = input.message;
    longer.push_back(std::byte{0});
    EXPECT_EQ(decode_error(*codec, longer, input.count), ErrorCode::malformed_message);
    input.message.pop_back();
    EXPECT_EQ(decode_error(*codec, input.message, input.count), ErrorCode::malformed_message);
  }
}

// Inputs a fuzz target crashed on (none found so far: scripts/fuzz.sh ran fuzz_decode and
// fuzz_wire_header clean). Each entry: the spec index into kFuzzSpecs, the output count, and
// the message as hex.
struct Regression {
  std::size_t spec;
  std::size_t count;
  const char* message_hex;
};
constexpr Regression kRegressions[] = {
    // A truncated qsgd message (header only) stands as the template for future entries.
    {10, 3, "4744 5a50 0104 0008 0300000000000000 0000000000000000 0002000000000000"},
};

std::vector<std::byte> from_hex(const char* hex) {
  std::vector<std::byte> bytes;
  int high = -1;
  for (const char* p = hex; *p != '\0'; ++p) {
    const char c = *p;
    int nibble;
    if (c >= '0' && c <= '9') nibble = c - '0';
    else if (c >= 'a' && c <= 'f') nibble = c - 'a' + 10;
    else continue;
    if (high < 0) {
      high = nibble;
    } else {
      bytes.push_back(static_cast<std::byte>(high * 16 + nibble));
      high = -1;
    }
  }
  return bytes;
}

TEST(FuzzRegressions, CrashInputsAreMalformed) {
  for (const Regression& regression : kRegressions) {
    SCOPED_TRACE(kFuzzSpecs[regression.spec]);
    const auto codec = make_codec(kFuzzSpecs[regression.spec]);
    const auto message = from_hex(regression.message_hex);
    EXPECT_EQ(decode_error(*codec, message, regression.count), ErrorCode::malformed_message);
    std::vector<float> acc(regression.count, 1.0f);
    EXPECT_EQ(error_code_of([&] { codec->decode_add(message, acc.data(), acc.size()); }),
              ErrorCode::malformed_message);
  }
}

}  // namespace
}  // namespace gradzip
