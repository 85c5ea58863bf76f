// The algorithm a Communicator call runs: every codec x algo= x size below / at / above
// min_bytes, warm-up, and the reduce-scatter / all-gather choices, against a table written out
// here (not recomputed from the code under test).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/algorithm_table.h"
#include "collectives/cost_model.h"
#include "compressors/codec_descriptor.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::AllreduceChoice;
using collectives::AllreducePath;
using collectives::choose_allgather;
using collectives::choose_allreduce;
using collectives::choose_reduce_scatter;

// Every element codec of the registry (compressors/codec_descriptor.h).
const std::vector<CodecKind> kElementCodecs = [] {
  std::vector<CodecKind> kinds;
  for (const compressors::CodecDescriptor& row : compressors::codec_descriptors())
    if (row.wire) kinds.push_back(row.kind);
  return kinds;
}();
constexpr Algorithm kAlgorithms[] = {Algorithm::auto_select, Algorithm::ring, Algorithm::sra,
                                     Algorithm::sparse, Algorithm::hier, Algorithm::rhd,
                                     Algorithm::tree};

// The flat algorithm algo=auto runs per codec, by its stats name.
// What algo=auto runs without the model, by the codec's collective family (its row says which
// family it is; a new codec is covered by its family).
std::string auto_name(CodecKind codec) {
  switch (compressors::codec_descriptor(codec).paths) {
    case compressors::CollectivePaths::dense: return "ring";
    case compressors::CollectivePaths::bucket_quantiser: return "sra";
    case compressors::CollectivePaths::top_selection: return "sparse";
    case compressors::CollectivePaths::shared_selection: return "randk";
    case compressors::CollectivePaths::whole_matrix: break;
  }
  return "?";
}

CompressionSpec spec_of(CodecKind codec, Algorithm algo, std::size_t min_bytes = 65536) {
  CompressionSpec spec;
  spec.codec = codec;
  spec.algo = algo;
  spec.min_bytes = min_bytes;
  return spec;
}

// An algorithm's name is spelled twice: in the spec parser (compressors/compression_spec.cpp,
// which make_codec needs without the collectives) and in its row. Every row with an algo= value
// must name it as the parser does, the parser must map that name back to the value, every
// algo= value but auto must have exactly one row, and no two rows may share a name.
TEST(AlgorithmChoice, TheRowsNameTheirAlgoValuesAsTheParserDoes) {
  std::set<Algorithm> with_rows;
  std::set<std::string> names;
  for (const collectives::AlgorithmRow& row : collectives::algorithm_rows()) {
    EXPECT_TRUE(names.insert(std::string(row.name)).second) << row.name << " named twice";
    if (!row.spec_value) continue;
    EXPECT_EQ(row.name, algorithm_name(*row.spec_value));
    EXPECT_EQ(CompressionSpec::parse("none:algo=" + std::string(row.name)).algo, *row.spec_value)
        << row.name;
    EXPECT_TRUE(with_rows.insert(*row.spec_value).second) << row.name;
  }
  for (const Algorithm algo : kAlgorithms)
    if (algo != Algorithm::auto_select) {
      EXPECT_EQ(with_rows.count(algo), 1u) << algorithm_name(algo);
    }
  EXPECT_EQ(with_rows.size() + 1, std::size(kAlgorithms)) << "an algo= value this test does not list";
}

