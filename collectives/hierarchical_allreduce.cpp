// Hierarchical all-reduce: uncompressed inside a node (shared memory is fast), compressed only
// across nodes (the slow links), as in Horovod's hierarchical all-reduce and BytePS.
//
// Transports: job.transport holds all P ranks; `intra` the L ranks of this rank's node (local
// index i = intra.rank()); `inter` the ranks with this rank's local index, one per node
// (world.split(node, rank) and world.split(local index, rank), both ordered by world rank).
//
// Steps, tensor of n elements, S shards (S = L when all nodes have L ranks; see below):
//   0. layout: the ranks all-gather (intra size, local index, inter size) over job.transport, so
//      every rank knows the node sizes and takes the same decisions; transports that do not
//      form nodes and local-index groups throw invalid_argument on every rank.
//   (a) reduce-scatter inside the node, uncompressed: ring_reduce_scatter over `intra` with the
//      codec `none` and no error feedback. Local rank i ends holding the node's exact f32 sum
//      of node-shard i = [shard_begin(n, L, i), shard_begin(n, L, i + 1)).
//   (b) across nodes, compressed: local rank i < S all-reduces its shard over `inter` with
//      run_flat_allreduce(inner): a ReduceJob whose data is the shard, with
//        name      hierarchical_shard_job_name(job.name) ("<name>@hier", job_encoder.h): its
//                  residual (error feedback) has the shard's size, and
//                  never collides with the flat path's residual of the whole tensor;
//        tensor_id job.ctx.tensor_id ^ ((i + 1) * 0x9E3779B9): the inner job's element offsets
//                  start at 0 in every shard, so without this shards i and j of one node (and
//                  one inter rank, hence one seed) would draw the same random numbers for
//                  their first, second, ... elements, and their stochastic rounding errors
//                  would be correlated. Distinct i give distinct ids (odd multiplier, i < 2^32);
//                  every member of one inter group has the same i, so random-k, which needs
//                  the same draws on all ranks, still gets them.
//      The inner algorithm guarantees identical bytes on every member of the group.
//   (c) all-gather inside the node, uncompressed: allgatherv of the f32 shards over `intra`.
//      Every rank of every node then holds the same bytes: shard i came out of step (b) the
//      same on every node, and step (c) copies bytes.
// The result is, shard by shard, `inner` applied across nodes to the exact node sums: the lossy
// codec compresses node partial sums (m = number of nodes contributions), never single ranks'.
// One node (m = 1): step (b) runs at one rank, i.e. D(C(node sum)), so the codec's loss (and
// error feedback) is the same at every node count. L = 1: steps (a) and (c) move nothing.
//
// Nodes of unequal size (e.g. P = 5 as nodes of 2, 2, 1). The inter group of local index i
// then lacks the nodes that have no rank i, so shard i could not be reduced over all nodes.
// Instead every node cuts the tensor into S = the smallest node's size shards: after step (a)
// a larger node moves its L-shards to S-shards (alltoallv inside the node, uncompressed, exact:
// each element moves from the one rank holding it to the one that needs it); ranks with local
// index < S run step (b) on the S-shards, in groups that now have a member on every node; ranks
// with local index >= S skip step (b) (their inter groups stay idle); step (c) gathers the
// S-shards (ranks >= S contribute nothing). Results stay correct and identical on all ranks;
// the price is that only S ranks per node carry cross-node traffic. stats.note says so.
//
// Stats (one CollectiveStats across all stages): bytes of (a), (b) and (c) add up; the raw f32
// blocks of (c) and of the redistribution count as payload bytes (they have no header), once
// per receiving rank. stats.algorithm = "hier/<inner>", <inner> the flat algorithm's name
// (e.g. "hier/sra", "hier/sparse->ring").
//
// Errors: if step (b) throws on a rank, the node still runs step (c) and then exchanges a
// failure flag (one u64 per rank inside the node), so no rank of that node waits forever and
// none returns a result holding the failed shard: the failing rank rethrows its error, the
// others throw ErrorCode::internal naming it. Messages over the transport's 2^31 - 1 byte
// limit (step (c) moves 4n bytes in one allgatherv) throw the transport's unsupported error;
// pipeline chunks keep tensors far below that.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr int kLayoutValues = 3;  // per rank: intra size, local index, inter size

// What every rank knows after step 0.
struct NodeLayout {
  int nodes = 1;           // number of nodes (ranks with local index 0)
  int smallest_node = 1;   // S: shards per node
  int largest_node = 1;
};

