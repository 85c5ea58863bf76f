// The life of per-name state in a Communicator: the release rule of names that stop being used
// (CommunicatorOptions::release_unused_after_calls) and checkpoints that carry the call numbers,
// so that a communicator restored from a checkpoint continues byte-identically.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "collectives/random_streams.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "kernels/fnv1a.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using testing::gaussian_contribution;
using testing::identical_on_all_ranks;
using testing::world_rank;
using testing::world_size;

Communicator world_with_window(std::uint64_t window) {
  CommunicatorOptions options;
  options.release_unused_after_calls = window;
  return Communicator::world(options);
}

// Every residual key of the store that contains `name` (worker, SRA server, all-gather and
// hierarchical keys all do; the tests' names are not part of one another's keys).
std::set<std::string> keys_of(Communicator& comm, const std::string& name) {
  std::set<std::string> keys;
  for (const std::string& key : collectives::state_of(comm).residuals().names())
    if (key.find(name) != std::string::npos) keys.insert(key);
  return keys;
}

void reduce(Communicator& comm, const std::string& name, std::size_t count, std::uint64_t seed,
            const std::string& spec) {
  std::vector<float> values = gaussian_contribution(count, world_rank(), seed);
  comm.allreduce(host_view(values.data(), values.size()), name, spec, ReduceOp::average);
}

// qsgd through SRA with error feedback: every rank keeps a worker residual, and owners of a
// chunk a server residual, so the rule is checked on both kinds of key.
constexpr const char* kSraSpec = "qsgd:bits=4,ef=on,algo=sra,min_bytes=0";

TEST(ResidualRelease, ANameUnusedForAWholeWindowIsReleasedAtTheWindowsEnd) {
  Communicator comm = world_with_window(4);
  collectives::CommunicatorState& state = collectives::state_of(comm);
  // Calls 0, 1: "grad_x"; calls 2 .. 11: "grad_y". Window N = 4: at the start of call 4 the window
  // [0, 4) used both; at the start of call 8 the window [4, 8) did not use "grad_x": released there.
  reduce(comm, "grad_x", 1000, 1, kSraSpec);
  reduce(comm, "grad_x", 1000, 2, kSraSpec);
  const std::set<std::string> a_keys = keys_of(comm, "grad_x");
  ASSERT_FALSE(a_keys.empty());
  EXPECT_TRUE(a_keys.count("grad_x")) << "worker residual";
  if (world_size() > 1) {
    EXPECT_TRUE(a_keys.count("sra-server:grad_x")) << "server residual";
  }
  EXPECT_EQ(state.names().call_number_of("grad_x"), 2u);
  ::testing::internal::CaptureStderr();
  for (int call = 2; call < 8; ++call) reduce(comm, "grad_y", 1000, 10 + call, kSraSpec);
  EXPECT_EQ(keys_of(comm, "grad_x"), a_keys) << "unused for 6 calls (< 2 windows): still kept";
  EXPECT_EQ(state.names().call_number_of("grad_x"), 2u);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "") << "nothing released, nothing said";
  EXPECT_EQ(state.names().released_residuals(), 0u);
  ::testing::internal::CaptureStderr();
  reduce(comm, "grad_y", 1000, 30, kSraSpec);  // call 8 ends the window [4, 8)
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(keys_of(comm, "grad_x").empty());
  // Not silent: the release is said once, naming the residuals and how to keep them.
  EXPECT_EQ(state.names().released_residuals(), a_keys.size());
  for (const char* part : {"gradzip: warning: released the error-feedback residuals of",
                           "'grad_x'", "release_unused_after_calls = 0", "4 calls"})
    EXPECT_NE(said.find(part), std::string::npos) << "missing '" << part << "' in: " << said;
  EXPECT_EQ(state.names().call_number_of("grad_x"), 0u) << "its call number is released too";
  EXPECT_EQ(state.names().call_number_of("grad_y"), 7u);
  EXPECT_FALSE(keys_of(comm, "grad_y").empty());

  // "grad_x" comes back as new: call number 0 on every rank (the call check compares it), a zero
  // residual, so its result equals a fresh communicator's first call of "grad_x".
  std::vector<float> again = gaussian_contribution(1000, world_rank(), 1);
  comm.allreduce(host_view(again.data(), again.size()), "grad_x", kSraSpec, ReduceOp::average);
  Communicator fresh = world_with_window(4);
  std::vector<float> first = gaussian_contribution(1000, world_rank(), 1);
  fresh.allreduce(host_view(first.data(), first.size()), "grad_x", kSraSpec, ReduceOp::average);
  EXPECT_TRUE(testing::same_bits(again, first));
  EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(again)));

  // Said once per communicator: releasing "grad_x" again (unused from call 9 on) is silent.
  ::testing::internal::CaptureStderr();
  for (int call = 0; call < 10; ++call) reduce(comm, "grad_y", 1000, 40 + call, kSraSpec);
  EXPECT_TRUE(keys_of(comm, "grad_x").empty());
  EXPECT_GT(state.names().released_residuals(), a_keys.size());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// The 32-bit tensor id the random streams were once keyed by alone: FNV-1a 64 of the name
