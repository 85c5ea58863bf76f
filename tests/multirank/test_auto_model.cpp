// algo=auto's model inputs in a Communicator: the link given by
// CommunicatorOptions::link_* or GRADZIP_LINK (and refused when malformed, naming what), or
// measured at the first call that needs it; γ measured once per process; both carried by a
// checkpoint so that a restarted run chooses as the run that saved it; and the choice, made
// on every rank alike, gives the bytes of the chosen algorithm run directly.
#include <gtest/gtest.h>
#include <mpi.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/link_calibration.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/checkpoint_file.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::LinkModel;
using testing::world_rank;
using testing::world_size;

TensorView host_view(float* data, std::size_t count) {
  return TensorView{data, count, DType::f32, Device{}};
}

std::vector<std::uint64_t> bits_of(const LinkModel& link) {
  return {std::bit_cast<std::uint64_t>(link.latency_s), std::bit_cast<std::uint64_t>(link.bytes_per_s),
          std::bit_cast<std::uint64_t>(link.exchange_bytes_per_s),
          std::bit_cast<std::uint64_t>(link.collective_latency_s)};
}

TEST(AutoModel, GivenLinkIsUsedAsGivenAndNothingIsMeasured) {
  CommunicatorOptions options;
  options.link_latency_us = 25;
  options.link_gbps = 8;  // 1e9 bytes per second
  options.link_exchange_gbps = 4;
  Communicator comm = Communicator::world(options);
  const auto& link = collectives::state_of(comm).auto_model().known_link();
  ASSERT_TRUE(link.has_value());
  EXPECT_DOUBLE_EQ(link->latency_s, 25e-6);
  EXPECT_DOUBLE_EQ(link->bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(link->exchange_bytes_per_s, 5e8);
  EXPECT_EQ(link->collective_latency_s, 0.0);
}

TEST(AutoModel, MalformedLinksAreRefusedNamingTheFieldAndTheVariableWins) {
  struct Case {
    double latency_us, gbps, exchange_gbps;
    const char* names;
  };
  for (const Case& c : {Case{-1, 10, 0, "link_latency_us"}, Case{5, -2, 0, "link_gbps"},
                        Case{5, 10, -3, "link_exchange_gbps"},
                        Case{5, 0, 0, "without CommunicatorOptions::link_gbps"},
                        Case{0, 0, 2, "without CommunicatorOptions::link_gbps"},
                        Case{5, std::numeric_limits<double>::infinity(), 0, "link_gbps"}}) {
    CommunicatorOptions options;
    options.link_latency_us = c.latency_us;
    options.link_gbps = c.gbps;
    options.link_exchange_gbps = c.exchange_gbps;
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { Communicator::world(options); }, &message),
              ErrorCode::invalid_argument)
        << c.names;
    EXPECT_NE(message.find(c.names), std::string::npos) << message;
  }
  // Malformed GRADZIP_LINK texts: tests/unit/test_link_options.cpp (the variable is read once
  // per process, like every GRADZIP_* variable).
  // A well-formed variable wins over the options.
  ASSERT_EQ(setenv("GRADZIP_LINK", "30,16,4", 1), 0);
  CommunicatorOptions options;
  options.link_gbps = 1;
  Communicator comm = Communicator::world(options);
  unsetenv("GRADZIP_LINK");
  const auto& link = collectives::state_of(comm).auto_model().known_link();
  ASSERT_TRUE(link.has_value());
  EXPECT_DOUBLE_EQ(link->latency_s, 30e-6);
  EXPECT_DOUBLE_EQ(link->bytes_per_s, 2e9);
  EXPECT_DOUBLE_EQ(link->exchange_bytes_per_s, 5e8);
}

