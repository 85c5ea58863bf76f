// collectives/checkpoint.h: the typed checkpoints go through the file and come back equal; the
// model inputs map onto the file's typed sections; files of format versions 1 and 2 (written
// here as earlier builds wrote them) load to the checkpoints they always loaded to; malformed
// or foreign entries are refused naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/checkpoint.h"
#include "error_feedback/checkpoint_file.h"
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

TEST(Checkpoint, ModelInputsMapOntoTheFilesTypesAndBack) {
  const error_feedback::CheckpointModelInputs saved = to_checkpoint_model_inputs(some_inputs());
  ASSERT_TRUE(saved.link.has_value());
  EXPECT_EQ(*saved.link, (error_feedback::SavedLink{12e-6, 3.5e9, 1.75e9, 40e-6}));
  ASSERT_EQ(saved.hierarchies.size(), 2u);
  // Under the spec's ranks_per_node: 0 keeps the detected size, 2 its own.
  EXPECT_EQ(saved.hierarchies.at(0).node_size, 4u);
  EXPECT_EQ(saved.hierarchies.at(2).node_size, 2u);
  EXPECT_EQ(saved.hierarchies.at(2).across, (error_feedback::SavedLink{30e-6, 1e9, 0.5e9, 60e-6}));
  EXPECT_EQ(saved.hierarchies.at(0).intra, (error_feedback::SavedLink{1e-6, 20e9, 0, 2e-6}));
  EXPECT_EQ(saved.codec_costs.at("sign:bucket=512"),
            (error_feedback::SavedCodecCost{1.5e-9, 0.25e-9, 0.125e-9}));
  // Back: ranks_per_node 0 is the nodes of ranks that share memory.
  expect_same_inputs(from_checkpoint_model_inputs(saved), some_inputs());
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
  error_feedback::CheckpointOwnerState state;
  state.call_numbers = {{"x", std::uint64_t{1} << 32}};
  store.save(path, state);
  ResidualStore into(1, 0, ResizePolicy::error);
  std::string message;
  EXPECT_EQ(error_code_of([&] { load_communicator_checkpoint(path, into); }, &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("'x' the call number 4294967296"), std::string::npos) << message;
  // The same in a version 2 file, where the call number is a counter.
  testing::write_legacy_checkpoint(path, 2, 1, 0, {}, {{"x", std::uint64_t{1} << 32}});
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

  // The file's own sections: each key in its lane, the step, the model inputs; no call numbers.
  const error_feedback::CheckpointContents raw = error_feedback::read_checkpoint_file(path);
  std::vector<error_feedback::CheckpointTensorKey> keys;
  for (const auto& [key, values] : raw.tensors) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<error_feedback::CheckpointTensorKey>{
                      {0, "bucket0/group0/chunk0"},
                      {1, "bucket0/group0/chunk0"},
                      {1, "bucket1/group0/chunk0"}}));
  EXPECT_EQ(raw.owner_state.step, std::optional<std::uint64_t>(17));
  EXPECT_TRUE(raw.owner_state.call_numbers.empty());
  EXPECT_EQ(raw.owner_state.model_inputs, to_checkpoint_model_inputs(some_inputs()));

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
  EXPECT_NE(message.find("Reducer::load_state"), std::string::npos) << message;
  EXPECT_NE(message.find("tensor 'bucket0/group0/chunk0' of lane 1 is beyond this Reducer's 1 lanes"),
            std::string::npos)
      << message;
  // Another world or rank: refused, naming both.
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 3, 0, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::size_mismatch);
  EXPECT_NE(message.find("world of 2 ranks; this store belongs to a world of 3"), std::string::npos)
      << message;
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 1, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("residuals of rank 0; this store belongs to rank 1"), std::string::npos)
      << message;
  // A Reducer's checkpoint is not a Communicator's: lanes beyond 0 or a step are refused.
  ResidualStore communicator_residuals(2, 0, ResizePolicy::error);
  EXPECT_EQ(error_code_of([&] { load_communicator_checkpoint(path, communicator_residuals); },
                          &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("holds tensor 'bucket0/group0/chunk0' in lane 1"), std::string::npos) << message;
  save_reducer_checkpoint(path, 2, 0, std::span(lanes, 1), {}, 17);
  EXPECT_EQ(error_code_of([&] { load_communicator_checkpoint(path, communicator_residuals); },
                          &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("holds a step (17): it is a Reducer's checkpoint"), std::string::npos) << message;
  EXPECT_EQ(communicator_residuals.size(), 0u) << "a refused load changes nothing";

  // A Communicator's checkpoint (call numbers, no step) is not a Reducer's: refused.
  ResidualStore communicator_store(2, 0, ResizePolicy::error);
  save_communicator_checkpoint(path, communicator_store, CommunicatorCheckpoint{{{"layer.w", 3}}, {}});
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("holds call numbers (tensor 'layer.w' first)"), std::string::npos) << message;
  save_communicator_checkpoint(path, communicator_store, CommunicatorCheckpoint{});
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("holds no step"), std::string::npos) << message;
  std::filesystem::remove(path);
}

