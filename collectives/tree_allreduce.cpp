// Binomial-tree all-reduce for small tensors, where the ring's 2(P - 1) and even SRA's all-to-all
// latencies dominate: 2 ceil(log2 P) sequential steps.
//
// Reduce (ceil(log2 P) steps, tag kReduceTag). For m = 1, 2, 4, ...: a rank with bit m set
// sends its f32 partial sum to rank - m and is done; otherwise it receives rank + m's partial
// sum (when rank + m < P) and adds it. Messages are the `none` codec's (uncompressed f32 with a
// header): for the small tensors this algorithm is for, compressing each hop saves little and
// would add ceil(log2 P) compressions. Rank 0 ends with the exact f32 sum, accumulated in a
// fixed order (its own data, then the subtrees of ranks 1, 2, 4, ...).
// Broadcast (ceil(log2 P) steps, tag kBroadcastTag). Rank 0 encodes the sum ONCE with the
// job's codec (the tree_root encoder, job_encoder.h: with error feedback a residual of n
// elements; the other ranks hold no residual). Rank r != 0 receives that message from
// r - lowbit(r); every rank forwards it unchanged to r + m for each m < lowbit(r) (all m < P
// for rank 0), largest subtree first, and decodes it, rank 0 included. So every rank ends with
// D(C(sum + e)) from the same bytes.
//
// Bytes sent by rank r: 32 + 4n in the reduce (r != 0), plus e(n) per child in the broadcast
// (rank 0: ceil(log2 P) children). One compression per element; error: the P - 1 f32 adds plus
// one compression of the sum. P == 1: D(C(g + e)).
// A worker residual "<name>" (left by another algorithm for the same name, or holding residuals
// folded into it by ResidualStore::fold_into) is added to the data first and zeroed: the tree
// compensates no worker encode, so this is how that mass reaches the result.
//
// Errors: a malformed message in the reduce throws at once (after this rank's own send has
// completed); a bad broadcast message is still forwarded and its decode error thrown after the
// sends complete, so every rank below it throws too.
#include <algorithm>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/message_tags.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr int kReduceTag = tag_of(MessageTag::tree_reduce);
constexpr int kBroadcastTag = tag_of(MessageTag::tree_broadcast);

}  // namespace

void tree_allreduce(ReduceJob& job) {
  GZ_REQUIRE(job.device.kind != DeviceKind::cuda, ErrorCode::internal, "tree_allreduce of '",
             job.name, "': runs on host memory (the Communicator stages CUDA tensors)");
  Transport& transport = job.transport;
  const int rank = transport.rank(), ranks = transport.size();
  const std::span<float> data = job.data;
  const std::size_t n = data.size();
  const Codec& none = uncompressed_codec();
  const std::size_t reduce_capacity = none.max_encoded_bytes(n);
  const std::size_t broadcast_capacity = job.codec.max_encoded_bytes(n);
  // One buffer: the reduce's messages, then the broadcast's. Per call: the tree is for small
  // tensors, where an allocation costs less than keeping a per-thread workspace.
  std::vector<std::byte> buffer(std::max(reduce_capacity, broadcast_capacity));
  const std::span<std::byte> memory(buffer);
  const TensorView data_view{data.data(), n, DType::f32, job.device};
  const ConstTensorView data_input(data.data(), n, DType::f32, job.device);

  // A worker residual "<name>" (another algorithm's, when algo=auto chose differently for this
  // name, or residuals folded into it by ResidualStore::fold_into) is not compensated by any
  // encode here: it joins the f32 data that the tree sums exactly, and is zeroed, so its mass
  // reaches the result instead of being stranded.
  deliver_worker_residual(job, "tree_allreduce");

  JobEncoder root_encoder = job_encoder(job, ResidualRole::tree_root, n);
  if (rank == 0) {
    // Registered (or its size checked) before rank 0 waits for anyone. A size mismatch throws
    // on rank 0 alone, but only when the tensor's size changed, which the call check has made
    // every rank agree on, and every rank's registration of its other residuals is the same.
    root_encoder.register_residual();
    root_encoder.place_in_worker(0);
  }

  // Reduce to rank 0.
  for (int m = 1; m < ranks; m *= 2) {
    PendingRequests pending(transport);
    if ((rank & m) != 0) {
      std::size_t bytes = 0;
      {
        StageTimer timer(job.stats, Stage::encode);
        bytes = none.encode(data_input, memory, encode_context(job, 0));
        count_encoded(job.stats, n, bytes);
      }
      const std::span<const std::byte> message = memory.first(bytes);
      const std::size_t send = pending.add(transport.isend(rank - m, kReduceTag, message));
      count_sent(job, message);
      pending.timed_wait(send, job.stats);
      break;
    }
    if (rank + m < ranks) {
      const std::size_t receive =
          pending.add(transport.irecv(rank + m, kReduceTag, memory.first(reduce_capacity)));
      const std::size_t bytes = pending.wait_receive(receive, job.stats);
      StageTimer timer(job.stats, Stage::decode);
      none.decode_add(memory.first(bytes), data_view);
    }
  }

  // Broadcast rank 0's message.
  PendingRequests pending(transport);
  std::size_t bytes = 0;
  int lowest_bit = 1;
  while (lowest_bit < ranks) lowest_bit *= 2;  // rank 0: every m < P is a child
  if (rank == 0) {
    StageTimer timer(job.stats, Stage::encode);
    const EncodeContext ctx = encode_context(job, 0, /*server=*/true);
    bytes = root_encoder.encode(data_input, memory, ctx);
    count_encoded(job.stats, n, bytes);
  } else {
    lowest_bit = rank & -rank;
    const std::size_t receive = pending.add(
        transport.irecv(rank - lowest_bit, kBroadcastTag, memory.first(broadcast_capacity)));
    bytes = pending.wait_receive(receive, job.stats);
  }
  const std::span<const std::byte> message = memory.first(bytes);
  std::vector<std::size_t> sends;
  for (int m = lowest_bit / 2; m >= 1; m /= 2)
    if (rank + m < ranks)
      sends.push_back(pending.add(transport.isend(rank + m, kBroadcastTag, message)));
  std::exception_ptr decode_error;
  try {
    StageTimer timer(job.stats, Stage::decode);
    job.codec.decode(message, data_view);
  } catch (const Error&) {
    decode_error = std::current_exception();
  }
  for (std::size_t send : sends) pending.timed_wait(send, job.stats);
  if (decode_error) std::rethrow_exception(decode_error);
  for (std::size_t i = 0; i < sends.size(); ++i) count_sent(job, message);
}

}  // namespace gradzip::collectives
