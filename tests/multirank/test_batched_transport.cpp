// The algorithms that run over NCCL, checked on CPUs: BatchedTransport gives a host transport
// NCCL's point-to-point rules (collectives/transport/nccl/nccl_transport.h):
//   - isend / irecv only record; the next wait() or start_posted() hands every recorded
//     operation to MPI at once, and a wait returns only when its whole batch has completed
//     (a group kernel completes as a whole);
//   - a receive must be exactly as long as the message that matches it;
//   - there are no tags: between two ranks, receives match sends in the order both were posted.
// A batch holding a receive whose send the peer posts only after one of its own later waits
// never completes under these rules, as on NCCL; here the test would hang (ctest's timeout
// fails it). So every algorithm routed to NCCL is run here at several rank counts, and its
// result must be byte-identical to the same call over plain MPI.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "multirank_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::Transport;
using testing::world_rank;
using testing::world_size;

class BatchedTransport final : public testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;

  Request isend(int peer, int tag, std::span<const std::byte> data) override {
    Op op;
    op.peer = peer;
    op.tag = tag;
    op.data = const_cast<std::byte*>(data.data());  // only read: it is sent
    op.bytes = data.size();
    return record(op);
  }
  Request irecv(int peer, int tag, std::span<std::byte> buffer) override {
    Op op;
    op.receive = true;
    op.peer = peer;
    op.tag = tag;
    op.data = buffer.data();
    op.bytes = buffer.size();
    return record(op);
  }

  std::size_t wait(Request request) override {
    Op& op = ops_.at(request.id);
    if (!op.started) start_posted();
    // The whole batch completes before any of its requests does.
    for (Op& other : ops_) {
      if (other.batch != op.batch || other.completed) continue;
      other.bytes_moved = inner().wait(other.inner);
      other.completed = true;
      if (other.receive && other.bytes_moved != other.bytes) {
        GZ_THROW(ErrorCode::size_mismatch, "batched transport: a receive of ", other.bytes,
                 " bytes from rank ", other.peer, " matched a message of ", other.bytes_moved,
                 " (NCCL needs both sides to name the same size)");
      }
    }
    ++waits_;
    return op.bytes_moved;
  }

  // NCCL has no tags. Every operation goes to MPI under one tag, so MPI's non-overtaking rule
  // (messages between two ranks with the same tag and communicator match in posting order) is
  // NCCL's: an algorithm that relies on tags to pair messages posted in different orders gets
  // the wrong bytes or a size mismatch here, as it would on NCCL.
  static constexpr int kOneTag = 0;

  void start_posted() override {
    for (Op& op : ops_) {
      if (op.started) continue;
      op.inner = op.receive ? inner().irecv(op.peer, kOneTag, {op.data, op.bytes})
                            : inner().isend(op.peer, kOneTag, {op.data, op.bytes});
      op.started = true;
      op.batch = batch_;
    }
    ++batch_;
  }

  bool waits_complete_whole_batches() const noexcept override { return true; }
  int waits() const noexcept { return waits_; }

 private:
  struct Op {
    bool receive = false;
    int peer = 0;
    int tag = 0;
    std::byte* data = nullptr;
    std::size_t bytes = 0;
    bool started = false;
    bool completed = false;
    std::size_t batch = 0;
    Request inner;
    std::size_t bytes_moved = 0;
  };
  Request record(Op op) {
    ops_.push_back(op);
    return Request{ops_.size() - 1};
  }

  std::vector<Op> ops_;  // every operation of the transport's life (tests are short)
  std::size_t batch_ = 0;
  int waits_ = 0;
};

struct Pair {
  Communicator plain;
  Communicator batched;
  BatchedTransport* batched_transport;
};

Pair make_pair() {
  auto batched = std::make_unique<BatchedTransport>(std::make_unique<MpiTransport>(MPI_COMM_WORLD));
  BatchedTransport* raw = batched.get();
  // One given link for both, so that algo=auto chooses alike in the two (γ is per process).
  CommunicatorOptions options;
  options.link_latency_us = 20;
  options.link_gbps = 10;
  return Pair{collectives::make_communicator(std::make_unique<MpiTransport>(MPI_COMM_WORLD), options),
              collectives::make_communicator(std::move(batched), options), raw};
}

std::vector<float> contribution(std::size_t count, int call) {
  return testing::gaussian_contribution(count, world_rank(), 1000 + static_cast<std::uint64_t>(call));
}