TEST(AlgorithmChoice, AllreduceTableForEveryCodecAlgorithmAndSize) {
  // min_bytes = 65536: 16383 elements are 65532 B (below), 16384 are exactly 65536 B (not
  // below: the rule is count * 4 < min_bytes), 100003 well above.
  for (CodecKind codec : kElementCodecs) {
    for (Algorithm algo : kAlgorithms) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{16383},
                                std::size_t{16384}, std::size_t{100003}}) {
        SCOPED_TRACE(::testing::Message() << codec_kind_name(codec) << " algo="
                                          << algorithm_name(algo) << " count=" << count);
        const AllreduceChoice choice = choose_allreduce(spec_of(codec, algo), count, 0);
        const bool below = count <= 16383;
        switch (algo) {
          case Algorithm::auto_select:
            if (below) {
              EXPECT_EQ(choice.path, AllreducePath::transport_sum);
              EXPECT_EQ(choice.name, "mpi");
              EXPECT_NE(choice.note.find("min_bytes=65536"), std::string::npos) << choice.note;
            } else {
              EXPECT_EQ(choice.path, AllreducePath::flat);
              EXPECT_EQ(choice.algorithm, Algorithm::auto_select);
              EXPECT_EQ(choice.name, auto_name(codec));
            }
            break;
          case Algorithm::ring:
          case Algorithm::sra:
          case Algorithm::sparse:
          case Algorithm::rhd:
          case Algorithm::tree:
            // An explicit flat algorithm runs at every size.
            EXPECT_EQ(choice.path, AllreducePath::flat);
            EXPECT_EQ(choice.algorithm, algo);
            EXPECT_EQ(choice.name, std::string(algorithm_name(algo)));
            break;
          case Algorithm::hier:
            EXPECT_EQ(choice.path, AllreducePath::hierarchical);
            EXPECT_EQ(choice.algorithm, Algorithm::auto_select);
            EXPECT_EQ(choice.name, "hier/" + auto_name(codec));
            break;
        }
      }
    }
  }
}

// --- algo=auto with the cost model -----------------------------------------------------------

using collectives::AutoModel;
using collectives::CodecCost;
using collectives::LinkModel;

// γ of a fast CPU codec: 1 ns per element to encode and to decode-add, 0.3 ns per f32 add.
constexpr CodecCost kGamma{1e-9, 1e-9, 0.3e-9};

AllreduceChoice choose_with(const CompressionSpec& spec, std::size_t count, int ranks,
                            const LinkModel& link) {
  const std::unique_ptr<Codec> codec = make_codec(spec);
  const AutoModel model{*codec, kGamma, link, ranks, std::nullopt};
  return choose_allreduce(spec, count, 0, &model);
}

TEST(AlgorithmChoice, AutoModelTakesTheTreeOnFastLinksAndSraOnSlowOnes) {
  // qsgd, 4096 elements, 4 ranks. Latency-bound link (25 µs, 10 Gbit/s, collectives 100 µs):
  // SRA pays 2 x max(3 x 25, 100) + 2 x max(2 x 25, 100) = 400 µs of start-ups, the tree
  // 4 x 25 = 100 µs plus 2 x (16 KiB + 2 KiB) / 1.25 GB/s = 30 µs: the tree, by far. Slow link
  // (40 µs, 100 Mbit/s): the tree's 37 KB take 3 ms, SRA's 6 messages of ~0.6 KB 0.3 ms: SRA.
  const CompressionSpec spec = CompressionSpec::parse("qsgd:bits=4,min_bytes=0");
  const AllreduceChoice fast = choose_with(spec, 4096, 4, LinkModel{25e-6, 1.25e9, 0, 100e-6});
  EXPECT_EQ(fast.path, AllreducePath::flat);
  EXPECT_EQ(fast.algorithm, Algorithm::tree);
  EXPECT_EQ(fast.name, "tree");
  EXPECT_EQ(fast.note.rfind("auto: model ms: sra ", 0), 0u) << fast.note;
  EXPECT_NE(fast.note.find(", tree "), std::string::npos) << fast.note;
  EXPECT_NE(fast.note.find("collective 0.1 ms) -> tree"), std::string::npos) << fast.note;
  const AllreduceChoice slow = choose_with(spec, 4096, 4, LinkModel{40e-6, 12.5e6, 0, 100e-6});
  EXPECT_EQ(slow.algorithm, Algorithm::sra);
  EXPECT_EQ(slow.name, "sra");
  // Top-k: the sparse all-reduce's k entries against the tree's f32 vectors, the same way.
  const CompressionSpec topk = CompressionSpec::parse("topk:ratio=0.01,min_bytes=0");
  EXPECT_EQ(choose_with(topk, 4096, 4, LinkModel{25e-6, 1.25e9, 0, 100e-6}).name, "tree");
  EXPECT_EQ(choose_with(topk, 1 << 20, 4, LinkModel{40e-6, 12.5e6, 0, 100e-6}).name, "sparse");
  // Random-k has one path, with or without a model.
  const CompressionSpec randk = CompressionSpec::parse("randk:min_bytes=0");
  const AllreduceChoice shared = choose_with(randk, 4096, 4, LinkModel{25e-6, 1.25e9, 0, 100e-6});
  EXPECT_EQ(shared.algorithm, Algorithm::auto_select);
  EXPECT_EQ(shared.name, "randk");
}

