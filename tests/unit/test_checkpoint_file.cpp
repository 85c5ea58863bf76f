// error_feedback/checkpoint_file.h on its own: a written file reads back exactly, and what the
// format cannot hold (unsorted or empty tensor names, empty counter names) is refused before
// anything is written. The layout byte by byte, every truncation and every flipped byte are
// tested through ResidualStore in test_error_feedback.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "error_feedback/checkpoint_file.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip::error_feedback {
namespace {

std::filesystem::path scratch_path(const std::string& name) {
  const auto directory = std::filesystem::temp_directory_path() / "gradzip-test-checkpoint-file";
  std::filesystem::create_directories(directory);
  const auto path = directory / name;
  std::filesystem::remove(path);
  return path;
}

TEST(CheckpointFile, WhatIsWrittenReadsBackExactly) {
  const std::vector<float> a{1.5f, -0.0f, INFINITY, 3e-40f};
  const std::vector<float> empty;
  const std::vector<float> b{7.0f};
  const std::vector<CheckpointTensor> tensors{{"a", a}, {"b/empty", empty}, {"c", b}};
  const CheckpointCounters counters{{"a", 7}, {"step", std::uint64_t{1} << 63}};
  const auto path = scratch_path("round-trip");
  write_checkpoint_file(path, 4, 3, tensors, counters);

  const CheckpointContents contents = read_checkpoint_file(path);
  EXPECT_EQ(contents.world_size, 4u);
  EXPECT_EQ(contents.rank, 3u);
  ASSERT_EQ(contents.tensors.size(), 3u);
  EXPECT_TRUE(testing::same_bits(contents.tensors.at("a"), a));
  EXPECT_TRUE(contents.tensors.at("b/empty").empty());
  EXPECT_TRUE(testing::same_bits(contents.tensors.at("c"), b));
  EXPECT_EQ(contents.counters, counters);
  // 24 header bytes, three records (4 + name + 8 + 4 values each), 8 + two counters, checksum.
  EXPECT_EQ(std::filesystem::file_size(path),
            24u + (4 + 1 + 8 + 16) + (4 + 7 + 8) + (4 + 1 + 8 + 4) + 8 + (4 + 1 + 8) +
                (4 + 4 + 8) + 8);
}

TEST(CheckpointFile, NamesTheFormatCannotHoldAreRefusedBeforeWriting) {
  const std::vector<float> values{1.0f};
  const auto path = scratch_path("refused");
  struct Case {
    std::vector<CheckpointTensor> tensors;
    CheckpointCounters counters;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{{"b", values}, {"a", values}}, {}, "tensor 1 is named 'a' after 'b'"},
      {{{"a", values}, {"a", values}}, {}, "tensor 1 is named 'a' after 'a'"},
      {{{"", values}}, {}, "tensor 0 is named ''"},
      {{{"a", values}}, {{"", 1}}, "a counter name of 0 bytes"},
  };
  for (const Case& c : cases) {
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { write_checkpoint_file(path, 1, 0, c.tensors, c.counters); },
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
