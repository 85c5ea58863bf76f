#include "collectives/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/codec_table.h"
#include "collectives/device_memory.h"
#include "collectives/segment_plan.h"
#include "compressors/wire_format.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

constexpr double kHeader = static_cast<double>(compressors::kWireHeaderBytes);

// Bytes of one message of m elements of `codec` (the header included).
double message_bytes(const Codec& codec, double m) {
  if (m <= 0) return kHeader;
  return static_cast<double>(codec.max_encoded_bytes(static_cast<std::size_t>(std::ceil(m))));
}

// An uncompressed f32 message of m elements.
double dense_bytes(double m) { return kHeader + 4.0 * m; }

int ceil_log2(int p) {
  int steps = 0;
  while ((1 << steps) < p) ++steps;
  return steps;
}

int floor_log2(int p) {
  int steps = 0;
  while ((2 << steps) <= p) ++steps;
  return steps;
}

CostEstimate finish(AlgorithmId algorithm, double latency, double transfer, double compute,
                    double bytes) {
  CostEstimate estimate;
  estimate.algorithm = algorithm;
  estimate.latency_s = latency;
  estimate.transfer_s = transfer;
  estimate.compute_s = compute;
  estimate.seconds = latency + transfer + compute;
  estimate.bytes_sent = bytes;
  return estimate;
}

void require_valid(int ranks, const LinkModel& link, const char* caller) {
  GZ_REQUIRE(ranks >= 1, ErrorCode::invalid_argument, caller, ": ", ranks, " ranks");
  GZ_REQUIRE(link.latency_s >= 0 && link.bytes_per_s > 0 && link.exchange_bytes_per_s >= 0 &&
                 link.collective_latency_s >= 0,
             ErrorCode::invalid_argument, caller, ": link latency ", link.latency_s,
             " s, bandwidth ", link.bytes_per_s, " B/s, exchange bandwidth ",
             link.exchange_bytes_per_s, " B/s, collective latency ", link.collective_latency_s,
             " s (need latencies >= 0, bandwidth > 0, exchange >= 0)");
}

// Open MPI's all-to-all / all-gather of P − 1 blocks per rank: P − 1 message start-ups, the
// blocks share the link; at least one collective's start-up.
double exchange_latency(int p, const LinkModel& link) {
  return std::max((p - 1) * link.latency_s, link.collective_latency_s);
}
// The 8-byte size all-gathers before SRA's and the all-gather's messages (and the pipelined
// algorithms' one status all-gather at the end).
double size_exchange_latency(int p, const LinkModel& link) {
  return std::max(ceil_log2(p) * link.latency_s, link.collective_latency_s);
}
// A stream-ordered call's completion: one flag all-reduce (a small collective); 0 on host paths.
double completion_latency(int p, const LinkModel& link) {
  return link.stream_ordered ? size_exchange_latency(p, link) : 0.0;
}

// The segments per chunk the pipelined ring and SRA cut a tensor of n elements on p ranks into
// (pipeline_segments in collective_job.h, from the chunks' sizes ⌊n/p⌋ and ⌈n/p⌉): 1 when the
// link's transport does not pipeline (LinkModel::pipelined); at most `max_segments`.
double modelled_segments(const Codec& codec, double n, int p, const LinkModel& link,
                         std::size_t max_segments) {
  if (!link.segments_chunks() || p < 2) return 1;
  const double m = n / p;
  const std::vector<std::size_t> chunks{static_cast<std::size_t>(std::floor(m)),
                                        static_cast<std::size_t>(std::ceil(m))};
  return static_cast<double>(
      segments_per_chunk(codec, chunks, codec.spec().segment_bytes, max_segments));
}

// A pipelined path's overlap: the segments' transfers run while other segments are encoded and
// decoded, so all but one segment's share of the smaller of the two is hidden.
void hide_overlap(CostEstimate& estimate, double segments) {
  if (segments <= 1) return;
  estimate.overlap_s =
      std::min(estimate.transfer_s, estimate.compute_s) * (segments - 1) / segments;
  estimate.seconds -= estimate.overlap_s;
}

