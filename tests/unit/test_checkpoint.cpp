// collectives/checkpoint.h: the typed checkpoints go through the file and come back equal; the
// layout in the file is the documented one (so files of earlier builds keep loading); malformed
// entries are refused naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "collectives/checkpoint.h"
#include "error_feedback/residual_store.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip::collectives {
namespace {

using error_feedback::ResidualStore;
using gradzip::testing::error_code_of;

std::string temporary_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("gradzip_test_checkpoint_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void fill(ResidualStore& store, const std::string& key, std::vector<float> values) {
  const std::span<float> target = store.residual(key, values.size());
  std::copy(values.begin(), values.end(), target.begin());
}

AutoModelInputs some_inputs() {
  AutoModelInputs inputs;
  inputs.link = LinkModel{12e-6, 3.5e9, 1.75e9, 40e-6};
  AutoHierarchy pairs;
  pairs.nodes.ranks_per_node = 2;
  pairs.nodes.intra = LinkModel{1e-6, 20e9, 0, 2e-6};
  pairs.across = LinkModel{30e-6, 1e9, 0.5e9, 60e-6};
  inputs.hierarchies.emplace(2, pairs);
  AutoHierarchy shared = pairs;
  shared.nodes.ranks_per_node = 4;  // detected
  shared.shared_memory = true;
  inputs.hierarchies.emplace(0, shared);
  inputs.codec_costs.emplace("sign:bucket=512", CodecCost{1.5e-9, 0.25e-9, 0.125e-9});
  return inputs;
}

void expect_same_link(const LinkModel& a, const LinkModel& b) {
  EXPECT_EQ(a.latency_s, b.latency_s);
  EXPECT_EQ(a.bytes_per_s, b.bytes_per_s);
  EXPECT_EQ(a.exchange_bytes_per_s, b.exchange_bytes_per_s);
  EXPECT_EQ(a.collective_latency_s, b.collective_latency_s);
}

void expect_same_inputs(const AutoModelInputs& a, const AutoModelInputs& b) {
  ASSERT_EQ(a.link.has_value(), b.link.has_value());
  if (a.link) expect_same_link(*a.link, *b.link);
  ASSERT_EQ(a.hierarchies.size(), b.hierarchies.size());
  for (const auto& [ranks_per_node, hierarchy] : a.hierarchies) {
    SCOPED_TRACE(ranks_per_node);
    const AutoHierarchy& other = b.hierarchies.at(ranks_per_node);
    EXPECT_EQ(hierarchy.nodes.ranks_per_node, other.nodes.ranks_per_node);
    EXPECT_EQ(hierarchy.shared_memory, other.shared_memory);
    expect_same_link(hierarchy.nodes.intra, other.nodes.intra);
    expect_same_link(hierarchy.across, other.across);
  }
  ASSERT_EQ(a.codec_costs.size(), b.codec_costs.size());
  for (const auto& [spec, cost] : a.codec_costs) {
    const CodecCost& other = b.codec_costs.at(spec);
    EXPECT_EQ(cost.encode_s, other.encode_s);
    EXPECT_EQ(cost.decode_add_s, other.decode_add_s);
    EXPECT_EQ(cost.add_s, other.add_s);
  }
}

TEST(Checkpoint, ModelInputsAreTheDocumentedCounters) {
  ResidualStore::Counters counters;
  put_auto_model(some_inputs(), counters);
  // The layout of checkpoint.h: 4 link terms, 2 x 2 x 4 node links, hier/0's detected size,
  // 3 gamma terms; each a double's bits.
  EXPECT_EQ(counters.size(), 4u + 16u + 1u + 3u);
  EXPECT_EQ(std::bit_cast<double>(counters.at("gradzip.auto/link/bytes_per_s")), 3.5e9);
  EXPECT_EQ(std::bit_cast<double>(counters.at("gradzip.auto/hier/2/across/latency_s")), 30e-6);
  EXPECT_EQ(std::bit_cast<double>(counters.at("gradzip.auto/hier/0/ranks_per_node")), 4.0);
  EXPECT_EQ(std::bit_cast<double>(counters.at("gradzip.auto/gamma/sign:bucket=512/add_s")), 0.125e-9);
  expect_same_inputs(get_auto_model(counters, "test"), some_inputs());
}

TEST(Checkpoint, MergeTakesTheOthersInputsWhereBothHaveOne) {
  AutoModelInputs mine;
  mine.codec_costs.emplace("fp16", CodecCost{1, 1, 1});
  mine.codec_costs.emplace("sign:bucket=512", CodecCost{9, 9, 9});
  mine.merge(some_inputs());
  ASSERT_TRUE(mine.link.has_value());
  EXPECT_EQ(mine.link->latency_s, 12e-6);
  EXPECT_EQ(mine.codec_costs.size(), 2u);
  EXPECT_EQ(mine.codec_costs.at("fp16").encode_s, 1.0) << "kept: the other has none";
  EXPECT_EQ(mine.codec_costs.at("sign:bucket=512").encode_s, 1.5e-9) << "the other's wins";
  EXPECT_EQ(mine.hierarchies.size(), 2u);
}

TEST(Checkpoint, ACommunicatorCheckpointComesBackWhole) {
  const std::string path = temporary_path("communicator");
  ResidualStore saved(4, 1, ResizePolicy::error);
  fill(saved, "layer.w", {0.5f, -1.25f, 3.0f});
  fill(saved, "sra-server:layer.w", {2.0f});
  CommunicatorCheckpoint rest;
  rest.call_numbers = {{"layer.w", 7}, {"layer.b", 0}};
  rest.auto_model = some_inputs();
  save_communicator_checkpoint(path, saved, rest);

  ResidualStore loaded(4, 1, ResizePolicy::error);
  const CommunicatorCheckpoint back = load_communicator_checkpoint(path, loaded);
  EXPECT_EQ(back.call_numbers, rest.call_numbers);
  expect_same_inputs(back.auto_model, rest.auto_model);
  ASSERT_EQ(loaded.names(), saved.names());
  const std::span<const float> w = loaded.residual("layer.w");
  EXPECT_EQ(std::vector<float>(w.begin(), w.end()), (std::vector<float>{0.5f, -1.25f, 3.0f}));
  std::filesystem::remove(path);
}

TEST(Checkpoint, ACallNumberBeyond32BitsIsRefused) {
  const std::string path = temporary_path("call_number");
  ResidualStore store(1, 0, ResizePolicy::error);
  store.save(path, {{"x", std::uint64_t{1} << 32}});
  ResidualStore into(1, 0, ResizePolicy::error);
  std::string message;
  EXPECT_EQ(error_code_of([&] { load_communicator_checkpoint(path, into); }, &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("'x' the call number 4294967296"), std::string::npos) << message;
  std::filesystem::remove(path);
}

TEST(Checkpoint, AReducerCheckpointKeepsEachLanesResiduals) {
  const std::string path = temporary_path("reducer");
  ResidualStore lane0(2, 0, ResizePolicy::error), lane1(2, 0, ResizePolicy::error);
  fill(lane0, "bucket0/group0/chunk0", {1.0f, 2.0f});
  fill(lane1, "bucket0/group0/chunk0", {-3.0f});  // the same key on another lane
  fill(lane1, "bucket1/group0/chunk0", {4.0f, 5.0f, 6.0f});
  const ResidualStore* lanes[] = {&lane0, &lane1};
  save_reducer_checkpoint(path, 2, 0, lanes, some_inputs(), 17);

  // The file's own entries: "lane<l>|<key>" and the counter "step".
  ResidualStore raw(2, 0, ResizePolicy::error);
  ResidualStore::Counters counters;
  raw.load(path, &counters);
  EXPECT_EQ(raw.names(), (std::vector<std::string>{"lane0|bucket0/group0/chunk0",
                                                   "lane1|bucket0/group0/chunk0",
                                                   "lane1|bucket1/group0/chunk0"}));
  EXPECT_EQ(counters.at("step"), 17u);

  const ReducerCheckpoint back = load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state");
  ASSERT_EQ(back.lane_residuals.size(), 2u);
  EXPECT_EQ(back.lane_residuals[0].at("bucket0/group0/chunk0"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(back.lane_residuals[1].at("bucket0/group0/chunk0"), (std::vector<float>{-3.0f}));
  EXPECT_EQ(back.lane_residuals[1].at("bucket1/group0/chunk0"), (std::vector<float>{4.0f, 5.0f, 6.0f}));
  ASSERT_TRUE(back.step.has_value());
  EXPECT_EQ(*back.step, 17u);
  expect_same_inputs(back.auto_model, some_inputs());

  // Fewer lanes than the file uses: refused, naming the entry.
  std::string message;
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 1, "Reducer::load_state"); },
                          &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("entry 'lane1|bucket0/group0/chunk0'"), std::string::npos) << message;

  // A Communicator's checkpoint (call numbers as counters) is not a Reducer's: refused.
  ResidualStore communicator_store(2, 0, ResizePolicy::error);
  save_communicator_checkpoint(path, communicator_store, CommunicatorCheckpoint{{{"layer.w", 3}}, {}});
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("the counter 'layer.w' = 3"), std::string::npos) << message;
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gradzip::collectives
