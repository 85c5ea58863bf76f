// What every algorithm in collectives/ receives, and the helpers they share: the shard
// partition, per-rank random streams, byte accounting and stage timers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/codec_table.h"
#include "collectives/segment_plan.h"
#include "collectives/device_memory.h"
#include "collectives/timeline.h"
#include "collectives/transport/transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

// One collective call as an algorithm sees it. The Communicator has already converted the
// tensor to f32, divided it by the number of ranks for ReduceOp::average, checked that all
// ranks agree on the call, and made the codec.
struct ReduceJob {
  Transport& transport;
  const Codec& codec;
  // In: this rank's contribution. Out: the result, byte-identical on every rank (for
  // reduce-scatter: this rank's shard only).
  std::span<float> data;
  // The tensor's name: keys the residuals (collectives/job_encoder.h: residual_key).
  std::string name;
  // Error feedback: null means off. Algorithms reach it only through job_encoder.h.
  error_feedback::ResidualStore* residuals = nullptr;
  // seed, step and tensor id of this call (element_offset is 0; algorithms set it per chunk).
  EncodeContext ctx;
  CollectiveStats& stats;
  // Where `data` lives. DeviceKind::cuda: `data` is memory of that CUDA device, the transport
  // moves device memory (NCCL), the codec encodes and decodes on the device and error feedback
  // runs there with its residuals kept in the (host) store. The ring, SRA and the sparse and
  // compressed all-gathers run so; collectives/call_memory.cpp (cuda_route) stages the others
  // through host memory.
  Device device{};
  // The pipelined algorithms' target message size in bytes (the spec's `segment` key,
  // collectives/segment_plan.h); 0: no pipelining.
  std::size_t segment_bytes = 0;
  // A stream-ordered device call (collectives/device_memory.h: OrderedDeviceCall) with a codec
  // whose message for n elements always has max_encoded_bytes(n) bytes (message_size_varies
  // is false): every rank knows every message's size, so the algorithms exchange no sizes
  // (which would wait on the host) and count sent bytes without reading headers back.
  bool sizes_known = false;
  // The call runs stream-ordered on the device (OrderedDeviceCall): its device checks are
  // agreed on by every rank at its completion, so the algorithms run no host-side agreement of
  // their own (MalformedHold::agree), and the ring may pipeline over NCCL (ring_pipelined.cpp).
  bool stream_ordered = false;
};

// Rank r's shard of `count` elements split over `ranks`: [shard_begin(r), shard_begin(r + 1)),
// as even as possible (sizes differ by at most one), for any count and rank count.
std::size_t shard_begin(std::size_t count, int ranks, int r) noexcept;

// The encode context for a message encoded on `rank` of chunk [element_offset, ...).
// Stochastic rounding draws independent numbers on every rank (the seed is mixed with the
// rank, and with `server` for SRA's owner-side encode) so that rounding errors of different
// ranks average out instead of adding up coherently. Random-k keeps the shared seed: every
// rank must pick the same indices.
EncodeContext encode_context(const ReduceJob& job, std::uint64_t element_offset, bool server = false);

// Adds one message this rank sent to the stats, split into header / index / payload bytes.
// A message in CUDA memory (`where` says so) has its header copied to the host first.
void count_sent(CollectiveStats& stats, std::span<const std::byte> message, Device where = {});
// The same for a message of `job` (its codec, its device). A device message of a codec that is
// not sparse (Codec::sparse(): no index bytes, so the split is header + the rest) is counted
// from its size alone, with no copy from the device and no synchronisation.
void count_sent(const ReduceJob& job, std::span<const std::byte> message);
// The same for a message of `elements` elements: with job.sizes_known, a sparse codec's device
// message is split by its spec (exact top-k: k_for(elements) indices) without reading it.
void count_sent(const ReduceJob& job, std::span<const std::byte> message, std::size_t elements);
// With job.sizes_known: throws internal unless an encode of `elements` elements wrote
// max_encoded_bytes(elements) bytes (what every rank assumed of it).
void require_known_size(const ReduceJob& job, std::size_t elements, std::size_t bytes);
// Adds the input bytes (as f32) a set of messages encoded, for compression_ratio.
void count_encoded(CollectiveStats& stats, std::size_t input_elements, std::size_t message_bytes);

