// gradzip-bench allreduce: gradzip::Communicator::allreduce (ReduceOp::sum) against
// MPI_Allreduce of the same f32 data, both measured in the same run. Run it under mpirun:
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bin/gradzip-bench allreduce [options]
//
// For each (spec, size), with P ranks and `bytes` = the uncompressed f32 size:
//   time_s                 median over --iters timed calls of the call's time, where a call's
//                          time is the slowest rank's (max over ranks); every call follows a
//                          barrier, and one untimed call warms up first
//   mpi_time_s             the same for MPI_Allreduce(MPI_SUM) in place on the same f32 data
//   algbw_gbps             bytes / time_s / 1e9                 (nccl-tests definitions,
//   busbw_gbps             algbw_gbps * 2(P-1)/P                 for the uncompressed size)
//   sent_bytes_per_rank    CollectiveStats::sent_bytes() of one call, max over ranks
//   theory_bytes_per_rank  what the algorithm's messages weigh by the formulas of
//                          docs/algorithms.md, max over ranks
//   speedup_vs_mpi         mpi_time_s / time_s
//   link_gbps              --link-gbps's G (null without it)
//   wire_s                 with --link-gbps G: sent_bytes_per_rank x 8 / (G x 1e9), the time the
//                          busiest rank's bytes take on a link of G Gbit/s (nominal: TCP/IP
//                          headers not counted); null without --link-gbps
//   time_over_wire         time_s / wire_s: 1 is a call at the speed of its bytes; above it, the
//                          CPU (codec work, copies) or latency sets the pace
//   encode_s, communicate_s, decode_s
//                          CollectiveStats' stage times of the timed calls, mean per call, max
//                          over ranks: where the time goes (communicate_s includes waiting for
//                          slower peers; a pipelined algorithm's stages overlap, so the three
//                          may add up to more or less than time_s)
// --check adds, for one extra call on a tensor name of its own (so error-feedback residuals start
// at zero and the result is the plain compressed all-reduce):
//   max_abs_error          max_i |result_i - exact_i| over all ranks, exact = the f64 sum
//   error_bound            a bound on that error derived from the codec and the algorithm
//                          (error_bound() below); 0 for `none`, whose integer data sum exactly
//   ranks_identical        every rank's result equals rank 0's byte for byte
//   cosine                 cos(result, exact) in f64 (1 when both are zero)
//   min_cosine             the floor it must reach: allreduce_cosine_floor (compressors/
//                          codec_descriptor.h) of the smallest cosine_estimate of the ranks' inputs
//                          and the compressions on an element's path (compressions_on_path()
//                          below), from kCosineMinElementsPerRank elements per rank; below that
//                          kSmallRowMinCosine (the result must point the way of the exact sum);
//                          0 (no floor) for `none` and empty tensors.
//                          The max-error bound alone accepts an all-zero result for sign, top-k
//                          and random-k (their bound is at least max sum |x|); the floor does not.
//                          Top-k and random-k that keep every element (k >= n, f32 values) get
//                          the bound of the sum's f32 adds alone: their result is exact.
// Data: `none` gets integer-valued floats in [-1000, 1000] (so the f32 sum is exact and the
// error must be exactly 0); every other codec gets N(0, 1) data, different on every rank.
//
// Specs: unless the user's spec sets min_bytes, ",min_bytes=0" is appended, so that small
// sizes go through the compressed algorithm too instead of the uncompressed small-tensor path.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/bench_support.h"
#include "collectives/algorithm_table.h"
#include "collectives/segment_plan.h"
#include "compressors/codec_descriptor.h"
#include "gradzip/error.h"

#if GRADZIP_HAVE_MPI
#include <mpi.h>

#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#endif

