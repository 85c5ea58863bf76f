// Every message tag the collectives put on a transport, in one enum: two kinds of message never
// share a tag, because the values follow from their order here (never assign one explicitly;
// add a kind at the end). A rank posts a receive for a (peer, tag) pair, so a message of one
// algorithm can never match a receive of another, even when a call's algorithms interleave
// (the hierarchical all-reduce runs one inside another; the pipelined ring and the sparse
// all-reduce used to share 150). The values start at 100: the transports keep the ones below
// for themselves (collectives/transport/mpi: 1, timeout notices on its own communicator).
#pragma once

namespace gradzip::collectives {

enum class MessageTag : int {
  ring_reduce_scatter = 100,        // ring_allreduce.cpp: partial sums to the right neighbour
  ring_allgather,                   //   reduced chunks around the ring
  rhd_fold,                         // halving_doubling_allreduce.cpp: extra ranks' halves in
  rhd_halving,                      //   recursive halving
  rhd_doubling,                     //   recursive doubling
  rhd_unfold,                       //   the result to the extra ranks
  tree_reduce,                      // tree_allreduce.cpp: f32 partial sums towards rank 0
  tree_broadcast,                   //   the encoded sum from rank 0
  link_calibration,                 // link_calibration.cpp: the link measurement's messages
  sra_contribution,                 // sra_pipelined.cpp: segment messages to their chunk's owner
  sra_owner,                        //   the owners' reduced segments to every rank
  ring_segment_reduce_scatter,      // ring_pipelined.cpp: segments of partial sums
  ring_segment_allgather_even,      //   reduced segments at even steps
  ring_segment_allgather_odd,       //   and at odd steps
  sparse_message,                   // sparse_allreduce.cpp: whole-tensor messages to every rank
};

// The tag as the transports take it.
constexpr int tag_of(MessageTag kind) noexcept { return static_cast<int>(kind); }

}  // namespace gradzip::collectives