TEST(AlgorithmChoice, AutoModelTakesTheHierarchyWhenNodesAreFastInsideAndSlowAcross) {
  // fp16, 2^18 elements, 4 ranks as 2 nodes of 2. The flat ring moves 6 messages of 2^16
  // halves (786 KB) over the 12.5 MB/s link: 63 ms. The hierarchy moves 4 MiB of f32 inside
  // the nodes at 10 GB/s (0.4 ms) and a 2-node ring of 2 messages of 2^16 halves (262 KB) per
  // inter group, whose two groups share the node's link (6.25 MB/s each): 42 ms, a third less.
  const CompressionSpec spec = CompressionSpec::parse("fp16:min_bytes=0,ranks_per_node=2");
  const std::unique_ptr<Codec> codec = make_codec(spec);
  const LinkModel slow{40e-6, 12.5e6, 0, 100e-6};
  AutoModel model{*codec, kGamma, slow, 4,
                  collectives::AutoHierarchy{collectives::HierarchyModel{2, LinkModel{1e-6, 10e9, 0, 5e-6}},
                                             LinkModel{40e-6, 6.25e6, 0, 100e-6}}};
  const AllreduceChoice fast_nodes = choose_allreduce(spec, 1 << 18, 0, &model);
  EXPECT_EQ(fast_nodes.path, AllreducePath::hierarchical);
  EXPECT_EQ(fast_nodes.algorithm, Algorithm::auto_select);
  EXPECT_EQ(fast_nodes.name, "hier/ring");
  EXPECT_NE(fast_nodes.note.find(", hier "), std::string::npos) << fast_nodes.note;
  EXPECT_NE(fast_nodes.note.find("nodes of 2"), std::string::npos) << fast_nodes.note;
  // Nodes no faster inside than across (every rank on its own link): the flat ring stays.
  model.hierarchy->nodes.intra = slow;
  model.hierarchy->across = slow;
  const AllreduceChoice flat_nodes = choose_allreduce(spec, 1 << 18, 0, &model);
  EXPECT_EQ(flat_nodes.path, AllreducePath::flat);
  EXPECT_EQ(flat_nodes.name, "ring");
}

TEST(AlgorithmChoice, AutoModelLeavesTheDefaultOnlyForAFifteenPercentGain) {
  // Dense fp16 on 8 ranks: rhd (6 steps) against the ring (14 steps), the same bytes. Sweep α:
  // the choice must leave the ring exactly when the fastest other candidate is predicted below
  // 85% of the ring's time, and the sweep must meet both a switch and the band where another
  // is faster but not by 15% (where the ring must stay).
  const CompressionSpec spec = CompressionSpec::parse("fp16:min_bytes=0");
  const std::unique_ptr<Codec> codec = make_codec(spec);
  bool kept_in_band = false, switched = false;
  for (double latency = 1e-7; latency < 1e-3; latency *= 1.25) {
    const LinkModel link{latency, 1.25e9, 0, 0};
    const double ring = collectives::estimate_allreduce(collectives::AlgorithmId::ring, *codec,
                                                        kGamma, 1 << 18, 8, link).seconds;
    double others = ring;
    for (collectives::AlgorithmId other : {collectives::AlgorithmId::sra,
                                                collectives::AlgorithmId::rhd,
                                                collectives::AlgorithmId::tree})
      others = std::min(others, collectives::estimate_allreduce(other, *codec, kGamma, 1 << 18, 8, link).seconds);
    const AllreduceChoice choice = choose_with(spec, 1 << 18, 8, link);
    SCOPED_TRACE(::testing::Message() << "latency " << latency << ": " << choice.note);
    if (others < 0.85 * ring) {
      EXPECT_NE(choice.algorithm, Algorithm::ring);
      switched = true;
    } else {
      EXPECT_EQ(choice.algorithm, Algorithm::ring);
      if (others < ring) kept_in_band = true;
    }
  }
  EXPECT_TRUE(switched);
  EXPECT_TRUE(kept_in_band);
}