// Message bytes of one call, in host memory or on a CUDA device (the job's): what lets an
// algorithm run unchanged on device memory. Growing does not keep the contents (every user
// writes a buffer, by an encode or a receive, after sizing it); shrinking keeps them.
class MessageBuffer {
 public:
  explicit MessageBuffer(Device device = {}) : device_(device) {}
  // size() becomes `bytes`; memory is allocated when the capacity is smaller.
  void resize(std::size_t bytes);
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> span() const noexcept { return {data_, size_}; }
  // resize(from.size()) and a copy of `from` (memory on the same side as this buffer).
  void assign(std::span<const std::byte> from);

 private:
  Device device_;
  std::unique_ptr<std::byte[]> host_;
  std::unique_ptr<DeviceAllocation> device_memory_;
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
};

// The requests a phase has posted and not yet completed. If an exception leaves the phase
// early, the destructor completes them (ignoring their own errors) so that no transfer
// outlives the buffers it reads or writes.
class PendingRequests {
 public:
  explicit PendingRequests(Transport& transport) : transport_(transport) {}
  PendingRequests(const PendingRequests&) = delete;
  PendingRequests& operator=(const PendingRequests&) = delete;
  ~PendingRequests();

  // Remembers a posted request; returns the handle wait() takes.
  std::size_t add(Transport::Request request);
  // Completes request `handle`; returns the bytes it moved.
  std::size_t wait(std::size_t handle);
  // wait(), its time added to stats.communicate_seconds.
  std::size_t timed_wait(std::size_t handle, CollectiveStats& stats);
  // timed_wait() of a receive, its bytes also added to stats.received_bytes.
  std::size_t wait_receive(std::size_t handle, CollectiveStats& stats);

 private:
  Transport& transport_;
  std::vector<Transport::Request> requests_;
  std::vector<bool> completed_;
};

// What the point-to-point algorithms (the pipelined SRA, the sparse all-reduce's pipelined
// exchange) do with a malformed received message: they may not leave the call on the spot (the
// peers would wait for this rank's sends), so the first failure is held while the schedule runs
// on, and agree() then makes every rank throw together.
class MalformedHold {
 public:
  // Runs `step`; a malformed_message it throws is held (the first one) instead of leaving.
  // Any other error leaves. Returns whether the step completed.
  template <typename Step>
  bool run(Step&& step) {
    try {
      step();
      return true;
    } catch (const Error& error) {
      if (error.code() != ErrorCode::malformed_message) throw;
      hold(error);
      return false;
    }
  }
  void hold(const Error& error) {
    if (!held_) held_ = error;
  }
  // One allgather_u64 of every rank's status (counted as communicate time): a rank holding a
  // failure throws it; the others throw malformed_message naming those ranks (`op` of `name`).
  void agree(Transport& transport, CollectiveStats& stats, std::string_view op,
             std::string_view name) const;
  // Throws the held failure, if any (a stream-ordered call, whose completion makes the ranks
  // agree, or one rank).
  void rethrow() const {
    if (held_) throw *held_;
  }

 private:
  std::optional<Error> held_;
};

// data[i] = +0.0f; `data` is host memory or memory of `where`.
void fill_zero(std::span<float> data, Device where);

// The stages of a call that CollectiveStats times.
enum class Stage : std::uint8_t { encode, communicate, decode, total };

// Adds the time between construction and destruction to the stats' field of `stage`. While the
// thread records a timeline (collectives/timeline.h) it also records the stage as a span
// (category "stage"; Stage::total records none: run_call records the call) whose args are the
// bytes the stats counted meanwhile (sent_bytes, received_bytes, encoded_input_bytes,
// encoded_message_bytes, those not zero) and the bytes given to note_bytes.
class StageTimer {
 public:
  StageTimer(CollectiveStats& stats, Stage stage);
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  // Bytes the stage moved that the stats count elsewhere or not at all (a completed request's):
  // the span's "bytes" argument.
  void note_bytes(std::size_t bytes) noexcept { noted_bytes_ += bytes; }

