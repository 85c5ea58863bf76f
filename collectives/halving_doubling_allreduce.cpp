// Recursive halving/doubling all-reduce of compressed messages (Rabenseifner's algorithm, as in
// Thakur, Rabenseifner & Gropp 2005 and Gloo's allreduce_halving_doubling), for any codec:
// log2 P sequential steps in each half instead of the ring's P - 1.
//
// Ranks. P' = 2^floor(log2 P) ranks take part in the halving and doubling; the other
// x = P - P' ranks are folded in first. Rank 2i + 1 < 2x ("folded") sends its whole tensor,
// encoded with the job's codec (through the worker residual "<name>" when error feedback is
// on), to rank 2i, which decode_adds it into its own f32 data and takes part as index i. Ranks
// >= 2x take part as index rank - x. Encoded rather than f32 so that the fold costs what the
// codec saves elsewhere; the price is one more compression of the folded ranks' contributions.
//
// Blocks. The tensor is cut into P' blocks, block b = [shard_begin(n, P', b),
// shard_begin(n, P', b + 1)); a range of blocks [lo, hi) is the elements between their bounds.
//
// Halving (log2 P' steps, tag kHalvingTag). Index h starts with blocks [0, P'). At step k the
// mask is m = P' >> (k + 1); the current range [lo, lo + 2m) splits into [lo, lo + m) and
// [lo + m, lo + 2m): h keeps the upper one when h & m, the lower one otherwise, encodes the
// other one as ONE message (its f32 values: its own data plus every partial sum received so
// far) and sends it to h ^ m, and decode_adds the partner's message of the range it keeps.
// After the last step h holds the f32 sum of block h over all ranks (each f32 add one
// decoded partner message; the grouping is fixed by the masks, so the sum does not depend on
// timing).
// Doubling (log2 P' steps, tag kDoublingTag). h encodes its block h ONCE (the owner's encode)
// and then, for m = 1, 2, ..., P'/2, sends every message it holds (those of blocks
// [h & ~(m-1), +m), back to back in block order) to h ^ m and receives the partner's m
// messages, which it places before or after its own so the blob stays in block order. The
// messages are forwarded as received, never re-encoded.
// Unfold (tag kUnfoldTag). Rank 2i sends the final blob (all P' messages) to rank 2i + 1.
// Every rank then decodes every block from the same blob, the owner its own block too, so all
// P ranks end with the same bytes. Messages in a blob are framed by their own headers (a
// message is 32 + payload_bytes long, docs/wire_format.md), each checked against its block's
// max_encoded_bytes before it is decoded.
//
// Error feedback: every encode goes through an encoder of its own role (job_encoder.h), each
// with a residual that only it updates, so that summed over calls nothing is lost:
//   worker (n elements): the fold message (folded ranks, whole tensor) and the halving step 0
//       message (the range sent, at its element offset; the rest of this residual stays zero
//       on ranks that are not folded);
//   halving_step k >= 1 (the size of the range sent at step k, offset 0): the re-encode of the
//       partial sum at step k;
//   halving_owner (the size of block h): the owner's encode.
//   A worker residual's elements that none of this rank's worker encodes compensate (left by
//   another algorithm for the same name, or residuals folded into it by
//   ResidualStore::fold_into) are added to the data before the fold and zeroed.
//   Each of the other residuals is placed in "<name>" (ResidualStore::set_placement) at the
//   elements it covers.
// Random draws: step 0 and the fold use encode_context(job, offset) (seed mixed with the rank);
// steps k >= 1 use offset 0 with the seed further mixed with k, so steps do not reuse draws;
// the owner uses encode_context's server stream.
//
// Bytes sent by index h (CollectiveStats counts each message as it is handed to the
// transport): sum_k e(|range sent at step k|) + sum of e(n_b) over the P' - 1 blocks it sends
// while doubling (1, 2, ..., P'/2 blocks), plus e(n_b) over all P' blocks when it has a folded
// partner; a folded rank sends e(n). Compressions a contribution goes through: at most
// log2 P' + 1 (+ 1 when folded).
//
// Errors: a malformed message in the fold or the halving throws at once once this rank's own
// send has completed (the ranks waiting for this rank's later steps are then stuck until
// their deadline, as in the ring's reduce-scatter); a bad message in the doubling is still
// forwarded, and the first decode error is thrown after every transfer has completed, so
// every rank that received the bad bytes throws and none waits. P == 1: the owner's encode
// and decode, D(C(g + e)) through the owner residual.
#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr int kFoldTag = tag_of(MessageTag::rhd_fold);
constexpr int kHalvingTag = tag_of(MessageTag::rhd_halving);
constexpr int kDoublingTag = tag_of(MessageTag::rhd_doubling);
constexpr int kUnfoldTag = tag_of(MessageTag::rhd_unfold);