// Ring: 2(P − 1) steps of one chunk message each; P encodes of a chunk (P − 1 partial sums, the
// owner's result), P − 1 decode_adds and P decodes (the all-gather, own chunk included).
// Uncompressed (`codec` unused): f32 chunk messages and P − 1 chunk adds.
// Pipelined (`segments` S > 1, ring_pipelined.cpp): every chunk message is S messages, S − 1
// more headers each; one status all-gather at the end; overlap as hide_overlap says.
CostEstimate ring(const Codec* codec, const CodecCost& cost, double n, int p, const LinkModel& link,
                  bool uncompressed, double segments = 1) {
  const double m = n / p;
  const double steps = 2.0 * (p - 1);
  const double bytes = steps * ((uncompressed ? dense_bytes(m) : message_bytes(*codec, m)) +
                                (segments - 1) * kHeader);
  const double compute = uncompressed
                             ? (p - 1) * m * cost.add_s
                             : n * cost.encode_s + (2.0 * p - 1.0) * m * cost.decode_add_s;
  // At two ranks the next and the previous rank are the same: each step is a pairwise exchange.
  const double rate = p == 2 ? link.exchange_rate() : link.bytes_per_s;
  // The host's pipelined ring ends in a status all-gather; a stream-ordered call in its completion.
  const double checks = link.stream_ordered ? completion_latency(p, link)
                        : segments > 1      ? size_exchange_latency(p, link)
                                            : 0.0;
  const double latency = steps * link.latency_s + checks;
  CostEstimate estimate = finish(AlgorithmId::ring, latency, bytes / rate, compute, bytes);
  hide_overlap(estimate, segments);
  return estimate;
}

// SRA: encode n once, all-to-all of P − 1 chunk messages, the owner decode_adds P and encodes
// its sum, all-gather of P − 1 messages, every rank decodes P chunks.
// Pipelined (the spec's segment key cuts every chunk into S > 1 segments over a link whose
// transport pipelines, or in a stream-ordered device call: LinkModel::segments_chunks):
// S − 1 more headers per message, no size exchanges but one status all-gather at the end (a
// stream-ordered call: its completion's flag all-reduce instead), and
// the segments' transfers overlap the other segments' encodes and decodes: all but one
// segment's share of the smaller of the two is hidden, overlap = min(transfer, compute) (S − 1) / S.
CostEstimate sra(const Codec& codec, const CodecCost& cost, double n, int p, const LinkModel& link) {
  const double m = n / p;
  const double segments = modelled_segments(codec, n, p, link, kMaxSegmentsPerChunk);
  const double bytes = 2.0 * (p - 1) * (message_bytes(codec, m) + (segments - 1) * kHeader);
  // Host: two size exchanges, or (pipelined) one status all-gather; stream-ordered: neither,
  // the completion's flag all-reduce.
  const double checks = link.stream_ordered ? completion_latency(p, link)
                                            : (segments > 1 ? 1 : 2) * size_exchange_latency(p, link);
  const double latency = 2 * exchange_latency(p, link) + checks;
  const double compute = (n + m) * cost.encode_s + 2.0 * n * cost.decode_add_s;
  CostEstimate estimate = finish(AlgorithmId::sra, latency, bytes / link.bytes_per_s, compute, bytes);
  hide_overlap(estimate, segments);
  return estimate;
}

// The sparse all-reduce: encode n once, all-gather P − 1 whole-tensor messages, decode_add P; or,
// when the dense ring moves fewer bytes (the library's rule, sparse_allreduce.cpp), the
// uncompressed ring over the decoded messages.
CostEstimate sparse(const Codec& codec, const CodecCost& cost, double n, int p,
                    const LinkModel& link) {
  const double whole = message_bytes(codec, n);
  const double gathered = (p - 1) * whole;
  const double dense_ring = 2.0 * (p - 1) * kHeader + 2.0 * (p - 1) * 4.0 * n / p;
  if (p > 1 && dense_ring < gathered) {
    CostEstimate estimate = ring(&codec, cost, n, p, link, /*uncompressed=*/true);
    estimate.algorithm = AlgorithmId::sparse;
    estimate.compute_s += n * (cost.encode_s + cost.decode_add_s);
    estimate.seconds = estimate.latency_s + estimate.transfer_s + estimate.compute_s;
    estimate.dense_switch = true;
    return estimate;
  }
  const double checks =
      link.stream_ordered ? completion_latency(p, link) : size_exchange_latency(p, link);
  const double latency = exchange_latency(p, link) + checks;
  const double compute = n * cost.encode_s + p * n * cost.decode_add_s;
  return finish(AlgorithmId::sparse, latency, gathered / link.bytes_per_s, compute, gathered);
}