// folded to 32 bits. About 1% of 10,000 names share one.
std::uint32_t folded_32_bit_id(const std::string& name) {
  const std::uint64_t hash = fnv1a64(name);
  return static_cast<std::uint32_t>(hash >> 32) ^ static_cast<std::uint32_t>(hash);
}

// Two names of the kind a model has that share a folded 32-bit id, found by search (the same
// pair on every rank).
std::pair<std::string, std::string> names_sharing_a_folded_id() {
  std::unordered_map<std::uint32_t, std::string> seen;
  for (std::uint64_t i = 0;; ++i) {
    std::string name = "layer" + std::to_string(i) + ".weight";
    const auto [entry, inserted] = seen.try_emplace(folded_32_bit_id(name), name);
    if (!inserted) return {entry->second, name};
  }
}

std::string qsgd_spec_with_seed(std::uint64_t seed) {
  return "qsgd:bits=2,ef=off,algo=sra,min_bytes=0,seed=" + std::to_string(seed);
}

TEST(RandomStreams, NamesSharingA32BitIdDrawTheirOwnNumbers) {
  const auto [first, second] = names_sharing_a_folded_id();
  ASSERT_NE(first, second);
  ASSERT_EQ(folded_32_bit_id(first), folded_32_bit_id(second));
  EXPECT_NE(collectives::random_stream_of(0, first).key, collectives::random_stream_of(0, second).key);
  Communicator comm = world_with_window(4);
  // The same input under both names: qsgd's stochastic rounding must round it differently.
  const std::vector<float> input = gaussian_contribution(4096, world_rank(), 5);
  std::vector<float> a = input, b = input;
  comm.allreduce(host_view(a.data(), a.size()), first, qsgd_spec_with_seed(0), ReduceOp::sum);
  comm.allreduce(host_view(b.data(), b.size()), second, qsgd_spec_with_seed(0), ReduceOp::sum);
  EXPECT_FALSE(testing::same_bits(a, b));
  EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(b)));
}