namespace gradzip::bench {

#if !GRADZIP_HAVE_MPI

int run_allreduce(int /*argc*/, char** /*argv*/) { return report_mpi_unavailable("allreduce"); }

#else

namespace {

using collectives::AlgorithmId;

struct Options {
  std::vector<std::size_t> sizes;  // bytes of f32 data
  std::vector<std::string> specs;
  int iters = 5;
  bool check = false;
  double link_gbps = 0;  // --link-gbps: the link wire_s assumes; 0: not given
  std::string json_path;
  bool help = false;
};

const std::vector<std::string> kDefaultSpecs = {
    "none", "fp16", "qsgd:bits=4", "qsgd:bits=8", "sign", "topk:ratio=0.01", "randk:ratio=0.01"};

std::vector<std::size_t> default_sizes() {
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = 1024; bytes <= (std::size_t{64} << 20); bytes *= 4) sizes.push_back(bytes);
  return sizes;
}

void print_help() {
  std::printf(
      "usage: mpirun -np P gradzip-bench allreduce [--size BYTES]... [--codec SPEC]... [--iters N]\n"
      "                                        [--check] [--link-gbps G] [--json FILE]\n"
      "  --size BYTES  f32 data per rank, a multiple of 4; repeat for several\n"
      "                (default 1 KiB .. 64 MiB by powers of 4)\n"
      "  --codec SPEC  a compression spec; repeat for several (default none, fp16, qsgd:bits=4,\n"
      "                qsgd:bits=8, sign, topk:ratio=0.01, randk:ratio=0.01). ',min_bytes=0' is\n"
      "                appended unless the spec sets min_bytes, so small sizes are compressed too\n"
      "  --iters N     timed calls per measurement; the median is reported (default 5)\n"
      "  --check       also compare every rank's result with the exact f64 sum: max error, its\n"
      "                bound, and whether all ranks hold identical bytes; exit 1 on a failure\n"
      "  --link-gbps G the ranks' link speed in Gbit/s: adds wire_s = sent bytes (max over\n"
      "                ranks) / the link rate, and time / wire_s\n"
      "  --json FILE   also write one JSON object per (spec, size) to FILE (rank 0)\n"
      "time = the slowest rank's time of one call (a barrier before each call); algbw = bytes /\n"
      "time, busbw = algbw * 2(P-1)/P for the uncompressed f32 size; sent = CollectiveStats bytes\n"
      "sent, max over ranks; theory = docs/algorithms.md's count for the algorithm and codec.\n");
}

// The spec as benchmarked: the user's text plus min_bytes=0 unless it sets min_bytes itself.
std::string with_min_bytes_zero(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  if (colon == std::string::npos) return spec + ":min_bytes=0";
  std::string_view rest = std::string_view(spec).substr(colon + 1);
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view option = rest.substr(0, comma);
    if (option.substr(0, option.find('=')) == "min_bytes") return spec;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return spec + ",min_bytes=0";
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      GZ_REQUIRE(i + 1 < argc, ErrorCode::invalid_argument, "allreduce: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--size") {
      const std::size_t bytes = parse_count("allreduce", value(), arg);
      GZ_REQUIRE(bytes % sizeof(float) == 0, ErrorCode::invalid_argument, "allreduce: --size ",
                 bytes, " is not a multiple of 4 (the data is f32)");
      options.sizes.push_back(bytes);
    } else if (arg == "--codec") {
      options.specs.emplace_back(value());
      CompressionSpec::parse(with_min_bytes_zero(options.specs.back()));  // bad specs fail here
    } else if (arg == "--iters") {
      options.iters = static_cast<int>(parse_count("allreduce", value(), arg));
      GZ_REQUIRE(options.iters >= 1, ErrorCode::invalid_argument, "allreduce: --iters must be >= 1");
    } else if (arg == "--check") {
      options.check = true;
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--link-gbps") {
      options.link_gbps = parse_positive("allreduce", value(), arg);
    } else if (arg == "--help" || arg == "-h") {
      options.help = true;
    } else {
      GZ_THROW(ErrorCode::invalid_argument, "allreduce: unknown option '", arg,
               "' (see gradzip-bench allreduce --help)");
    }
  }
  if (options.sizes.empty()) options.sizes = default_sizes();
  if (options.specs.empty()) options.specs = kDefaultSpecs;
  return options;
}

// ---- theory: bytes a rank sends, by algorithm -------------------------------------------------
// The bytes of the messages a rank hands to the transport, counted the way each algorithm calls
// count_sent() (collectives/collective_job.h), derived in docs/algorithms.md. The size of one
// message of m elements (header included) is the codec's max_encoded_bytes(m): exact for every
// codec but approximate top-k, where it is an upper bound.

// Chunk c of n elements over `ranks`: [begin(c), begin(c + 1)), the partition of
// Communicator::shard_begin (floor(c * n / ranks)), restated here for any rank count.
std::size_t chunk_begin(std::size_t n, int ranks, int c) {
  __extension__ typedef unsigned __int128 u128;
  return static_cast<std::size_t>(static_cast<u128>(n) * static_cast<unsigned>(c) /
                                  static_cast<unsigned>(ranks));
}

std::size_t chunk_count(std::size_t n, int ranks, int c) {
  return chunk_begin(n, ranks, c + 1) - chunk_begin(n, ranks, c);
}

// The headers pipelining adds to each chunk message of the ring and SRA (host memory over MPI,
// the spec's segment key; collectives/segment_plan.h): S - 1 of them, S segments per chunk,
// at most `max_segments` (the ring's cap, or SRA's).
std::uint64_t extra_segment_headers(const Codec& codec, int ranks, std::size_t n,
                                    std::size_t max_segments) {
  std::vector<std::size_t> counts;
  for (int c = 0; c < ranks; ++c) counts.push_back(chunk_count(n, ranks, c));
  return (collectives::segments_per_chunk(codec, counts, codec.spec().segment_bytes, max_segments) - 1) *
         compressors::kWireHeaderBytes;
}

// Ring (collectives/ring_allreduce.cpp) at position r of `ranks`: in the reduce-scatter it
// sends every chunk but chunk r (P - 1 messages, each a partial sum encoded afresh), in the
// all-gather every chunk but chunk r + 1 (its own encoded once, then the bytes it received,
// forwarded unchanged). `pipelined`: the ring of the call itself (not the uncompressed rings
// inside random-k, the sparse dense switch and the hierarchical node stages, which run
// unsegmented), whose chunk messages are S segment messages each (extra_segment_headers) from
// kMinRanksForPipelinedRing ranks on.
std::uint64_t ring_bytes(const Codec& codec, int ranks, int r, std::size_t n,
                         bool allgather_half = true, bool pipelined = false) {
  const std::uint64_t extra =
      pipelined && ranks >= collectives::kMinRanksForPipelinedRing
          ? extra_segment_headers(codec, ranks, n, collectives::kMaxRingSegmentsPerChunk)
          : 0;
  std::uint64_t bytes = 0;
  for (int c = 0; c < ranks; ++c) {
    const std::uint64_t message = codec.max_encoded_bytes(chunk_count(n, ranks, c)) + extra;
    if (c != r) bytes += message;                                          // reduce-scatter
    if (allgather_half && c != (r + 1) % ranks) bytes += message;          // all-gather
  }
  return bytes;
}

