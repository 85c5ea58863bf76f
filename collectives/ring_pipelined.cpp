// Pipelined ring all-reduce: the ring (collectives/ring_allreduce.cpp) with each of the P chunks
// cut into S segments (collectives/segment_plan.h), so that inside one step the encode of one
// segment overlaps the transfer of the one before and the decode of the one before that.
//
// Same arithmetic as the ring, segment by segment. Reduce-scatter step s (0 <= s < P - 1) on
// rank r: for k = 0 .. S - 1, encode segment k of chunk (r - s - 1) mod P (the worker encoder,
// error feedback keyed by the element's index in the tensor) and send it to r + 1, then wait for
// segment k - 1 of chunk (r - s - 2) mod P from r - 1 and decode_add it; the last segment's
// decode_add ends the step. All-gather: rank r encodes its reduced chunk r segment by segment,
// sending each segment as soon as it is written and keeping D(message); at step s it receives
// the S segments of chunk (r - s - 1) mod P, forwards each one (except at the last step) as soon
// as it has arrived, then decodes it. Segment boundaries are whole codec granules (whole
// buckets and code bytes), so every decoded value, the residuals and the result are bit for bit
// those of the unsegmented ring; the bytes on the wire are the same payload bytes plus one
// 32-byte header per extra message: 2 (P - 1) (S - 1) more headers sent per rank
// (docs/algorithms.md).
//
// Buffers: the reduce-scatter alternates two send areas and two receive areas by step parity
// (a step's sends complete, at the latest, at the end of the next step; the receives of step
// s + 1 are posted at the start of step s, into the area step s - 1 has finished decoding), each
// as large as the largest chunk's S segment messages. The all-gather keeps one area per chunk
// (a forwarded segment is read by its send while it is decoded). The memory is the ring's
// per-thread workspace (collectives/ring_common.h), reused from call to call.
//
// Errors: a received segment that is too long, shorter than a header or refused by the decoder
// does not end the call on the spot (the ring's other ranks would wait for this rank's sends):
// the first such failure is held and the schedule runs on (a reduce-scatter partial sum that
// missed a segment is still encoded and sent, its values unspecified; an all-gather segment is
// forwarded as it arrived, or empty when its receive failed, so the ranks downstream hold a
// failure too); at the end one allgather_u64 of every rank's status makes every rank throw
// malformed_message together (MalformedHold). Any other error (a timeout, a failed encode)
// leaves at once; the posted requests are completed first (PendingRequests), within the
// transport's deadline.
//
// Host memory over transports whose posted operations start when posted and whose messages are
// cheap, and device memory in a stream-ordered call over NCCL with fixed-size messages
// (pipeline_segments in collective_job.h); elsewhere the unsegmented ring runs.
//
// Over NCCL (Transport::waits_complete_whole_batches: posted operations start together at the
// next wait, as one group on the transport's stream) a receive posted ahead would sit in a group
// that cannot complete before the peer's later groups, which wait for it: so each segment's
// receive is posted with the send that pairs with it, and the pair starts at once
// (start_posted), one group per segment. Every rank posts the same sequence, so group j of a
// rank holds the send that group j of its right neighbour receives. In a stream-ordered call
// (collectives/device_memory.h) nothing waits on the host: segment k + 1's encode is queued on
// the work stream while segment k's group runs on the transport's stream, and segment k - 1's
// decode waits (on the device) for that segment's group only; malformed segments are found by
// the device checks and agreed on at the call's completion.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/device_memory.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "collectives/ring_common.h"
#include "collectives/segment_plan.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

// Tags of their own (collectives/message_tags.h). The all-gather alternates two tags by step
// parity: a rank sends its own chunk's segments (the right neighbour's step 0) interleaved with
// the forwards of the segments it receives at its step 0 (the neighbour's step 1), and a
// receive matches the sends of its (peer, tag) in posting order, so consecutive steps need
// different tags; sends of steps two apart never interleave (step s + 2's forwards start after
// step s's last), so two tags suffice.
constexpr int kReduceScatterTag = tag_of(MessageTag::ring_segment_reduce_scatter);
constexpr int kAllgatherTag[2] = {tag_of(MessageTag::ring_segment_allgather_even),
                                 tag_of(MessageTag::ring_segment_allgather_odd)};

std::size_t idx(int c) { return static_cast<std::size_t>(c); }