NodeLayout agree_on_layout(const ReduceJob& job, Transport& intra, Transport& inter) {
  Transport& world = job.transport;
  const std::uint64_t mine[kLayoutValues] = {static_cast<std::uint64_t>(intra.size()),
                                             static_cast<std::uint64_t>(intra.rank()),
                                             static_cast<std::uint64_t>(inter.size())};
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world.size()) * kLayoutValues);
  {
    StageTimer timer(job.stats, Stage::communicate);
    world.allgather_u64(mine, all);
  }
  const auto value = [&](int r, int field) {
    return all[static_cast<std::size_t>(r) * kLayoutValues + static_cast<std::size_t>(field)];
  };
  NodeLayout layout;
  layout.nodes = 0;
  layout.smallest_node = world.size();
  layout.largest_node = 0;
  std::uint64_t ranks_in_nodes = 0;
  for (int r = 0; r < world.size(); ++r) {
    const std::uint64_t node_size = value(r, 0), local_index = value(r, 1);
    GZ_REQUIRE(node_size >= 1 && local_index < node_size, ErrorCode::invalid_argument,
               "hierarchical_allreduce of '", job.name, "': rank ", r, " reports local index ",
               local_index, " in a node of ", node_size, " ranks");
    layout.smallest_node = std::min(layout.smallest_node, static_cast<int>(node_size));
    layout.largest_node = std::max(layout.largest_node, static_cast<int>(node_size));
    if (local_index == 0) {
      ++layout.nodes;
      ranks_in_nodes += node_size;
    }
  }
  GZ_REQUIRE(ranks_in_nodes == static_cast<std::uint64_t>(world.size()),
             ErrorCode::invalid_argument, "hierarchical_allreduce of '", job.name, "': ",
             layout.nodes, " nodes hold ", ranks_in_nodes, " ranks, the transport has ",
             world.size(), " (intra transports must partition the ranks into nodes)");
  // Ranks that take part in step (b) need one group member per node.
  for (int r = 0; r < world.size(); ++r) {
    if (value(r, 1) < static_cast<std::uint64_t>(layout.smallest_node))
      GZ_REQUIRE(value(r, 2) == static_cast<std::uint64_t>(layout.nodes),
                 ErrorCode::invalid_argument, "hierarchical_allreduce of '", job.name,
                 "': rank ", r, " (local index ", value(r, 1), ") has an inter transport of ",
                 value(r, 2), " ranks, expected one per node (", layout.nodes, ")");
  }
  return layout;
}

// [begin, end) of shard `index` of `count` elements cut into `shards`.
struct Range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const noexcept { return end - begin; }
};

Range shard_range(std::size_t count, int shards, int index) {
  return {shard_begin(count, shards, index), shard_begin(count, shards, index + 1)};
}

std::size_t overlap(Range a, Range b) {
  const std::size_t begin = std::max(a.begin, b.begin), end = std::min(a.end, b.end);
  return end > begin ? end - begin : 0;
}

std::span<const std::byte> bytes_of(std::span<const float> values) {
  return std::as_bytes(values);
}

// After step (a) on a node of L > S ranks: local rank j holds L-shard j; afterwards local rank
// t < S holds S-shard t. Both partitions are contiguous and increasing, so the pieces rank j
// sends to t = 0, 1, ... lie in that order inside its L-shard, and the pieces rank t receives
// from j = 0, 1, ... tile its S-shard in order: the alltoallv sends and receives in place
// (from a copy of the L-shard, since MPI forbids overlapping send and receive buffers).
void move_to_smaller_shards(ReduceJob& job, Transport& intra, int shards) {
  const std::size_t count = job.data.size();
  const int node_size = intra.size(), local = intra.rank();
  const Range held = shard_range(count, node_size, local);
  const Range wanted = local < shards ? shard_range(count, shards, local) : Range{};
  std::vector<std::size_t> send_bytes(static_cast<std::size_t>(node_size), 0),
      receive_bytes(static_cast<std::size_t>(node_size), 0);
  for (int t = 0; t < shards; ++t)
    send_bytes[static_cast<std::size_t>(t)] =
        overlap(held, shard_range(count, shards, t)) * sizeof(float);
  for (int j = 0; j < node_size; ++j)
    receive_bytes[static_cast<std::size_t>(j)] =
        overlap(wanted, shard_range(count, node_size, j)) * sizeof(float);
  const std::vector<float> held_copy(job.data.begin() + static_cast<std::ptrdiff_t>(held.begin),
                                     job.data.begin() + static_cast<std::ptrdiff_t>(held.end));
  {
    StageTimer timer(job.stats, Stage::communicate);
    intra.alltoallv(bytes_of(held_copy), send_bytes,
                    std::as_writable_bytes(job.data.subspan(wanted.begin, wanted.size())),
                    receive_bytes);
  }
  for (int r = 0; r < node_size; ++r) {
    if (r == local) continue;
    job.stats.sent_payload_bytes += send_bytes[static_cast<std::size_t>(r)];
    job.stats.received_bytes += receive_bytes[static_cast<std::size_t>(r)];
  }
}

