// The algorithm a Communicator call runs: every codec x algo= x size below / at / above
// min_bytes, warm-up, and the reduce-scatter / all-gather choices, against a table written out
// here (not recomputed from the code under test).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/cost_model.h"
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

constexpr CodecKind kElementCodecs[] = {CodecKind::none, CodecKind::fp16, CodecKind::bf16,
                                        CodecKind::qsgd, CodecKind::sign, CodecKind::topk,
                                        CodecKind::randk, CodecKind::terngrad};
constexpr Algorithm kAlgorithms[] = {Algorithm::auto_select, Algorithm::ring, Algorithm::sra,
                                     Algorithm::sparse, Algorithm::hier, Algorithm::rhd,
                                     Algorithm::tree};

// The flat algorithm algo=auto runs per codec, by its stats name.
std::string auto_name(CodecKind codec) {
  switch (codec) {
    case CodecKind::none:
    case CodecKind::fp16:
    case CodecKind::bf16: return "ring";
    case CodecKind::qsgd:
    case CodecKind::sign:
    case CodecKind::terngrad: return "sra";
    case CodecKind::topk: return "sparse";
    case CodecKind::randk: return "randk";
    default: return "?";
  }
}

CompressionSpec spec_of(CodecKind codec, Algorithm algo, std::size_t min_bytes = 65536) {
  CompressionSpec spec;
  spec.codec = codec;
  spec.algo = algo;
  spec.min_bytes = min_bytes;
  return spec;
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
                       (algo == Algorithm::auto_select &&
                        (codec == CodecKind::qsgd || codec == CodecKind::sign ||
                         codec == CodecKind::terngrad));
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