// Random-k: select k of n (encode), an uncompressed ring over the k values, decode.
CostEstimate randk(const Codec& codec, const CodecCost& cost, double n, int p, const LinkModel& link) {
  const double k = static_cast<double>(codec.spec().k_for(static_cast<std::size_t>(n)));
  CostEstimate inner = ring(&codec, cost, k, p, link, /*uncompressed=*/true);
  inner.algorithm = AlgorithmId::randk;
  inner.compute_s += n * (cost.encode_s + cost.decode_add_s);
  inner.seconds = inner.latency_s + inner.transfer_s + inner.compute_s;
  return inner;
}

// Recursive halving / doubling over the largest power of two p2 <= P (r = P − p2 extra ranks
// fold their encoded vector into a partner first and get the result's messages at the end):
// halving step j (1..log2 p2) sends e(n / 2^j) and decode_adds as much; the owner encodes its
// n / p2 segment once; doubling step j forwards 2^(j−1) segment messages; every rank decodes
// p2 segments.
CostEstimate rhd(const Codec& codec, const CodecCost& cost, double n, int p, const LinkModel& link) {
  const int levels = floor_log2(p);
  const int p2 = 1 << levels;
  const bool folded = p2 != p;
  double bytes = 0, compute = 0;
  double half = n;
  for (int j = 1; j <= levels; ++j) {
    half /= 2;
    bytes += message_bytes(codec, half);
    compute += half * (cost.encode_s + cost.decode_add_s);
  }
  const double segment = n / p2;
  bytes += (p2 - 1) * message_bytes(codec, segment);
  compute += segment * cost.encode_s + n * cost.decode_add_s;
  double steps = 2.0 * levels;
  if (folded) {  // the fold (one encoded vector in) and the unfold (p2 segment messages out)
    steps += 2;
    bytes += message_bytes(codec, n) + p2 * message_bytes(codec, segment);
    compute += n * (cost.encode_s + cost.decode_add_s);
  }
  // Every step but the fold's send and the unfold's messages is a pairwise exchange.
  return finish(AlgorithmId::rhd, steps * link.latency_s + completion_latency(p, link),
                bytes / link.exchange_rate(), compute, bytes);
}

// Binomial reduce to rank 0 in f32 (⌈log2 P⌉ full-vector steps, an add each), rank 0 encodes
// the exact sum once, binomial broadcast of that message (⌈log2 P⌉ steps), every rank decodes.
CostEstimate tree(const Codec& codec, const CodecCost& cost, double n, int p, const LinkModel& link) {
  const double levels = ceil_log2(p);
  const double bytes = levels * (dense_bytes(n) + message_bytes(codec, n));
  const double compute = levels * n * cost.add_s + n * (cost.encode_s + cost.decode_add_s);
  return finish(AlgorithmId::tree, 2 * levels * link.latency_s + completion_latency(p, link),
                bytes / link.bytes_per_s, compute, bytes);
}

// The codec's default flat path (its row in collectives/codec_table.cpp), from the table.
CostEstimate flat_default(const Codec& codec, const CodecCost& cost, double n, int p,
                          const LinkModel& link) {
  const HierarchyModel unused;
  const EstimateInputs in{codec, cost, n, p, link, unused};
  return algorithm_row(codec_row(codec.spec().codec).default_path).estimate(in);
}

// Hierarchical: a ring reduce-scatter (f32) inside each node of L ranks, the codec's flat
// algorithm across the P / L nodes on n / L elements, an all-gather (f32) inside the node.
CostEstimate hier(const Codec& codec, const CodecCost& cost, double n, int p, const LinkModel& link,
                  const HierarchyModel& hierarchy) {
  const int per_node = std::max(1, std::min(hierarchy.ranks_per_node, p));
  const int nodes = std::max(1, p / per_node);
  const double node_steps = per_node - 1;
  const double shard = n / per_node;
  const double intra_bytes = 2.0 * node_steps * dense_bytes(shard);
  const double intra_latency = 2.0 * node_steps * hierarchy.intra.latency_s;
  const double intra_transfer = intra_bytes / hierarchy.intra.bytes_per_s;
  const double intra_compute = node_steps * shard * cost.add_s;
  CostEstimate across = nodes > 1 ? flat_default(codec, cost, shard, nodes, link) : CostEstimate{};
  CostEstimate estimate = finish(AlgorithmId::hier, intra_latency + across.latency_s,
                                 intra_transfer + across.transfer_s,
                                 intra_compute + across.compute_s, intra_bytes + across.bytes_sent);
  return estimate;
}

}  // namespace