TEST(BatchedTransport, AllreduceAlgorithmsGiveThePlainResult) {
  // Every algorithm the Communicator routes to NCCL: ring (fixed-size codecs, exact top-k),
  // SRA, the sparse all-reduce (exact and approximate top-k, and its dense switch), with error
  // feedback, and the uncompressed ring.
  const std::vector<std::string> specs = {
      "none:algo=ring",  "fp16",          "bf16:ef=on",        "qsgd:bits=4,bucket=512",
      "sign:ef=on",      "qsgd:bits=2,algo=ring", "topk:ratio=0.01",  "topk:ratio=0.01,approx=on,ef=on",
      "topk:ratio=0.02,algo=ring", "topk:ratio=0.6", "sign:algo=sparse", "fp16:algo=ring,segment=300"};
  Pair pair = make_pair();
  for (const std::string& spec : specs) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{100003}}) {
      const std::string name = spec + "/" + std::to_string(count);  // residuals per size
      SCOPED_TRACE(name);
      for (int call = 0; call < 2; ++call) {
        std::vector<float> plain = contribution(count, call);
        std::vector<float> batched = plain;
        const CollectiveStats want =
            pair.plain.allreduce(host_view(plain.data(), count), name, spec, ReduceOp::average);
        const CollectiveStats got =
            pair.batched.allreduce(host_view(batched.data(), count), name, spec, ReduceOp::average);
        EXPECT_EQ(got.algorithm, want.algorithm);
        // The same payload and index bytes; over MPI the ring and SRA may run pipelined
        // (one header per extra segment message), over NCCL never.
        EXPECT_EQ(got.sent_payload_bytes, want.sent_payload_bytes);
        EXPECT_EQ(got.sent_index_bytes, want.sent_index_bytes);
        EXPECT_LE(got.sent_header_bytes, want.sent_header_bytes);
        if (spec == "fp16:algo=ring,segment=300" && count == 100003 &&
            world_size() >= collectives::kMinRanksForPipelinedRing) {
          // Chunks of 100003 / P fp16 elements (>= 40 KB) cut into 300-byte segments: more
          // headers over MPI (the ring pipelines from 3 ranks on).
          EXPECT_GT(want.sent_header_bytes, got.sent_header_bytes);
        }
        if (count > 0) {
          ASSERT_EQ(std::memcmp(plain.data(), batched.data(), count * sizeof(float)), 0);
        }
      }
    }
  }
  if (world_size() > 1) {
    EXPECT_GT(pair.batched_transport->waits(), 0);
  }
  // What the Communicator tells algo=auto's model (LinkModel::pipelined) and what the ring and
  // SRA go by: MPI pipelines, NCCL (the batched emulation) does not.
  MpiTransport mpi(MPI_COMM_WORLD);
  EXPECT_TRUE(collectives::transport_pipelines(mpi));
  EXPECT_FALSE(collectives::transport_pipelines(*pair.batched_transport));
}

// The emulation's own rule, checked against MPI's: rank 0 sends A (tag 5) then B (tag 6) to
// rank 1, which posts its receive for tag 6 first. MPI pairs by tag (the first receive gets B);
// NCCL, and so the batched transport, by posting order (the first receive gets A).
TEST(BatchedTransport, ReceivesMatchSendsInPostingOrderWhateverTheTags) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<float> a = {1.0f, 2.0f}, b = {3.0f, 4.0f};
  const auto bytes = [](const std::vector<float>& v) { return std::as_bytes(std::span(v)); };
  const auto writable = [](std::vector<float>& v) { return std::as_writable_bytes(std::span(v)); };
  for (const bool batched : {false, true}) {
    SCOPED_TRACE(batched ? "batched (NCCL's rule)" : "plain MPI");
    MpiTransport mpi(MPI_COMM_WORLD);
    BatchedTransport nccl_like(mpi);
    Transport& transport = batched ? static_cast<Transport&>(nccl_like) : mpi;
    if (world_rank() == 0) {
      const Transport::Request first = transport.isend(1, 5, bytes(a));
      const Transport::Request second = transport.isend(1, 6, bytes(b));
      transport.wait(first);
      transport.wait(second);
    } else if (world_rank() == 1) {
      std::vector<float> first_posted(2), second_posted(2);
      const Transport::Request first = transport.irecv(0, 6, writable(first_posted));
      const Transport::Request second = transport.irecv(0, 5, writable(second_posted));
      transport.wait(first);
      transport.wait(second);
      EXPECT_EQ(first_posted, batched ? a : b);
      EXPECT_EQ(second_posted, batched ? b : a);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST(BatchedTransport, ShardedCollectivesGiveThePlainResult) {
  Pair pair = make_pair();
  const std::size_t count = 50021;
  for (const char* spec : {"qsgd:bits=4", "fp16", "topk:ratio=0.05", "sign:ef=on"}) {
    SCOPED_TRACE(spec);
    std::vector<float> plain = contribution(count, 0);
    std::vector<float> batched = plain;
    pair.plain.reduce_scatter(host_view(plain.data(), count), "s", CompressionSpec::parse(spec));
    pair.batched.reduce_scatter(host_view(batched.data(), count), "s", CompressionSpec::parse(spec));
    const std::size_t begin = pair.plain.shard_begin(count, world_rank());
    const std::size_t end = pair.plain.shard_begin(count, world_rank() + 1);
    ASSERT_EQ(std::memcmp(plain.data() + begin, batched.data() + begin, (end - begin) * sizeof(float)), 0);
    pair.plain.allgather(host_view(plain.data(), count), "s", CompressionSpec::parse(spec));
    pair.batched.allgather(host_view(batched.data(), count), "s", CompressionSpec::parse(spec));
    ASSERT_EQ(std::memcmp(plain.data(), batched.data(), count * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace gradzip
