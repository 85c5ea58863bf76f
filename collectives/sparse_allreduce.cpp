// The sparse all-reduce (algo=sparse; top-k's default): every rank encodes its whole tensor
// once, the messages are all-gathered, and every rank decodes all of them. Made for top-k (a
// message of k (index, value) pairs is far smaller than the tensor, and sparse messages cannot
// be summed on the way as a ring would need), correct for any codec.
//
// Steps on each of P ranks, tensor of n elements:
//   1. encode: this rank's whole tensor into one message m_r, through error feedback when it is
//      on (ErrorFeedbackCodec::encode_chunk, key job.name, count n, ctx = encode_context(job, 0)).
//   2. exchange: the message sizes (allgather_u64), then the messages (allgatherv): every rank
//      holds m_0 .. m_{P-1}, byte for byte the same everywhere.
//      (No size exchange in a stream-ordered device call with exact top-k, job.sizes_known:
//      every message then has max_encoded_bytes(n).)
//   3. decode: data = 0, then data += D(m_r) for r = 0, 1, ..., P-1 in that order (decode_add).
//      The same bytes summed in the same order give the same bits on every rank; the result is
//      sum_r D(m_r), this rank's own message included exactly as the others see it.
// Pipelined (host tensors over MPI or torch.distributed, unless the spec says segment=0): steps
// 2 and 3 together, point to point with receives of the codec's bound and no size exchange,
// each message decode_added (in rank order) as soon as it has arrived, so the zeroing and the
// earlier messages' decodes overlap the later transfers (gather_and_decode_as_messages_arrive).
// Same messages, same adds in the same order: the same bits and bytes as the allgatherv path.
// P == 1: no communication; data = D(m_0) = D(C(g + e)).
//
// Bytes received per rank: sum_{r != me} |m_r|, for top-k (P - 1) (32 + k (index + value
// bytes)). Bytes sent: this rank's message, delivered to P - 1 ranks, is counted P - 1 times.
//
// Dense switch. The union of P top-k selections holds up to P k entries; once that is a large
// share of n a dense ring moves fewer bytes. Before anything moves, every rank estimates, from
// the spec and n alone (the same numbers on every rank, so every rank takes the same path):
//   all-gather: (P - 1) * max_encoded_bytes(n)      for top-k = (P - 1) (32 + k (iw + vw)),
//                                                  k = spec.k_for(n), iw / vw the index / value
//                                                  bytes (an upper bound: approx keeps <= k)
//   dense ring: 2 (P - 1) 32 + 2 (P - 1) 4 n / P   the ring with codec `none`: 2 (P - 1)
//                                                  messages of about n / P f32 values each
// and when the ring is cheaper (strictly), this rank encodes its tensor as in step 1 (error
// feedback included, so the residual update is the same on both paths), decodes its own message
// into data (dense f32) and runs ring_allreduce on it with codec `none` and no error feedback.
// The ring sums exactly those decoded vectors, so the result is again sum_r D(m_r), identical on
// every rank (the ring's own guarantee), though summed in the ring's order rather than rank
// order (bitwise different from the sparse path for non-integer data; equal for data whose sums
// are exact). stats.algorithm becomes "sparse->ring" and stats.note says why.
// With f32 values and u32 indices the switch comes at about P k / n = 1 (headers decide near
// it): at P = 2 and ratio 0.5 the all-gather is still 32 bytes cheaper (4n + 32 vs 4n + 64) and
// stays; from P = 3 on it switches.
//
// Errors: a size above max_encoded_bytes(n) in the size exchange throws malformed_message on
// every rank (all see the same sizes) before anything is allocated for it; a message that fails
// its codec's validation throws malformed_message on every rank (all hold the same bytes). In
// both cases data is unspecified and the residual has already been updated. The pipelined path
// holds such failures until its transfers are done and then throws on every rank together
// after one allgather_u64 of every rank's status.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

__extension__ typedef unsigned __int128 u128;  // byte estimates of huge tensors times P

// Estimated bytes one rank receives on either path (see the file comment).
struct PathCosts {
  u128 gathered = 0;  // the all-gather of every rank's message
  u128 dense_ring = 0;
};

PathCosts estimate_costs(const Codec& codec, std::size_t count, int ranks) {
  const u128 others = static_cast<u128>(ranks - 1);
  PathCosts costs;
  costs.gathered = others * codec.max_encoded_bytes(count);
  costs.dense_ring = 2 * others * compressors::kWireHeaderBytes +
                     2 * others * sizeof(float) * static_cast<u128>(count) /
                         static_cast<unsigned>(ranks);
  return costs;
}