TEST(AlgorithmChoice, DenseAllreduceEstimateIsTheUncompressedRingPlusTheFlush) {
  // 2^20 elements on 4 ranks over a 5 µs, 5 GB/s link, adds at 0.3 ns: 6 messages of
  // 32 + 4 x 2^18 bytes = 6,291,648 B take 1.2583296 ms, their start-ups 30 µs, the
  // 3 x 2^18 adds 0.2359296 ms; flushing the residual adds 2^20 x 0.3 ns = 0.3145728 ms.
  const LinkModel shared_memory{5e-6, 5e9, 0, 20e-6};
  const collectives::CostEstimate flushed =
      collectives::estimate_dense_allreduce(kGamma, 1 << 20, 4, shared_memory, true);
  EXPECT_NEAR(flushed.seconds, 1.838832e-3, 1e-12);
  EXPECT_NEAR(flushed.transfer_s, 1.2583296e-3, 1e-12);
  EXPECT_DOUBLE_EQ(flushed.bytes_sent, 6291648.0);
  const collectives::CostEstimate plain =
      collectives::estimate_dense_allreduce(kGamma, 1 << 20, 4, shared_memory, false);
  EXPECT_NEAR(plain.seconds, 1.838832e-3 - 0.3145728e-3, 1e-12);
  // Two ranks exchange pairwise: the exchange rate.
  const collectives::CostEstimate pair = collectives::estimate_dense_allreduce(
      kGamma, 1 << 20, 2, LinkModel{5e-6, 5e9, 2.5e9, 0}, false);
  EXPECT_NEAR(pair.transfer_s, 2 * (32 + 4.0 * (1 << 19)) / 2.5e9, 1e-12);
  EXPECT_EQ(collectives::estimate_dense_allreduce(kGamma, 1 << 20, 1, shared_memory, true).seconds, 0);
  EXPECT_THROW(collectives::estimate_dense_allreduce(kGamma, 1, 0, shared_memory, true), Error);
}