class PipelinedRing {
 public:
  PipelinedRing(ReduceJob& job, std::size_t segments)
      : job_(job),
        transport_(job.transport),
        ring_(job.transport),
        segments_(segments),
        plan_(job.codec, job.data.size(), ring_.ranks, segments),
        encoder_(job_encoder(job, ResidualRole::worker, job.data.size())),
        pending_(job.transport) {
    GZ_REQUIRE(ring_.ranks >= 2 && segments_ >= 2 &&
                   (job.device.kind != DeviceKind::cuda || job.stream_ordered),
               ErrorCode::internal, "pipelined ring: needs host memory or a stream-ordered "
               "device call, 2 or more ranks and 2 or more segments (got ", ring_.ranks,
               " ranks, ", segments_, " segments)");
    std::size_t all_chunks = 0;
    for (int c = 0; c < ring_.ranks; ++c) {
      // Offsets of the chunk's S segment messages inside an area of its own.
      std::vector<std::size_t>& offsets = message_offset_.emplace_back(1, 0);
      for (std::size_t k = 0; k < segments_; ++k)
        offsets.push_back(offsets.back() + job.codec.max_encoded_bytes(plan_.segment_count(k, c)));
      area_bytes_ = std::max(area_bytes_, offsets.back());
      all_chunks += offsets.back();
    }
    // Reduce-scatter: 2 send and 2 receive areas; all-gather: one area per chunk (chunk c's
    // at chunk_area_begin_[c]). The phases run one after the other in the same memory.
    for (int c = 0; c < ring_.ranks; ++c)
      chunk_area_begin_.push_back(
          c == 0 ? 0 : chunk_area_begin_.back() + message_offset_[idx(c - 1)].back());
    const std::size_t workspace_bytes = std::max(4 * area_bytes_, all_chunks);
    if (job.device.kind == DeviceKind::cuda) {
      device_workspace_.emplace(workspace_bytes, job.device.index, "pipelined ring");
      memory_ = {device_workspace_->data(), workspace_bytes};
    } else {
      workspace_.emplace(workspace_bytes);
      memory_ = workspace_->memory();
    }
    // Before any request is posted, so that a size mismatch throws on every rank.
    encoder_.register_residual();
  }

  void reduce_scatter() {
    receives_.assign(idx(ring_.ranks - 1) * segments_, SIZE_MAX);
    std::vector<std::size_t> step_sends[2];
    if (!per_segment_groups_) post_reduce_scatter_receives(0);
    for (int step = 0; step < ring_.ranks - 1; ++step) {
      if (!per_segment_groups_ && step + 1 < ring_.ranks - 1) post_reduce_scatter_receives(step + 1);
      const int send_chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
      std::vector<std::size_t>& sends = step_sends[step % 2];
      for (std::size_t k = 0; k < segments_; ++k) {
        const std::span<std::byte> out =
            reduce_scatter_slot(step % 2, /*send=*/true, send_chunk, k);
        const std::size_t bytes = encode_segment(send_chunk, k, out);
        const std::span<const std::byte> message = out.first(bytes);
        if (per_segment_groups_) post_reduce_scatter_receive(step, k);
        sends.push_back(pending_.add(transport_.isend(ring_.right, kReduceScatterTag, message)));
        if (per_segment_groups_) transport_.start_posted();
        count_sent(job_, message);
        if (k >= 1) receive_and_add(step, k - 1);
      }
      receive_and_add(step, segments_ - 1);
      // The other parity's area is the next step's: its sends (step - 1's) must be done.
      for (const std::size_t send : step_sends[(step + 1) % 2])
        pending_.timed_wait(send, job_.stats);
      step_sends[(step + 1) % 2].clear();
    }
    for (const std::size_t send : step_sends[(ring_.ranks - 2) % 2])
      pending_.timed_wait(send, job_.stats);
  }