// The ranks of the halving/doubling all-reduce (collectives/halving_doubling_allreduce.cpp):
// P' = the largest power of two <= P take part, the x = P - P' odd ranks below 2x are folded
// into the even rank below them.
struct HalvingDoublingRanks {
  int p2 = 1, extra = 0, steps = 0;
  explicit HalvingDoublingRanks(int ranks) {
    while (2 * p2 <= ranks) p2 *= 2;
    extra = ranks - p2;
    while ((1 << steps) < p2) ++steps;
  }
};

// Halving/doubling at rank r: a folded rank sends its whole tensor once; index h sends one
// message of the range it gives away at each halving step, then while doubling the blocks
// [h & ~(m-1), +m) it holds for m = 1, 2, ..., P'/2 (each block's message as its owner
// encoded it), and, with a folded partner, all P' block messages once more.
std::uint64_t halving_doubling_bytes(const Codec& codec, int ranks, int r, std::size_t n) {
  const HalvingDoublingRanks hd(ranks);
  if (r < 2 * hd.extra && r % 2 == 1) return codec.max_encoded_bytes(n);
  const int h = r < 2 * hd.extra ? r / 2 : r - hd.extra;
  const auto range_bytes = [&](int lo, int hi) {
    return codec.max_encoded_bytes(chunk_begin(n, hd.p2, hi) - chunk_begin(n, hd.p2, lo));
  };
  const auto blocks_bytes = [&](int lo, int hi) {
    std::uint64_t bytes = 0;
    for (int b = lo; b < hi; ++b) bytes += range_bytes(b, b + 1);
    return bytes;
  };
  std::uint64_t bytes = 0;
  int lo = 0;
  for (int k = 0; k < hd.steps; ++k) {
    const int m = hd.p2 >> (k + 1);
    const bool upper = (h & m) != 0;
    bytes += upper ? range_bytes(lo, lo + m) : range_bytes(lo + m, lo + 2 * m);
    if (upper) lo += m;
  }
  for (int m = 1; m < hd.p2; m *= 2) bytes += blocks_bytes(h & ~(m - 1), (h & ~(m - 1)) + m);
  if (r < 2 * hd.extra) bytes += blocks_bytes(0, hd.p2);
  return bytes;
}

// Binomial tree at rank r (collectives/tree_allreduce.cpp): ranks != 0 send their f32 partial
// sum once (codec none); every rank forwards rank 0's message to its children r + m for
// m < lowbit(r) (every m < P for rank 0).
std::uint64_t tree_bytes(const Codec& codec, int ranks, int r, std::size_t n) {
  const std::unique_ptr<Codec> none = make_codec(CompressionSpec{});
  int lowest = 1;
  while (lowest < ranks) lowest *= 2;
  if (r != 0) lowest = r & -r;
  std::uint64_t bytes = r != 0 ? none->max_encoded_bytes(n) : 0;
  for (int m = lowest / 2; m >= 1; m /= 2)
    if (r + m < ranks) bytes += codec.max_encoded_bytes(n);
  return bytes;
}

// Bytes the rank at position r of `ranks` hands to the transport in one flat all-reduce of n
// elements by `algo` (a CollectiveStats name), counted the way the algorithm calls
// count_sent(). Message sizes are the codec's max_encoded_bytes(count): the exact size for
// every codec but approximate top-k (an upper bound there). Derivations: docs/algorithms.md.
std::uint64_t flat_bytes(const Codec& codec, const std::string& algo, int ranks, int r,
                         std::size_t n) {
  if (ranks == 1) return 0;
  // The transport's own uncompressed all-reduce: gradzip does not count its bytes.
  if (algo == collectives::kTransportSumName) return 0;
  const std::unique_ptr<Codec> none = make_codec(CompressionSpec{});
  // The dense switch of the sparse all-reduce: an uncompressed ring of the decoded tensor.
  if (algo == collectives::kSparseDenseSwitchName) return ring_bytes(*none, ranks, r, n);
  const collectives::AlgorithmRow* row = collectives::find_algorithm_row(algo);
  GZ_REQUIRE(row != nullptr, ErrorCode::internal, "allreduce: no algorithm is named '", algo,
             "' (benchmarks/allreduce_bench.cpp)");
  const std::uint64_t others = static_cast<std::uint64_t>(ranks - 1);
  switch (row->path) {
    case AlgorithmId::ring: return ring_bytes(codec, ranks, r, n, true, /*pipelined=*/true);
    case AlgorithmId::sra: {
      // P - 1 worker messages (every chunk but its own), then its owned chunk's message,
      // counted once for each of the P - 1 ranks the all-gather delivers it to. Pipelined
      // (host memory over MPI, the spec's segment key): each of those messages is S segment
      // messages holding the same payload, i.e. S - 1 more headers each.
      const std::uint64_t extra_headers =
          extra_segment_headers(codec, ranks, n, collectives::kMaxSegmentsPerChunk);
      std::uint64_t bytes = 0;
      for (int c = 0; c < ranks; ++c)
        if (c != r) bytes += codec.max_encoded_bytes(chunk_count(n, ranks, c)) + extra_headers;
      return bytes + others * (codec.max_encoded_bytes(chunk_count(n, ranks, r)) + extra_headers);
    }
    // One message of the whole tensor, counted once per receiving rank.
    case AlgorithmId::sparse: return others * codec.max_encoded_bytes(n);
    // An uncompressed ring over the k values at the shared indices.
    case AlgorithmId::randk: return ring_bytes(*none, ranks, r, codec.spec().k_for(n));
    case AlgorithmId::rhd: return halving_doubling_bytes(codec, ranks, r, n);
    case AlgorithmId::tree: return tree_bytes(codec, ranks, r, n);
    case AlgorithmId::hier: break;  // per node: sent_bytes_theory composes the flat counts
  }
  GZ_THROW(ErrorCode::internal, "allreduce: no flat byte count theory for '", algo,
           "' (benchmarks/allreduce_bench.cpp)");
}

