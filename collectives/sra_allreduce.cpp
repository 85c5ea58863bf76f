// Scatter-reduce-allgather (SRA): a compressed all-reduce in two all-to-all style exchanges and
// exactly two compressions, whatever the number of ranks P.
//
// The tensor of n elements is cut into P chunks; chunk c = [shard_begin(n, P, c),
// shard_begin(n, P, c + 1)) is owned by rank c.
//
//   1. Scatter-reduce. Every rank encodes its contribution as P chunk messages (the worker
//      encoder, job_encoder.h: with error feedback the tensor's worker residual), its own chunk
//      included. The P x P message sizes are all-gathered (allgather_u64), then one alltoallv
//      delivers message c of every rank to owner c. The owner's own message is not sent (its
//      alltoallv block is empty) but decoded where it was encoded, so every contribution goes
//      through C and D alike.
//      The owner sums the P decoded contributions in rank order 0 .. P-1 with decode_add into a
//      zeroed f32 accumulator (a fixed order, so the sum does not depend on arrival order).
//   2. All-gather. The owner encodes the sum once (the sra_server encoder: with error feedback
//      a residual of the owned chunk's size, placed at the chunk's offset in the worker's),
//      the P message sizes are all-gathered, then the messages (allgatherv). Every rank decodes
//      every chunk from the gathered bytes, the owner its own message too, so all ranks end
//      with the same bytes.
//
//   result = D_s(C_s(sum_r D(C(g_r + e_r)) + e_s))            (per chunk; e = residuals)
//
// P == 1 runs the same two stages without communication, so a lossy codec and error feedback
// behave the same at every P. sra_reduce_scatter is step 1 alone: the rank's shard of the
// output holds the f32 sum of the decoded contributions, with no server-side encode.
//
// Error feedback over the two stages telescopes (real arithmetic, per element, step t):
//   worker r:  d_r = D(C(g_r + e_r^{t-1})),   e_r^t = g_r + e_r^{t-1} - d_r
//   owner:     s = sum_r d_r,  out = D_s(C_s(s + E^{t-1})),   E^t = s + E^{t-1} - out
//   => out^t = sum_r (g_r^t + e_r^{t-1} - e_r^t) + E^{t-1} - E^t, and summed over t = 1..T
//      (e^0 = E^0 = 0): sum_t out^t + sum_r e_r^T + E^T = sum_t sum_r g_r^t.
// Nothing that either compression drops is lost: it waits in a worker or the owner's residual.
//
// Bytes this rank sends (the stats count them the same way): P - 1 worker messages of about
// |C(chunk)| each in step 1 and its server message to each of the P - 1 other ranks in step 2,
// i.e. about 2 (P - 1) / P |C(n)| plus 2 (P - 1) headers. The size exchanges (P + 1 u64 per rank)
// are metadata and are not counted as messages.
// A stream-ordered device call whose codec's message sizes are fixed (job.sizes_known) skips
// both size exchanges: every message has its chunk's max_encoded_bytes, known to every rank.
//
// Validation: every rank checks the whole all-gathered size table (each announced message must
// be between a bare header and codec.max_encoded_bytes(chunk count)) before any buffer is sized
// from it, so a bad size makes every rank throw malformed_message together instead of some
// ranks waiting in the next exchange. Message contents are validated by the decoders.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

