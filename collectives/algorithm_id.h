// The key of the algorithm table (collectives/algorithm_table.h): every all-reduce path the
// library runs besides the transport's own uncompressed sum. Public algo= values
// (gradzip::Algorithm) map onto these; random-k's shared-index path has no algo= value.
#pragma once

#include <cstdint>

namespace gradzip::collectives {

enum class AlgorithmId : std::uint8_t {
  ring,       // ring reduce-scatter + all-gather, re-encoding partial sums (codec `none`: plain)
  sra,        // scatter-reduce-allgather: encode once, owner re-encodes the sum
  sparse,     // the sparse all-reduce: an all-gather of whole-tensor messages (with the dense
              // switch)
  randk,      // random-k's shared-index path: a ring over k values
  rhd,        // recursive halving (re-encoding) + doubling (forwarding), Rabenseifner
  tree,       // binomial reduce in f32, the sum encoded once, binomial broadcast of the message
  hier,       // uncompressed inside nodes, the codec's flat algorithm across nodes
};

// The path's name: what CollectiveStats::algorithm reports and the cost model prints (its row's
// `name`; defined in collectives/algorithm_table.cpp).
const char* algorithm_id_name(AlgorithmId algorithm) noexcept;

}  // namespace gradzip::collectives