// Step (c): every local rank t < S contributes S-shard t; all of `data` is written.
void gather_shards(ReduceJob& job, Transport& intra, int shards) {
  const std::size_t count = job.data.size();
  const int node_size = intra.size(), local = intra.rank();
  std::vector<std::size_t> block_bytes(static_cast<std::size_t>(node_size), 0);
  for (int t = 0; t < shards; ++t)
    block_bytes[static_cast<std::size_t>(t)] = shard_range(count, shards, t).size() * sizeof(float);
  const Range own = local < shards ? shard_range(count, shards, local) : Range{};
  const std::vector<float> own_copy(job.data.begin() + static_cast<std::ptrdiff_t>(own.begin),
                                    job.data.begin() + static_cast<std::ptrdiff_t>(own.end));
  {
    StageTimer timer(job.stats, Stage::communicate);
    intra.allgatherv(bytes_of(own_copy), std::as_writable_bytes(job.data), block_bytes);
  }
  const std::size_t own_bytes = own.size() * sizeof(float);
  job.stats.sent_payload_bytes += own_bytes * static_cast<std::size_t>(node_size - 1);
  job.stats.received_bytes += count * sizeof(float) - own_bytes;
}

// After step (c): throws on every rank of the node if step (b) failed on any of them.
void rethrow_node_failure(ReduceJob& job, Transport& intra, const std::exception_ptr& failure) {
  const std::uint64_t failed = failure ? 1 : 0;
  std::vector<std::uint64_t> flags(static_cast<std::size_t>(intra.size()));
  intra.allgather_u64(std::span<const std::uint64_t>(&failed, 1), flags);
  if (failure) std::rethrow_exception(failure);
  for (int r = 0; r < intra.size(); ++r)
    GZ_REQUIRE(flags[static_cast<std::size_t>(r)] == 0, ErrorCode::internal,
               "hierarchical_allreduce of '", job.name, "' (", job.transport.describe(),
               "): the cross-node all-reduce failed on local rank ", r,
               " of this node; its shard of the result is missing");
}

// The name run_flat_allreduce reports for `inner` (for ranks that do not run it).
std::string inner_name(const Codec& codec, Algorithm inner) {
  if (inner == Algorithm::auto_select) return std::string(default_path_name(codec.spec().codec));
  return std::string(algorithm_name(inner));
}

}  // namespace

void hierarchical_allreduce(ReduceJob& job, Transport& intra, Transport& inter, Algorithm inner) {
  // Checked on every rank before anything moves (run_flat_allreduce would throw on the ranks
  // of step (b) only, leaving the others waiting in step (c)).
  GZ_REQUIRE(inner != Algorithm::hier, ErrorCode::invalid_argument, "hierarchical_allreduce of '",
             job.name, "': the inner algorithm must be flat (auto, ring, sra or allgather)");
  const NodeLayout layout = agree_on_layout(job, intra, inter);
  const int shards = layout.smallest_node;
  const int local = intra.rank();
  const std::size_t count = job.data.size();

  // A worker residual "<name>" (another algorithm's for the same name, or residuals folded into
  // it by ResidualStore::fold_into) is compensated by no encode here (the inner algorithm keeps
  // "<name>@hier"): it joins the data before the node stage, which sums exactly, and is zeroed.
  deliver_worker_residual(job, "hierarchical_allreduce");

  if (intra.size() > 1) {  // (a)
    ReduceJob node_sum{intra, uncompressed_codec(), job.data, job.name, /*residuals=*/nullptr,
                       job.ctx, job.stats};
    ring_reduce_scatter(node_sum);
    if (shards < intra.size()) move_to_smaller_shards(job, intra, shards);
  }

  std::string algorithm = inner_name(job.codec, inner);
  std::exception_ptr failure;
  if (local < shards) {  // (b)
    const Range shard = shard_range(count, shards, local);
    EncodeContext ctx = job.ctx;
    ctx.tensor_id ^= static_cast<std::uint32_t>(local + 1) * 0x9E3779B9u;
    ReduceJob across_nodes{inter, job.codec, job.data.subspan(shard.begin, shard.size()),
                           hierarchical_shard_job_name(job.name), job.residuals, ctx, job.stats};
    across_nodes.segment_bytes = job.segment_bytes;
    // The shard's residuals (the inner algorithm's, under the shard job's name) sit at the
    // shard's offset of the tensor (ResidualStore::fold_into).
    place_inner_job(job, across_nodes, shard.begin);
    try {
      run_flat_allreduce(across_nodes, inner);
      algorithm = job.stats.algorithm;  // may carry a switch, e.g. "sparse->ring"
    } catch (...) {
      failure = std::current_exception();
    }
  }

  if (intra.size() > 1) {  // (c)
    gather_shards(job, intra, shards);
    rethrow_node_failure(job, intra, failure);
  } else if (failure) {
    std::rethrow_exception(failure);
  }

  job.stats.algorithm = "hier/" + algorithm;
  if (layout.smallest_node < layout.largest_node) {
    if (!job.stats.note.empty()) job.stats.note += "; ";
    job.stats.note += detail::concat(
        "nodes of unequal size (", layout.smallest_node, " to ", layout.largest_node,
        " ranks): ", shards, " shard(s) per node, local ranks >= ", shards,
        " take no part in the cross-node stage");
  }
}

}  // namespace gradzip::collectives
