// Pipelined scatter-reduce-allgather: SRA (collectives/sra_allreduce.cpp) with each of the P
// chunks cut into S segments (collectives/segment_plan.h), so that inside one call the encode of
// one segment overlaps the transfer of the one before and the owner's sum, server encode and
// the final decodes of earlier segments.
//
// Same arithmetic as SRA, segment by segment: segment k of chunk c is encoded by every rank (the
// worker encoder, error feedback keyed by the element's index in the tensor) and sent to owner
// c; the owner sums the P decoded contributions in rank order 0 .. P-1 into its slice of
// job.data, encodes the sum once (the server encoder, residual of the owned chunk, element
// offset counted from the chunk's start) and sends that message to every other rank; every rank
// decodes every owner's message, its own included. Segment boundaries are whole codec granules
// (whole buckets and code bytes), so the decoded values, the residuals and the result are bit
// for bit those of the unsegmented SRA; the bytes on the wire are the same payload bytes plus
// one 32-byte header per extra message: 2 (P - 1) (S - 1) more headers sent per rank
// (docs/algorithms.md).
//
// Schedule on rank r (receives take a buffer of their segment's message bound and are posted one
// segment ahead; a receive matches the sends of its (peer, tag) in posting order, so one tag
// per phase serves all segments):
//   for k = 0 .. S-1:
//     post the receives of segment k+1 (segment 0's before the loop)
//     encode segment k of chunks r+1, r+2, ..., r+P-1 (mod P), sending each message as soon as
//       it is written, then the own chunk's (kept for the sum)
//     k >= 1: wait for segment k-1's contributions, sum them, encode the sum, send it to all
//     k >= 2: wait for segment k-2's owner messages and decode them
//   then the sums of segment S-1 and the decodes of S-2 and S-1.
// A segment's contributions were sent one whole segment's encode earlier, so the waits find
// them arrived when the wire keeps up with the encode.
//
// Errors: a received message that is too long, shorter than a header, over its segment's bound
// or refused by the decoder does not end the call on the spot (the peers would wait for this
// rank's sends): the first such failure is held, every send and receive of the schedule still
// runs (a failed sum is still encoded and sent; its values are unspecified), and at the end one
// allgather_u64 of every rank's status makes every rank throw malformed_message together: the
// ranks that received bad bytes their own error, the others one naming those ranks. Any other
// error (a timeout, a failed encode) leaves at once; the posted requests are completed first
// (PendingRequests), within the transport's deadline.
//
// Host memory over transports whose posted operations start when posted and whose messages are
// cheap (MPI), and device memory in a stream-ordered call over NCCL with fixed-size messages;
// elsewhere (host memory over NCCL-like transports, those whose every message is expensive:
// torch.distributed through Python) the unsegmented SRA runs.
//
// Over NCCL (Transport::waits_complete_whole_batches: posted operations start together at the
// next wait, as one group) a receive posted a segment ahead would sit in a group that cannot
// complete before the peers' later groups, which wait for it. There each exchange is one group
// of its own, its receives posted with its sends and started at once (start_posted): segment k's
// contributions (every rank's P - 1 sends to the owners, its P - 1 receives), then segment
// k - 1's owner messages. Every rank launches the same sequence of groups (C0, C1, O0, C2, O1,
// ..., O(S-1)), so a rank's sends to a peer and that peer's receives from it pair up in order.
// In a stream-ordered call nothing waits on the host: segment k + 1's encodes are queued on the
// work stream while segment k's group runs on the transport's stream; a decode waits (on the
// device) for its own segment's group; malformed messages are found by the device checks and
// agreed on at the call's completion.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "collectives/segment_plan.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

// Tags of their own (collectives/message_tags.h), so that no message of another algorithm can
// match these receives.
constexpr int kContributionTag = tag_of(MessageTag::sra_contribution);  // to a chunk's owner
constexpr int kOwnerTag = tag_of(MessageTag::sra_owner);  // the owners' reduced segments