TEST(Checkpoint, ModelInputsTheWriterCannotSaveAreRefused) {
  const std::string path = temporary_path("bad_inputs");
  AutoModelInputs inputs = some_inputs();
  inputs.link->bytes_per_s = 0;
  ResidualStore store(1, 0, ResizePolicy::error);
  std::string message;
  EXPECT_EQ(error_code_of([&] { save_communicator_checkpoint(path, store, {{}, inputs}); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("link.bytes_per_s = 0 (must be > 0)"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(path));
}

// ---- files of format versions 1 and 2 ---------------------------------------------------------

// algo=auto's model inputs as version 2 files stored them (checkpoint.h): each term a double's
// bits under its documented counter name.
testing::LegacyCheckpointCounters version2_model_counters(const AutoModelInputs& inputs) {
  testing::LegacyCheckpointCounters counters;
  const auto put = [&](const std::string& name, double value) {
    counters["gradzip.auto/" + name] = std::bit_cast<std::uint64_t>(value);
  };
  const auto put_link = [&](const std::string& prefix, const LinkModel& link) {
    put(prefix + "latency_s", link.latency_s);
    put(prefix + "bytes_per_s", link.bytes_per_s);
    put(prefix + "exchange_bytes_per_s", link.exchange_bytes_per_s);
    put(prefix + "collective_latency_s", link.collective_latency_s);
  };
  if (inputs.link) put_link("link/", *inputs.link);
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) {
    const std::string prefix = "hier/" + std::to_string(ranks_per_node) + "/";
    put_link(prefix + "intra/", hierarchy.nodes.intra);
    put_link(prefix + "across/", hierarchy.across);
    if (ranks_per_node == 0) put("hier/0/ranks_per_node", hierarchy.nodes.ranks_per_node);
  }
  for (const auto& [spec, cost] : inputs.codec_costs) {
    put("gamma/" + spec + "/encode_s", cost.encode_s);
    put("gamma/" + spec + "/decode_add_s", cost.decode_add_s);
    put("gamma/" + spec + "/add_s", cost.add_s);
  }
  return counters;
}

TEST(Checkpoint, AVersion2CommunicatorCheckpointLoadsAsItDid) {
  const std::string path = temporary_path("communicator_v2");
  testing::LegacyCheckpointCounters counters = version2_model_counters(some_inputs());
  // 4 link terms, 2 x 2 x 4 node link terms, hier/0's detected size, 3 gamma terms.
  EXPECT_EQ(counters.size(), 4u + 16u + 1u + 3u);
  counters["layer.b"] = 0;
  counters["layer.w"] = 7;
  testing::write_legacy_checkpoint(path, 2, 4, 1,
                                   {{"layer.w", {0.5f, -1.25f, 3.0f}}, {"sra-server:layer.w", {2.0f}}},
                                   counters);
  ResidualStore loaded(4, 1, ResizePolicy::error);
  const CommunicatorCheckpoint back = load_communicator_checkpoint(path, loaded);
  EXPECT_EQ(back.call_numbers, (std::map<std::string, std::uint32_t, std::less<>>{{"layer.b", 0}, {"layer.w", 7}}));
  expect_same_inputs(back.auto_model, some_inputs());
  EXPECT_EQ(loaded.names(), (std::vector<std::string>{"layer.w", "sra-server:layer.w"}));
  const std::span<const float> w = loaded.residual("layer.w");
  EXPECT_EQ(std::vector<float>(w.begin(), w.end()), (std::vector<float>{0.5f, -1.25f, 3.0f}));

  // A malformed model input counter is refused naming it, and the residuals stay as they were.
  counters["gradzip.auto/link/latency_s"] = std::bit_cast<std::uint64_t>(-1.0);
  testing::write_legacy_checkpoint(path, 2, 4, 1, {}, counters);
  ResidualStore untouched(4, 1, ResizePolicy::error);
  std::string message;
  EXPECT_EQ(error_code_of([&] { load_communicator_checkpoint(path, untouched); }, &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("the counter 'gradzip.auto/link/latency_s' = -1"), std::string::npos) << message;

  // A version 1 file: the residuals, no call numbers or model inputs.
  testing::write_legacy_checkpoint(path, 1, 4, 1, {{"layer.w", {1.0f}}});
  const CommunicatorCheckpoint old = load_communicator_checkpoint(path, untouched);
  EXPECT_TRUE(old.call_numbers.empty());
  expect_same_inputs(old.auto_model, AutoModelInputs{});
  EXPECT_EQ(untouched.residual("layer.w")[0], 1.0f);
  std::filesystem::remove(path);
}

TEST(Checkpoint, AVersion2ReducerCheckpointLoadsAsItDid) {
  const std::string path = temporary_path("reducer_v2");
  testing::LegacyCheckpointCounters counters = version2_model_counters(some_inputs());
  counters["step"] = 17;
  const testing::LegacyCheckpointTensors tensors = {{"lane0|bucket0/group0/chunk0", {1.0f, 2.0f}},
                                                    {"lane1|bucket0/group0/chunk0", {-3.0f}},
                                                    {"lane1|bucket1/group0/chunk0", {4.0f, 5.0f, 6.0f}}};
  testing::write_legacy_checkpoint(path, 2, 2, 0, tensors, counters);
  const ReducerCheckpoint back = load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state");
  ASSERT_EQ(back.lane_residuals.size(), 2u);
  EXPECT_EQ(back.lane_residuals[0].at("bucket0/group0/chunk0"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(back.lane_residuals[1].at("bucket0/group0/chunk0"), (std::vector<float>{-3.0f}));
  EXPECT_EQ(back.lane_residuals[1].at("bucket1/group0/chunk0"), (std::vector<float>{4.0f, 5.0f, 6.0f}));
  EXPECT_EQ(back.step, std::optional<std::uint64_t>(17));
  expect_same_inputs(back.auto_model, some_inputs());

  // The same contents through a version 3 file: the same checkpoint.
  const std::string v3_path = temporary_path("reducer_v3");
  ResidualStore lane0(2, 0, ResizePolicy::error), lane1(2, 0, ResizePolicy::error);
  fill(lane0, "bucket0/group0/chunk0", {1.0f, 2.0f});
  fill(lane1, "bucket0/group0/chunk0", {-3.0f});
  fill(lane1, "bucket1/group0/chunk0", {4.0f, 5.0f, 6.0f});
  const ResidualStore* lanes[] = {&lane0, &lane1};
  save_reducer_checkpoint(v3_path, 2, 0, lanes, some_inputs(), 17);
  const ReducerCheckpoint from_v3 = load_reducer_checkpoint(v3_path, 2, 0, 2, "Reducer::load_state");
  EXPECT_EQ(from_v3.lane_residuals, back.lane_residuals);
  EXPECT_EQ(from_v3.step, back.step);
  expect_same_inputs(from_v3.auto_model, back.auto_model);
  std::filesystem::remove(v3_path);

  // Fewer lanes than the file uses: refused, naming the entry (today's message).
  std::string message;
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 1, "Reducer::load_state"); },
                          &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("entry 'lane1|bucket0/group0/chunk0'"), std::string::npos) << message;
  // A version 2 Communicator's checkpoint (call numbers as counters) is not a Reducer's.
  testing::write_legacy_checkpoint(path, 2, 2, 0, {}, {{"layer.w", 3}});
  EXPECT_EQ(error_code_of([&] { load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state"); },
                          &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("the counter 'layer.w' = 3"), std::string::npos) << message;
  // A version 1 file: lanes, no step or model inputs.
  testing::write_legacy_checkpoint(path, 1, 2, 0, {{"lane1|w", {8.0f}}});
  const ReducerCheckpoint old = load_reducer_checkpoint(path, 2, 0, 2, "Reducer::load_state");
  EXPECT_FALSE(old.step.has_value());
  EXPECT_EQ(old.lane_residuals[1].at("w"), (std::vector<float>{8.0f}));
  EXPECT_TRUE(old.lane_residuals[0].empty());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gradzip::collectives
