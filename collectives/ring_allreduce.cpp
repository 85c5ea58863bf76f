// Ring all-reduce and ring reduce-scatter of compressed chunks (the bandwidth-optimal ring of
// Patarasuk & Yuan, 2009, as in Baidu's and Gloo's allreduce_ring), for any codec.
//
// Ranks form a ring: rank r sends to r+1 and receives from r-1 (mod P). The tensor of n
// elements is cut into P chunks, chunk c = [shard_begin(n, P, c), shard_begin(n, P, c + 1)),
// so chunk r is rank r's shard of the public reduce-scatter contract.
//
// Reduce-scatter (P - 1 steps, tag kReduceScatterTag). At step s (0 <= s < P - 1) rank r
//   - encodes its f32 accumulator of chunk (r - s - 1) mod P (its own data at s = 0, own data
//     plus everything received for that chunk afterwards) and sends the message to r+1;
//   - receives chunk (r - s - 2) mod P from r-1 and decode_adds it into its data.
//   The last chunk received, at s = P - 2, is chunk r: rank r ends owning the sum of chunk r
//   over all ranks, accumulated along the chain r+1, r+2, ..., r (each hop one f32 add of a
//   decoded message). With a lossy codec every hop re-encodes a partial sum, so each of the
//   P - 1 hops adds that codec's error of the partial sum it encoded.
// All-gather (P - 1 steps, tag kAllgatherTag). Rank r encodes its reduced chunk r once and
//   replaces its data with D(message) (it decodes its own bytes, so it ends with what the
//   others get). At step s it sends the message of chunk (r - s) mod P (its own at s = 0,
//   afterwards the bytes received at step s - 1, unchanged) and receives chunk (r - s - 1)
//   mod P, which it decodes into its data. Every chunk's bytes are encoded once, by its owner,
//   so all ranks end byte-identical.
// So each rank encodes each chunk exactly once per all-reduce: chunks r-1, ..., r-P+1 in the
// reduce-scatter, chunk r in the all-gather. With error feedback every encode goes through the
// worker encoder (job_encoder.h: the worker residual of the tensor, the slice of that chunk),
// so every element's residual is updated once per call, and summed over the
// chain the residual updates telescope: result + sum over ranks of the new residuals
// = sum over ranks of (input + old residual), up to f32 rounding of the adds.
// P == 1 needs no step: the all-reduce is D(C(g + e)) of the rank's own data, the
// reduce-scatter leaves the data as given (unencoded).
//
// Bytes on the wire per rank: 2 (P - 1) messages of a chunk of about n / P elements.
// Overlap: every receive is posted before the send that pairs with it and before the encode
// that precedes that send; in the all-gather all receives are posted up front and each
// received message is forwarded before it is decoded, so decoding overlaps the next transfer.
// Over a transport whose waits complete whole batches (NCCL, where a receive posted up front
// would hold the first wait until the end) each step posts its receive with the forward of the
// message before it and starts both (Transport::start_posted) before decoding: the same
// overlap, one step at a time.
//
// Errors: a malformed message throws ErrorCode::malformed_message. In the all-gather the
// failure is held until this rank has forwarded and received every message (the ring keeps
// moving, so no rank is left waiting for bytes this rank owes it, and every rank downstream of
// the bad bytes throws too). In the reduce-scatter it is thrown at once, once the step's send
// has completed; ranks that did not see the bad message then wait for the steps this rank no
// longer runs, so a malformed message there is fatal to the job (as in MPI), unless every
// rank fails at the same step. Either way, every request this rank posted is completed before
// the error leaves the call, so no transfer writes into a buffer freed by the unwinding.
#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/device_memory.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "collectives/ring_common.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr int kReduceScatterTag = tag_of(MessageTag::ring_reduce_scatter);
constexpr int kAllgatherTag = tag_of(MessageTag::ring_allgather);