// A message's place in the call's one buffer: `capacity` bytes from `offset`.
struct Slot {
  std::size_t offset = 0;
  std::size_t capacity = 0;
};

class PipelinedSra {
 public:
  // allgather false: the reduce-scatter half only.
  PipelinedSra(ReduceJob& job, std::size_t segments, bool allgather)
      : job_(job),
        op_(allgather ? "sra_allreduce" : "sra_reduce_scatter"),
        allgather_(allgather),
        ranks_(job.transport.size()),
        rank_(job.transport.rank()),
        segments_(segments),
        plan_(job.codec, job.data.size(), ranks_, segments),
        worker_encoder_(job_encoder(job, ResidualRole::worker, job.data.size())),
        server_encoder_(job_encoder(job, ResidualRole::sra_server, owned_count(job))),
        pending_(job.transport),
        memory_(job.device) {
    server_encoder_.place_in_worker(plan_.chunk_begin(rank_));
    lay_out_slots();
  }

  // The whole call. The reduce-scatter half leaves this rank's shard of job.data holding the
  // sum of the decoded contributions.
  void run() {
    // Before any request is posted, so that a residual size mismatch throws on every rank.
    worker_encoder_.register_residual();
    if (allgather_) server_encoder_.register_residual();
    receive_contribution_.assign(segments_ * idx(ranks_), SIZE_MAX);
    receive_owner_.assign(segments_ * idx(ranks_), SIZE_MAX);
    if (!per_exchange_groups_) post_receives(0);
    for (std::size_t k = 0; k < segments_; ++k) {
      if (!per_exchange_groups_ && k + 1 < segments_) post_receives(k + 1);
      encode_contributions(k);
      if (k >= 1) reduce_segment(k - 1);
      if (allgather_ && k >= 2) decode_owner_messages(k - 2);
    }
    reduce_segment(segments_ - 1);
    if (allgather_) {
      if (segments_ >= 2) decode_owner_messages(segments_ - 2);
      decode_owner_messages(segments_ - 1);
    }
    for (const std::size_t send : sends_) pending_.timed_wait(send, job_.stats);
    // A stream-ordered call's completion makes the ranks agree on its device checks.
    if (job_.stream_ordered) failures_.rethrow();
    else failures_.agree(job_.transport, job_.stats, op_, job_.name);
  }

 private:
  static std::size_t idx(int r) { return static_cast<std::size_t>(r); }
  static std::size_t owned_count(const ReduceJob& job) {
    const std::size_t n = job.data.size();
    const int ranks = job.transport.size();
    const int rank = job.transport.rank();
    return shard_begin(n, ranks, rank + 1) - shard_begin(n, ranks, rank);
  }
  std::size_t at(std::size_t k, int c) const { return k * idx(ranks_) + idx(c); }

  std::size_t segment_count(std::size_t k, int c) const { return plan_.segment_count(k, c); }
  std::span<float> segment_data(std::size_t k, int c) const {
    return plan_.segment_of(job_.data, k, c);
  }
  std::span<std::byte> slot(const Slot& s) const { return memory_.span().subspan(s.offset, s.capacity); }

  // One buffer for every message of the call: per segment, this rank's P contribution
  // messages, the P - 1 contributions it receives and (all-reduce) its owner message and the
  // P - 1 owner messages it receives, each sized by the codec's bound for its segment.
  void lay_out_slots() {
    std::size_t offset = 0;
    const auto take = [&offset](std::size_t capacity) {
      const Slot s{offset, capacity};
      offset += capacity;
      return s;
    };
    const std::size_t all = segments_ * idx(ranks_);
    contribution_.resize(all);
    received_.resize(all);
    owner_.resize(all);  // owner_[at(k, c)]: chunk c's owner message of segment k
    for (std::size_t k = 0; k < segments_; ++k) {
      const std::size_t own_capacity = job_.codec.max_encoded_bytes(segment_count(k, rank_));
      for (int c = 0; c < ranks_; ++c) {
        const std::size_t capacity = job_.codec.max_encoded_bytes(segment_count(k, c));
        contribution_[at(k, c)] = take(capacity);
        if (c != rank_) received_[at(k, c)] = take(own_capacity);
        if (allgather_) owner_[at(k, c)] = take(capacity);
      }
    }
    memory_.resize(offset);
    contribution_bytes_.assign(all, 0);
    owner_bytes_.assign(all, 0);
  }

