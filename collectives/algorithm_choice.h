// Which algorithm a Communicator call runs, decided from the spec, the element count and the
// call's step alone. Every rank has checked that it agrees with the others on all three
// (collectives/call_check.h) before it asks, so every rank makes the same choice.
//
// All-reduce (choose_allreduce):
//   warm-up (step < spec.warmup)           -> uncompressed transport all-reduce ("mpi")
//   algo=auto, count * 4 < spec.min_bytes  -> uncompressed transport all-reduce ("mpi"):
//                                             below a few KiB latency dominates and compressing
//                                             saves nothing; error feedback is not involved
//   algo=auto, random-k (fallback=off)     -> its shared-index path
//   algo=auto with an AutoModel            -> the codec's default (the first of its row's
//                                             auto_choices, collectives/codec_table.cpp; and
//                                             hier when the model has a node structure),
//                                             unless another candidate is predicted at least
//                                             15% faster: then the fastest (ties: the
//                                             earlier); the note lists every candidate's
//                                             predicted time
//                                             With fallback=dense (random-k included): the
//                                             transport's dense f32 all-reduce ("mpi") when
//                                             estimate_dense_allreduce predicts it no slower
//                                             than that choice; AllreduceChoice::dense_fallback
//   algo=auto without one                  -> the codec's default (its row's default_path)
// The AutoModel's inputs (link, γ) are agreed bit for bit by every rank
// (collectives/link_calibration.h), so the model's choice is the same everywhere too.
//   algo=ring | sra | sparse | rhd | tree  -> that flat algorithm, at any size
//   algo=hier                              -> hierarchical_allreduce with the codec's default
//                                             flat algorithm across nodes (auto)
//   codec powersgd                         -> ErrorCode::unsupported (a Reducer-level
//                                             compressor: it needs whole matrices)
// Reduce-scatter (choose_reduce_scatter): SRA's first half for algo=sra and for the codecs whose
// default path is SRA, the ring's first half otherwise (there is no sparse, hierarchical, halving/doubling or tree
// reduce-scatter); during
// warm-up the codec is `none`. All-gather always runs compressed_allgather (codec `none`
// during warm-up).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "collectives/cost_model.h"
#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

enum class AllreducePath : std::uint8_t {
  transport_sum,  // Transport::allreduce_f32_sum on the f32 data, no codec, no error feedback
  flat,           // run_flat_allreduce(job, algorithm)
  hierarchical,   // hierarchical_allreduce(job, intra, inter, algorithm)
};

struct AllreduceChoice {
  AllreducePath path = AllreducePath::transport_sum;
  // flat: what run_flat_allreduce gets (auto_select lets it pick, random-k included);
  // hierarchical: the inner algorithm across nodes; transport_sum: unused (auto_select).
  Algorithm algorithm = Algorithm::auto_select;
  // The name the call reports in CollectiveStats::algorithm: "mpi", "ring", "sra",
  // "sparse", "randk" or "hier/<inner>" (inner as the flat names).
  std::string name;
  // Why, when the reason is not obvious from the spec (warm-up, below min_bytes, auto).
  std::string note;
  // transport_sum chosen by fallback=dense: the caller adds the error-feedback residual (every
  // role's, folded into the worker's) to the tensor and zeroes it before the dense sum, and
  // sets CollectiveStats::fallback.
  bool dense_fallback = false;
};

// The node structure algo=auto's model knows when the hierarchical all-reduce is a candidate.
struct AutoHierarchy {
  HierarchyModel nodes;  // ranks per node and the link inside a node
  LinkModel across;      // the link of each inter-node group, all groups busy at once
  // The nodes are the ranks that share memory (spec ranks_per_node=0), not stated by the spec.
  bool shared_memory = false;
};

// What algo=auto chooses by: the cost model's inputs for one call.
struct AutoModel {
  const Codec& codec;  // the call's codec (its spec gives the message sizes)
  CodecCost cost;      // γ, agreed across ranks
  LinkModel link;      // agreed across ranks
  int ranks = 1;
  // When set (the spec's node structure, stated by ranks_per_node=L or, for 0, the ranks that
  // share memory, has two or more nodes of two or more ranks each, all of one size), the
  // hierarchical all-reduce is a candidate too, for every codec but random-k.
  std::optional<AutoHierarchy> hierarchy;
};

// Whether algo=auto's model may ever decide for `spec`: algo=auto with a codec that has more
// than one candidate (not random-k, not powersgd), or random-k with fallback=dense. What the
// Reducer asks to measure the model up front.
bool spec_uses_model(const CompressionSpec& spec) noexcept;

// Whether `ranks` ranks form two or more nodes of `ranks_per_node` >= 2 ranks each (all of one
// size): the node structures the hierarchical all-reduce is a candidate for.
bool forms_nodes(int ranks, std::uint32_t ranks_per_node) noexcept;

// Whether a spec's `ranks_per_node` may give algo=auto's model a node structure on `ranks`
// ranks: a stated size that forms_nodes, or 0 (the ranks that share memory, known only once
// detected, a collective) on 4 or more ranks. What the Reducer asks to measure up front.
bool may_form_nodes(int ranks, std::uint32_t ranks_per_node) noexcept;

// Whether choose_allreduce would consult an AutoModel for this call (so the caller knows
// whether to make one, which may measure the link and γ: collectives). False for explicit
// algorithms, warm-up, tensors under min_bytes, random-k, one rank and CUDA tensors (`cuda`:
// the model's γ is the CPU's, and rhd and tree would stage the tensor through host memory).
bool auto_uses_model(const CompressionSpec& spec, std::size_t count, std::uint32_t step, int ranks,
                     bool cuda);

// The all-reduce of `count` elements under `spec` at the name's call number `step`; `model` is
// used for algo=auto when auto_uses_model says so (null: the codec's default).
// Throws ErrorCode::unsupported for powersgd.
AllreduceChoice choose_allreduce(const CompressionSpec& spec, std::size_t count, std::uint32_t step,
                                 const AutoModel* model = nullptr);

struct ShardedChoice {
  // Reduce-scatter: an algorithm whose row has run_reduce_scatter (ring or sra). All-gather:
  // none (compressed_allgather is the all-gather collective's only algorithm and has no algo=
  // value).
  std::optional<Algorithm> algorithm;
  bool warmup = false;                    // true: run with codec none, without error feedback
  std::string name;                       // CollectiveStats::algorithm
  std::string note;
};

// The reduce-scatter / all-gather of `spec` at call number `step`. Throws unsupported for
// powersgd.
ShardedChoice choose_reduce_scatter(const CompressionSpec& spec, std::uint32_t step);
ShardedChoice choose_allgather(const CompressionSpec& spec, std::uint32_t step);

}  // namespace gradzip::collectives