// The message memory of a call, kept per thread from call to call so that later calls do not
// fault in fresh pages (see the ring's RingWorkspace). One call at a time per thread.
std::span<std::byte> thread_workspace(std::size_t bytes) {
  thread_local std::vector<std::byte> memory;
  if (memory.size() < bytes) {
    memory.clear();
    memory.shrink_to_fit();  // free the old block before taking the larger one
    memory.resize(bytes);
  }
  return {memory.data(), bytes};
}

class HalvingDoubling {
 public:
  explicit HalvingDoubling(ReduceJob& job)
      : job_(job),
        transport_(job.transport),
        rank_(job.transport.rank()),
        ranks_(job.transport.size()),
        count_(job.data.size()) {
    GZ_REQUIRE(job.device.kind != DeviceKind::cuda, ErrorCode::internal,
               "halving_doubling_allreduce of '", job.name,
               "': runs on host memory (the Communicator stages CUDA tensors)");
    while (2 * p2_ <= ranks_) p2_ *= 2;
    extra_ = ranks_ - p2_;
    while ((1 << steps_) < p2_) ++steps_;
    if (rank_ < 2 * extra_) {
      folded_ = rank_ % 2 == 1;
      hd_ = folded_ ? -1 : rank_ / 2;
    } else {
      hd_ = rank_ - extra_;
    }
    for (int b = 0; b < p2_; ++b)
      block_capacity_.push_back(job.codec.max_encoded_bytes(block_count(b)));
    const std::size_t fold_capacity = extra_ > 0 ? job.codec.max_encoded_bytes(count_) : 0;
    blob_capacity_ = range_capacity(0, p2_);

    std::size_t halving_send = 0, halving_receive = 0, doubling_receive = 0;
    if (hd_ >= 0) {
      int lo = 0;
      for (int k = 0; k < steps_; ++k) {
        const Step step = halving_step(k, lo);
        halving_send = std::max(
            halving_send, job.codec.max_encoded_bytes(range_count(step.send_lo, step.send_hi)));
        halving_receive = std::max(
            halving_receive, job.codec.max_encoded_bytes(range_count(step.keep_lo, step.keep_hi)));
        lo = step.keep_lo;
      }
      for (int m = 1; m < p2_; m *= 2) {
        const int partner_lo = (hd_ ^ m) & ~(m - 1);
        doubling_receive = std::max(doubling_receive, range_capacity(partner_lo, partner_lo + m));
      }
    }
    halving_send_capacity_ = halving_send;
    scratch_bytes_ =
        std::max({halving_send + halving_receive, doubling_receive, folded_ ? fold_capacity : 0});
    blob_region_bytes_ = std::max(blob_capacity_, has_folded_partner() ? fold_capacity : 0);
    memory_ = thread_workspace(scratch_bytes_ + blob_region_bytes_);

    // One encoder per role. Every residual this rank will update is registered (or its size
    // checked) before any request is posted, so that a size mismatch throws on every rank
    // before anyone waits; each residual other than the worker's is placed at its elements.
    worker_encoder_.emplace(job_encoder(job, ResidualRole::worker, count_));
    if (folded_ || (hd_ >= 0 && steps_ > 0)) worker_encoder_->register_residual();
    if (hd_ >= 0) {
      int lo = 0;
      for (int k = 0; k < steps_; ++k) {
        const Step step = halving_step(k, lo);
        if (k > 0) {
          step_encoders_.push_back(job_encoder(job, ResidualRole::halving_step,
                                               range_count(step.send_lo, step.send_hi), k));
          step_encoders_.back().register_residual();
          step_encoders_.back().place_in_worker(block_begin(step.send_lo));
        }
        lo = step.keep_lo;
      }
      owner_encoder_.emplace(job_encoder(job, ResidualRole::halving_owner, block_count(hd_)));
      owner_encoder_->register_residual();
      owner_encoder_->place_in_worker(block_begin(hd_));
    }
    flush_uncovered_worker_residual();
  }