TEST(RandomStreams, AStreamKeyHeldByAnotherNameInTheProcessIsRefusedOnEveryRank) {
  // random_stream_of(seed, name).key = seed ^ mix64(hash(name)): seed_b makes "beta"'s key
  // that of "alpha" under seed 0, the one way to make two names meet short of a 64-bit hash
  // collision.
  const std::string alpha = "stream.alpha", beta = "stream.beta";
  const std::uint64_t seed_b =
      collectives::random_stream_of(0, alpha).key ^ collectives::random_stream_of(0, beta).key;
  ASSERT_EQ(collectives::random_stream_of(seed_b, beta).key, collectives::random_stream_of(0, alpha).key);

  Communicator comm = world_with_window(4);
  {
    // Rank 0 alone holds alpha's key, through an owner outside this communicator (as another
    // communicator of the process would): rank 0 refuses, and the call check makes every rank
    // throw rather than leave the others waiting.
    std::optional<collectives::RandomStreamClaims> elsewhere;
    if (world_rank() == 0) {
      elsewhere.emplace();
      ASSERT_FALSE(elsewhere->claim(0, alpha, 0).has_value());
    }
    std::string message;
    const ErrorCode code =
        testing::error_code_of([&] { reduce(comm, beta, 1000, 1, qsgd_spec_with_seed(seed_b)); }, &message);
    EXPECT_EQ(code, ErrorCode::invalid_argument);
    for (const std::string& part : {alpha, beta, std::string("random stream"), std::string("Rename")})
      EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
    // The communicator goes on; beta's own stream under seed 0 is free.
    reduce(comm, beta, 1000, 2, qsgd_spec_with_seed(0));
  }
  // The owner is gone: its key is free again.
  reduce(comm, beta, 1000, 3, qsgd_spec_with_seed(seed_b));

  // Inside one communicator: alpha under seed 0 now meets beta's claim under seed_b.
  EXPECT_EQ(testing::error_code_of([&] { reduce(comm, alpha, 1000, 4, qsgd_spec_with_seed(0)); }),
            ErrorCode::invalid_argument);
  // Once beta's claim is released (a window without it), alpha may take the key; the same name
  // in a second communicator shares it.
  for (int call = 0; call < 8; ++call) reduce(comm, "another.weight", 1000, 5 + call, kSraSpec);
  reduce(comm, alpha, 1000, 20, qsgd_spec_with_seed(0));
  Communicator second = world_with_window(4);
  reduce(second, alpha, 1000, 21, qsgd_spec_with_seed(0));
  EXPECT_EQ(testing::error_code_of([&] { reduce(second, beta, 1000, 22, qsgd_spec_with_seed(seed_b)); }),
            ErrorCode::invalid_argument);
}

TEST(ResidualRelease, ZeroKeepsEverything) {
  Communicator comm = world_with_window(0);
  reduce(comm, "old", 500, 1, kSraSpec);
  for (int call = 0; call < 40; ++call) reduce(comm, "new", 500, 2 + call, kSraSpec);
  EXPECT_TRUE(keys_of(comm, "old").count("old"));
  EXPECT_EQ(collectives::state_of(comm).names().call_number_of("old"), 1u);
}

TEST(ResidualRelease, ResidualMemoryFollowsAChangingTensorSet) {
  // Sets of 3 tensors (total 3000 elements) replaced every 20 steps; window 3 steps' worth of
  // calls (9). A set's state goes between 9 and 17 calls after its last use, so at any time the
  // store holds the live set and at most the previous one.
  constexpr std::uint64_t kWindow = 9;
  Communicator comm = world_with_window(kWindow);
  collectives::CommunicatorState& state = collectives::state_of(comm);
  const std::size_t sizes[3][3] = {{1000, 1500, 500}, {500, 1000, 1500}, {1500, 500, 1000}};
  const std::string spec = "topk:ratio=0.05,min_bytes=0,algo=sparse";
  const std::size_t worker_bytes_of_a_set = 3000 * sizeof(float);
  std::size_t most_bytes = 0;
  for (int step = 0; step < 200; ++step) {
    const int set = step / 20;
    for (int t = 0; t < 3; ++t) {
      const std::string name = "set" + std::to_string(set) + ".t" + std::to_string(t);
      reduce(comm, name, sizes[set % 3][t], 100 + step, spec);
    }
    most_bytes = std::max(most_bytes, state.residuals().total_bytes());
    // The live set is always there; any other set is the previous one, within the window.
    for (const std::string& key : state.residuals().names()) {
      const int owner = std::stoi(key.substr(3, key.find('.') - 3));
      EXPECT_TRUE(owner == set || (owner == set - 1 && step % 20 < 6))
          << "step " << step << " holds '" << key << "'";
    }
  }
  EXPECT_EQ(most_bytes, 2 * worker_bytes_of_a_set);
  EXPECT_EQ(state.residuals().total_bytes(), worker_bytes_of_a_set);
}