TEST(AutoModel, TheLinkIsMeasuredOnlyByTheFirstCallThatNeedsTheModel) {
  Communicator comm = Communicator::world();
  collectives::CommunicatorState& state = collectives::state_of(comm);
  std::vector<float> data(8192, 1.0f);
  // Below min_bytes, an explicit algorithm, random-k: no model, nothing measured.
  comm.allreduce(host_view(data.data(), 16), "small", "qsgd");
  comm.allreduce(host_view(data.data(), data.size()), "pinned", "qsgd:algo=sra,min_bytes=0");
  comm.allreduce(host_view(data.data(), data.size()), "randk", "randk:min_bytes=0");
  EXPECT_FALSE(state.auto_model().known_link().has_value());
  const CollectiveStats stats =
      comm.allreduce(host_view(data.data(), data.size()), "auto", "qsgd:min_bytes=0");
  if (world_size() == 1) {
    // One rank has no link: the codec's default, no model.
    EXPECT_FALSE(state.auto_model().known_link().has_value());
    EXPECT_EQ(stats.algorithm, "sra");
    return;
  }
  ASSERT_TRUE(state.auto_model().known_link().has_value());
  // Agreed bit for bit, and the note names the model's times.
  const std::vector<std::uint64_t> bits = bits_of(*state.auto_model().known_link());
  EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const std::uint64_t>(bits))));
  EXPECT_NE(stats.note.find("auto: model ms: sra "), std::string::npos) << stats.note;
  EXPECT_NE(stats.note.find(", tree "), std::string::npos) << stats.note;
  EXPECT_TRUE(stats.algorithm == "sra" || stats.algorithm == "tree") << stats.algorithm;
  EXPECT_NE(stats.note.find("-> " + stats.algorithm), std::string::npos) << stats.note;
  const std::string name_bytes(stats.algorithm);
  EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const char>(name_bytes))));
}

// The link of two communicators differs when one is given another figure; a checkpoint of the
// first, loaded by the second, makes the second choose as the first (whatever it was given).
TEST(AutoModel, ACheckpointCarriesTheModelInputsToTheRestartedRun) {
  if (world_size() < 2) GTEST_SKIP() << "one rank has no link and no model";
  const testing::ScratchDirectory scratch("gradzip-test-auto-model");
  const std::string path = scratch.file("rank" + std::to_string(world_rank()));
  // A latency-bound link: for 4096 qsgd elements the tree (4 start-ups at 4 ranks) wins over
  // SRA (2 collectives of P - 1 messages and 2 size all-gathers); a slow one: SRA's few bytes
  // win over the tree's f32 vectors.
  CommunicatorOptions fast, slow;
  fast.link_latency_us = 200;
  fast.link_gbps = 100;
  slow.link_latency_us = 1;
  slow.link_gbps = 0.01;
  const std::string spec = "qsgd:bits=4,min_bytes=0";
  std::vector<float> input = testing::gaussian_contribution(4096, world_rank(), 5);

  Communicator saving = Communicator::world(fast);
  std::vector<float> data = input;
  const CollectiveStats before = saving.allreduce(host_view(data.data(), data.size()), "w", spec);
  EXPECT_EQ(before.algorithm, "tree") << before.note;
  saving.save_residuals(path);

  Communicator other = Communicator::world(slow);
  data = input;
  EXPECT_EQ(other.allreduce(host_view(data.data(), data.size()), "x", spec).algorithm, "sra");

  Communicator restarted = Communicator::world(slow);
  // Its own choice first (kept for this spec and size), then the checkpoint's inputs, which
  // must replace the kept choice too.
  data = input;
  EXPECT_EQ(restarted.allreduce(host_view(data.data(), data.size()), "y", spec).algorithm, "sra");
  restarted.load_residuals(path);
  EXPECT_EQ(bits_of(*collectives::state_of(restarted).auto_model().known_link()),
            bits_of(*collectives::state_of(saving).auto_model().known_link()));
  std::vector<float> a = input, b = input;
  const CollectiveStats continued = saving.allreduce(host_view(a.data(), a.size()), "w", spec);
  const CollectiveStats resumed = restarted.allreduce(host_view(b.data(), b.size()), "w", spec);
  EXPECT_EQ(resumed.algorithm, "tree") << resumed.note;
  EXPECT_EQ(resumed.note, continued.note);
  EXPECT_TRUE(testing::same_bits(a, b));
}