TEST(AlgorithmChoice, FallbackDenseSendsDenseExactlyWhereTheModelPredictsItNoSlower) {
  // γ of a slow error-feedback encode (20 ns per element, what top-k with EF costs on a 2-core
  // CPU): on shared memory (5 GB/s) the 2^20-element dense all-reduce (1.8 ms) beats encoding
  // alone (21 ms); on 1 Gbit/s it takes 50 ms, and top-k's few hundred KB win.
  const CodecCost slow_encode{20e-9, 1e-9, 0.3e-9};
  const LinkModel shared_memory{5e-6, 5e9, 0, 20e-6};
  const LinkModel gigabit{50e-6, 125e6, 0, 200e-6};
  const std::size_t n = 1 << 20;
  const auto choose = [&](const char* text, const LinkModel& link) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    const std::unique_ptr<Codec> codec = make_codec(spec);
    const AutoModel model{*codec, slow_encode, link, 4, std::nullopt};
    return choose_allreduce(spec, n, 0, &model);
  };
  for (const char* text : {"topk:fallback=dense", "sign:fallback=dense", "qsgd:bits=4,fallback=dense",
                           "fp16:fallback=dense", "randk:fallback=dense"}) {
    SCOPED_TRACE(text);
    const AllreduceChoice near = choose(text, shared_memory);
    EXPECT_EQ(near.path, AllreducePath::transport_sum) << near.note;
    EXPECT_TRUE(near.dense_fallback);
    EXPECT_EQ(near.name, "mpi");
    EXPECT_NE(near.note.find("fallback=dense: dense 1."), std::string::npos) << near.note;
    const AllreduceChoice far = choose(text, gigabit);
    EXPECT_NE(far.path, AllreducePath::transport_sum) << far.note;
    EXPECT_FALSE(far.dense_fallback);
    EXPECT_NE(far.note.find(", dense "), std::string::npos) << far.note;  // both predictions
    EXPECT_EQ(far.note.find("fallback=dense:"), std::string::npos) << far.note;
  }
  // The flush is in the prediction and the note says it happens only with error feedback.
  EXPECT_NE(choose("topk:fallback=dense", shared_memory).note.find("residual flushed"), std::string::npos);
  EXPECT_EQ(choose("topk:ef=off,fallback=dense", shared_memory).note.find("residual flushed"),
            std::string::npos);
  // Random-k keeps its shared-index path when that wins.
  const AllreduceChoice randk = choose("randk:fallback=dense", gigabit);
  EXPECT_EQ(randk.path, AllreducePath::flat);
  EXPECT_EQ(randk.algorithm, Algorithm::auto_select);
  EXPECT_EQ(randk.name, "randk");
  // Without the key the model never leaves the compressed paths, however fast the link.
  for (const char* text : {"topk", "sign", "randk"}) {
    const AllreduceChoice kept = choose(text, shared_memory);
    EXPECT_NE(kept.path, AllreducePath::transport_sum) << text << ": " << kept.note;
    EXPECT_FALSE(kept.dense_fallback) << text;
  }
}

TEST(AlgorithmChoice, FallbackDenseTakesTheTieAndNothingSlower) {
  // Sweep the link rate across the crossing: dense wherever its estimate is <= the compressed
  // choice's, compressed everywhere else, and the sweep meets both sides.
  const CompressionSpec spec = CompressionSpec::parse("sign:fallback=dense");
  const std::unique_ptr<Codec> codec = make_codec(spec);
  const CodecCost gamma{5e-9, 1e-9, 0.3e-9};
  bool dense_seen = false, compressed_seen = false;
  for (double rate = 1e7; rate < 1e11; rate *= 1.3) {
    const LinkModel link{20e-6, rate, 0, 0};
    const double dense =
        collectives::estimate_dense_allreduce(gamma, 1 << 20, 4, link, true).seconds;
    const double sra =
        collectives::estimate_allreduce(collectives::AlgorithmId::sra, *codec, gamma, 1 << 20, 4, link).seconds;
    const AutoModel model{*codec, gamma, link, 4, std::nullopt};
    const AllreduceChoice choice = choose_allreduce(spec, 1 << 20, 0, &model);
    SCOPED_TRACE(::testing::Message() << "rate " << rate << ": " << choice.note);
    ASSERT_EQ(choice.dense_fallback || choice.name == "sra", true);
    EXPECT_EQ(choice.dense_fallback, dense <= sra);
    (choice.dense_fallback ? dense_seen : compressed_seen) = true;
  }
  EXPECT_TRUE(dense_seen);
  EXPECT_TRUE(compressed_seen);
}