std::string dense_switch_note(const Codec& codec, std::size_t count, int ranks,
                              const PathCosts& costs) {
  char text[256];
  if (codec.sparse()) {
    const double union_density = static_cast<double>(ranks) *
                                 static_cast<double>(codec.spec().k_for(count)) /
                                 static_cast<double>(count);
    std::snprintf(text, sizeof text,
                  "sparse union too dense (P*k/n = %.3g): dense ring (estimated bytes received "
                  "per rank: all-gather %llu, dense ring %llu)",
                  union_density, static_cast<unsigned long long>(costs.gathered),
                  static_cast<unsigned long long>(costs.dense_ring));
  } else {
    std::snprintf(text, sizeof text,
                  "all-gathered dense messages cost more than a dense ring: dense ring "
                  "(estimated bytes received per rank: all-gather %llu, dense ring %llu)",
                  static_cast<unsigned long long>(costs.gathered),
                  static_cast<unsigned long long>(costs.dense_ring));
  }
  return text;
}

// Encodes this rank's whole tensor once (step 1) into `out`; returns the message size. With
// `keep_decoded`, job.data becomes D(message) — from the decode the error-feedback update
// makes anyway when it is on — for the paths that need this rank's decoded message alone.
std::size_t encode_whole_tensor(ReduceJob& job, std::span<std::byte> out, bool keep_decoded) {
  const std::size_t count = job.data.size();
  const ConstTensorView tensor(job.data.data(), count, DType::f32, job.device);
  const EncodeContext ctx = encode_context(job, 0);
  JobEncoder encoder = job_encoder(job, ResidualRole::worker, count);
  std::size_t bytes = 0;
  {
    StageTimer timer(job.stats, Stage::encode);
    bytes = encoder.encode(tensor, out, ctx, keep_decoded ? job.data : std::span<float>{});
    count_encoded(job.stats, count, bytes);
  }
  if (keep_decoded && !encoder.fills_decoded()) {
    StageTimer timer(job.stats, Stage::decode);
    job.codec.decode(out.first(bytes), TensorView{job.data.data(), count, DType::f32, job.device});
  }
  return bytes;
}

// The dense switch: job.data already holds D(own message); an uncompressed ring sums those
// vectors.
void ring_sum_of_decoded_messages(ReduceJob& job, std::string note) {
  ReduceJob dense{job.transport, uncompressed_codec(), job.data, job.name,
                  /*residuals=*/nullptr, job.ctx, job.stats, job.device};
  ring_allreduce(dense);
  job.stats.algorithm = kSparseDenseSwitchName;
  job.stats.note = std::move(note);
}

// The pipelined all-gather (step 2 and 3 together) runs for host tensors over transports whose
// posted operations start when posted (MPI, torch.distributed), unless the spec's segment=0
// turns pipelining off.
bool pipelines_allgather(const ReduceJob& job) {
  return job.segment_bytes > 0 && job.device.kind != DeviceKind::cuda &&
         !job.transport.waits_complete_whole_batches();
}

constexpr int kSparseMessageTag = tag_of(MessageTag::sparse_message);

// Steps 2 and 3 with the decodes overlapping the transfers: every rank posts a receive of the
// codec's bound (max_encoded_bytes(n)) from each other rank and sends its own message to each;
// job.data is zeroed, then the P messages are decode_added in rank order, each as soon as it
// has arrived, so the zeroing and the earlier ranks' decodes run while later messages travel.
// Same bytes, same order of adds, hence the same bits as the allgatherv path; no size exchange.
// A message that is too long, shorter than a header or refused by its decoder is held until
// every transfer has completed; then one allgather_u64 of every rank's status makes every rank
// throw malformed_message together (the ranks that received bad bytes their own error).
void gather_and_decode_as_messages_arrive(ReduceJob& job, std::span<const std::byte> mine,
                                          std::size_t capacity) {
  Transport& transport = job.transport;
  const int ranks = transport.size(), rank = transport.rank();
  const auto index = [](int r) { return static_cast<std::size_t>(r); };
  MessageBuffer received(job.device);
  received.resize(index(ranks - 1) * capacity);
  // Rank r's message lands in slot r (r < rank) or r - 1 (r > rank).
  const auto slot = [&](int r) {
    return received.span().subspan(index(r < rank ? r : r - 1) * capacity, capacity);
  };
  PendingRequests pending(transport);
  std::vector<std::size_t> receives(index(ranks), SIZE_MAX), sends;
  for (int i = 1; i < ranks; ++i) {
    const int from = (rank + ranks - i) % ranks;
    receives[index(from)] = pending.add(transport.irecv(from, kSparseMessageTag, slot(from)));
  }
  for (int i = 1; i < ranks; ++i) {
    sends.push_back(pending.add(transport.isend((rank + i) % ranks, kSparseMessageTag, mine)));
    count_sent(job, mine);
  }

  MalformedHold failures;
  const TensorView sum{job.data.data(), job.data.size(), DType::f32, job.device};
  {
    StageTimer timer(job.stats, Stage::decode);
    fill_zero(job.data, job.device);
  }
  for (int r = 0; r < ranks; ++r) {
    std::span<const std::byte> message = mine;
    if (r != rank) {
      std::size_t bytes = 0;
      if (!failures.run([&] { bytes = pending.wait_receive(receives[index(r)], job.stats); }))
        continue;
      if (bytes < compressors::kWireHeaderBytes) {
        failures.hold(Error(ErrorCode::malformed_message,
                       detail::concat("sparse_allreduce of '", job.name, "' (", transport.describe(),
                                      "): rank ", r, " sent a message of ", bytes,
                                      " bytes, less than a ", compressors::kWireHeaderBytes,
                                      "-byte header")));
        continue;
      }
      message = slot(r).first(bytes);
    }
    StageTimer timer(job.stats, Stage::decode);
    failures.run([&] { job.codec.decode_add(message, sum); });
  }
  for (const std::size_t send : sends) pending.timed_wait(send, job.stats);

  failures.agree(transport, job.stats, "sparse_allreduce", job.name);
}

}  // namespace

