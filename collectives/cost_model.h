// The α-β-γ cost model of gradzip's all-reduce algorithms (docs/cost-model.md): how long one
// compressed all-reduce of n f32 elements takes on P ranks, from
//   α  the start-up time of one message (software and wire latency),
//   β  the time per byte of a rank's link (1 / bandwidth, each direction, full duplex),
//   γ  the codec's time per element to encode, and to decode-and-add one message,
// and the exact message sizes of the codec (Codec::max_encoded_bytes, docs/algorithms.md).
//
// Every algorithm is modelled on its critical path as gradzip runs it: a sequence of steps,
// each sending one message (or, for the all-to-all and all-gather of SRA and the sparse
// all-gather, P − 1 messages that share the link) and doing its encodes and decodes before or
// after the transfer, without overlap, except for the pipelined ring and SRA
// (CostEstimate::overlap_s). The model is what benchmarks/model/ projects to large clusters
// and validates against the emulated-cluster measurements (docs/results.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algorithm_id.h"
#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

struct LinkModel {
  double latency_s = 50e-6;       // α
  double bytes_per_s = 125e6;     // 1 / β (1 Gbit/s): each rank sends to one peer and
                                  // receives from another (a ring step)
  // The rate of a pairwise exchange, where two ranks send to each other at once over one
  // connection (halving/doubling's steps); 0: the same as bytes_per_s. On a full-duplex
  // fabric it is; Open MPI's TCP transport on the emulated cluster reached 40-56% of the ring
  // rate with 4 MiB messages but the full rate with rhd's smaller ones, so measure_link does
  // not measure it (docs/cost-model.md); it can be given (link_exchange_gbps).
  double exchange_bytes_per_s = 0;
  // The start-up of one small collective (an all-gather of 8 bytes per rank), as measure_link
  // measures it; 0: not known. SRA's and the sparse all-reduce's collectives cost at least
  // this each: on the emulated cluster's 4 ranks on 2 cores it was about 5 α, because a
  // collective waits for every rank to be scheduled.
  double collective_latency_s = 0;
  // Whether the transport runs the pipelined ring and SRA (the spec's `segment` key): not one
  // whose waits complete whole batches (NCCL) or whose every message is expensive
  // (torch.distributed through Python): transport_pipelines() in collectives/collective_job.h.
  // Not measured and not saved with the model's inputs: the Communicator sets it from its
  // transport for every choice.
  bool pipelined = true;
  // Whether the modelled calls are stream-ordered device calls: CUDA tensors over NCCL with a
  // codec whose message sizes follow from the element count (collectives/collective_job.h:
  // ReduceJob::stream_ordered and sizes_known). Their ring and SRA cut chunks into segments
  // whatever `pipelined` says (the segments overlap on streams, not through host waits:
  // pipeline_segments); no algorithm exchanges sizes; the call's checks end in one flag
  // all-reduce, a small collective, at its completion (instead of the host paths' status
  // all-gathers). The Communicator's algo=auto does not consult the model for CUDA tensors;
  // `gradzip-bench model --device cuda` projects such calls with γ measured on the device.
  bool stream_ordered = false;

  // Whether the ring and SRA run segmented over this link (pipelined or stream_ordered).
  bool segments_chunks() const noexcept { return pipelined || stream_ordered; }

  double exchange_rate() const noexcept {
    return exchange_bytes_per_s > 0 ? exchange_bytes_per_s : bytes_per_s;
  }
};

// γ of one codec, in seconds per f32 element.
struct CodecCost {
  double encode_s = 0;      // encode (with error feedback when the spec has it: g + e, encode,
                            // decode, e update)
  double decode_add_s = 0;  // decode_add of a message of m elements, per element
  double add_s = 0;         // one f32 add of a vector (the uncompressed reductions)
};


// Two links for the hierarchical all-reduce: inside a node (shared memory, NVLink) and across.
struct HierarchyModel {
  int ranks_per_node = 8;
  LinkModel intra{1e-6, 50e9};
};

