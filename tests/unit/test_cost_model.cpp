// The α-β-γ cost model (collectives/cost_model.h): every algorithm's terms against the
// formulas of docs/cost-model.md, worked by hand for small cases with round parameters.
#include "collectives/cost_model.h"
#include "collectives/segment_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "gradzip/codec.h"
#include "gradzip/error.h"

namespace gradzip {
namespace {

using collectives::CodecCost;
using collectives::CostEstimate;
using collectives::LinkModel;
using collectives::AlgorithmId;
using collectives::auto_candidates;
using collectives::estimate_allreduce;

// α = 1 s, B = 1 byte/s: latency counts start-ups, transfer counts bytes.
constexpr LinkModel kUnitLink{1.0, 1.0};
// γ = 1 s per element for every operation, so compute counts element operations.
constexpr CodecCost kUnitCost{1.0, 1.0, 1.0};

CostEstimate estimate(AlgorithmId algorithm, const std::string& spec, std::size_t n, int p,
                      const CodecCost& cost = kUnitCost, const LinkModel& link = kUnitLink) {
  const std::unique_ptr<Codec> codec = make_codec(spec);
  return collectives::estimate_allreduce(algorithm, *codec, cost, n, p, link);
}

void expect_terms(const CostEstimate& e, double latency, double transfer, double compute) {
  EXPECT_DOUBLE_EQ(e.latency_s, latency);
  EXPECT_DOUBLE_EQ(e.transfer_s, transfer);
  EXPECT_DOUBLE_EQ(e.compute_s, compute);
  EXPECT_DOUBLE_EQ(e.seconds, latency + transfer + compute);
}

TEST(CostModel, UncompressedRing) {
  // P = 4, n = 1000: 6 steps of 32 + 4·250 bytes; 3 adds of 250 elements.
  const CostEstimate e = estimate(AlgorithmId::ring, "none", 1000, 4);
  expect_terms(e, 6, 6 * 1032.0, 3 * 250.0);
  EXPECT_DOUBLE_EQ(e.bytes_sent, 6 * 1032.0);
}

TEST(CostModel, CompressedRingAndSra) {
  // fp16, e(m) = 32 + 2m; P = 4, n = 1000, m = 250: e = 532.
  expect_terms(estimate(AlgorithmId::ring, "fp16", 1000, 4), 6, 6 * 532.0,
               1000 + 7 * 250.0);
  // SRA: 2·3 exchange start-ups + 2·⌈log2 4⌉ size exchanges; 2·3 messages; (n + m) encodes,
  // 2n decode_adds.
  expect_terms(estimate(AlgorithmId::sra, "fp16", 1000, 4), 6 + 4, 6 * 532.0,
               1250 + 2000.0);
}

TEST(CostModel, PipelinedSraHidesTheSmallerOfTransferAndCompute) {
  // fp16:segment=1000, P = 4, n = 4000, m = 1000: e(m) = 32 + 2000 = 2032, cut into
  // S = ceil(2000 / (1000 - 32)) = 3 segments, so 2 more headers per message:
  // 6 (2032 + 64) = 12,576 bytes. Start-ups: 2 exchanges of 3 and one status all-gather of
  // ceil(log2 4) = 2 (no size exchanges). Compute as unsegmented: 5000 encodes + 8000 decodes.
  // Hidden: min(12,576, 13,000) x 2/3 = 8,384.
  const CostEstimate e = estimate(AlgorithmId::sra, "fp16:segment=1000", 4000, 4);
  EXPECT_DOUBLE_EQ(e.latency_s, 6 + 2);
  EXPECT_DOUBLE_EQ(e.transfer_s, 12576);
  EXPECT_DOUBLE_EQ(e.bytes_sent, 12576);
  EXPECT_DOUBLE_EQ(e.compute_s, 13000);
  EXPECT_DOUBLE_EQ(e.overlap_s, 8384);
  EXPECT_DOUBLE_EQ(e.seconds, 8 + 12576 + 13000 - 8384);
  // segment=0 is the unsegmented SRA: the size exchanges, no extra headers, nothing hidden.
  const CostEstimate whole = estimate(AlgorithmId::sra, "fp16:segment=0", 4000, 4);
  expect_terms(whole, 6 + 4, 6 * 2032.0, 13000);
  EXPECT_DOUBLE_EQ(whole.overlap_s, 0);
  // Codecs that are never cut keep the unsegmented estimate at any size.
  const CostEstimate never_cut = estimate(AlgorithmId::sra, "topk:k=10,algo=sra,segment=64", 4000, 4);
  EXPECT_DOUBLE_EQ(never_cut.overlap_s, 0);
}

TEST(CostModel, PipelinedRingHidesTheSmallerOfTransferAndCompute) {
  // fp16:segment=1000, P = 4, n = 4000, m = 1000: e(m) = 2032 in S = 3 segments (as above), so
  // 6 (2032 + 64) = 12,576 bytes; start-ups: 6 steps and one status all-gather of
  // ceil(log2 4) = 2. Compute as unsegmented: 4000 encodes + 7 x 1000 decodes = 11,000.
  // Hidden: min(12,576, 11,000) x 2/3.
  const CostEstimate e = estimate(AlgorithmId::ring, "fp16:segment=1000", 4000, 4);
  EXPECT_DOUBLE_EQ(e.latency_s, 6 + 2);
  EXPECT_DOUBLE_EQ(e.transfer_s, 12576);
  EXPECT_DOUBLE_EQ(e.bytes_sent, 12576);
  EXPECT_DOUBLE_EQ(e.compute_s, 11000);
  EXPECT_DOUBLE_EQ(e.overlap_s, 11000.0 * 2 / 3);
  EXPECT_DOUBLE_EQ(e.seconds, 8 + 12576 + 11000 - 11000.0 * 2 / 3);
  // Uncompressed: 4000 payload bytes per chunk message in ceil(4000 / 968) = 5 segments:
  // 6 (4032 + 4 x 32) = 24,960 bytes; 3 x 1000 adds; hidden 3000 x 4/5.
  const CostEstimate dense = estimate(AlgorithmId::ring, "none:segment=1000", 4000, 4);
  EXPECT_DOUBLE_EQ(dense.transfer_s, 24960);
  EXPECT_DOUBLE_EQ(dense.compute_s, 3000);
  EXPECT_DOUBLE_EQ(dense.overlap_s, 2400);
  EXPECT_DOUBLE_EQ(dense.seconds, 8 + 24960 + 3000 - 2400);
  // The ring cuts a chunk into at most kMaxRingSegmentsPerChunk = 8 segments: segment=100
  // would give ceil(2000 / 68) = 30 (and does for SRA), the ring 8: 6 (2032 + 7 x 32) bytes.
  EXPECT_DOUBLE_EQ(estimate(AlgorithmId::ring, "fp16:segment=100", 4000, 4).bytes_sent, 6 * 2256.0);
  EXPECT_DOUBLE_EQ(estimate(AlgorithmId::sra, "fp16:segment=100", 4000, 4).bytes_sent,
                   6 * (2032.0 + 29 * 32));
  // segment=0: the unsegmented ring, nothing hidden.
  const CostEstimate whole = estimate(AlgorithmId::ring, "fp16:segment=0", 4000, 4);
  expect_terms(whole, 6, 6 * 2032.0, 11000);
  EXPECT_DOUBLE_EQ(whole.overlap_s, 0);
  // Below kMinRanksForPipelinedRing (2 ranks) the ring runs unsegmented whatever the key, and
  // the model says so; SRA still pipelines there.
  static_assert(collectives::kMinRanksForPipelinedRing == 3);
  const CostEstimate two_cut = estimate(AlgorithmId::ring, "fp16:segment=100", 4000, 2);
  const CostEstimate two_whole = estimate(AlgorithmId::ring, "fp16:segment=0", 4000, 2);
  EXPECT_DOUBLE_EQ(two_cut.overlap_s, 0);
  expect_terms(two_cut, two_whole.latency_s, two_whole.transfer_s, two_whole.compute_s);
  EXPECT_GT(estimate(AlgorithmId::sra, "fp16:segment=100", 4000, 2).overlap_s, 0);
}

// Over a transport that does not pipeline (LinkModel::pipelined false: NCCL, torch.distributed
// through Python) the ring and SRA run unsegmented, and the model says so whatever the key.
TEST(CostModel, ALinkThatDoesNotPipelineGetsTheUnsegmentedEstimates) {
  LinkModel unpipelined = kUnitLink;
  unpipelined.pipelined = false;
  for (const AlgorithmId algorithm : {AlgorithmId::ring, AlgorithmId::sra}) {
    const CostEstimate cut = estimate(algorithm, "fp16:segment=1000", 4000, 4, kUnitCost, unpipelined);
    const CostEstimate whole = estimate(algorithm, "fp16:segment=0", 4000, 4);
    EXPECT_DOUBLE_EQ(cut.overlap_s, 0);
    expect_terms(cut, whole.latency_s, whole.transfer_s, whole.compute_s);
  }
}

// Stream-ordered device calls (CUDA tensors over NCCL, fixed-size codecs) segment the ring's and
// SRA's chunks over a transport that does not pipeline, exchange no sizes and end in one
// completion all-reduce (⌈log2 P⌉ α = 2 α at P = 4 on the unit link): every path's latency is
// the host's without its size exchanges and status all-gathers, plus that one collective.
TEST(CostModel, StreamOrderedDeviceCallsSegmentOnAnyTransportAndEndInOneCompletion) {
  LinkModel device = kUnitLink;
  device.pipelined = false;  // NCCL's waits complete whole batches
  device.stream_ordered = true;
  constexpr double kCompletion = 2;  // ceil(log2 4) start-ups
  for (const AlgorithmId algorithm : {AlgorithmId::ring, AlgorithmId::sra}) {
    SCOPED_TRACE(collectives::algorithm_id_name(algorithm));
    // Segmented as on a host transport that pipelines (whose status all-gather costs what the
    // completion costs): the same terms and the same overlap.
    const CostEstimate cut = estimate(algorithm, "fp16:segment=1000", 4000, 4, kUnitCost, device);
    const CostEstimate host_cut = estimate(algorithm, "fp16:segment=1000", 4000, 4);
    EXPECT_GT(cut.overlap_s, 0);
    EXPECT_DOUBLE_EQ(cut.overlap_s, host_cut.overlap_s);
    EXPECT_DOUBLE_EQ(cut.seconds, host_cut.seconds);
    EXPECT_DOUBLE_EQ(cut.bytes_sent, host_cut.bytes_sent);
  }
  // Unsegmented: the ring gains the completion (the host ring checks nothing after its last
  // step); SRA loses its two size exchanges (2 x 2) and gains the completion.
  const CostEstimate host_ring = estimate(AlgorithmId::ring, "fp16:segment=0", 4000, 4);
  const CostEstimate ring = estimate(AlgorithmId::ring, "fp16:segment=0", 4000, 4, kUnitCost, device);
  expect_terms(ring, host_ring.latency_s + kCompletion, host_ring.transfer_s, host_ring.compute_s);
  EXPECT_DOUBLE_EQ(host_ring.latency_s, 6);
  const CostEstimate host_sra = estimate(AlgorithmId::sra, "qsgd:bits=4,segment=0", 4000, 4);
  const CostEstimate sra = estimate(AlgorithmId::sra, "qsgd:bits=4,segment=0", 4000, 4, kUnitCost, device);
  expect_terms(sra, host_sra.latency_s - 2 * 2 + kCompletion, host_sra.transfer_s, host_sra.compute_s);
  EXPECT_DOUBLE_EQ(sra.latency_s, 2 * 3 + kCompletion);  // two exchanges of P − 1 = 3 start-ups
  // The sparse all-gather: its size exchange becomes the completion (both 2 here).
  const CostEstimate host_sparse = estimate(AlgorithmId::sparse, "topk:k=10", 1000, 4);
  expect_terms(estimate(AlgorithmId::sparse, "topk:k=10", 1000, 4, kUnitCost, device),
               3 + kCompletion, host_sparse.transfer_s, host_sparse.compute_s);
  // rhd and the tree: the completion on top of their steps.
  for (const AlgorithmId algorithm : {AlgorithmId::rhd, AlgorithmId::tree}) {
    const CostEstimate host = estimate(algorithm, "none", 1000, 4);
    expect_terms(estimate(algorithm, "none", 1000, 4, kUnitCost, device),
                 host.latency_s + kCompletion, host.transfer_s, host.compute_s);
  }
}

TEST(CostModel, SparseAllgatherAndItsDenseSwitch) {
  // top-k k = 10 of 1000 (f32 values, u32 indices): e(n) = 32 + 80 = 112; P = 4: 3 messages.
  expect_terms(estimate(AlgorithmId::sparse, "topk:k=10", 1000, 4), 3 + 2, 3 * 112.0,
               1000 + 4 * 1000.0);
  // k = 500 of 1000: (P−1)·e(n) = 3·(32 + 4000) exceeds the dense ring's 6·32 + 6·1000 = 6192:
  // the uncompressed ring runs over the decoded messages.
  const CostEstimate dense = estimate(AlgorithmId::sparse, "topk:k=500", 1000, 4);
  EXPECT_TRUE(dense.dense_switch);
  expect_terms(dense, 6, 6 * 1032.0, 3 * 250.0 + 1000 * 2.0);
}

TEST(CostModel, RandomKRunsARingOverItsValues) {
  // k = 100 of 1000 at P = 4: an uncompressed ring over 100 values (m = 25), plus selection and
  // scatter of n.
  expect_terms(estimate(AlgorithmId::randk, "randk:k=100", 1000, 4), 6, 6 * (32 + 100.0),
               3 * 25.0 + 2000.0);
}

TEST(CostModel, HalvingDoublingPowerOfTwoAndFolded) {
  // P = 4, none (e(m) = 32 + 4m), n = 1000: halving sends e(500) + e(250), doubling 3·e(250);
  // compute: (500 + 250)·2 halving, 250 encodes, 1000 decode_adds.
  const double halving = (32 + 2000.0) + (32 + 1000.0);
  expect_terms(estimate(AlgorithmId::rhd, "none", 1000, 4), 4, halving + 3 * 1032.0,
               1500 + 250 + 1000.0);
  // P = 5 = 4 + 1: the same on the 4 ranks, plus the fold (e(n)) and the unfold (4·e(250)),
  // 2 more start-ups and n·(encode + decode_add).
  expect_terms(estimate(AlgorithmId::rhd, "none", 1000, 5), 6,
               halving + 3 * 1032.0 + 4032.0 + 4 * 1032.0, 1500 + 250 + 1000.0 + 2000.0);
}

TEST(CostModel, BinomialTreeReducesInF32AndBroadcastsOneMessage) {
  // P = 5: ⌈log2 5⌉ = 3 levels down with the f32 vector (32 + 4000 bytes, an add each), 3 up
  // with the message of the sum (fp16: 32 + 2000); one encode and one decode of n.
  expect_terms(estimate(AlgorithmId::tree, "fp16", 1000, 5), 6, 3 * 4032.0 + 3 * 2032.0,
               3000 + 2000.0);
}

TEST(CostModel, OneRankOrNoElementsCostNothingAndBadLinksAreRefused) {
  for (const CostEstimate& e : {estimate(AlgorithmId::ring, "fp16", 1000, 1),
                                estimate(AlgorithmId::sra, "sign", 0, 8)}) {
    EXPECT_EQ(e.seconds, 0.0);
  }
  try {
    estimate(AlgorithmId::ring, "none", 10, 2, kUnitCost, LinkModel{1e-6, 0});
    ADD_FAILURE() << "a zero bandwidth was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
  }
}

TEST(CostModel, LatencyFavoursFewStepsAndBandwidthFavoursFewBytes) {
  const std::unique_ptr<Codec> none = make_codec("none");
  const auto cheapest = [&](std::size_t n, const LinkModel& link) {
    return collectives::cheapest_allreduce(collectives::candidate_algorithms(none->spec()), *none,
                                           CodecCost{}, n, 64, link)
        .algorithm;
  };
  // 16 elements at α = 1 ms: start-ups decide. Ring and SRA: 126 or more; tree and rhd: 12
  // each, and then bytes decide: the tree moves 12 vectors of 32 + 64 bytes (1152), rhd's
  // doubling alone forwards 63 messages of 36 bytes (a one-element segment's header): the tree.
  EXPECT_EQ(cheapest(16, LinkModel{1e-3, 1e9}), AlgorithmId::tree);
  // 2^26 elements at 1 Gbit/s and α = 1 µs: bytes only; the tree sends 12 whole vectors and
  // loses; ring and rhd send the same bytes, rhd with fewer start-ups.
  EXPECT_EQ(cheapest(std::size_t{1} << 26, LinkModel{1e-6, 125e6}), AlgorithmId::rhd);
  // Tree against ring alone, small tensor, high latency: the tree.
  const CostEstimate tree = collectives::estimate_allreduce(AlgorithmId::tree, *none,
                                                            CodecCost{}, 16, 64, LinkModel{1e-3, 1e9});
  const CostEstimate ring = collectives::estimate_allreduce(AlgorithmId::ring, *none,
                                                            CodecCost{}, 16, 64, LinkModel{1e-3, 1e9});
  EXPECT_LT(tree.seconds, ring.seconds);
}

TEST(CostModel, AutoCandidatesNeverCompressMoreOftenThanTheDefault) {
  // The default first; the ring (P - 1 re-encodes) and rhd (log2 P) only where the default is
  // the ring itself.
  using A = AlgorithmId;
  const std::vector<A> dense = {A::ring, A::sra, A::rhd, A::tree};
  EXPECT_EQ(auto_candidates(CodecKind::none), dense);
  EXPECT_EQ(auto_candidates(CodecKind::fp16), dense);
  EXPECT_EQ(auto_candidates(CodecKind::bf16), dense);
  EXPECT_EQ(auto_candidates(CodecKind::qsgd), (std::vector<A>{A::sra, A::tree}));
  EXPECT_EQ(auto_candidates(CodecKind::sign), (std::vector<A>{A::sra, A::tree}));
  EXPECT_EQ(auto_candidates(CodecKind::topk), (std::vector<A>{A::sparse, A::tree}));
  EXPECT_EQ(auto_candidates(CodecKind::randk), (std::vector<A>{A::randk}));
}

TEST(CostModel, CollectiveStartUpBoundsSraAndTheAllgatherButNotTheRing) {
  // 4 ranks: SRA's latency is 2 x max(3 α, c) + 2 x max(2 α, c); the ring's 6 α whatever c.
  const auto codec = make_codec(CompressionSpec::parse("sign"));
  const CodecCost free{0, 0, 0};
  const LinkModel plain{10e-6, 1e9, 0, 0}, slow_collectives{10e-6, 1e9, 0, 50e-6};
  EXPECT_NEAR(estimate_allreduce(AlgorithmId::sra, *codec, free, 4096, 4, plain).latency_s,
              2 * 30e-6 + 2 * 20e-6, 1e-12);
  EXPECT_NEAR(estimate_allreduce(AlgorithmId::sra, *codec, free, 4096, 4, slow_collectives).latency_s,
              4 * 50e-6, 1e-12);
  EXPECT_NEAR(estimate_allreduce(AlgorithmId::sparse, *codec, free, 4096, 4, slow_collectives).latency_s,
              2 * 50e-6, 1e-12);
  EXPECT_NEAR(estimate_allreduce(AlgorithmId::ring, *codec, free, 4096, 4, slow_collectives).latency_s,
              6 * 10e-6, 1e-12);
}

TEST(CostModel, CandidatesFollowTheCodec) {
  using A = AlgorithmId;
  EXPECT_EQ(collectives::candidate_algorithms(CompressionSpec::parse("none")),
            (std::vector<A>{A::ring, A::sra, A::rhd, A::tree}));
  EXPECT_EQ(collectives::candidate_algorithms(CompressionSpec::parse("randk")),
            (std::vector<A>{A::randk}));
  EXPECT_EQ(collectives::candidate_algorithms(CompressionSpec::parse("topk")),
            (std::vector<A>{A::sparse, A::ring, A::rhd, A::tree}));
  EXPECT_EQ(collectives::candidate_algorithms(CompressionSpec::parse("sign")),
            (std::vector<A>{A::sra, A::ring, A::rhd, A::tree}));
}

TEST(CostModel, MeasuredGammaIsPositiveAndErrorFeedbackCostsMore) {
  const std::unique_ptr<Codec> plain = make_codec("sign:ef=off");
  const std::unique_ptr<Codec> feedback = make_codec("sign:ef=on");
  const CodecCost without = collectives::measure_codec_cost(*plain, 1 << 16, 3);
  const CodecCost with = collectives::measure_codec_cost(*feedback, 1 << 16, 3);
  EXPECT_GT(without.encode_s, 0);
  EXPECT_GT(without.decode_add_s, 0);
  EXPECT_GT(without.add_s, 0);
  // Error feedback adds a decode and two passes over the tensor to the encode.
  EXPECT_GT(with.encode_s, without.encode_s);
}

}  // namespace
}  // namespace gradzip