  void run() {
    fold();
    std::size_t blob_bytes = 0;
    if (hd_ >= 0) {
      halve();
      blob_bytes = gather_blocks();
    }
    PendingRequests pending(transport_);
    std::optional<std::size_t> unfold_send;
    if (has_folded_partner()) {
      unfold_send = pending.add(transport_.isend(rank_ + 1, kUnfoldTag, blob().first(blob_bytes)));
    } else if (folded_) {
      const std::size_t receive = pending.add(transport_.irecv(rank_ - 1, kUnfoldTag, blob()));
      blob_bytes = pending.wait_receive(receive, job_.stats);
    }
    // Decoding overlaps the unfold send; its first error waits until that send has completed.
    std::exception_ptr decode_error;
    std::vector<std::span<const std::byte>> messages;
    try {
      messages = split_blocks(blob().first(blob_bytes));
      StageTimer timer(job_.stats, Stage::decode);
      for (int b = 0; b < p2_; ++b) {
        const std::span<float> values = range_data(b, b + 1);
        job_.codec.decode(messages[idx(b)],
                          TensorView{values.data(), values.size(), DType::f32, job_.device});
      }
    } catch (const Error&) {
      decode_error = std::current_exception();
    }
    if (unfold_send) pending.timed_wait(*unfold_send, job_.stats);
    if (decode_error) std::rethrow_exception(decode_error);
    // Counted once every message has decoded: count_sent reads their headers.
    for (const auto& [lo, hi] : doubling_sent_)
      for (int b = lo; b < hi; ++b) count_sent(job_, messages[idx(b)]);
    if (unfold_send)
      for (const auto& message : messages) count_sent(job_, message);
  }

 private:
  // One halving step's split of the current range: what this rank keeps and sends.
  struct Step {
    int mask, keep_lo, keep_hi, send_lo, send_hi;
  };

  static std::size_t idx(int i) { return static_cast<std::size_t>(i); }
  bool has_folded_partner() const { return rank_ < 2 * extra_ && !folded_; }
  int world_rank_of(int hd) const { return hd < extra_ ? 2 * hd : hd + extra_; }
  std::size_t block_begin(int b) const { return shard_begin(count_, p2_, b); }
  std::size_t block_count(int b) const { return block_begin(b + 1) - block_begin(b); }
  std::size_t range_count(int lo, int hi) const { return block_begin(hi) - block_begin(lo); }
  std::span<float> range_data(int lo, int hi) const {
    return job_.data.subspan(block_begin(lo), range_count(lo, hi));
  }
  std::size_t range_capacity(int lo, int hi) const {
    std::size_t bytes = 0;
    for (int b = lo; b < hi; ++b) bytes += block_capacity_[idx(b)];
    return bytes;
  }
  // Step k of the halving from the range [lo, lo + 2m) held before it, m = P' >> (k + 1).
  Step halving_step(int k, int lo) const {
    const int m = p2_ >> (k + 1), mid = lo + m;
    return (hd_ & m) != 0 ? Step{m, mid, mid + m, lo, mid} : Step{m, lo, mid, mid, mid + m};
  }
  std::span<std::byte> scratch() const { return memory_.first(scratch_bytes_); }
  std::span<std::byte> blob() const { return memory_.subspan(scratch_bytes_, blob_capacity_); }

  // Encodes `values` with `encoder` (at ctx's element offset of its residual) into `out`;
  // returns the message size.
  std::size_t encode(std::span<const float> values, std::span<std::byte> out, JobEncoder& encoder,
                     const EncodeContext& ctx) {
    StageTimer timer(job_.stats, Stage::encode);
    const ConstTensorView view(values.data(), values.size(), DType::f32, job_.device);
    const std::size_t bytes = encoder.encode(view, out, ctx);
    count_encoded(job_.stats, values.size(), bytes);
    return bytes;
  }

  void decode_add(std::span<const std::byte> message, std::span<float> into) {
    StageTimer timer(job_.stats, Stage::decode);
    job_.codec.decode_add(message, TensorView{into.data(), into.size(), DType::f32, job_.device});
  }