// Where every rank sits in the hierarchical all-reduce's nodes, found the way the
// Communicator forms them (ranks_per_node L: ranks [kL, (k+1)L) form node k; 0: the ranks
// that share memory), by MPI directly.
struct NodeLayout {
  struct Place {
    int node_size = 1;  // ranks of this rank's node
    int local = 0;      // index inside the node
    int position = 0;   // index inside the cross-node group of its local index
  };
  std::vector<Place> places;  // by world rank
  int nodes = 0;
  int smallest_node = 0;
  int largest_node = 0;
};

NodeLayout node_layout(std::uint32_t ranks_per_node) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm node = MPI_COMM_NULL, across = MPI_COMM_NULL;
  if (ranks_per_node == 0)
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  else
    MPI_Comm_split(MPI_COMM_WORLD, rank / static_cast<int>(ranks_per_node), rank, &node);
  int mine[3] = {1, 0, 0};
  MPI_Comm_size(node, &mine[0]);
  MPI_Comm_rank(node, &mine[1]);
  MPI_Comm_split(MPI_COMM_WORLD, mine[1], rank, &across);
  MPI_Comm_rank(across, &mine[2]);
  MPI_Comm_free(&across);
  MPI_Comm_free(&node);
  std::vector<int> all(3 * static_cast<std::size_t>(ranks));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  NodeLayout layout;
  layout.smallest_node = ranks;
  for (int r = 0; r < ranks; ++r) {
    const NodeLayout::Place place{all[3 * r], all[3 * r + 1], all[3 * r + 2]};
    layout.places.push_back(place);
    if (place.local == 0) ++layout.nodes;
    layout.smallest_node = std::min(layout.smallest_node, place.node_size);
    layout.largest_node = std::max(layout.largest_node, place.node_size);
  }
  return layout;
}

// Hierarchical all-reduce (collectives/hierarchical_allreduce.cpp) on world rank r: (a) the
// uncompressed ring reduce-scatter inside its node of L ranks; with S = the smallest node's
// size < L, the f32 pieces that move its L-shard to S-shards; (b) for local index < S, the
// inner flat algorithm over the cross-node group on S-shard `local`; (c) its f32 S-shard, sent
// to the L - 1 others of its node (counted once per receiver).
std::uint64_t hierarchical_bytes(const Codec& codec, const std::string& inner,
                                 const NodeLayout& layout, int r, std::size_t n) {
  const std::unique_ptr<Codec> none = make_codec(CompressionSpec{});
  const NodeLayout::Place& place = layout.places[static_cast<std::size_t>(r)];
  const int L = place.node_size, S = layout.smallest_node, local = place.local;
  std::uint64_t bytes = 0;
  if (L > 1) bytes += ring_bytes(*none, L, local, n, /*allgather_half=*/false);
  if (L > 1 && S < L) {
    const std::size_t held_begin = chunk_begin(n, L, local), held_end = chunk_begin(n, L, local + 1);
    for (int t = 0; t < S; ++t) {
      if (t == local) continue;
      const std::size_t begin = std::max(held_begin, chunk_begin(n, S, t));
      const std::size_t end = std::min(held_end, chunk_begin(n, S, t + 1));
      if (end > begin) bytes += (end - begin) * sizeof(float);
    }
  }
  if (local < S) {
    const std::size_t shard = chunk_count(n, S, local);
    bytes += flat_bytes(codec, inner, layout.nodes, place.position, shard);
    bytes += static_cast<std::uint64_t>(L - 1) * shard * sizeof(float);
  }
  return bytes;
}

// The largest number of bytes any rank sends in one all-reduce by `algo` of n elements.
std::uint64_t theoretical_sent_bytes(const Codec& codec, const std::string& algo,
                                     const NodeLayout* layout, int ranks, std::size_t n) {
  const bool hierarchical = algo.rfind("hier/", 0) == 0;
  std::uint64_t most = 0;
  for (int r = 0; r < ranks; ++r)
    most = std::max(most, hierarchical
                              ? hierarchical_bytes(codec, algo.substr(5), *layout, r, n)
                              : flat_bytes(codec, algo, ranks, r, n));
  return most;
}

// ---- error bounds ----------------------------------------------------------------------------
// Unit roundoff of f32 (an add or a cast to f32 errs by at most kF32Unit of the result).
constexpr double kF32Unit = 0x1p-24;

// Bound on |D(C(y))_i - y_i| for one compression of a vector y with |y_j| <= y_max for all j
// (for bucket codecs: in y_i's bucket): the codec's row says it
// (compressors/codec_descriptor.cpp lists each codec's).
double compression_error(const CompressionSpec& spec, double y_max) {
  const auto bound = compressors::codec_descriptor(spec.codec).error_bound;
  return bound != nullptr ? bound(spec, y_max) : HUGE_VAL;
}

// Top-k and random-k with f32 values that keep every element of every message (k >= n for the
// whole tensor, so for each chunk too): lossless, the result is the sum up to f32 adds.
bool keeps_every_element(const CompressionSpec& spec, std::size_t count) {
  return (spec.codec == CodecKind::topk || spec.codec == CodecKind::randk) &&
         spec.values == DType::f32 && count > 0 && spec.k_for(count) >= count;
}