void sparse_allreduce(ReduceJob& job) {
  Transport& transport = job.transport;
  const int ranks = transport.size();
  const std::size_t count = job.data.size();
  const std::size_t capacity = job.codec.max_encoded_bytes(count);

  // The path is known before encoding (it depends on the spec, n and P only), so the paths
  // that need this rank's decoded message get it from the encode step.
  const PathCosts costs = estimate_costs(job.codec, count, ranks);
  const bool dense_switch = costs.dense_ring < costs.gathered;

  // Written by the encode before it is read: no zero fill. Host or device memory, as job.data.
  MessageBuffer mine(job.device);
  mine.resize(capacity);
  const std::size_t mine_bytes =
      encode_whole_tensor(job, mine.span(), /*keep_decoded=*/dense_switch || ranks == 1);
  const std::span<const std::byte> my_message(mine.data(), mine_bytes);

  if (dense_switch)
    return ring_sum_of_decoded_messages(job, dense_switch_note(job.codec, count, ranks, costs));
  if (ranks == 1) return;  // job.data = D(own message)

  if (pipelines_allgather(job)) return gather_and_decode_as_messages_arrive(job, my_message, capacity);

  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(ranks));
  if (job.sizes_known) {
    // Every message has max_encoded_bytes(n): no exchange.
    require_known_size(job, count, mine_bytes);
    sizes.assign(sizes.size(), capacity);
  } else {
    StageTimer timer(job.stats, Stage::communicate);
    const std::uint64_t my_size = mine_bytes;
    transport.allgather_u64(std::span<const std::uint64_t>(&my_size, 1), sizes);
  }
  // Sizes are checked on every rank against the same bound, so a bad one stops all ranks
  // before the all-gather (no rank is left waiting) and before the buffer is sized from it.
  std::vector<std::size_t> message_bytes(sizes.size());
  for (int r = 0; r < ranks; ++r) {
    const std::uint64_t size = sizes[static_cast<std::size_t>(r)];
    GZ_REQUIRE(size >= compressors::kWireHeaderBytes && size <= capacity,
               ErrorCode::malformed_message, "sparse_allreduce of '", job.name, "' (",
               transport.describe(), "): rank ", r, " announces a message of ", size,
               " bytes; a message of ", count, " elements holds ", compressors::kWireHeaderBytes,
               " to ", capacity, " bytes (", job.codec.name(), ")");
    message_bytes[static_cast<std::size_t>(r)] = static_cast<std::size_t>(size);
  }
  const std::size_t total = std::accumulate(message_bytes.begin(), message_bytes.end(),
                                            std::size_t{0});
  // Every byte of it is written by the all-gather: no need to zero it first.
  MessageBuffer all(job.device);
  all.resize(total);
  {
    StageTimer timer(job.stats, Stage::communicate);
    transport.allgatherv(my_message, all.span(), message_bytes);
  }
  for (int r = 0; r < ranks - 1; ++r) count_sent(job, my_message, count);
  job.stats.received_bytes += total - mine_bytes;

  StageTimer timer(job.stats, Stage::decode);
  fill_zero(job.data, job.device);
  std::size_t offset = 0;
  for (std::size_t r = 0; r < message_bytes.size(); ++r) {
    job.codec.decode_add(all.span().subspan(offset, message_bytes[r]),
                         TensorView{job.data.data(), count, DType::f32, job.device});
    offset += message_bytes[r];
  }
}

}  // namespace gradzip::collectives