// One ring all-reduce (or reduce-scatter) call: the chunk geometry, the encoder and the
// message buffers, set up once; reduce_scatter() and allgather() move the bytes.
class RingAllreduce {
 public:
  explicit RingAllreduce(ReduceJob& job)
      : job_(job),
        transport_(job.transport),
        ring_(job.transport),
        count_(job.data.size()),
        encoder_(job_encoder(job, ResidualRole::worker, job.data.size())) {
    // Message slots: the all-gather keeps one per chunk; the reduce-scatter uses the first two
    // (as large as the largest chunk's) as its send and receive buffers.
    slot_begin_.push_back(0);
    for (int c = 0; c < ring_.ranks; ++c) {
      message_capacity_.push_back(job.codec.max_encoded_bytes(chunk_count(c)));
      slot_begin_.push_back(slot_begin_.back() + message_capacity_.back());
    }
    largest_message_ = *std::max_element(message_capacity_.begin(), message_capacity_.end());
    const std::size_t workspace_bytes =
        ring_.ranks == 1 ? slot_begin_.back() : std::max(slot_begin_.back(), 2 * largest_message_);
    if (on_device()) {
      device_workspace_.emplace(workspace_bytes, job.device.index, "ring all-reduce");
      memory_ = {device_workspace_->data(), workspace_bytes};
    } else {
      workspace_.emplace(workspace_bytes);
      memory_ = workspace_->memory();
    }
    // Before any request is posted, so that a size mismatch throws on every rank.
    encoder_.register_residual();
  }

  void reduce_scatter() {
    if (ring_.ranks == 1) return;
    const std::span<std::byte> send = memory_.first(largest_message_);
    std::byte* const receive = memory_.data() + largest_message_;
    for (int step = 0; step < ring_.ranks - 1; ++step) {
      const int send_chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
      const int receive_chunk = ring_position(ring_.rank - step - 2, ring_.ranks);
      const std::span<std::byte> receive_buffer(receive, message_capacity_[receive_chunk]);
      PendingRequests pending(transport_);
      const std::size_t receive_request =
          pending.add(transport_.irecv(ring_.left, kReduceScatterTag, receive_buffer));
      const std::size_t send_bytes = encode_chunk(send_chunk, send);
      const std::span<const std::byte> message = send.first(send_bytes);
      const std::size_t send_request =
          pending.add(transport_.isend(ring_.right, kReduceScatterTag, message));
      count_sent(job_, message, chunk_count(send_chunk));
      const std::size_t received = wait_receive(pending, receive_request);
      {
        StageTimer timer(job_.stats, Stage::decode);
        const std::span<float> chunk = chunk_data(receive_chunk);
        job_.codec.decode_add(receive_buffer.first(received),
                              TensorView{chunk.data(), chunk.size(), DType::f32, job_.device});
      }
      timed_wait(pending, send_request);
    }
  }