TEST(AlgorithmChoice, AutoUsesTheModelOnlyWhereItChooses) {
  const CompressionSpec qsgd = CompressionSpec::parse("qsgd");  // min_bytes 65536
  EXPECT_TRUE(collectives::auto_uses_model(qsgd, 16384, 0, 4, false));
  EXPECT_FALSE(collectives::auto_uses_model(qsgd, 16383, 0, 4, false)) << "below min_bytes";
  EXPECT_FALSE(collectives::auto_uses_model(qsgd, 16384, 0, 1, false)) << "one rank";
  EXPECT_FALSE(collectives::auto_uses_model(qsgd, 16384, 0, 4, true)) << "CUDA tensor";
  EXPECT_FALSE(collectives::auto_uses_model(CompressionSpec::parse("qsgd:algo=sra"), 16384, 0, 4, false));
  EXPECT_FALSE(collectives::auto_uses_model(CompressionSpec::parse("qsgd:warmup=2"), 16384, 1, 4, false));
  EXPECT_TRUE(collectives::auto_uses_model(CompressionSpec::parse("qsgd:warmup=2"), 16384, 2, 4, false));
  EXPECT_FALSE(collectives::auto_uses_model(CompressionSpec::parse("randk"), 16384, 0, 4, false));
  // fallback=dense gives random-k's single path a second candidate: the dense all-reduce.
  EXPECT_TRUE(collectives::auto_uses_model(CompressionSpec::parse("randk:fallback=dense"), 16384, 0, 4, false));
  EXPECT_FALSE(collectives::auto_uses_model(CompressionSpec::parse("randk:fallback=dense"), 16384, 0, 4, true));
  EXPECT_FALSE(collectives::auto_uses_model(CompressionSpec::parse("powersgd"), 16384, 0, 4, false));
}

TEST(AlgorithmChoice, NodeStructuresThatMayBeCandidates) {
  // Stated sizes: two or more nodes of one size >= 2.
  EXPECT_TRUE(collectives::forms_nodes(4, 2));
  EXPECT_TRUE(collectives::forms_nodes(8, 4));
  EXPECT_TRUE(collectives::forms_nodes(9, 3));
  EXPECT_FALSE(collectives::forms_nodes(4, 4)) << "one node";
  EXPECT_FALSE(collectives::forms_nodes(4, 1)) << "one rank per node";
  EXPECT_FALSE(collectives::forms_nodes(5, 2)) << "nodes of 2, 2 and 1";
  EXPECT_FALSE(collectives::forms_nodes(4, 0)) << "0 is no size";
  EXPECT_FALSE(collectives::forms_nodes(4, 4000000000u)) << "more than the ranks";
  // 0, the ranks that share memory: may form nodes from 4 ranks on (known once detected).
  EXPECT_TRUE(collectives::may_form_nodes(4, 0));
  EXPECT_TRUE(collectives::may_form_nodes(7, 0));
  EXPECT_FALSE(collectives::may_form_nodes(3, 0));
  EXPECT_TRUE(collectives::may_form_nodes(6, 3));
  EXPECT_FALSE(collectives::may_form_nodes(6, 4));
}

TEST(AlgorithmChoice, MinBytesComparesTheExactByteCount) {
  // min_bytes = 10: 2 elements (8 B) are below, 3 elements (12 B) are not.
  EXPECT_EQ(choose_allreduce(spec_of(CodecKind::fp16, Algorithm::auto_select, 10), 2, 0).path,
            AllreducePath::transport_sum);
  EXPECT_EQ(choose_allreduce(spec_of(CodecKind::fp16, Algorithm::auto_select, 10), 3, 0).path,
            AllreducePath::flat);
  // min_bytes = 12: 3 elements are exactly 12 B, not below.
  EXPECT_EQ(choose_allreduce(spec_of(CodecKind::fp16, Algorithm::auto_select, 12), 3, 0).path,
            AllreducePath::flat);
  // min_bytes = 0: even an empty tensor runs the compressed algorithm.
  EXPECT_EQ(choose_allreduce(spec_of(CodecKind::topk, Algorithm::auto_select, 0), 0, 0).path,
            AllreducePath::flat);
  // Near 2^64 bytes, where count * 4 would overflow: with min_bytes = 2^64 - 1,
  // count = 2^62 - 1 is 2^64 - 4 B (below) and count = 2^62 is 2^64 B (not below).
  const CompressionSpec huge = spec_of(CodecKind::sign, Algorithm::auto_select, SIZE_MAX);
  EXPECT_EQ(choose_allreduce(huge, SIZE_MAX / 4, 0).path, AllreducePath::transport_sum);
  EXPECT_EQ(choose_allreduce(huge, SIZE_MAX / 4 + 1, 0).path, AllreducePath::flat);
  EXPECT_EQ(choose_allreduce(huge, SIZE_MAX / 2, 0).path, AllreducePath::flat);
}