  // The worker residual "<name>" may hold mass where this rank's worker encodes do not
  // compensate it: another algorithm's worker residual (algo=auto chose differently for the
  // same name), or residuals folded into it (ResidualStore::fold_into). This rank's worker
  // encodes cover the whole tensor when it is folded, the range sent at halving step 0 when it
  // takes part with steps, and nothing with one participant. The rest is added to the data
  // (still f32, before any encode, so the later encodes and their residuals carry it) and
  // zeroed: nothing is lost and nothing counted twice. Host memory: this algorithm is staged.
  void flush_uncovered_worker_residual() {
    if (folded_) return;
    std::size_t covered_begin = 0, covered_end = 0;
    if (hd_ >= 0 && steps_ > 0) {
      const Step first = halving_step(0, 0);
      covered_begin = block_begin(first.send_lo);
      covered_end = block_begin(first.send_hi);
    }
    deliver_worker_residual(job_, "halving_doubling_allreduce", covered_begin, covered_end);
  }

  // Rank 2i + 1 < 2x sends its encoded tensor to rank 2i, which adds it to its data.
  void fold() {
    PendingRequests pending(transport_);
    if (folded_) {
      const std::span<std::byte> out = scratch();
      const std::size_t bytes = encode(job_.data, out, *worker_encoder_, encode_context(job_, 0));
      const std::span<const std::byte> message = out.first(bytes);
      const std::size_t send = pending.add(transport_.isend(rank_ - 1, kFoldTag, message));
      count_sent(job_, message);
      pending.timed_wait(send, job_.stats);
    } else if (has_folded_partner()) {
      const std::span<std::byte> in = memory_.subspan(scratch_bytes_, blob_region_bytes_);
      const std::size_t receive = pending.add(
          transport_.irecv(rank_ + 1, kFoldTag, in.first(job_.codec.max_encoded_bytes(count_))));
      const std::size_t bytes = pending.wait_receive(receive, job_.stats);
      decode_add(in.first(bytes), job_.data);
    }
  }

  void halve() {
    const std::span<std::byte> send_buffer = scratch().first(halving_send_capacity_);
    int lo = 0;
    for (int k = 0; k < steps_; ++k) {
      const Step step = halving_step(k, lo);
      const int partner = world_rank_of(hd_ ^ step.mask);
      const std::span<float> keep = range_data(step.keep_lo, step.keep_hi);
      const std::span<float> send = range_data(step.send_lo, step.send_hi);
      const std::span<std::byte> receive_buffer =
          scratch().subspan(halving_send_capacity_, job_.codec.max_encoded_bytes(keep.size()));
      PendingRequests pending(transport_);
      const std::size_t receive =
          pending.add(transport_.irecv(partner, kHalvingTag, receive_buffer));
      std::size_t bytes = 0;
      if (k == 0) {
        bytes = encode(send, send_buffer, *worker_encoder_,
                       encode_context(job_, block_begin(step.send_lo)));
      } else {
        EncodeContext ctx = encode_context(job_, 0);
        ctx.seed ^= 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(k);
        bytes = encode(send, send_buffer, step_encoders_[static_cast<std::size_t>(k - 1)], ctx);
      }
      const std::span<const std::byte> message = send_buffer.first(bytes);
      const std::size_t send_request = pending.add(transport_.isend(partner, kHalvingTag, message));
      count_sent(job_, message);
      const std::size_t received = pending.wait_receive(receive, job_.stats);
      decode_add(receive_buffer.first(received), keep);
      pending.timed_wait(send_request, job_.stats);
      lo = step.keep_lo;
    }
  }

