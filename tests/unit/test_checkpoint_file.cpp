// error_feedback/checkpoint_file.h on its own, format version 3: the layout byte by byte, every
// section read back exactly, every truncation and every flipped byte refused, each malformed
// field refused naming it, and what the format cannot hold refused before anything is written.
// Files of versions 1 and 2 are tested through ResidualStore in test_error_feedback.cpp and
// through the typed checkpoints in test_checkpoint.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "error_feedback/checkpoint_file.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip::error_feedback {
namespace {

using testing::append_le;
using testing::append_name;
using testing::put_le;

std::filesystem::path scratch_path(const std::string& name) {
  const auto directory = std::filesystem::temp_directory_path() / "gradzip-test-checkpoint-file";
  std::filesystem::create_directories(directory);
  const auto path = directory / name;
  std::filesystem::remove(path);
  return path;
}

constexpr std::uint32_t kWorld = 4;
constexpr std::uint32_t kRank = 3;
const std::vector<float> kLane0Values{1.5f, -0.0f};
const std::vector<float> kLane2Values{7.0f};
constexpr SavedLink kLink{12e-6, 3.5e9, 1.75e9, 40e-6};
constexpr SavedLink kIntra{1e-6, 20e9, 0, 2e-6};
constexpr SavedLink kAcross{30e-6, 1e9, 0.5e9, 60e-6};
constexpr SavedCodecCost kSignCost{1.5e-9, 0.25e-9, 0.125e-9};

// The tensors of the reference file: "a" in lanes 0 and 2.
std::vector<CheckpointTensorView> reference_tensors() {
  return {{0, "a", kLane0Values}, {2, "a", kLane2Values}};
}

// Every section of the reference file: a call number, a step, a link, nodes of ranks that
// share memory (detected size 4) and nodes of 2, a codec cost.
CheckpointOwnerState reference_owner_state() {
  CheckpointOwnerState state;
  state.call_numbers = {{"a", 9}};
  state.step = 17;
  state.model_inputs.link = kLink;
  state.model_inputs.hierarchies = {{0, SavedHierarchy{4, kIntra, kAcross}},
                                    {2, SavedHierarchy{2, kIntra, kAcross}}};
  state.model_inputs.codec_costs = {{"sign:bucket=512", kSignCost}};
  return state;
}

void append_link(std::vector<unsigned char>& bytes, const SavedLink& link) {
  for (const double term : {link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s,
                            link.collective_latency_s})
    append_le<double>(bytes, term);
}

// The reference file as the header comment of checkpoint_file.h lays it out, field by field,
// with the offsets of the fields the refusal tests edit.
struct ReferenceFile {
  std::vector<unsigned char> bytes;
  std::map<std::string, std::size_t, std::less<>> offset_of;
};

ReferenceFile reference_file() {
  ReferenceFile file;
  std::vector<unsigned char>& b = file.bytes;
  const auto mark = [&](const std::string& field) { file.offset_of[field] = b.size(); };
  b = {'G', 'Z', 'E', 'F'};
  append_le<std::uint32_t>(b, 3);  // version
  append_le<std::uint32_t>(b, kWorld);
  append_le<std::uint32_t>(b, kRank);
  mark("tensor count");
  append_le<std::uint64_t>(b, 2);
  mark("first tensor lane");
  append_le<std::uint32_t>(b, 0);
  mark("first tensor name length");
  append_name(b, "a");
  append_le<std::uint64_t>(b, 2);
  append_le<float>(b, 1.5f);
  append_le<float>(b, -0.0f);
  mark("second tensor lane");
  append_le<std::uint32_t>(b, 2);
  append_name(b, "a");
  append_le<std::uint64_t>(b, 1);
  append_le<float>(b, 7.0f);
  mark("call number count");
  append_le<std::uint64_t>(b, 1);
  append_name(b, "a");
  append_le<std::uint64_t>(b, 9);
  mark("step present");
  append_le<std::uint8_t>(b, 1);
  mark("step");
  append_le<std::uint64_t>(b, 17);
  mark("link present");
  append_le<std::uint8_t>(b, 1);
  mark("link");
  append_link(b, kLink);
  mark("node structure count");
  append_le<std::uint32_t>(b, 2);
  mark("first ranks_per_node");
  append_le<std::uint32_t>(b, 0);
  mark("first node size");
  append_le<std::uint32_t>(b, 4);
  append_link(b, kIntra);
  append_link(b, kAcross);
  mark("second ranks_per_node");
  append_le<std::uint32_t>(b, 2);
  mark("second node size");
  append_le<std::uint32_t>(b, 2);
  append_link(b, kIntra);
  append_link(b, kAcross);
  mark("codec cost count");
  append_le<std::uint32_t>(b, 1);
  append_name(b, "sign:bucket=512");
  mark("codec cost terms");
  append_le<double>(b, kSignCost.encode_s);
  append_le<double>(b, kSignCost.decode_add_s);
  append_le<double>(b, kSignCost.add_s);
  mark("checksum");
  append_le<std::uint64_t>(b, testing::fnv1a64_reference(b.data(), b.size()));
  return file;
}

// `call` must throw `code` with a message that names the path and contains `expected`.
void expect_refusal(const std::function<void()>& call, ErrorCode code,
                    const std::filesystem::path& path, const std::string& expected) {
  std::string message;
  EXPECT_EQ(testing::error_code_of(call, &message), code) << message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << "expected '" << expected << "' in: " << message;
}

TEST(CheckpointFile, TheLayoutIsTheDocumentedOneByteByByte) {
  const auto path = scratch_path("layout");
  write_checkpoint_file(path, kWorld, kRank, reference_tensors(), reference_owner_state());
  const ReferenceFile expected = reference_file();
  EXPECT_EQ(testing::read_file_bytes(path), expected.bytes);
  // 24 header bytes, two tensors (4 + 4 + 1 + 8 + values), 8 + one call number (4 + 1 + 8),
  // 9 of step, 33 of link, 4 + two node structures of 72, 4 + one codec cost (4 + 15 + 24), 8.
  EXPECT_EQ(expected.bytes.size(), 24u + (17 + 8) + (17 + 4) + 8 + 13 + 9 + 33 + 4 + 2 * 72 + 4 +
                                       (4 + 15 + 24) + 8);
}

TEST(CheckpointFile, EverySectionReadsBackExactly) {
  const auto path = scratch_path("round-trip");
  const std::vector<float> special{1.5f, -0.0f, INFINITY, 3e-40f};
  const std::vector<float> empty;
  const std::vector<CheckpointTensorView> tensors{
      {0, "a", special}, {0, "b/empty", empty}, {2, "a", kLane2Values}};
  write_checkpoint_file(path, kWorld, kRank, tensors, reference_owner_state());

  const CheckpointContents contents = read_checkpoint_file(path);
  EXPECT_EQ(contents.format_version, 3u);
  EXPECT_EQ(contents.world_size, kWorld);
  EXPECT_EQ(contents.rank, kRank);
  ASSERT_EQ(contents.tensors.size(), 3u);
  EXPECT_TRUE(testing::same_bits(contents.tensors.at({0, "a"}), special));
  EXPECT_TRUE(contents.tensors.at({0, "b/empty"}).empty());
  EXPECT_TRUE(testing::same_bits(contents.tensors.at({2, "a"}), kLane2Values));
  EXPECT_EQ(contents.owner_state, reference_owner_state());
  EXPECT_EQ(contents.owner_state.model_inputs.hierarchies.at(0).node_size, 4u);
  EXPECT_TRUE(contents.version2_counters.empty());

  // Absent step and link, no node structures or codec costs: absent again.
  CheckpointOwnerState sparse;
  sparse.call_numbers = {{"x", std::uint64_t{1} << 63}};
  write_checkpoint_file(path, 1, 0, {}, sparse);
  const CheckpointContents back = read_checkpoint_file(path);
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_EQ(back.owner_state, sparse);
  EXPECT_FALSE(back.owner_state.step.has_value());
  EXPECT_FALSE(back.owner_state.model_inputs.link.has_value());
  // A step of 0 is present, not absent.
  sparse.step = 0;
  write_checkpoint_file(path, 1, 0, {}, sparse);
  EXPECT_EQ(read_checkpoint_file(path).owner_state.step, std::optional<std::uint64_t>(0));
}

TEST(CheckpointFile, EveryTruncationIsRefused) {
  const auto path = scratch_path("truncated");
  const std::vector<unsigned char> good = reference_file().bytes;
  for (std::size_t length = 0; length < good.size(); ++length) {
    SCOPED_TRACE(length);
    testing::write_file_bytes(path, std::vector<unsigned char>(good.begin(), good.begin() + length));
    expect_refusal([&] { read_checkpoint_file(path); }, ErrorCode::io_error, path, "");
  }
}

TEST(CheckpointFile, EveryFlippedByteIsRefused) {
  const auto path = scratch_path("flipped");
  const std::vector<unsigned char> good = reference_file().bytes;
  for (std::size_t offset = 0; offset < good.size(); ++offset) {
    SCOPED_TRACE(offset);
    auto bytes = good;
    bytes[offset] ^= 0x01;
    testing::write_file_bytes(path, bytes);
    // The version's low byte flips 3 to 2, a version this build reads (the bytes are then a
    // corrupt version 2 file); its other bytes make a version it does not read.
    const bool unknown_version = offset > 4 && offset < 8;
    expect_refusal([&] { read_checkpoint_file(path); },
                   unknown_version ? ErrorCode::invalid_argument : ErrorCode::io_error, path,
                   unknown_version ? "format version" : "");
  }
  // A flipped value or checksum byte: only the checksum can tell.
  for (const std::size_t offset : {reference_file().offset_of.at("codec cost terms"), good.size() - 1}) {
    auto bytes = good;
    bytes[offset] ^= 0x80;
    testing::write_file_bytes(path, bytes);
    expect_refusal([&] { read_checkpoint_file(path); }, ErrorCode::io_error, path, "checksum mismatch");
  }
}

TEST(CheckpointFile, EachMalformedFieldIsRefusedNamingIt) {
  const auto path = scratch_path("malformed");
  const ReferenceFile reference = reference_file();
  const auto at = [&](std::string_view field) { return reference.offset_of.find(field)->second; };
  struct Case {
    std::string what;
    std::function<void(std::vector<unsigned char>&)> edit;
    std::string expected;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      {"tensors unsorted by lane",
       [&](auto& b) { put_le<std::uint32_t>(b, at("first tensor lane"), 3); },
       "tensor 'a' of lane 2 does not follow tensor 'a' of lane 3 in strictly increasing (lane, "
       "name) order"},
      {"the same tensor twice",
       [&](auto& b) { put_le<std::uint32_t>(b, at("second tensor lane"), 0); },
       "tensor 'a' of lane 0 does not follow tensor 'a' of lane 0"},
      {"an empty tensor name",
       [&](auto& b) { put_le<std::uint32_t>(b, at("first tensor name length"), 0); },
       "tensor 0 has a name length of 0"},
      {"a name longer than the file",
       [&](auto& b) { put_le<std::uint32_t>(b, at("first tensor name length"), 0xFFFFFFFFu); },
       "tensor 0 has a name length of 4294967295"},
      {"a tensor count beyond the file",
       [&](auto& b) { put_le<std::uint64_t>(b, at("tensor count"), ~std::uint64_t{0}); },
       "18446744073709551615 tensors cannot fit"},
      {"a call number count beyond the file",
       [&](auto& b) { put_le<std::uint64_t>(b, at("call number count"), std::uint64_t{1} << 40); },
       "1099511627776 call numbers cannot fit"},
      {"step present byte 2", [&](auto& b) { b[at("step present")] = 2; },
       "the step's present byte is 2"},
      {"an absent step that is not 0", [&](auto& b) { b[at("step present")] = 0; },
       "the absent step holds 17 (must be 0)"},
      {"link present byte 2", [&](auto& b) { b[at("link present")] = 2; },
       "the link's present byte is 2"},
      {"an absent link that is not 0", [&](auto& b) { b[at("link present")] = 0; },
       "the absent link's terms are not all 0"},
      {"a NaN latency", [&](auto& b) { put_le<double>(b, at("link"), nan); },
       "link.latency_s = nan (must be finite and >= 0)"},
      {"a negative latency", [&](auto& b) { put_le<double>(b, at("link"), -1.0); },
       "link.latency_s = -1 (must be finite and >= 0)"},
      {"an infinite rate", [&](auto& b) { put_le<double>(b, at("link") + 8, INFINITY); },
       "link.bytes_per_s = inf (must be finite and >= 0)"},
      {"a rate of 0", [&](auto& b) { put_le<double>(b, at("link") + 8, 0.0); },
       "link.bytes_per_s = 0 (must be > 0)"},
      {"a node structure count beyond the file",
       [&](auto& b) { put_le<std::uint32_t>(b, at("node structure count"), 0xFFFFFFFFu); },
       "4294967295 node structures cannot fit"},
      {"node size 1 for ranks that share memory",
       [&](auto& b) { put_le<std::uint32_t>(b, at("first node size"), 1); },
       "node structure 0 (ranks that share memory): node size = 1 (must be the detected size, 2 "
       "to 2147483647)"},
      {"a node size other than ranks_per_node",
       [&](auto& b) { put_le<std::uint32_t>(b, at("second node size"), 3); },
       "node structure 2: node size = 3 (must equal its ranks_per_node)"},
      {"ranks_per_node 1",
       [&](auto& b) {
         put_le<std::uint32_t>(b, at("second ranks_per_node"), 1);
         put_le<std::uint32_t>(b, at("second node size"), 1);
       },
       "node structure 1: ranks_per_node = 1 (must be 0 or 2 to 2147483647)"},
      {"node structures unsorted",
       [&](auto& b) {
         put_le<std::uint32_t>(b, at("first ranks_per_node"), 2);
         put_le<std::uint32_t>(b, at("first node size"), 2);
       },
       "node structure 2 does not follow node structure 2 in strictly increasing ranks_per_node "
       "order"},
      {"a negative intra term",
       [&](auto& b) { put_le<double>(b, at("first node size") + 4 + 16, -0.5); },
       "node structure 0 intra.exchange_bytes_per_s = -0.5 (must be finite and >= 0)"},
      {"a NaN codec cost", [&](auto& b) { put_le<double>(b, at("codec cost terms") + 16, nan); },
       "codec cost 'sign:bucket=512'.add_s = nan (must be finite and >= 0)"},
      {"a codec cost count beyond the file",
       [&](auto& b) { put_le<std::uint32_t>(b, at("codec cost count"), 2); },
       "2 codec costs cannot fit"},
      {"trailing bytes",
       [&](auto& b) { b.insert(b.begin() + static_cast<std::ptrdiff_t>(at("checksum")), {0, 0, 0}); },
       "3 unexpected bytes between the last record"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto bytes = reference.bytes;
    c.edit(bytes);
    testing::rehash_checkpoint(bytes);
    testing::write_file_bytes(path, bytes);
    expect_refusal([&] { read_checkpoint_file(path); }, ErrorCode::io_error, path, c.expected);
  }
  // The control: the unedited bytes load.
  testing::write_file_bytes(path, reference.bytes);
  EXPECT_EQ(read_checkpoint_file(path).owner_state, reference_owner_state());
}

TEST(CheckpointFile, WhatTheFormatCannotHoldIsRefusedBeforeWriting) {
  const std::vector<float> values{1.0f};
  const auto path = scratch_path("refused");
  struct Case {
    std::vector<CheckpointTensorView> tensors;
    CheckpointOwnerState state;
    const char* expected;
  };
  CheckpointOwnerState empty_call_number;
  empty_call_number.call_numbers = {{"", 1}};
  CheckpointOwnerState nan_link;
  nan_link.model_inputs.link = SavedLink{NAN, 1e9, 0, 0};
  CheckpointOwnerState no_rate;
  no_rate.model_inputs.link = SavedLink{1e-6, 0, 0, 0};
  CheckpointOwnerState lone_node;
  lone_node.model_inputs.hierarchies = {{0, SavedHierarchy{1, kIntra, kAcross}}};
  CheckpointOwnerState negative_cost;
  negative_cost.model_inputs.codec_costs = {{"fp16", SavedCodecCost{1e-9, -1e-9, 0}}};
  CheckpointOwnerState unnamed_cost;
  unnamed_cost.model_inputs.codec_costs = {{"", kSignCost}};
  const std::vector<Case> cases = {
      {{{0, "b", values}, {0, "a", values}}, {}, "tensor 1 is named 'a' in lane 0 after 'b' in lane 0"},
      {{{2, "a", values}, {1, "b", values}}, {}, "tensor 1 is named 'b' in lane 1 after 'a' in lane 2"},
      {{{0, "a", values}, {0, "a", values}}, {}, "tensor 1 is named 'a' in lane 0 after 'a' in lane 0"},
      {{{0, "", values}}, {}, "tensor 0 is named '' in lane 0"},
      {{}, empty_call_number, "a call number's tensor name of 0 bytes"},
      {{}, nan_link, "link.latency_s = nan (must be finite and >= 0)"},
      {{}, no_rate, "link.bytes_per_s = 0 (must be > 0)"},
      {{}, lone_node, "node structure 0 (ranks that share memory): node size = 1"},
      {{}, negative_cost, "codec cost 'fp16'.decode_add_s = -1e-09 (must be finite and >= 0)"},
      {{}, unnamed_cost, "codec cost '': an empty spec"},
  };
  for (const Case& c : cases) {
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { write_checkpoint_file(path, 1, 0, c.tensors, c.state); },
                                     &message),
              ErrorCode::invalid_argument);
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    EXPECT_FALSE(std::filesystem::exists(path)) << c.expected;
  }
  // Nothing left beside the target either (no temporary file).
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path())) {
    EXPECT_EQ(entry.path().filename().string().find("refused.tmp"), std::string::npos)
        << entry.path();
  }
}

}  // namespace
}  // namespace gradzip::error_feedback