TEST(AlgorithmChoice, WarmupStepsRunUncompressedWhateverTheAlgorithm) {
  for (Algorithm algo : kAlgorithms) {
    CompressionSpec spec = spec_of(CodecKind::topk, algo, 0);
    spec.warmup = 3;
    for (std::uint32_t step = 0; step < 3; ++step) {
      const AllreduceChoice choice = choose_allreduce(spec, 100003, step);
      EXPECT_EQ(choice.path, AllreducePath::transport_sum) << "step " << step;
      EXPECT_EQ(choice.name, "mpi");
      EXPECT_NE(choice.note.find("warm-up call " + std::to_string(step + 1) + " of 3"),
                std::string::npos)
          << choice.note;
    }
    EXPECT_NE(choose_allreduce(spec, 100003, 3).path, AllreducePath::transport_sum);
  }
}

TEST(AlgorithmChoice, PowersgdIsUnsupportedInEveryCollective) {
  for (Algorithm algo : kAlgorithms) {
    const CompressionSpec spec = spec_of(CodecKind::powersgd, algo);
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { choose_allreduce(spec, 100003, 0); }, &message),
              ErrorCode::unsupported);
    EXPECT_NE(message.find("Reducer"), std::string::npos) << message;
    EXPECT_EQ(testing::error_code_of([&] { choose_reduce_scatter(spec, 0); }),
              ErrorCode::unsupported);
    EXPECT_EQ(testing::error_code_of([&] { choose_allgather(spec, 0); }), ErrorCode::unsupported);
  }
}

TEST(AlgorithmChoice, ReduceScatterUsesSraForTheQuantisersOrWhenAsked) {
  for (CodecKind codec : kElementCodecs) {
    for (Algorithm algo : kAlgorithms) {
      SCOPED_TRACE(::testing::Message() << codec_kind_name(codec) << " algo=" << algorithm_name(algo));
      const collectives::ShardedChoice choice = choose_reduce_scatter(spec_of(codec, algo), 0);
      const bool sra = algo == Algorithm::sra ||
                       (algo == Algorithm::auto_select && auto_name(codec) == "sra");
      EXPECT_EQ(choice.algorithm, sra ? Algorithm::sra : Algorithm::ring);
      EXPECT_EQ(choice.name, sra ? "sra" : "ring");
      EXPECT_FALSE(choice.warmup);
      // algo=sparse / hier / rhd / tree have no reduce-scatter: the note says the ring runs
      // instead.
      EXPECT_EQ(choice.note.empty(), algo == Algorithm::auto_select || algo == Algorithm::ring ||
                                         algo == Algorithm::sra)
          << choice.note;
    }
  }
  CompressionSpec warm = spec_of(CodecKind::sign, Algorithm::auto_select);
  warm.warmup = 1;
  EXPECT_TRUE(choose_reduce_scatter(warm, 0).warmup);
  EXPECT_EQ(choose_reduce_scatter(warm, 0).algorithm, Algorithm::ring);
  EXPECT_FALSE(choose_reduce_scatter(warm, 1).warmup);
  EXPECT_EQ(choose_reduce_scatter(warm, 1).algorithm, Algorithm::sra);
}

TEST(AlgorithmChoice, AllgatherAlwaysRunsTheCompressedAllgather) {
  for (CodecKind codec : kElementCodecs) {
    for (Algorithm algo : kAlgorithms) {
      const collectives::ShardedChoice choice = choose_allgather(spec_of(codec, algo), 5);
      EXPECT_FALSE(choice.algorithm.has_value());  // the collective's one algorithm
      EXPECT_EQ(choice.name, "allgather");
      EXPECT_FALSE(choice.warmup);
    }
  }
  CompressionSpec warm = spec_of(CodecKind::qsgd, Algorithm::auto_select);
  warm.warmup = 2;
  EXPECT_TRUE(choose_allgather(warm, 1).warmup);
  EXPECT_FALSE(choose_allgather(warm, 2).warmup);
}

}  // namespace
}  // namespace gradzip