  void allgather() {
    // One message slot per chunk, each max_encoded_bytes(chunk) long.
    std::vector<std::size_t> message_bytes(static_cast<std::size_t>(ring_.ranks), 0);
    const auto slot = [&](int c) { return memory_.subspan(slot_begin_[c], message_capacity_[c]); };

    // Receives are posted up front, unless the transport completes posted operations only in
    // whole batches (NCCL): then each step posts its own, or the first wait would also wait
    // for receives whose sends the left neighbour posts only after its own later waits.
    PendingRequests pending(transport_);
    std::vector<std::size_t> receive_requests;
    const bool post_per_step = transport_.waits_complete_whole_batches();
    const auto post_receive = [&](int step) {
      const int receive_chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
      receive_requests.push_back(
          pending.add(transport_.irecv(ring_.left, kAllgatherTag, slot(receive_chunk))));
    };
    if (!post_per_step) {
      for (int step = 0; step < ring_.ranks - 1; ++step) post_receive(step);
    }

    std::vector<int> sent_chunks;
    std::vector<std::size_t> send_requests;
    const auto forward = [&](int c) {
      const std::span<const std::byte> message = slot(c).first(message_bytes[c]);
      send_requests.push_back(pending.add(transport_.isend(ring_.right, kAllgatherTag, message)));
      sent_chunks.push_back(c);
    };
    // The owner keeps D(message): error feedback decodes it while updating the residual;
    // without it the owner decodes after its message has left.
    message_bytes[ring_.rank] = encode_chunk(ring_.rank, slot(ring_.rank), /*keep_decoded=*/true);
    if (ring_.ranks > 1) forward(ring_.rank);
    if (!encoder_.fills_decoded())
      decode_chunk(ring_.rank, slot(ring_.rank).first(message_bytes[ring_.rank]));

    // A bad message is still forwarded (its bytes are what the owner sent) and the ring runs
    // to the end; the first decode error is thrown once every request has completed. Nothing
    // between posting and completing may throw on a bad message, or the ranks downstream would
    // wait for bytes that never come: so the sent bytes are counted (count_sent reads the
    // header) only at the end, once every message has decoded.
    std::exception_ptr first_error;
    if (post_per_step && ring_.ranks > 1) post_receive(0);
    for (int step = 0; step < ring_.ranks - 1; ++step) {
      const int chunk = ring_position(ring_.rank - step - 1, ring_.ranks);
      message_bytes[chunk] = wait_receive(pending, receive_requests[step]);
      if (step + 1 < ring_.ranks - 1) {
        forward(chunk);
        // Per-step posting: the next step's transfer starts now and overlaps this decode.
        if (post_per_step) {
          post_receive(step + 1);
          transport_.start_posted();
        }
      }
      try {
        decode_chunk(chunk, slot(chunk).first(message_bytes[chunk]));
      } catch (const Error&) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    for (std::size_t request : send_requests) timed_wait(pending, request);
    if (first_error) std::rethrow_exception(first_error);
    for (int c : sent_chunks) count_sent(job_, slot(c).first(message_bytes[c]), chunk_count(c));
  }

 private:
  bool on_device() const noexcept { return job_.device.kind == DeviceKind::cuda; }
  std::size_t chunk_begin(int c) const { return shard_begin(count_, ring_.ranks, c); }
  std::size_t chunk_count(int c) const { return chunk_begin(c + 1) - chunk_begin(c); }
  std::span<float> chunk_data(int c) const {
    return job_.data.subspan(chunk_begin(c), chunk_count(c));
  }

  // Encodes this rank's f32 data of chunk c into `out`; returns the message size. With
  // `keep_decoded` and an encoder that fills_decoded(), the chunk's data also becomes
  // D(message), from the decode the residual update makes anyway.
  std::size_t encode_chunk(int c, std::span<std::byte> out, bool keep_decoded = false) {
    StageTimer timer(job_.stats, Stage::encode);
    const std::span<float> chunk = chunk_data(c);
    const ConstTensorView view(chunk.data(), chunk.size(), DType::f32, job_.device);
    const EncodeContext ctx = encode_context(job_, chunk_begin(c));
    const std::size_t bytes =
        encoder_.encode(view, out, ctx, keep_decoded ? chunk : std::span<float>{});
    count_encoded(job_.stats, chunk.size(), bytes);
    return bytes;
  }

  // data of chunk c = D(message).
  void decode_chunk(int c, std::span<const std::byte> message) {
    StageTimer timer(job_.stats, Stage::decode);
    const std::span<float> chunk = chunk_data(c);
    job_.codec.decode(message, TensorView{chunk.data(), chunk.size(), DType::f32, job_.device});
  }

  std::size_t timed_wait(PendingRequests& pending, std::size_t handle) {
    return pending.timed_wait(handle, job_.stats);
  }

  // Completes a receive, counts its bytes and returns them.
  std::size_t wait_receive(PendingRequests& pending, std::size_t handle) {
    return pending.wait_receive(handle, job_.stats);
  }

  ReduceJob& job_;
  Transport& transport_;
  const RingNeighbours ring_;
  const std::size_t count_;
  std::vector<std::size_t> message_capacity_;  // max_encoded_bytes of chunk c
  std::vector<std::size_t> slot_begin_;        // offset of chunk c's slot in the workspace
  std::size_t largest_message_ = 0;
  // The message slots: a per-thread host cache, or a device allocation for device jobs.
  std::optional<RingWorkspace> workspace_;
  std::optional<DeviceAllocation> device_workspace_;
  std::span<std::byte> memory_;
  JobEncoder encoder_;  // this rank's chunks: the worker residual of the whole tensor
};

}  // namespace

std::size_t ring_pipeline_segments(const ReduceJob& job) {
  if (job.transport.size() < kMinRanksForPipelinedRing) return 1;
  return pipeline_segments(job, kMaxRingSegmentsPerChunk, /*stream_ordered_device=*/true);
}

void ring_allreduce(ReduceJob& job) {
  if (const std::size_t segments = ring_pipeline_segments(job); segments > 1)
    return ring_pipelined(job, segments, /*allgather=*/true);
  RingAllreduce ring(job);
  ring.reduce_scatter();
  ring.allgather();
}

void ring_reduce_scatter(ReduceJob& job) {
  if (const std::size_t segments = ring_pipeline_segments(job); segments > 1)
    return ring_pipelined(job, segments, /*allgather=*/false);
  RingAllreduce ring(job);
  ring.reduce_scatter();
}

}  // namespace gradzip::collectives