// Whether the world's ranks form nodes of two (4 or more ranks, an even count). Checks that
// `hierarchy`, the model's node structure for the call that gave `stats`, exists exactly then
// (one node, or nodes of 2 and 1, are no candidate), with nodes of 2 and measured links, and
// that the call's note offers hier exactly then.
bool expect_nodes_of_two_exactly_when_formed(const CollectiveStats& stats,
                                             const std::optional<collectives::AutoHierarchy>& hierarchy) {
  const int ranks = world_size();
  if (ranks < 4 || ranks % 2 != 0) {
    EXPECT_FALSE(hierarchy.has_value());
    EXPECT_EQ(stats.note.find(", hier "), std::string::npos) << stats.note;
    return false;
  }
  EXPECT_TRUE(hierarchy.has_value());
  if (!hierarchy) return false;
  EXPECT_EQ(hierarchy->nodes.ranks_per_node, 2);
  EXPECT_GT(hierarchy->nodes.intra.bytes_per_s, 0.0);
  EXPECT_GT(hierarchy->across.bytes_per_s, 0.0);
  EXPECT_NE(stats.note.find(", hier "), std::string::npos) << stats.note;
  return true;
}

// Saves `comm`'s checkpoint and loads it into `restored` (a fresh world communicator when
// null): the loaded model inputs must be the saved ones. Returns them as the file saves them.
error_feedback::CheckpointModelInputs expect_checkpoint_carries_model(Communicator& comm,
                                                                     Communicator* restored = nullptr) {
  const testing::ScratchDirectory scratch("gradzip-test-auto-checkpoint");
  const std::string path = scratch.file("rank" + std::to_string(world_rank()));
  comm.save_residuals(path);
  std::optional<Communicator> fresh;
  if (restored == nullptr) restored = &fresh.emplace(Communicator::world());
  restored->load_residuals(path);
  const error_feedback::CheckpointModelInputs saved =
      collectives::to_checkpoint_model_inputs(collectives::state_of(comm).auto_model().inputs());
  const error_feedback::CheckpointModelInputs loaded =
      collectives::to_checkpoint_model_inputs(collectives::state_of(*restored).auto_model().inputs());
  EXPECT_EQ(loaded, saved);
  return saved;
}

// Nodes of two ranks (4 or more ranks, an even count): the model measures the link inside and
// across the nodes once, and a checkpoint carries all of it.
TEST(AutoModel, NodeStructuresAreMeasuredOnceAndCheckpointed) {
  Communicator comm = Communicator::world();
  collectives::CommunicatorState& state = collectives::state_of(comm);
  std::vector<float> data = testing::gaussian_contribution(8192, world_rank(), 9);
  const CollectiveStats stats =
      comm.allreduce(host_view(data.data(), data.size()), "n", "fp16:min_bytes=0,ranks_per_node=2");
  const std::optional<collectives::AutoHierarchy>& hierarchy = state.auto_model().hierarchy(2);
  if (!expect_nodes_of_two_exactly_when_formed(stats, hierarchy)) return;
  EXPECT_NE(stats.note.find("nodes of 2: inside "), std::string::npos) << stats.note;
  const std::vector<std::uint64_t> bits = bits_of(hierarchy->across);
  EXPECT_TRUE(testing::identical_on_all_ranks(std::as_bytes(std::span<const std::uint64_t>(bits))));

  const error_feedback::CheckpointModelInputs saved = expect_checkpoint_carries_model(comm);
  ASSERT_TRUE(saved.hierarchies.contains(2));
  EXPECT_EQ(saved.hierarchies.at(2).node_size, 2u);
  EXPECT_GT(saved.hierarchies.at(2).intra.bytes_per_s, 0.0);
  EXPECT_GT(saved.hierarchies.at(2).across.bytes_per_s, 0.0);
}

