// fallback=dense under mpirun: on a link the model is told is fast, a compressed spec's tensor
// goes through the transport's own f32 all-reduce with every residual of the tensor (the
// worker's and the ones SRA's owners keep) added to it and zeroed, so the result is exactly
// MPI's sum of gradient + residual and nothing compressed earlier is lost; on a slow link the
// same spec compresses. Stats (and the Reducer's fallback_chunks) say which path ran.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator_internal.h"
#include "collectives/job_encoder.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/reducer.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using testing::world_rank;
using testing::world_size;

TensorView host_view(float* data, std::size_t count) {
  return TensorView{data, count, DType::f32, Device{}};
}

// A link the model must find faster than any compressed path on 2 cores (400 Gbit/s, 1 µs),
// or slower than every compressed path of a sign / top-k message (0.01 Gbit/s).
Communicator communicator_with_link(double gbps) {
  CommunicatorOptions options;
  options.link_latency_us = 1;
  options.link_gbps = gbps;
  return Communicator::world(options);
}

bool bytes_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// MPI's sum as the transport computes it: MPI_Iallreduce, which may add in another order than
// MPI_Allreduce (with 3 ranks Open MPI's do).
void transport_sum(float* data, int count) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
}

constexpr std::size_t kCount = 5000;

TEST(DenseFallback, FlushesEveryResidualOfTheTensorIntoAnExactDenseSum) {
  Communicator comm = communicator_with_link(400);
  error_feedback::ResidualStore& store = collectives::residuals_of(comm);
  // Step 1 compresses with SRA (explicit algo): each rank keeps the worker residual "w" and,
  // with two ranks or more, SRA's owner residual of its chunk.
  std::vector<float> first = testing::gaussian_contribution(kCount, world_rank(), 11);
  const CollectiveStats compressed =
      comm.allreduce(host_view(first.data(), kCount), "w", "sign:algo=sra,min_bytes=0");
  EXPECT_FALSE(compressed.fallback);
  EXPECT_EQ(compressed.algorithm, "sra");

  // What the flush must deliver: every residual of "w" folded into the worker's (on a copy).
  error_feedback::ResidualStore folded = store;
  folded.fold_into("w", kCount);
  const std::vector<float> residual(folded.residual("w").begin(), folded.residual("w").end());
  EXPECT_TRUE(std::any_of(residual.begin(), residual.end(), [](float e) { return e != 0.0f; }));
  const std::string server_key = collectives::residual_key(collectives::ResidualRole::sra_server, "w");
  if (world_size() >= 2) {
    // The owner residual is real mass the flush must not forget.
    ASSERT_TRUE(store.contains(server_key));
    const std::vector<float> worker(store.residual("w").begin(), store.residual("w").end());
    EXPECT_FALSE(bytes_equal(worker, residual)) << "SRA's owner residual was all zero";
  }

  // Step 2 with fallback=dense: on one rank there is no model (nothing to choose) and the call
  // compresses; on two or more the fast link makes it dense.
  std::vector<float> second = testing::gaussian_contribution(kCount, world_rank(), 12);
  std::vector<float> expected(kCount);
  for (std::size_t i = 0; i < kCount; ++i) expected[i] = second[i] + residual[i];
  transport_sum(expected.data(), static_cast<int>(kCount));
  const CollectiveStats dense =
      comm.allreduce(host_view(second.data(), kCount), "w", "sign:fallback=dense,min_bytes=0");
  if (world_size() == 1) {
    EXPECT_FALSE(dense.fallback) << dense.to_string();
    EXPECT_NE(dense.algorithm, "mpi");
    return;
  }
  EXPECT_TRUE(dense.fallback) << dense.to_string();
  EXPECT_EQ(dense.algorithm, "mpi");
  EXPECT_NE(dense.note.find("fallback=dense: dense "), std::string::npos) << dense.note;
  EXPECT_NE(dense.note.find("residual flushed"), std::string::npos) << dense.note;
  EXPECT_TRUE(bytes_equal(second, expected)) << "not MPI's sum of gradient + residual";
  // Nothing is left behind: the worker residual is zero and the owner residual is gone.
  const std::span<const float> after = store.residual("w");
  EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](float e) { return e == 0.0f; }));
  EXPECT_FALSE(store.contains(server_key));

  // Step 3: the dense choice is kept (the model's inputs did not change), and with a zero
  // residual it is exactly MPI's sum of the gradients.
  std::vector<float> third = testing::gaussian_contribution(kCount, world_rank(), 13);
  std::vector<float> exact = third;
  transport_sum(exact.data(), static_cast<int>(kCount));
  EXPECT_TRUE(comm.allreduce(host_view(third.data(), kCount), "w", "sign:fallback=dense,min_bytes=0")
                  .fallback);
  EXPECT_TRUE(bytes_equal(third, exact));
}

TEST(DenseFallback, ASlowLinkKeepsCompressingAndTheNoteGivesBothPredictions) {
  Communicator comm = communicator_with_link(0.01);
  for (const char* spec : {"sign:fallback=dense,min_bytes=0", "topk:fallback=dense,min_bytes=0",
                           "randk:fallback=dense,min_bytes=0"}) {
    SCOPED_TRACE(spec);
    std::vector<float> data = testing::gaussian_contribution(kCount, world_rank(), 21);
    const CollectiveStats stats = comm.allreduce(host_view(data.data(), kCount), spec, spec);
    EXPECT_FALSE(stats.fallback) << stats.to_string();
    EXPECT_NE(stats.algorithm, "mpi") << stats.to_string();
    if (world_size() >= 2) {
      EXPECT_NE(stats.note.find(", dense "), std::string::npos) << stats.note;
      EXPECT_LT(stats.sent_bytes(), kCount * sizeof(float)) << "it did not compress";
    }
  }
}

TEST(DenseFallback, TheReducerCountsItsDenseChunksAndAveragesExactly) {
  Communicator comm = communicator_with_link(400);
  ReducerOptions options;
  options.spec = "topk:ratio=0.01,fallback=dense,min_bytes=0";
  options.chunk_bytes = 8192;  // 2048 elements: kCount makes 3 chunks
  options.lanes = 1;
  Reducer reducer(comm, options);
  std::vector<float> gradient = testing::gaussian_contribution(kCount, world_rank(), 31);
  std::vector<float> expected = gradient;
  const float ranks = static_cast<float>(world_size());
  for (float& value : expected) value /= ranks;
  // The Reducer cuts the 5000 elements into ceil(5000 / 2048) = 3 chunks at floor(c 5000 / 3),
  // one all-reduce each (MPI's summation order may depend on the message size).
  for (const auto& [begin, end] : {std::pair<int, int>{0, 1666}, {1666, 3333}, {3333, 5000}})
    transport_sum(expected.data() + begin, end - begin);
  reducer.add("w", host_view(gradient.data(), kCount));
  reducer.mark_ready("w");
  reducer.wait();
  const ReducerStats& stats = reducer.stats();
  if (world_size() == 1) {
    EXPECT_EQ(stats.fallback_chunks, 0u);
    return;
  }
  EXPECT_EQ(stats.fallback_chunks, 3u);
  EXPECT_NE(stats.to_json().find("\"fallback_chunks\":3"), std::string::npos) << stats.to_json();
  // First step: the residual is zero, so the dense average is MPI's sum of g / P exactly.
  EXPECT_TRUE(bytes_equal(gradient, expected));
}

}  // namespace
}  // namespace gradzip