// The cosine floor below compressors::kCosineMinElementsPerRank elements per rank, where no
// estimate of the cosine holds (a 7-element random-k keeps one element's sum: its cosine is
// that element's share of the sum's norm, 0.08 on the check's data). It only asks that the
// result point the way of the exact sum, which an all-zero result (cosine 0) and a negated sum
// (cosine below 0) fail.
constexpr double kSmallRowMinCosine = 1e-6;

// A bound on max_i |result_i - sum_r x_{r,i}| of one call on fresh residuals, where
// max_magnitude M = max |x_{r,i}| and max_sum_magnitude A = max_i sum_r |x_{r,i}|, both over
// all ranks. Per algorithm (docs/algorithms.md, "Error"), with e(y) = compression_error():
//   ring       P encodes of partial sums: encode k (k = 1 .. P) sees k contributions plus the
//              error so far, |y| <= Y_k = min(k M, A) + E_{k-1}; E_k = E_{k-1} + e(Y_k) + the
//              f32 add that forms y_k (<= 2^-24 Y_k)
//   sra        P worker encodes of single contributions (e(M) each), P - 1 f32 adds of the
//              decoded values (|sum| <= Y_s = A + P e(M)), one owner encode e(Y_s)
//   sparse     sum_r D(C(x_r)): P encodes e(M) in different elements' favour at worst, P - 1 f32
//              adds; a dropped top-k element errs by at most |sum over the ranks that dropped
//              it| <= A, so top-k's bound is A plus the adds
//   randk      every rank keeps the same indices: a dropped element errs by |sum_r x_r,i| <= A,
//              a kept one by the P - 1 f32 adds of the inner ring (+ f16 rounding of the sum)
//   mpi        the transport's f32 sum: P - 1 adds
//   rhd        the x fold messages of single contributions (e(M) each, one f32 add); halving
//              step k: P'/2^(k+1) messages hold an element, each a partial sum of at most
//              w 2^k contributions (w = 2 with folds) plus the error so far E,
//              |y| <= Y_k = min(w 2^k M, A) + E, each decode_add one f32 add (<= 2^-24 (A + E));
//              the owner's encode e(A + E). Top-k / random-k with f32 values decode each
//              element to its value or 0, so every partial sum is a subset sum: A plus the adds
//   tree       the exact f32 reduce (P - 1 adds) and rank 0's one encode e(A + adds)
double flat_error_bound(const CompressionSpec& spec, const std::string& algo, int ranks,
                        double max_magnitude, double max_sum_magnitude) {
  const double P = ranks, M = max_magnitude, A = max_sum_magnitude;
  const double adds = (P - 1) * kF32Unit * A * (1 + 0x1p-20);
  if (algo == collectives::kTransportSumName) return adds;
  const collectives::AlgorithmRow* row = collectives::find_algorithm_row(algo);
  if (row == nullptr) return HUGE_VAL;  // no bound for an unknown name: the check fails visibly
  switch (row->path) {
    case AlgorithmId::ring: {
      double error = 0;
      for (int k = 1; k <= ranks; ++k) {
        const double y = std::min(k * M, A) + error;
        error += compression_error(spec, y) + (k > 1 ? kF32Unit * y : 0);
      }
      return error * (1 + 0x1p-20);
    }
    case AlgorithmId::sra: {
      const double worker = compression_error(spec, M);
      const double sum = A + P * worker;
      return (P * worker + (P - 1) * kF32Unit * sum +
              compression_error(spec, sum * (1 + 0x1p-20))) *
             (1 + 0x1p-20);
    }
    case AlgorithmId::sparse: {  // kSparseDenseSwitchName included
      if (spec.codec == CodecKind::topk) return A + (P - 1) * kF32Unit * 2 * A;
      const double worker = compression_error(spec, M);
      return P * worker + (P - 1) * kF32Unit * (A + P * worker) * (1 + 0x1p-20);
    }
    case AlgorithmId::randk: return A + adds;
    case AlgorithmId::rhd: {
      if ((spec.codec == CodecKind::topk || spec.codec == CodecKind::randk) &&
          spec.values == DType::f32)
        return A + 2 * adds;
      const HalvingDoublingRanks hd(ranks);
      double error = hd.extra * (compression_error(spec, M) + kF32Unit * A);
      const double w = hd.extra > 0 ? 2 : 1;
      for (int k = 0; k < hd.steps; ++k) {
        const double messages = hd.p2 >> (k + 1);
        const double y = std::min(w * (1 << k) * M, A) + error;
        error += messages * (compression_error(spec, y) + kF32Unit * (A + error));
      }
      return (error + compression_error(spec, (A + error) * (1 + 0x1p-20))) * (1 + 0x1p-20);
    }
    case AlgorithmId::tree:
      return (adds + compression_error(spec, (A + adds) * (1 + 0x1p-20))) * (1 + 0x1p-20);
    case AlgorithmId::hier: break;  // error_bound composes it per node
  }
  return HUGE_VAL;
}

// The encodes on an element's way from the inputs to the result (allreduce_cosine_floor's S):
// the ring encodes each partial sum once per hop (P), SRA a worker's share and the owner's sum
// (2), halving/doubling one per step plus the fold and the owner's final encode; the sparse
// all-reduce, random-k's and the tree encode once; the transport's sum never. hier/<inner>: the
// node sums are exact, then <inner> runs over the nodes.
int compressions_on_path(const std::string& algo, int ranks, const NodeLayout* layout) {
  if (algo.rfind("hier/", 0) == 0)
    return compressions_on_path(algo.substr(5), layout->nodes, nullptr);
  if (algo == collectives::kTransportSumName) return 0;
  const collectives::AlgorithmRow* row = collectives::find_algorithm_row(algo);
  if (row == nullptr) return ranks;
  switch (row->path) {
    case AlgorithmId::ring: return ranks;
    case AlgorithmId::sra: return 2;
    case AlgorithmId::rhd: {
      const HalvingDoublingRanks hd(ranks);
      return hd.steps + (hd.extra > 0 ? 1 : 0) + 1;
    }
    case AlgorithmId::sparse:
    case AlgorithmId::randk:
    case AlgorithmId::tree:
    case AlgorithmId::hier: return 1;
  }
  return ranks;
}