// A Reducer measures algo=auto's link and the node structures its specs give on the user's
// communicator when it is made (not each lane while the others move data), and its checkpoint
// carries them.
TEST(AutoModel, AReducerMeasuresTheModelOnceOnTheUsersCommunicator) {
  const int ranks = world_size();
  Communicator comm = Communicator::world();
  ReducerOptions options;
  options.spec = "fp16:min_bytes=0,ranks_per_node=2";
  options.lanes = 2;
  Reducer reducer(comm, options);
  const error_feedback::CheckpointModelInputs measured =
      collectives::to_checkpoint_model_inputs(collectives::state_of(comm).auto_model().inputs());
  if (ranks == 1) {
    EXPECT_EQ(measured, error_feedback::CheckpointModelInputs{}) << "one rank: nothing to measure";
    return;
  }
  EXPECT_TRUE(measured.link.has_value());
  EXPECT_EQ(measured.hierarchies.contains(2), ranks >= 4 && ranks % 2 == 0);

  std::vector<float> gradient = testing::gaussian_contribution(6000, world_rank(), 3);
  reducer.add("w", host_view(gradient.data(), gradient.size()));
  reducer.mark_ready("w");
  reducer.wait();
  reducer.step();
  const testing::ScratchDirectory scratch("gradzip-test-auto-reducer");
  const std::string path = scratch.file("rank" + std::to_string(world_rank()));
  reducer.save_state(path);
  const error_feedback::CheckpointModelInputs saved =
      error_feedback::read_checkpoint_file(path).owner_state.model_inputs;
  // The lanes' link and node figures are the user communicator's (γ comes on top).
  EXPECT_EQ(saved.link, measured.link);
  for (const auto& [ranks_per_node, hierarchy] : measured.hierarchies) {
    ASSERT_TRUE(saved.hierarchies.contains(ranks_per_node)) << ranks_per_node;
    EXPECT_EQ(saved.hierarchies.at(ranks_per_node), hierarchy) << ranks_per_node;
  }
  for (const auto& [spec, cost] : measured.codec_costs) {
    ASSERT_TRUE(saved.codec_costs.contains(spec)) << spec;
    EXPECT_EQ(saved.codec_costs.at(spec), cost) << spec;
  }
}

// MPI_COMM_WORLD's transport with pretend hosts: split_by_node groups ranks 2k and 2k + 1 (the
// last rank alone when the count is odd), as a cluster of two-rank nodes would. Every other
// call goes to MPI.
class PairsAsHostsTransport final : public testing::ForwardingTransport {
 public:
  PairsAsHostsTransport() : ForwardingTransport(std::make_unique<collectives::MpiTransport>(MPI_COMM_WORLD)) {}
  std::unique_ptr<collectives::Transport> split_by_node() override {
    return inner().split(rank() / 2, rank());
  }
};

// Nodes of ranks that share memory (ranks_per_node=0, the default) are offered to the model as
// stated ones are: detected once (with a size every rank agrees on), measured once, named in
// the note, and carried by a checkpoint with their size. With the real detection on this one
// host they are one node: no candidate.
TEST(AutoModel, NodesOfRanksThatShareMemoryAreOfferedToTheModel) {
  const int ranks = world_size();
  const std::string spec = "topk:ratio=0.05,min_bytes=0";
  std::vector<float> input = testing::gaussian_contribution(8192, world_rank(), 4);

  Communicator one_host = Communicator::world();
  std::vector<float> data = input;
  CollectiveStats stats = one_host.allreduce(host_view(data.data(), data.size()), "h", spec);
  if (ranks > 1) {
    EXPECT_FALSE(collectives::state_of(one_host).auto_model().hierarchy(0).has_value());
  }
  EXPECT_EQ(stats.note.find(", hier "), std::string::npos) << stats.note;

  Communicator pairs = collectives::make_communicator(std::make_unique<PairsAsHostsTransport>());
  collectives::CommunicatorState& state = collectives::state_of(pairs);
  data = input;
  stats = pairs.allreduce(host_view(data.data(), data.size()), "h", spec);
  EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
  if (ranks == 1) return;  // one rank: no model at all
  const std::optional<collectives::AutoHierarchy>& hierarchy = state.auto_model().hierarchy(0);
  if (!expect_nodes_of_two_exactly_when_formed(stats, hierarchy)) return;
  EXPECT_TRUE(hierarchy->shared_memory);
  EXPECT_NE(stats.note.find("nodes of 2 (shared memory): inside "), std::string::npos) << stats.note;

  Communicator restored = Communicator::world();
  const error_feedback::CheckpointModelInputs saved = expect_checkpoint_carries_model(pairs, &restored);
  ASSERT_TRUE(saved.hierarchies.contains(0));
  EXPECT_EQ(saved.hierarchies.at(0).node_size, 2u);
  const std::optional<collectives::AutoHierarchy>& carried =
      collectives::state_of(restored).auto_model().hierarchy(0);
  ASSERT_TRUE(carried.has_value());
  EXPECT_EQ(carried->nodes.ranks_per_node, 2);
  EXPECT_TRUE(carried->shared_memory);
}