CostEstimate estimate_allreduce(AlgorithmId algorithm, const Codec& codec,
                                const CodecCost& cost, std::size_t count, int ranks,
                                const LinkModel& link, const HierarchyModel& hierarchy) {
  require_valid(ranks, link, "estimate_allreduce");
  if (ranks == 1 || count == 0) {
    CostEstimate none;
    none.algorithm = algorithm;
    return none;
  }
  const EstimateInputs in{codec, cost, static_cast<double>(count), ranks, link, hierarchy};
  return algorithm_row(algorithm).estimate(in);
}

CostEstimate estimate_dense_allreduce(const CodecCost& cost, std::size_t count, int ranks,
                                      const LinkModel& link, bool flush_residual) {
  require_valid(ranks, link, "estimate_dense_allreduce");
  if (ranks == 1 || count == 0) return CostEstimate{};
  const double n = static_cast<double>(count);
  CostEstimate estimate = ring(nullptr, cost, n, ranks, link, /*uncompressed=*/true);
  if (flush_residual) {
    estimate.compute_s += n * cost.add_s;
    estimate.seconds = estimate.latency_s + estimate.transfer_s + estimate.compute_s;
  }
  return estimate;
}

CostEstimate estimate_ring(const EstimateInputs& in) {
  const double segments =
      in.ranks < kMinRanksForPipelinedRing
          ? 1
          : modelled_segments(in.codec, in.n, in.ranks, in.link, kMaxRingSegmentsPerChunk);
  return ring(&in.codec, in.cost, in.n, in.ranks, in.link,
              /*uncompressed=*/in.codec.spec().codec == CodecKind::none, segments);
}
CostEstimate estimate_sra(const EstimateInputs& in) { return sra(in.codec, in.cost, in.n, in.ranks, in.link); }
CostEstimate estimate_sparse(const EstimateInputs& in) {
  return sparse(in.codec, in.cost, in.n, in.ranks, in.link);
}
CostEstimate estimate_randk(const EstimateInputs& in) { return randk(in.codec, in.cost, in.n, in.ranks, in.link); }
CostEstimate estimate_rhd(const EstimateInputs& in) { return rhd(in.codec, in.cost, in.n, in.ranks, in.link); }
CostEstimate estimate_tree(const EstimateInputs& in) { return tree(in.codec, in.cost, in.n, in.ranks, in.link); }
CostEstimate estimate_hier(const EstimateInputs& in) {
  return hier(in.codec, in.cost, in.n, in.ranks, in.link, in.hierarchy);
}

std::vector<AlgorithmId> candidate_algorithms(const CompressionSpec& spec) {
  const std::span<const AlgorithmId> runnable = codec_row(spec.codec).runnable;
  return {runnable.begin(), runnable.end()};
}

std::vector<AlgorithmId> auto_candidates(CodecKind codec) {
  const std::span<const AlgorithmId> choices = codec_row(codec).auto_choices;
  return {choices.begin(), choices.end()};
}

CostEstimate cheapest_allreduce(const std::vector<AlgorithmId>& candidates,
                                const Codec& codec, const CodecCost& cost, std::size_t count,
                                int ranks, const LinkModel& link, const HierarchyModel& hierarchy) {
  GZ_REQUIRE(!candidates.empty(), ErrorCode::invalid_argument, "cheapest_allreduce: no candidates");
  CostEstimate best = estimate_allreduce(candidates.front(), codec, cost, count, ranks, link, hierarchy);
  for (std::size_t i = 1; i < candidates.size(); ++i) {
    const CostEstimate other = estimate_allreduce(candidates[i], codec, cost, count, ranks, link, hierarchy);
    if (other.seconds < best.seconds) best = other;
  }
  return best;
}