  void allgather() {
    receives_.assign(idx(ring_.ranks - 1) * segments_, SIZE_MAX);
    message_bytes_.assign(idx(ring_.ranks) * segments_, 0);
    forwarded_.clear();
    if (!per_segment_groups_) {
      post_allgather_receives(0);
      if (ring_.ranks > 2) post_allgather_receives(1);
    }
    // The own chunk, segment by segment, each sent as soon as it is written; between two
    // encodes, the segment of step 0 that came meanwhile is forwarded and decoded.
    for (std::size_t k = 0; k < segments_; ++k) {
      const std::span<std::byte> out = chunk_slot(ring_.rank, k);
      std::size_t bytes = 0;
      {
        StageTimer timer(job_.stats, Stage::encode);
        const std::span<float> values = segment_data(k, ring_.rank);
        const ConstTensorView view(values.data(), values.size(), DType::f32, job_.device);
        bytes = encoder_.encode(view, out, encode_context(job_, plan_.segment_first(k, ring_.rank)),
                                values);
        count_encoded(job_.stats, values.size(), bytes);
      }
      message_bytes_[at(ring_.rank, k)] = bytes;
      const std::span<const std::byte> message = out.first(bytes);
      if (per_segment_groups_) post_allgather_receive(0, k);
      sends_.push_back(pending_.add(transport_.isend(ring_.right, kAllgatherTag[0], message)));
      if (per_segment_groups_) transport_.start_posted();
      count_sent(job_, message);
      if (!encoder_.fills_decoded()) decode_segment(ring_.rank, k, message);
      if (k >= 1) forward_and_decode(0, k - 1);
    }
    forward_and_decode(0, segments_ - 1);
    for (int step = 1; step < ring_.ranks - 1; ++step) {
      if (!per_segment_groups_ && step + 1 < ring_.ranks - 1) post_allgather_receives(step + 1);
      for (std::size_t k = 0; k < segments_; ++k) forward_and_decode(step, k);
    }
  }

  // Completes the sends and makes every rank throw together if any held a malformed message
  // (in a stream-ordered call the call's completion does that); then counts the forwarded
  // messages (count_sent reads their headers, or their sizes where job.sizes_known).
  void finish(const char* op) {
    for (const std::size_t send : sends_) pending_.timed_wait(send, job_.stats);
    if (job_.stream_ordered) failures_.rethrow();
    else failures_.agree(transport_, job_.stats, op, job_.name);
    for (const auto& [chunk, k] : forwarded_)
      count_sent(job_, chunk_slot(chunk, k).first(message_bytes_[at(chunk, k)]));
  }

 private:
  std::span<float> segment_data(std::size_t k, int c) const {
    return plan_.segment_of(job_.data, k, c);
  }
  std::size_t at(int c, std::size_t k) const { return idx(c) * segments_ + k; }
  std::size_t capacity(int c, std::size_t k) const {
    return message_offset_[idx(c)][k + 1] - message_offset_[idx(c)][k];
  }

  // Reduce-scatter: segment k of chunk c in the send or receive area of `parity`.
  std::span<std::byte> reduce_scatter_slot(int parity, bool send, int c, std::size_t k) const {
    const std::size_t area = (send ? 0 : 2) + idx(parity);
    return memory_.subspan(area * area_bytes_ + message_offset_[idx(c)][k], capacity(c, k));
  }
  // All-gather: segment k of chunk c.
  std::span<std::byte> chunk_slot(int c, std::size_t k) const {
    return memory_.subspan(chunk_area_begin_[idx(c)] + message_offset_[idx(c)][k], capacity(c, k));
  }

  void post_reduce_scatter_receive(int step, std::size_t k) {
    const int chunk = ring_position(ring_.rank - step - 2, ring_.ranks);
    receives_[idx(step) * segments_ + k] = pending_.add(transport_.irecv(
        ring_.left, kReduceScatterTag, reduce_scatter_slot(step % 2, /*send=*/false, chunk, k)));
  }
  void post_reduce_scatter_receives(int step) {
    for (std::size_t k = 0; k < segments_; ++k) post_reduce_scatter_receive(step, k);
  }
  void post_allgather_receive(int step, std::size_t k) {
    const int chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
    receives_[idx(step) * segments_ + k] =
        pending_.add(transport_.irecv(ring_.left, kAllgatherTag[step % 2], chunk_slot(chunk, k)));
  }
  void post_allgather_receives(int step) {
    for (std::size_t k = 0; k < segments_; ++k) post_allgather_receive(step, k);
  }

  std::size_t encode_segment(int c, std::size_t k, std::span<std::byte> out) {
    StageTimer timer(job_.stats, Stage::encode);
    const std::span<float> values = segment_data(k, c);
    const ConstTensorView view(values.data(), values.size(), DType::f32, job_.device);
    const std::size_t bytes =
        encoder_.encode(view, out, encode_context(job_, plan_.segment_first(k, c)));
    count_encoded(job_.stats, values.size(), bytes);
    return bytes;
  }