//   hier/<inner>  the node sums (exact ring reduce-scatter in f32: at most (L - 1) adds, L the
//              largest node, <= (L - 1) 2^-24 A in all) are the contributions of `inner` across
//              the m nodes, each at most min(L M, A) in magnitude
double error_bound(const CompressionSpec& spec, const std::string& algo, int ranks,
                   double max_magnitude, double max_sum_magnitude, const NodeLayout* layout) {
  if (algo.rfind("hier/", 0) != 0)
    return flat_error_bound(spec, algo, ranks, max_magnitude, max_sum_magnitude);
  const double A = max_sum_magnitude;
  const double node_adds = (layout->largest_node - 1) * kF32Unit * A * (1 + 0x1p-20);
  const double node_sum = std::min(layout->largest_node * max_magnitude, A) + node_adds;
  return flat_error_bound(spec, algo.substr(5), layout->nodes, node_sum, A + node_adds) + node_adds;
}

// ---- measurement ---------------------------------------------------------------------------

struct Row {
  std::string spec;
  std::string algo;
  int ranks = 1;
  std::size_t bytes = 0;
  double time_s = 0;
  double mpi_time_s = 0;
  std::uint64_t sent_bytes_per_rank = 0;
  std::uint64_t theory_bytes_per_rank = 0;
  bool checked = false;
  double max_abs_error = 0;
  double error_bound = 0;
  bool ranks_identical = false;
  double cosine = 1;
  double min_cosine = 0;
  double link_gbps = 0;  // 0: no wire time
  double encode_s = 0;  // stage times: mean per timed call, max over ranks
  double communicate_s = 0;
  double decode_s = 0;

  double algbw_gbps() const { return time_s > 0 ? static_cast<double>(bytes) / time_s / 1e9 : 0; }
  double busbw_gbps() const { return algbw_gbps() * 2.0 * (ranks - 1) / ranks; }
  double speedup_vs_mpi() const { return time_s > 0 ? mpi_time_s / time_s : 0; }
  // NaN without a link (json_number writes null).
  double wire_s() const {
    return link_gbps > 0 ? static_cast<double>(sent_bytes_per_rank) * 8.0 / (link_gbps * 1e9) : NAN;
  }
  double time_over_wire() const { return wire_s() > 0 ? time_s / wire_s() : NAN; }
  bool check_failed() const {
    return checked &&
           (!ranks_identical || !(max_abs_error <= error_bound) || !(cosine >= min_cosine));
  }
};

// Median over `iters` timed calls of the slowest rank's time; `prepare` (untimed) restores the
// input, a barrier lines the ranks up, and one untimed call warms up first.
template <typename Prepare, typename Call>
double median_call_seconds(int iters, Prepare&& prepare, Call&& call) {
  std::vector<double> times;
  for (int i = -1; i < iters; ++i) {
    prepare();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    call();
    const double mine =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double slowest = max_over_ranks(mine);
    if (i >= 0) times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  const std::size_t middle = times.size() / 2;
  return times.size() % 2 == 1 ? times[middle] : 0.5 * (times[middle - 1] + times[middle]);
}

// Rank r's data: integers in [-1000, 1000] (exact f32 sums) or N(0, 1), seeded by rank.
std::vector<float> contribution(std::size_t count, int rank, bool integer_valued) {
  std::mt19937_64 engine(0x67727a70ull * 1000003u + static_cast<std::uint64_t>(rank) +
                         (integer_valued ? 0u : 17u));
  std::vector<float> values(count);
  if (integer_valued) {
    std::uniform_int_distribution<int> pick(-1000, 1000);
    for (float& value : values) value = static_cast<float>(pick(engine));
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& value : values) value = normal(engine);
  }
  return values;
}

