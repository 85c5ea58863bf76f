// Compressed all-gather (Communicator::allgather): on entry rank r's shard
// [shard_begin(n, P, r), shard_begin(n, P, r + 1)) of job.data holds its data; on return every
// shard s of job.data holds D(C(rank s's shard)), the same bytes on every rank.
//   1. Rank r encodes its shard once (the worker encoder, job_encoder.h: with error feedback
//      its residual has the tensor's n elements and the shard reads and updates its slice;
//      ctx element_offset = the shard's first element).
//   2. The message sizes are exchanged (transport.allgather_u64); each is checked against
//      max_encoded_bytes of its shard before any buffer is sized from it. A stream-ordered
//      device call whose codec's sizes are fixed (job.sizes_known) exchanges none: every size
//      is its shard's max_encoded_bytes.
//   3. The messages are exchanged with one allgatherv, in rank order.
//   4. Every rank decodes every shard's message, its own included, into job.data: all ranks
//      decode the same bytes with the same decoder, so they end byte-identical, and the owner
//      holds what the others received rather than its uncompressed data.
// P == 1: no communication; the shard (the whole tensor) becomes D(C(g + e)).
//
// Stats: the message is counted as sent P - 1 times (every other rank receives it, whatever
// schedule MPI_Allgatherv uses) and the other ranks' messages as received; the 8-byte size of
// each message, when exchanged before it, counts as header bytes both ways.
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void compressed_allgather(ReduceJob& job) {
  const int rank = job.transport.rank();
  const int ranks = job.transport.size();
  const std::size_t count = job.data.size();
  const auto shard_data = [&](int s) {
    const std::size_t begin = shard_begin(count, ranks, s);
    return job.data.subspan(begin, shard_begin(count, ranks, s + 1) - begin);
  };

  // 1. This rank's message.
  const std::span<float> mine = shard_data(rank);
  // Buffers are left uninitialised: encode and allgatherv write every byte that is read. They
  // are host or device memory, as job.data.
  const std::size_t capacity = job.codec.max_encoded_bytes(mine.size());
  MessageBuffer message_memory(job.device);
  message_memory.resize(capacity);
  std::size_t message_bytes = 0;
  {
    StageTimer timer(job.stats, Stage::encode);
    const ConstTensorView shard(mine.data(), mine.size(), DType::f32, job.device);
    const EncodeContext ctx = encode_context(job, shard_begin(count, ranks, rank));
    message_bytes =
        job_encoder(job, ResidualRole::worker, count).encode(shard, message_memory.span(), ctx);
    require_known_size(job, mine.size(), message_bytes);
    count_encoded(job.stats, mine.size(), message_bytes);
  }
  const std::span<const std::byte> message(message_memory.data(), message_bytes);

  const auto decode_shard = [&](int s, std::span<const std::byte> bytes) {
    StageTimer timer(job.stats, Stage::decode);
    const std::span<float> shard = shard_data(s);
    job.codec.decode(bytes, TensorView{shard.data(), shard.size(), DType::f32, job.device});
  };
  if (ranks == 1) {
    decode_shard(rank, message);
    return;
  }

  // 2. Message sizes, checked before they size anything.
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(ranks));
  if (job.sizes_known) {
    // Every shard's message has its max_encoded_bytes: no exchange (and none to count).
    for (int s = 0; s < ranks; ++s) sizes[s] = job.codec.max_encoded_bytes(shard_data(s).size());
  } else {
    StageTimer timer(job.stats, Stage::communicate);
    const std::uint64_t my_size = message_bytes;
    job.transport.allgather_u64(std::span<const std::uint64_t>(&my_size, 1), sizes);
  }
  std::vector<std::size_t> block_bytes(static_cast<std::size_t>(ranks));
  for (int s = 0; s < ranks; ++s) {
    const std::size_t shard_capacity = job.codec.max_encoded_bytes(shard_data(s).size());
    GZ_REQUIRE(sizes[s] <= shard_capacity, ErrorCode::malformed_message,
               "compressed_allgather of '", job.name, "' on ", job.transport.describe(), ": rank ",
               s, " announces a ", sizes[s], "-byte message for its shard of ",
               shard_data(s).size(), " elements; the codec's messages hold at most ",
               shard_capacity, " bytes");
    block_bytes[s] = static_cast<std::size_t>(sizes[s]);
  }

  // 3. All messages, in rank order.
  const std::size_t all_bytes =
      std::accumulate(block_bytes.begin(), block_bytes.end(), std::size_t{0});
  MessageBuffer all_memory(job.device);
  all_memory.resize(all_bytes);
  const std::span<std::byte> all = all_memory.span();
  {
    StageTimer timer(job.stats, Stage::communicate);
    job.transport.allgatherv(message, all, block_bytes);
  }
  const std::uint64_t size_bytes =
      job.sizes_known ? 0 : sizeof(std::uint64_t) * static_cast<std::uint64_t>(ranks - 1);
  for (int copy = 0; copy < ranks - 1; ++copy) count_sent(job, message, mine.size());
  job.stats.sent_header_bytes += size_bytes;
  job.stats.received_bytes += all.size() - message_bytes + size_bytes;

  // 4. Every shard from its owner's bytes.
  std::size_t offset = 0;
  for (int s = 0; s < ranks; ++s) {
    decode_shard(s, all.subspan(offset, block_bytes[s]));
    offset += block_bytes[s];
  }
}

}  // namespace gradzip::collectives