 private:
  CollectiveStats& stats_;
  Stage stage_;
  ThreadTimeline timeline_;
  std::chrono::steady_clock::time_point start_;
  // The stats' byte counters at construction (read only while recording a timeline).
  std::uint64_t sent_at_start_ = 0;
  std::uint64_t received_at_start_ = 0;
  std::uint64_t encoded_input_at_start_ = 0;
  std::uint64_t encoded_message_at_start_ = 0;
  std::size_t noted_bytes_ = 0;
};

// The algorithms, one per file. Each works for any count (0 included) and any rank count.
void ring_allreduce(ReduceJob& job);                     // ring_allreduce.cpp
void ring_reduce_scatter(ReduceJob& job);                // ring_allreduce.cpp (first half)
void randk_allreduce(ReduceJob& job);                    // randk_allreduce.cpp
void sra_allreduce(ReduceJob& job);                      // sra_allreduce.cpp
void sra_reduce_scatter(ReduceJob& job);                 // sra_allreduce.cpp (first half)
// Whether the pipelined ring and SRA may run over `transport`: not when its waits complete
// whole batches (NCCL: a receive posted ahead would hold the first wait until the end) or its
// every message is expensive (Transport::messages_are_expensive: torch.distributed through
// Python, where 64 KiB segments made qsgd-4 2x slower).
bool transport_pipelines(const Transport& transport);
// How many segments per chunk the pipelined ring and SRA cut the job's P chunks (shard_begin)
// into (collectives/segment_plan.h): 1, run unsegmented, for one rank, a host transport that does
// not pipeline, segment_bytes 0 and codecs that may not be cut; device memory too, unless
// `stream_ordered_device` (the ring and SRA, which pipeline a stream-ordered call over NCCL
// with fixed-size messages, job.sizes_known); at most `max_segments` (the ring's:
// kMaxRingSegmentsPerChunk).
std::size_t pipeline_segments(const ReduceJob& job, std::size_t max_segments = kMaxSegmentsPerChunk,
                              bool stream_ordered_device = false);
// SRA with its chunks cut into segments whose encode, transfer and decode overlap
// (sra_pipelined.cpp; allgather false: the reduce-scatter half).
void sra_pipelined(ReduceJob& job, std::size_t segments, bool allgather);
// The ring cut the same way (ring_pipelined.cpp); ring_allreduce and ring_reduce_scatter run
// it when ring_pipeline_segments(job) > 1: pipeline_segments(job, kMaxRingSegmentsPerChunk),
// or 1 with fewer than kMinRanksForPipelinedRing ranks.
std::size_t ring_pipeline_segments(const ReduceJob& job);
void ring_pipelined(ReduceJob& job, std::size_t segments, bool allgather);
void sparse_allreduce(ReduceJob& job);                   // sparse_allreduce.cpp
void compressed_allgather(ReduceJob& job);               // allgather.cpp
// Recursive halving reduce-scatter then recursive doubling all-gather (Rabenseifner), one
// re-encode per halving step; non-powers of two fold the extra ranks in first.
void halving_doubling_allreduce(ReduceJob& job);         // halving_doubling_allreduce.cpp
// Binomial-tree reduce to rank 0 (uncompressed f32), one encode there, binomial broadcast.
void tree_allreduce(ReduceJob& job);                     // tree_allreduce.cpp
// Reduce-scatter inside the node (uncompressed), `inner` across nodes on each shard, all-gather
// inside the node (uncompressed). `intra` / `inter` are the node and cross-node transports.
void hierarchical_allreduce(ReduceJob& job, Transport& intra, Transport& inter,
                            Algorithm inner);             // hierarchical_allreduce.cpp

// The `none` codec, for the uncompressed stages of composite algorithms (random-k's value ring,
// the sparse all-reduce's dense switch, the hierarchical node stages). Codecs are stateless, so
// one process-wide instance serves every call.
const Codec& uncompressed_codec();

// Runs flat algorithm `algo` (ring, sra, sparse, rhd, tree; auto = the codec's default path,
// collectives/codec_table.h: random-k's shared-index path or default_flat_algorithm) on the
// job and records its name in job.stats.algorithm.
// Throws invalid_argument for hier.
void run_flat_allreduce(ReduceJob& job, Algorithm algo);

}  // namespace gradzip::collectives