// One SRA call. The constructor fixes the chunk partition and each chunk's message bound (what
// every buffer and every size check derives from); the steps encode, move bytes and decode.
class SraRound {
 public:
  SraRound(ReduceJob& job, const char* op)
      : job_(job),
        op_(op),
        ranks_(job.transport.size()),
        rank_(job.transport.rank()),
        chunk_begin_(static_cast<std::size_t>(ranks_) + 1),
        chunk_capacity_(static_cast<std::size_t>(ranks_)),
        send_(job.device),
        own_message_(job.device),
        received_(job.device),
        owned_message_(job.device),
        gathered_(job.device) {
    const std::size_t n = job.data.size();
    for (int c = 0; c <= ranks_; ++c) chunk_begin_[idx(c)] = shard_begin(n, ranks_, c);
    for (int c = 0; c < ranks_; ++c)
      chunk_capacity_[idx(c)] = job.codec.max_encoded_bytes(chunk_count(c));
    worker_encoder_.emplace(job_encoder(job, ResidualRole::worker, n));
    server_encoder_.emplace(job_encoder(job, ResidualRole::sra_server, chunk_count(rank_)));
    // The owner-side residual covers this rank's chunk of the tensor (ResidualStore::fold_into).
    server_encoder_->place_in_worker(chunk_begin_[idx(rank_)]);
  }

  // Step 1: encodes this rank's P chunk messages, delivers chunk c's messages to owner c and
  // returns the owner's f32 sum of the P decoded contributions (rank order 0 .. P-1).
  // Returns this rank's owned slice of job.data, now holding the sum.
  std::span<float> scatter_reduce() {
    encode_contributions();
    exchange_contributions();
    return sum_contributions();
  }

  // Step 2: encodes the owner's sum `owned_sum` once, all-gathers the P owners' messages and
  // decodes all of them into job.data.
  void allgather(std::span<const float> owned_sum) {
    encode_owned_sum(owned_sum);
    gather_owned_messages();
    decode_gathered();
  }

  std::size_t chunk_count(int c) const { return chunk_begin_[idx(c) + 1] - chunk_begin_[idx(c)]; }
  std::size_t owned_begin() const { return chunk_begin_[idx(rank_)]; }

 private:
  static std::size_t idx(int r) { return static_cast<std::size_t>(r); }

  ConstTensorView input_chunk(int c) const {
    return ConstTensorView(job_.data.data() + chunk_begin_[idx(c)], chunk_count(c), DType::f32,
                           job_.device);
  }
  // f32 values of job.data (host or device memory), as a view the codec takes.
  TensorView data_view(std::span<float> values) const {
    return TensorView{values.data(), values.size(), DType::f32, job_.device};
  }

  // The messages to the other ranks are packed back to back in rank order (alltoallv's block
  // layout, with an empty block for this rank); the own chunk's message goes to own_message_.
  // Chunk c is written at the end of the earlier chunks' messages, where at least
  // sum_{c' >= c} capacity(c') >= capacity(c) bytes remain, as encode requires.
  void encode_contributions() {
    StageTimer timer(job_.stats, Stage::encode);
    send_.resize(std::accumulate(chunk_capacity_.begin(), chunk_capacity_.end(), std::size_t{0}) -
                 chunk_capacity_[idx(rank_)]);
    own_message_.resize(chunk_capacity_[idx(rank_)]);
    send_sizes_.assign(idx(ranks_), 0);
    send_offsets_.assign(idx(ranks_), 0);
    std::size_t offset = 0;
    for (int c = 0; c < ranks_; ++c) {
      const std::span<std::byte> out = c == rank_ ? own_message_.span() : send_.span().subspan(offset);
      const EncodeContext ctx = encode_context(job_, chunk_begin_[idx(c)]);
      const std::size_t bytes = worker_encoder_->encode(input_chunk(c), out, ctx);
      require_known_size(job_, chunk_count(c), bytes);
      count_encoded(job_.stats, chunk_count(c), bytes);
      if (c == rank_) {
        own_message_.resize(bytes);
        continue;
      }
      send_sizes_[idx(c)] = bytes;
      send_offsets_[idx(c)] = offset;
      offset += bytes;
    }
  }

  // The message of chunk c (c != rank_) in send_.
  std::span<const std::byte> sent_message(int c) const {
    return std::span<const std::byte>(send_.span()).subspan(send_offsets_[idx(c)], send_sizes_[idx(c)]);
  }