  void decode_segment(int c, std::size_t k, std::span<const std::byte> message) {
    StageTimer timer(job_.stats, Stage::decode);
    const std::span<float> values = segment_data(k, c);
    failures_.run([&] {
      job_.codec.decode(message, TensorView{values.data(), values.size(), DType::f32, job_.device});
    });
  }

  // Completes receive (step, k); returns its byte count, or nothing (failure held) when the
  // transport refused it or it is shorter than a header.
  std::optional<std::size_t> receive(int step, std::size_t k, int chunk, const char* phase) {
    std::size_t bytes = 0;
    const std::size_t request = receives_[idx(step) * segments_ + k];
    if (!failures_.run([&] { bytes = pending_.wait_receive(request, job_.stats); })) return std::nullopt;
    if (bytes < compressors::kWireHeaderBytes) {
      failures_.hold(Error(
          ErrorCode::malformed_message,
          detail::concat("ring ", phase, " of '", job_.name, "' (", transport_.describe(),
                         "): segment ", k, " of chunk ", chunk, " from rank ", ring_.left, " has ",
                         bytes, " bytes, less than a ", compressors::kWireHeaderBytes,
                         "-byte header")));
      return std::nullopt;
    }
    return bytes;
  }

  void receive_and_add(int step, std::size_t k) {
    const int chunk = ring_position(ring_.rank - step - 2, ring_.ranks);
    const std::optional<std::size_t> bytes = receive(step, k, chunk, "reduce-scatter");
    if (!bytes) return;
    const std::span<const std::byte> message =
        reduce_scatter_slot(step % 2, /*send=*/false, chunk, k).first(*bytes);
    StageTimer timer(job_.stats, Stage::decode);
    const std::span<float> values = segment_data(k, chunk);
    failures_.run([&] {
      job_.codec.decode_add(message,
                            TensorView{values.data(), values.size(), DType::f32, job_.device});
    });
  }

  // All-gather step `step`, segment k: receive, forward unless this is the last step (the
  // bytes as they came, empty if the receive failed), decode.
  void forward_and_decode(int step, std::size_t k) {
    const int chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
    const std::optional<std::size_t> bytes = receive(step, k, chunk, "all-gather");
    message_bytes_[at(chunk, k)] = bytes.value_or(0);
    const std::span<const std::byte> message =
        chunk_slot(chunk, k).first(message_bytes_[at(chunk, k)]);
    if (step + 1 < ring_.ranks - 1) {
      // The right neighbour receives it at its step + 1; over NCCL this rank's receive of step
      // + 1's segment k pairs with it (the left neighbour forwards it at the same point).
      if (per_segment_groups_) post_allgather_receive(step + 1, k);
      sends_.push_back(
          pending_.add(transport_.isend(ring_.right, kAllgatherTag[(step + 1) % 2], message)));
      if (per_segment_groups_) transport_.start_posted();
      forwarded_.emplace_back(chunk, k);
    }
    if (bytes) decode_segment(chunk, k, message);
  }

  ReduceJob& job_;
  Transport& transport_;
  const RingNeighbours ring_;
  const std::size_t segments_;
  const SegmentedChunks plan_;
  std::vector<std::vector<std::size_t>> message_offset_;  // per chunk, S + 1 message offsets
  std::vector<std::size_t> chunk_area_begin_;             // all-gather: chunk c's area
  std::size_t area_bytes_ = 0;  // the largest chunk's S segment messages
  JobEncoder encoder_;
  // Over NCCL: one group per segment, each receive posted with the send it pairs with.
  const bool per_segment_groups_ = job_.transport.waits_complete_whole_batches();
  // The message memory: the per-thread host cache, or a device allocation for device jobs.
  std::optional<RingWorkspace> workspace_;
  std::optional<DeviceAllocation> device_workspace_;
  std::span<std::byte> memory_;
  PendingRequests pending_;
  // The posted receives of the current phase, [step * S + k].
  std::vector<std::size_t> receives_;
  // All-gather: every send, each segment message's size ([at(c, k)]) and the forwarded ones.
  std::vector<std::size_t> sends_;
  std::vector<std::size_t> message_bytes_;
  std::vector<std::pair<int, std::size_t>> forwarded_;
  MalformedHold failures_;
};

}  // namespace

void ring_pipelined(ReduceJob& job, std::size_t segments, bool allgather) {
  PipelinedRing ring(job, segments);
  ring.reduce_scatter();
  if (allgather) ring.allgather();
  ring.finish(allgather ? "ring_allreduce" : "ring_reduce_scatter");
}

}  // namespace gradzip::collectives