// True when `values` is byte-identical to rank 0's copy on every rank.
bool identical_to_rank0(const std::vector<float>& values) {
  std::vector<float> reference = values;
  constexpr std::size_t kPiece = std::size_t{1} << 28;  // floats per MPI_Bcast: counts are int
  for (std::size_t begin = 0; begin < reference.size(); begin += kPiece) {
    const std::size_t count = std::min(kPiece, reference.size() - begin);
    MPI_Bcast(reference.data() + begin, static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
  }
  // memcmp of an empty vector's (possibly null) data would be undefined.
  int same = values.empty() ||
             std::memcmp(reference.data(), values.data(), values.size() * sizeof(float)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return same != 0;
}

// In-place f64 sum over ranks, in pieces (MPI counts are int).
void sum_over_ranks(std::vector<double>& values) {
  constexpr std::size_t kPiece = std::size_t{1} << 27;
  for (std::size_t begin = 0; begin < values.size(); begin += kPiece) {
    const std::size_t count = std::min(kPiece, values.size() - begin);
    MPI_Allreduce(MPI_IN_PLACE, values.data() + begin, static_cast<int>(count), MPI_DOUBLE,
                  MPI_SUM, MPI_COMM_WORLD);
  }
}

void mpi_allreduce_sum(std::vector<float>& values) {
  constexpr std::size_t kPiece = std::size_t{1} << 28;
  for (std::size_t begin = 0; begin < values.size(); begin += kPiece) {
    const std::size_t count = std::min(kPiece, values.size() - begin);
    MPI_Allreduce(MPI_IN_PLACE, values.data() + begin, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }
}

// One extra call on its own tensor name, compared with the exact f64 sum.
void check_result(Communicator& comm, const std::string& spec_text, const CompressionSpec& spec,
                  const std::vector<float>& input, const NodeLayout* layout, Row& row) {
  std::vector<float> result = input;
  const CollectiveStats stats =
      comm.allreduce(host_view(result.data(), result.size()),
                     "check/" + spec_text + "/" + std::to_string(row.bytes), spec);
  std::vector<double> exact(input.begin(), input.end());
  std::vector<double> magnitude(input.size());
  double max_magnitude = 0;
  for (std::size_t i = 0; i < input.size(); ++i) {
    magnitude[i] = std::fabs(static_cast<double>(input[i]));
    max_magnitude = std::max(max_magnitude, magnitude[i]);
  }
  sum_over_ranks(exact);
  sum_over_ranks(magnitude);
  double error = 0;
  double max_sum_magnitude = 0;
  for (std::size_t i = 0; i < input.size(); ++i) {
    // NaN compares false with everything: count it as an infinite error.
    const double diff = std::fabs(static_cast<double>(result[i]) - exact[i]);
    error = std::max(error, std::isnan(diff) ? HUGE_VAL : diff);
    max_sum_magnitude = std::max(max_sum_magnitude, magnitude[i]);
  }
  row.checked = true;
  row.max_abs_error = max_over_ranks(error);
  max_magnitude = max_over_ranks(max_magnitude);
  // `none` runs on integer-valued data whose sums stay below 2^24: every f32 add is exact, so
  // the result must be too.
  row.error_bound = spec.codec == CodecKind::none
                        ? 0.0
                        : error_bound(spec, stats.algorithm, row.ranks, max_magnitude,
                                      max_sum_magnitude, layout);
  if (keeps_every_element(spec, input.size())) {
    // Nothing is dropped or rounded: only the f32 adds of the sums err, at most two per
    // contribution on any algorithm's path (halving/doubling's fold adds one).
    row.error_bound = std::min(row.error_bound, 2 * (row.ranks - 1) * kF32Unit *
                                                    max_over_ranks(max_sum_magnitude) * (1 + 0x1p-20));
  }
  row.ranks_identical = identical_to_rank0(result);

  // The cosine with the exact sum, against its floor (rejects zeros and a negated sum).
  const double cosine = compressors::cosine_similarity(result, exact);
  row.cosine = -max_over_ranks(-(std::isnan(cosine) ? -HUGE_VAL : cosine));
  const std::size_t per_rank = input.size() / static_cast<std::size_t>(row.ranks);
  if (spec.codec == CodecKind::none || input.empty()) return;
  if (per_rank >= compressors::kCosineMinElementsPerRank) {
    const double single = -max_over_ranks(
        -compressors::codec_descriptor(spec.codec).cosine_estimate(spec, input));
    row.min_cosine = compressors::allreduce_cosine_floor(
        single, compressions_on_path(stats.algorithm, row.ranks, layout));
  } else {
    row.min_cosine = kSmallRowMinCosine;
  }
}

Row measure(const std::string& spec_text, std::size_t bytes, const std::vector<float>& input,
            bool check, int iters) {
  // A communicator per row: error-feedback residuals start at zero and are freed afterwards.
  Communicator comm = Communicator::world();
  const CompressionSpec spec = CompressionSpec::parse(spec_text);
  const auto codec = make_codec(spec);
  Row row;
  row.spec = spec_text;
  row.ranks = comm.size();
  row.bytes = bytes;

  std::vector<float> work(input.size());
  const auto restore = [&] { std::copy(input.begin(), input.end(), work.begin()); };
  const std::string name = "bench/" + spec_text + "/" + std::to_string(bytes);
  CollectiveStats stats;
  // Stage times summed over the timed calls (median_call_seconds' first call warms up).
  double stage_seconds[3] = {0, 0, 0};  // encode, communicate, decode
  int calls = 0;
  row.time_s = median_call_seconds(iters, restore, [&] {
    stats = comm.allreduce(host_view(work.data(), work.size()), name, spec);
    if (calls++ == 0) return;
    stage_seconds[0] += stats.encode_seconds;
    stage_seconds[1] += stats.communicate_seconds;
    stage_seconds[2] += stats.decode_seconds;
  });
  const int timed_calls = std::max(calls - 1, 1);
  row.encode_s = max_over_ranks(stage_seconds[0] / timed_calls);
  row.communicate_s = max_over_ranks(stage_seconds[1] / timed_calls);
  row.decode_s = max_over_ranks(stage_seconds[2] / timed_calls);
  row.mpi_time_s = median_call_seconds(iters, restore, [&] { mpi_allreduce_sum(work); });
  row.algo = stats.algorithm;
  row.sent_bytes_per_rank = max_over_ranks(stats.sent_bytes());
  // The node layout of the hierarchical all-reduce, found by MPI (a collective: every rank ran
  // the same algorithm).
  std::optional<NodeLayout> layout;
  if (row.algo.rfind("hier/", 0) == 0) layout = node_layout(spec.ranks_per_node);
  row.theory_bytes_per_rank = theoretical_sent_bytes(*codec, row.algo, layout ? &*layout : nullptr,
                                                     row.ranks, input.size());
  if (check) check_result(comm, spec_text, spec, input, layout ? &*layout : nullptr, row);
  return row;
}

void print_header(bool check, bool wire, int spec_width) {
  std::printf("%-*s %-15s %9s %10s %8s %8s %10s %10s %10s %8s", spec_width, "spec", "algo", "size",
              "time_s", "algbw", "busbw", "sent/rank", "theory", "mpi_s", "speedup");
  if (wire) std::printf(" %10s %7s", "wire_s", "t/wire");
  if (check)
    std::printf(" %10s %10s %7s %7s %5s", "max_err", "bound", "cosine", "min_cos", "same");
  std::printf("\n");
}

void print_row(const Row& row, int spec_width) {
  std::printf("%-*s %-15s %9s %10.3e %8.3f %8.3f %10s %10s %10.3e %8.2f", spec_width,
              row.spec.c_str(), row.algo.c_str(),
              human_bytes(static_cast<double>(row.bytes)).c_str(), row.time_s, row.algbw_gbps(),
              row.busbw_gbps(), human_bytes(static_cast<double>(row.sent_bytes_per_rank)).c_str(),
              human_bytes(static_cast<double>(row.theory_bytes_per_rank)).c_str(), row.mpi_time_s,
              row.speedup_vs_mpi());
  if (row.link_gbps > 0) std::printf(" %10.3e %7.2f", row.wire_s(), row.time_over_wire());
  if (row.checked)
    std::printf(" %10.3e %10.3e %7.4f %7.4f %5s%s", row.max_abs_error, row.error_bound,
                row.cosine, row.min_cosine, row.ranks_identical ? "yes" : "NO",
                row.check_failed() ? "  FAIL" : "");
  std::printf("\n");
  std::fflush(stdout);
}

void write_json(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream json(path);
  GZ_REQUIRE(json.good(), ErrorCode::io_error, "allreduce: cannot write --json file '", path, "'");
  json << "[\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json << "  {\"spec\": " << json_string(r.spec) << ", \"algo\": " << json_string(r.algo)
         << ", \"ranks\": " << r.ranks << ", \"bytes\": " << r.bytes
         << ", \"time_s\": " << json_number(r.time_s)
         << ", \"algbw_gbps\": " << json_number(r.algbw_gbps())
         << ", \"busbw_gbps\": " << json_number(r.busbw_gbps())
         << ", \"sent_bytes_per_rank\": " << r.sent_bytes_per_rank
         << ", \"theory_bytes_per_rank\": " << r.theory_bytes_per_rank
         << ", \"mpi_time_s\": " << json_number(r.mpi_time_s)
         << ", \"speedup_vs_mpi\": " << json_number(r.speedup_vs_mpi())
         << ", \"link_gbps\": " << json_number(r.link_gbps > 0 ? r.link_gbps : NAN)
         << ", \"wire_s\": " << json_number(r.wire_s())
         << ", \"time_over_wire\": " << json_number(r.time_over_wire())
         << ", \"encode_s\": " << json_number(r.encode_s)
         << ", \"communicate_s\": " << json_number(r.communicate_s)
         << ", \"decode_s\": " << json_number(r.decode_s);
    if (r.checked)
      json << ", \"max_abs_error\": " << json_number(r.max_abs_error)
           << ", \"error_bound\": " << json_number(r.error_bound)
           << ", \"cosine\": " << json_number(r.cosine)
           << ", \"min_cosine\": " << json_number(r.min_cosine)
           << ", \"ranks_identical\": " << (r.ranks_identical ? "true" : "false");
    json << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  json << "]\n";
}

int run(const Options& options) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const bool root = rank == 0;
  int spec_width = 28;
  for (const std::string& spec : options.specs)
    spec_width = std::max(spec_width, static_cast<int>(with_min_bytes_zero(spec).size()));
  if (root) {
    std::printf("gradzip-bench allreduce: %d ranks, ReduceOp::sum of f32, median of %d timed calls "
                "(each the slowest rank's time), MPI_Allreduce of the same data in the same run\n",
                ranks, options.iters);
    std::printf("algbw = bytes/time, busbw = algbw*2(P-1)/P (uncompressed f32 bytes); GB/s = 1e9 "
                "B/s; sent = bytes this rank sent (max over ranks), theory = docs/algorithms.md\n\n");
    if (options.link_gbps > 0)
      std::printf("wire_s = sent/rank at %g Gbit/s (nominal, no TCP/IP headers); t/wire = time_s / "
                  "wire_s\n\n", options.link_gbps);
    print_header(options.check, options.link_gbps > 0, spec_width);
  }
  std::vector<Row> rows;
  for (const std::size_t bytes : options.sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> integers, gaussian;
    for (const std::string& user_spec : options.specs) {
      const std::string spec = with_min_bytes_zero(user_spec);
      const bool exact = CompressionSpec::parse(spec).codec == CodecKind::none;
      std::vector<float>& input = exact ? integers : gaussian;
      if (input.size() != count) input = contribution(count, rank, exact);
      rows.push_back(measure(spec, bytes, input, options.check, options.iters));
      rows.back().link_gbps = options.link_gbps;
      if (root) print_row(rows.back(), spec_width);
    }
  }
  if (root && !options.json_path.empty()) write_json(options.json_path, rows);
  const bool failed =
      std::any_of(rows.begin(), rows.end(), [](const Row& row) { return row.check_failed(); });
  if (root && options.check)
    std::printf("\n--check: %s\n", failed ? "FAILED (see FAIL rows)" : "all rows within bound and "
                                                                       "above their cosine floor, "
                                                                       "identical on every rank");
  return failed ? 1 : 0;
}

}  // namespace

int run_allreduce(int argc, char** argv) {
  return run_mpi_command("allreduce", argc, argv, parse_options, print_help, run);
}

#endif

}  // namespace gradzip::bench