namespace {

// The fastest of `repeats` runs of `run`, per element of `sample`; `settle` ends each timed run
// (a device measurement waits for the device there; a host one has nothing to wait for).
template <typename Run, typename Settle>
double fastest_per_element(int repeats, std::size_t sample, Run&& run, Settle&& settle) {
  using Clock = std::chrono::steady_clock;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    run();
    settle();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best / static_cast<double>(sample);
}

// γ of the encode (with error feedback's extra passes when the spec has ef=on: g' = g + e,
// encode, decode, e = g' - D(C(g'))) of `input` into `message`, host or device alike; `bytes`
// gets the message's size. `time` is a fastest_per_element bound to the measurement.
template <typename Time>
double encode_seconds(const Codec& codec, ConstTensorView input, std::span<std::byte> message,
                      std::size_t& bytes, Time&& time) {
  const EncodeContext ctx{codec.spec().seed, 0, 1, 0};
  if (!codec.spec().error_feedback) return time([&] { bytes = codec.encode(input, message, ctx); });
  error_feedback::ResidualStore store(1, 0, ResizePolicy::error);
  error_feedback::ErrorFeedbackCodec feedback(
      std::shared_ptr<const Codec>(&codec, [](const Codec*) {}), store);
  return time([&] { bytes = feedback.encode("gamma", input, message, ctx); });
}

// γ on CUDA device `device`: the data copied there once, every timed run waited for.
CodecCost measure_device_codec_cost(const Codec& codec, const std::vector<float>& data,
                                    int repeats, int device) {
  const std::string op = detail::concat("measure_codec_cost (cuda:", device, ")");
  const std::size_t sample = data.size();
  const Device where{DeviceKind::cuda, device};
  DeviceAllocation d_data(sample * sizeof(float), device, op);
  DeviceAllocation d_accumulator(sample * sizeof(float), device, op);
  DeviceAllocation d_message(codec.max_encoded_bytes(sample), device, op);
  copy_host_to_device(d_data.data(), data.data(), sample * sizeof(float), device, op);
  zero_on_device(d_accumulator.data(), sample * sizeof(float), device);
  const ConstTensorView input{d_data.data(), sample, DType::f32, where};
  const TensorView accumulator{d_accumulator.data(), sample, DType::f32, where};
  const std::span<std::byte> message(d_message.data(), d_message.size());
  const auto time = [&](auto&& run) {
    return fastest_per_element(repeats, sample, run, [&] { finish_queued_work(device, op); });
  };
  std::size_t bytes = 0;
  CodecCost cost;
  cost.encode_s = encode_seconds(codec, input, message, bytes, time);
  cost.decode_add_s = time([&] { codec.decode_add(message.first(bytes), accumulator); });
  // The uncompressed reductions' f32 adds: decode_add of a `none` message.
  const std::unique_ptr<Codec> plain = make_codec(CompressionSpec::parse("none"));
  DeviceAllocation d_plain(plain->max_encoded_bytes(sample), device, op);
  const std::span<std::byte> plain_message(d_plain.data(), d_plain.size());
  const std::size_t plain_bytes = plain->encode(input, plain_message, EncodeContext{});
  cost.add_s = time([&] { plain->decode_add(plain_message.first(plain_bytes), accumulator); });
  return cost;
}

}  // namespace

CodecCost measure_codec_cost(const Codec& codec, std::size_t sample, int repeats, Device where) {
  GZ_REQUIRE(sample > 0 && repeats > 0, ErrorCode::invalid_argument, "measure_codec_cost: sample ",
             sample, ", repeats ", repeats);
  // Deterministic N(0, 1)-like data: a sum of uniforms is enough for timing.
  std::vector<float> data(sample);
  std::uint64_t state = 0x2545F4914F6CDD1Dull;
  for (float& v : data) {
    double sum = 0;
    for (int i = 0; i < 4; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      sum += static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5;
    }
    v = static_cast<float>(sum * 1.7320508);
  }
  if (where.kind == DeviceKind::cuda) return measure_device_codec_cost(codec, data, repeats, where.index);
  std::vector<float> accumulator(sample, 0.0f), other(sample, 0.0f);
  std::vector<std::byte> message(codec.max_encoded_bytes(sample));
  const ConstTensorView input{data.data(), sample, DType::f32, Device{}};
  const auto time = [&](auto&& run) { return fastest_per_element(repeats, sample, run, [] {}); };
  std::size_t bytes = 0;
  CodecCost cost;
  cost.encode_s = encode_seconds(codec, input, message, bytes, time);
  const std::span<const std::byte> encoded(message.data(), bytes);
  cost.decode_add_s = time([&] { codec.decode_add(encoded, accumulator.data(), sample); });
  cost.add_s = time([&] {
    for (std::size_t i = 0; i < sample; ++i) other[i] += data[i];
  });
  return cost;
}

}  // namespace gradzip::collectives