TEST(CommunicatorCheckpoint, ARestoredCommunicatorContinuesByteIdentically) {
  // Stochastic codecs draw from (seed, the name's call number, name): the checkpoint must carry
  // the call numbers, not only the residuals.
  const testing::ScratchDirectory scratch("gradzip-test-lifecycle");
  const std::string path = scratch.file("ef-rank" + std::to_string(world_rank()));
  const std::vector<std::string> specs = {"qsgd:bits=2,ef=on,min_bytes=0",
                                          "randk:ratio=0.05,min_bytes=0",
                                          "topk:ratio=0.02,min_bytes=0,warmup=3",
                                          "sign:algo=sra,min_bytes=0"};
  constexpr std::size_t kCount = 3001;
  Communicator original = Communicator::world();
  for (int step = 0; step < 4; ++step)
    for (std::size_t s = 0; s < specs.size(); ++s)
      reduce(original, "t" + std::to_string(s), kCount, 7 * step + s, specs[s]);
  original.save_residuals(path);

  Communicator restored = Communicator::world();
  restored.load_residuals(path);
  Communicator cold = Communicator::world();  // no checkpoint: must differ somewhere
  bool cold_differs = false;
  for (int step = 4; step < 10; ++step) {
    for (std::size_t s = 0; s < specs.size(); ++s) {
      const std::string name = "t" + std::to_string(s);
      std::vector<float> a = gaussian_contribution(kCount, world_rank(), 7 * step + s);
      std::vector<float> b = a, c = a;
      original.allreduce(host_view(a.data(), a.size()), name, specs[s], ReduceOp::average);
      restored.allreduce(host_view(b.data(), b.size()), name, specs[s], ReduceOp::average);
      cold.allreduce(host_view(c.data(), c.size()), name, specs[s], ReduceOp::average);
      EXPECT_TRUE(testing::same_bits(a, b)) << specs[s] << " step " << step;
      cold_differs = cold_differs || !testing::same_bits(a, c);
    }
  }
  EXPECT_TRUE(cold_differs) << "the comparison above could pass without the checkpoint";
  EXPECT_EQ(collectives::state_of(restored).names().call_number_of("t0"), 10u);
}

TEST(CommunicatorCheckpoint, AnotherWorldSizeIsRefusedNamingBoth) {
  const testing::ScratchDirectory scratch("gradzip-test-lifecycle");
  const std::string path = scratch.file("ef-rank" + std::to_string(world_rank()));
  // A checkpoint written by a store of world size + 1 (what a job of another size writes).
  error_feedback::ResidualStore other(static_cast<std::uint32_t>(world_size() + 1),
                                      static_cast<std::uint32_t>(world_rank()), ResizePolicy::error);
  other.residual("w", 4);
  error_feedback::CheckpointOwnerState call_numbers;
  call_numbers.call_numbers = {{"w", 3}};
  other.save(path, call_numbers);
  Communicator comm = Communicator::world();
  try {
    comm.load_residuals(path);
    ADD_FAILURE() << "a checkpoint of another world size loaded";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::size_mismatch);
    const std::string text = error.what();
    EXPECT_NE(text.find("world of " + std::to_string(world_size() + 1) + " ranks"), std::string::npos) << text;
    EXPECT_NE(text.find("world of " + std::to_string(world_size())), std::string::npos) << text;
  }
  EXPECT_EQ(collectives::state_of(comm).names().call_number_of("w"), 0u) << "a refused load changes nothing";
}

}  // namespace
}  // namespace gradzip