  // Posts the receives of segment k: its P - 1 contributions to this rank's chunk and
  // (allgather) the P - 1 other owners' messages. Segment k + 1's are posted before segment k is
  // encoded, so a receive is waiting when its message comes (it arrives during the encode of
  // segment k + 1 or later) while at most two segments' receives are outstanding: MPI matches
  // an arriving message against the posted receives one by one.
  void post_receives(std::size_t k) {
    post_contribution_receives(k);
    if (allgather_) post_owner_receives(k);
  }
  void post_contribution_receives(std::size_t k) {
    for (int i = 1; i < ranks_; ++i) {
      const int s = (rank_ + ranks_ - i) % ranks_;
      receive_contribution_[at(k, s)] =
          pending_.add(job_.transport.irecv(s, kContributionTag, slot(received_[at(k, s)])));
    }
  }
  void post_owner_receives(std::size_t k) {
    for (int i = 1; i < ranks_; ++i) {
      const int o = (rank_ + ranks_ - i) % ranks_;
      receive_owner_[at(k, o)] =
          pending_.add(job_.transport.irecv(o, kOwnerTag, slot(owner_[at(k, o)])));
    }
  }

  void send(int peer, int tag, std::span<const std::byte> message) {
    sends_.push_back(pending_.add(job_.transport.isend(peer, tag, message)));
    count_sent(job_, message);
  }

  // Segment k of every chunk through the worker encoder; the other ranks' chunks first, each
  // sent as soon as it is encoded, the own chunk's last (it stays here for the sum).
  void encode_contributions(std::size_t k) {
    if (per_exchange_groups_) post_contribution_receives(k);
    for (int i = 1; i <= ranks_; ++i) {
      const int c = (rank_ + i) % ranks_;
      std::span<const std::byte> message;
      {
        StageTimer timer(job_.stats, Stage::encode);
        const std::span<float> values = segment_data(k, c);
        const ConstTensorView input(values.data(), values.size(), DType::f32, job_.device);
        const std::size_t bytes = worker_encoder_.encode(
            input, slot(contribution_[at(k, c)]), encode_context(job_, plan_.segment_first(k, c)));
        count_encoded(job_.stats, values.size(), bytes);
        contribution_bytes_[at(k, c)] = bytes;
        message = slot(contribution_[at(k, c)]).first(bytes);
      }
      if (c != rank_) send(c, kContributionTag, message);
    }
    if (per_exchange_groups_) job_.transport.start_posted();  // segment k's contributions
  }

  // Completes a receive; returns the message, or nothing (failure held) when the transport or
  // the size check refused it.
  std::optional<std::span<const std::byte>> receive(std::size_t request, const Slot& s,
                                                    int sender, std::size_t k, const char* what) {
    std::size_t bytes = 0;
    if (!failures_.run([&] { bytes = pending_.wait_receive(request, job_.stats); }))
      return std::nullopt;
    if (bytes < compressors::kWireHeaderBytes) {
      failures_.hold(Error(ErrorCode::malformed_message,
                 detail::concat(op_, " of '", job_.name, "' (", job_.transport.describe(), "): ",
                                what, " of segment ", k, " from rank ", sender, " has ", bytes,
                                " bytes, less than a ", compressors::kWireHeaderBytes,
                                "-byte header")));
      return std::nullopt;
    }
    return std::span<const std::byte>(slot(s).first(bytes));
  }