  // The owner's encode of block hd_, then the doubling exchanges; returns the blob's size (all
  // P' messages in block order).
  std::size_t gather_blocks() {
    const std::span<std::byte> gathered = blob();
    std::size_t bytes =
        encode(range_data(hd_, hd_ + 1), gathered, *owner_encoder_,
               encode_context(job_, 0, /*server=*/true));
    for (int m = 1; m < p2_; m *= 2) {
      const int partner = hd_ ^ m;
      const int lo = hd_ & ~(m - 1), partner_lo = partner & ~(m - 1);
      const std::span<std::byte> receive_buffer =
          scratch().first(range_capacity(partner_lo, partner_lo + m));
      PendingRequests pending(transport_);
      const std::size_t receive =
          pending.add(transport_.irecv(world_rank_of(partner), kDoublingTag, receive_buffer));
      const std::size_t send = pending.add(
          transport_.isend(world_rank_of(partner), kDoublingTag, gathered.first(bytes)));
      doubling_sent_.emplace_back(lo, lo + m);
      const std::size_t received = pending.wait_receive(receive, job_.stats);
      pending.timed_wait(send, job_.stats);
      // Both fit: bytes <= capacity of this rank's m blocks, received <= the partner's.
      if (partner_lo < lo) {
        std::memmove(gathered.data() + received, gathered.data(), bytes);
        std::memcpy(gathered.data(), receive_buffer.data(), received);
      } else {
        std::memcpy(gathered.data() + bytes, receive_buffer.data(), received);
      }
      bytes += received;
    }
    return bytes;
  }

  // The P' messages of `gathered`, framed by their headers' payload_bytes; each must fit its
  // block's bound, and together they must fill `gathered` exactly (else malformed_message).
  std::vector<std::span<const std::byte>> split_blocks(std::span<const std::byte> gathered) const {
    std::vector<std::span<const std::byte>> messages;
    std::size_t offset = 0;
    for (int b = 0; b < p2_; ++b) {
      const std::size_t left = gathered.size() - offset;
      GZ_REQUIRE(left >= compressors::kWireHeaderBytes, ErrorCode::malformed_message,
                 "halving_doubling_allreduce of '", job_.name, "' (", transport_.describe(),
                 "): the gathered messages end at block ", b, " of ", p2_, " (", left,
                 " bytes left, a message has at least ", compressors::kWireHeaderBytes, ")");
      const std::uint64_t payload = compressors::announced_payload_bytes(gathered.subspan(offset));
      const std::size_t bound = block_capacity_[idx(b)];
      GZ_REQUIRE(payload <= bound - compressors::kWireHeaderBytes &&
                     payload <= left - compressors::kWireHeaderBytes,
                 ErrorCode::malformed_message, "halving_doubling_allreduce of '", job_.name, "' (",
                 transport_.describe(), "): the message of block ", b, " (", block_count(b),
                 " elements) announces ", payload, " payload bytes; at most ",
                 std::min(bound, left) - compressors::kWireHeaderBytes, " fit");
      const std::size_t bytes = compressors::kWireHeaderBytes + payload;
      messages.push_back(gathered.subspan(offset, bytes));
      offset += bytes;
    }
    GZ_REQUIRE(offset == gathered.size(), ErrorCode::malformed_message,
               "halving_doubling_allreduce of '", job_.name, "' (", transport_.describe(),
               "): ", gathered.size() - offset, " bytes trail the ", p2_, " gathered messages");
    return messages;
  }

  ReduceJob& job_;
  Transport& transport_;
  const int rank_;
  const int ranks_;
  const std::size_t count_;
  int p2_ = 1;     // ranks in the halving/doubling: the largest power of two <= P
  int extra_ = 0;  // P - p2_: ranks folded into a partner
  int steps_ = 0;  // log2 p2_
  bool folded_ = false;
  int hd_ = -1;                              // index in the halving/doubling; -1 for a folded rank
  std::vector<std::size_t> block_capacity_;  // max_encoded_bytes of block b
  std::size_t blob_capacity_ = 0;            // sum of block_capacity_
  std::size_t halving_send_capacity_ = 0;
  std::size_t scratch_bytes_ = 0;      // halving messages, doubling receives, fold send
  std::size_t blob_region_bytes_ = 0;  // the gathered blob, or the fold receive
  std::span<std::byte> memory_;
  std::optional<JobEncoder> worker_encoder_;  // the fold and halving step 0
  std::vector<JobEncoder> step_encoders_;     // halving step k >= 1 at index k - 1
  std::optional<JobEncoder> owner_encoder_;   // the owner's block (ranks with an index)
  std::vector<std::pair<int, int>> doubling_sent_;  // block ranges sent while doubling
};

}  // namespace

void halving_doubling_allreduce(ReduceJob& job) { HalvingDoubling(job).run(); }

}  // namespace gradzip::collectives