  // Throws malformed_message when rank `sender` announced `bytes` for a message of chunk
  // `chunk`: a message is at least a header and at most the codec's bound for the chunk.
  void check_announced_size(std::uint64_t bytes, int sender, int chunk, const char* step) const {
    const std::size_t capacity = chunk_capacity_[idx(chunk)];
    GZ_REQUIRE(bytes >= compressors::kWireHeaderBytes && bytes <= capacity,
               ErrorCode::malformed_message, op_, " of '", job_.name, "' (",
               job_.transport.describe(), "): ", step, ": rank ", sender,
               " announced a message of ", bytes, " bytes for chunk ", chunk, " (",
               chunk_count(chunk), " elements); a valid message has ",
               compressors::kWireHeaderBytes, " to ", capacity, " bytes");
  }

  void exchange_contributions() {
    if (ranks_ == 1) return;  // the only message is this rank's own, decoded from send_
    std::vector<std::uint64_t> sizes(idx(ranks_) * idx(ranks_));  // sizes[s * P + c]
    if (job_.sizes_known) {
      // Every message has its chunk's max_encoded_bytes: no exchange.
      for (int s = 0; s < ranks_; ++s)
        for (int c = 0; c < ranks_; ++c) sizes[idx(s) * idx(ranks_) + idx(c)] = chunk_capacity_[idx(c)];
    } else {
      StageTimer timer(job_.stats, Stage::communicate);
      std::vector<std::uint64_t> mine(send_sizes_.begin(), send_sizes_.end());
      mine[idx(rank_)] = own_message_.size();
      job_.transport.allgather_u64(mine, sizes);
    }
    for (int s = 0; s < ranks_; ++s)
      for (int c = 0; c < ranks_; ++c)
        check_announced_size(sizes[idx(s) * idx(ranks_) + idx(c)], s, c, "scatter-reduce");

    std::vector<std::size_t> recv_counts(idx(ranks_));
    for (int s = 0; s < ranks_; ++s)
      recv_counts[idx(s)] = s == rank_ ? 0 : sizes[idx(s) * idx(ranks_) + idx(rank_)];
    received_.resize(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
    for (int d = 0; d < ranks_; ++d)
      if (d != rank_) count_sent(job_, sent_message(d));
    job_.stats.received_bytes += received_.size();
    StageTimer timer(job_.stats, Stage::communicate);
    job_.transport.alltoallv(send_.span(), send_sizes_, received_.span(), recv_counts);
    received_sizes_ = std::move(recv_counts);
  }

  // Sums into the owned slice of job.data: its contribution is already encoded in own_message_,
  // so the slice is free, and reduce-scatter's result lands in place without a copy.
  std::span<float> sum_contributions() {
    StageTimer timer(job_.stats, Stage::decode);
    const std::size_t owned = chunk_count(rank_);
    const std::span<float> sum = job_.data.subspan(owned_begin(), owned);
    fill_zero(sum, job_.device);
    std::size_t offset = 0;
    for (int s = 0; s < ranks_; ++s) {
      if (s == rank_) {
        job_.codec.decode_add(own_message_.span(), data_view(sum));
      } else {
        const std::size_t bytes = received_sizes_[idx(s)];
        job_.codec.decode_add(received_.span().subspan(offset, bytes), data_view(sum));
        offset += bytes;
      }
    }
    return sum;
  }

  void encode_owned_sum(std::span<const float> owned_sum) {
    StageTimer timer(job_.stats, Stage::encode);
    const ConstTensorView sum(owned_sum.data(), owned_sum.size(), DType::f32, job_.device);
    owned_message_.resize(chunk_capacity_[idx(rank_)]);
    const EncodeContext ctx = encode_context(job_, 0, /*server=*/true);
    owned_bytes_ = server_encoder_->encode(sum, owned_message_.span(), ctx);
    require_known_size(job_, sum.count, owned_bytes_);
    count_encoded(job_.stats, sum.count, owned_bytes_);
  }

  void gather_owned_messages() {
    const std::span<const std::byte> mine(owned_message_.data(), owned_bytes_);
    if (ranks_ == 1) {
      gathered_.assign(mine);
      gathered_sizes_.assign(1, owned_bytes_);
      return;
    }
    std::vector<std::uint64_t> sizes(idx(ranks_));
    if (job_.sizes_known) {
      for (int c = 0; c < ranks_; ++c) sizes[idx(c)] = chunk_capacity_[idx(c)];
    } else {
      StageTimer timer(job_.stats, Stage::communicate);
      const std::uint64_t announced = owned_bytes_;
      job_.transport.allgather_u64(std::span<const std::uint64_t>(&announced, 1), sizes);
    }
    for (int c = 0; c < ranks_; ++c) check_announced_size(sizes[idx(c)], c, c, "all-gather");
    gathered_sizes_.assign(sizes.begin(), sizes.end());
    gathered_.resize(std::accumulate(gathered_sizes_.begin(), gathered_sizes_.end(),
                                     std::size_t{0}));
    // The owner's message reaches each of the P - 1 other ranks once.
    for (int d = 1; d < ranks_; ++d) count_sent(job_, mine);
    job_.stats.received_bytes += gathered_.size() - owned_bytes_;
    StageTimer timer(job_.stats, Stage::communicate);
    job_.transport.allgatherv(mine, gathered_.span(), gathered_sizes_);
  }

  void decode_gathered() {
    StageTimer timer(job_.stats, Stage::decode);
    std::size_t offset = 0;
    for (int c = 0; c < ranks_; ++c) {
      const std::size_t bytes = gathered_sizes_[idx(c)];
      job_.codec.decode(gathered_.span().subspan(offset, bytes),
                        data_view(job_.data.subspan(chunk_begin_[idx(c)], chunk_count(c))));
      offset += bytes;
    }
  }

  ReduceJob& job_;
  const char* op_;
  int ranks_;
  int rank_;
  std::vector<std::size_t> chunk_begin_;     // P + 1 chunk boundaries
  std::vector<std::size_t> chunk_capacity_;  // codec.max_encoded_bytes of each chunk
  std::optional<JobEncoder> worker_encoder_;  // this rank's P contribution chunks
  std::optional<JobEncoder> server_encoder_;  // the owned chunk's reduced sum

  // Step 1: this rank's messages to the other ranks, back to back in rank order, their sizes
  // and offsets by destination (size 0 for this rank), and the message of the owned chunk.
  // Message memory is host or device memory, where job.data lives.
  MessageBuffer send_;
  std::vector<std::size_t> send_sizes_;
  std::vector<std::size_t> send_offsets_;
  MessageBuffer own_message_;
  MessageBuffer received_;                   // step 1: the other ranks' messages of the owned chunk
  std::vector<std::size_t> received_sizes_;  // by sender; 0 for this rank

  MessageBuffer owned_message_;  // step 2: the owner's message (capacity-sized)
  std::size_t owned_bytes_ = 0;
  MessageBuffer gathered_;                   // step 2: every owner's message, rank order
  std::vector<std::size_t> gathered_sizes_;
};

}  // namespace

void sra_allreduce(ReduceJob& job) {
  if (const std::size_t segments =
          pipeline_segments(job, kMaxSegmentsPerChunk, /*stream_ordered_device=*/true);
      segments > 1)
    return sra_pipelined(job, segments, /*allgather=*/true);
  SraRound round(job, "sra_allreduce");
  const std::span<const float> owned_sum = round.scatter_reduce();
  round.allgather(owned_sum);
}

void sra_reduce_scatter(ReduceJob& job) {
  if (const std::size_t segments =
          pipeline_segments(job, kMaxSegmentsPerChunk, /*stream_ordered_device=*/true);
      segments > 1)
    return sra_pipelined(job, segments, /*allgather=*/false);
  SraRound round(job, "sra_reduce_scatter");
  round.scatter_reduce();  // leaves the sum in this rank's shard of job.data
}

}  // namespace gradzip::collectives