  // The owner's step for segment k: the P contributions summed in rank order into the owned
  // slice of job.data, then (all-reduce) encoded once and sent to every other rank.
  void reduce_segment(std::size_t k) {
    std::vector<std::optional<std::span<const std::byte>>> messages(idx(ranks_));
    for (int s = 0; s < ranks_; ++s) {
      if (s == rank_)
        messages[idx(s)] = slot(contribution_[at(k, s)]).first(contribution_bytes_[at(k, s)]);
      else
        messages[idx(s)] = receive(receive_contribution_[at(k, s)], received_[at(k, s)], s, k,
                                   "the contribution");
    }
    const std::span<float> sum = segment_data(k, rank_);
    {
      StageTimer timer(job_.stats, Stage::decode);
      fill_zero(sum, job_.device);
      const TensorView accumulator{sum.data(), sum.size(), DType::f32, job_.device};
      for (int s = 0; s < ranks_; ++s)
        if (messages[idx(s)])
          failures_.run([&] { job_.codec.decode_add(*messages[idx(s)], accumulator); });
    }
    if (!allgather_) return;
    std::span<const std::byte> message;
    {
      StageTimer timer(job_.stats, Stage::encode);
      const ConstTensorView input(sum.data(), sum.size(), DType::f32, job_.device);
      const std::size_t bytes = server_encoder_.encode(
          input, slot(owner_[at(k, rank_)]),
          encode_context(job_, plan_.segment_offset(k, rank_), /*server=*/true));
      count_encoded(job_.stats, sum.size(), bytes);
      owner_bytes_[at(k, rank_)] = bytes;
      message = slot(owner_[at(k, rank_)]).first(bytes);
    }
    if (per_exchange_groups_) post_owner_receives(k);
    for (int i = 1; i < ranks_; ++i) send((rank_ + i) % ranks_, kOwnerTag, message);
    if (per_exchange_groups_) job_.transport.start_posted();  // segment k's owner messages
  }

  // Every owner's message of segment k decoded into its chunk's segment of job.data.
  void decode_owner_messages(std::size_t k) {
    for (int o = 0; o < ranks_; ++o) {
      std::optional<std::span<const std::byte>> message;
      if (o == rank_)
        message = slot(owner_[at(k, o)]).first(owner_bytes_[at(k, o)]);
      else
        message = receive(receive_owner_[at(k, o)], owner_[at(k, o)], o, k, "the owner message");
      if (!message) continue;
      StageTimer timer(job_.stats, Stage::decode);
      const std::span<float> values = segment_data(k, o);
      failures_.run([&] {
        job_.codec.decode(*message, TensorView{values.data(), values.size(), DType::f32, job_.device});
      });
    }
  }

  ReduceJob& job_;
  const char* op_;
  bool allgather_;
  int ranks_;
  int rank_;
  std::size_t segments_;
  SegmentedChunks plan_;
  JobEncoder worker_encoder_;
  JobEncoder server_encoder_;
  // Over NCCL: one group per exchange, its receives posted with its sends.
  const bool per_exchange_groups_ = job_.transport.waits_complete_whole_batches();
  PendingRequests pending_;
  MessageBuffer memory_;
  // Slots and message sizes, indexed at(k, c): this rank's contribution to chunk c, the
  // contribution received from rank c (c != rank_), chunk c's owner message (this rank's own
  // at c == rank_).
  std::vector<Slot> contribution_, received_, owner_;
  std::vector<std::size_t> contribution_bytes_, owner_bytes_;
  // PendingRequests handles of the posted receives (at(k, peer)) and of every send.
  std::vector<std::size_t> receive_contribution_, receive_owner_;
  std::vector<std::size_t> sends_;
  MalformedHold failures_;
};

}  // namespace

void sra_pipelined(ReduceJob& job, std::size_t segments, bool allgather) {
  PipelinedSra round(job, segments, allgather);
  round.run();
}

}  // namespace gradzip::collectives