struct CostEstimate {
  AlgorithmId algorithm = AlgorithmId::ring;
  double seconds = 0;     // latency_s + transfer_s + compute_s - overlap_s
  double latency_s = 0;   // α times the sequential message start-ups
  double transfer_s = 0;  // β times the bytes on the critical path
  double compute_s = 0;   // γ terms
  // Transfer and compute that run at the same time: the pipelined ring's and SRA's (segment
  // key), 0 for every other path.
  double overlap_s = 0;
  double bytes_sent = 0;  // bytes this rank sends (docs/algorithms.md's count)
  bool dense_switch = false;  // sparse: the dense ring would run instead
};

// What one path's estimate reads: the codec (its spec() gives the algorithm's parameters) and
// its γ, the element count n, the rank count (>= 2 here), the link and, for hier, the nodes.
struct EstimateInputs {
  const Codec& codec;
  const CodecCost& cost;
  double n;
  int ranks;
  const LinkModel& link;
  const HierarchyModel& hierarchy;
};

// Each path's estimate (docs/cost-model.md derives them); the algorithm table
// (collectives/algorithm_table.cpp) holds one per path, and estimate_allreduce calls it.
CostEstimate estimate_ring(const EstimateInputs& in);       // codec none: plain f32 adds
CostEstimate estimate_sra(const EstimateInputs& in);
CostEstimate estimate_sparse(const EstimateInputs& in);     // with the dense switch
CostEstimate estimate_randk(const EstimateInputs& in);
CostEstimate estimate_rhd(const EstimateInputs& in);
CostEstimate estimate_tree(const EstimateInputs& in);
CostEstimate estimate_hier(const EstimateInputs& in);       // the codec's default path across nodes

// The modelled time of one all-reduce of `count` elements on `ranks` ranks with `codec`
// (whose spec() gives the algorithm's parameters) and its γ. `hierarchy` is used by hier only.
// ranks >= 1; one rank costs 0.
CostEstimate estimate_allreduce(AlgorithmId algorithm, const Codec& codec,
                                const CodecCost& cost, std::size_t count, int ranks,
                                const LinkModel& link, const HierarchyModel& hierarchy = {});

// What fallback=dense runs instead of a compressed path (collectives/algorithm_choice.h): the
// transport's own all-reduce of n f32 elements, modelled as the uncompressed ring (2(P − 1)
// messages of n / P f32 values, (P − 1) n / P adds; the bandwidth-optimal schedule MPI
// libraries use for large messages), plus n adds when error feedback flushes its residual
// into the tensor first (`flush_residual`). `algorithm` is reported as AlgorithmId::ring.
// ranks >= 1 and the link's contract as for estimate_allreduce; one rank or n == 0 costs 0.
CostEstimate estimate_dense_allreduce(const CodecCost& cost, std::size_t count, int ranks,
                                      const LinkModel& link, bool flush_residual);

// The flat algorithms that run `spec`'s codec on P ranks with a link each, the codec's default
// first (CodecRow::runnable in collectives/codec_table.h). hier is not among them: it needs the
// node structure (algo=hier says it; HierarchyModel describes it to the model).
std::vector<AlgorithmId> candidate_algorithms(const CompressionSpec& spec);

// What algo=auto chooses among (collectives/algorithm_choice.h), the default first: the
// candidates that compress each element no more often than the codec's default algorithm does
// (CodecRow::auto_choices in collectives/codec_table.h, which lists them per codec).
std::vector<AlgorithmId> auto_candidates(CodecKind codec);

// The cheapest of `candidates` (ties: the earlier one).
CostEstimate cheapest_allreduce(const std::vector<AlgorithmId>& candidates,
                                const Codec& codec, const CodecCost& cost, std::size_t count,
                                int ranks, const LinkModel& link,
                                const HierarchyModel& hierarchy = {});

// Measures γ of `codec` on this CPU: encode and decode_add of `sample` elements of N(0, 1)
// data, the fastest of `repeats` runs each (error feedback's extra passes included when the
// spec has ef=on), and f32 adds. A few milliseconds for sample = 2^20.
// With `where` a CUDA device: the same on device memory of that device (the device codecs and
// device error feedback, each run waited for; the adds are f32 adds there too, as the
// uncompressed reductions run them: decode_add of a `none` message). On the emulated device
// (GRADZIP_DEVICE=emulated) that times the kernels' CPU twins, not a GPU.
CodecCost measure_codec_cost(const Codec& codec, std::size_t sample = std::size_t{1} << 20,
                             int repeats = 3, Device where = Device{});

}  // namespace gradzip::collectives