// Model inputs in a checkpoint of format version 2 (written as earlier builds wrote it: counters
// holding a double's bits under gradzip.auto/ names); version 3's typed sections are refused by
// the file's reader (tests/unit/test_checkpoint_file.cpp).
TEST(AutoModel, AMalformedModelCounterInACheckpointIsRefusedNamingIt) {
  const testing::ScratchDirectory scratch("gradzip-test-auto-model-bad");
  const std::string path = scratch.file("rank" + std::to_string(world_rank()));
  const auto world = static_cast<std::uint32_t>(world_size());
  const auto rank = static_cast<std::uint32_t>(world_rank());
  const auto save = [&](const testing::LegacyCheckpointCounters& counters) {
    testing::write_legacy_checkpoint(path, 2, world, rank, {}, counters);
  };
  save({{"gradzip.auto/link/latency_s", std::bit_cast<std::uint64_t>(-1.0)}});
  Communicator comm = Communicator::world();
  std::string message;
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("gradzip.auto/link/latency_s"), std::string::npos) << message;
  save({{"gradzip.auto/link/latency_s", std::bit_cast<std::uint64_t>(1e-5)}});
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("incomplete"), std::string::npos) << message;
  // A node structure with its inside link only.
  testing::LegacyCheckpointCounters half;
  for (const char* term : {"latency_s", "bytes_per_s", "exchange_bytes_per_s", "collective_latency_s"})
    half[std::string("gradzip.auto/hier/2/intra/") + term] = std::bit_cast<std::uint64_t>(1.0);
  save(half);
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("lacks its across link"), std::string::npos) << message;
  // Nodes of ranks that share memory without their detected size, and with a size that is no
  // whole number of ranks.
  testing::LegacyCheckpointCounters detected;
  for (const char* side : {"intra/", "across/"}) {
    for (const char* term : {"latency_s", "bytes_per_s", "exchange_bytes_per_s", "collective_latency_s"})
      detected[std::string("gradzip.auto/hier/0/") + side + term] = std::bit_cast<std::uint64_t>(1.0);
  }
  save(detected);
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("lacks its detected size"), std::string::npos) << message;
  detected["gradzip.auto/hier/0/ranks_per_node"] = std::bit_cast<std::uint64_t>(2.5);
  save(detected);
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("gradzip.auto/hier/0/ranks_per_node"), std::string::npos) << message;
  // A stated size written another way than export writes it.
  half.clear();
  half["gradzip.auto/hier/02/intra/latency_s"] = std::bit_cast<std::uint64_t>(1.0);
  save(half);
  EXPECT_EQ(testing::error_code_of([&] { comm.load_residuals(path); }, &message), ErrorCode::io_error);
  EXPECT_NE(message.find("gradzip.auto/hier/02/intra/latency_s"), std::string::npos) << message;
  // The complete structure loads, with its detected size.
  detected["gradzip.auto/hier/0/ranks_per_node"] = std::bit_cast<std::uint64_t>(2.0);
  save(detected);
  comm.load_residuals(path);
  const std::optional<collectives::AutoHierarchy>& loaded = collectives::state_of(comm).auto_model().hierarchy(0);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->nodes.ranks_per_node, 2);
}

}  // namespace
}  // namespace gradzip
