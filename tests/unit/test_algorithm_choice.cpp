// The algorithm a Communicator call runs: every codec x algo= x size below / at / above
// min_bytes, warm-up, and the reduce-scatter / all-gather choices, against a table written out
// here (not recomputed from the code under test).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/algorithm_choice.h"
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
                                        CodecKind::randk};
constexpr Algorithm kAlgorithms[] = {Algorithm::auto_select, Algorithm::ring, Algorithm::sra,
                                     Algorithm::allgather, Algorithm::hier, Algorithm::rhd,
                                     Algorithm::tree};

// The flat algorithm algo=auto runs per codec, by its stats name.
std::string auto_name(CodecKind codec) {
  switch (codec) {
    case CodecKind::none:
    case CodecKind::fp16:
    case CodecKind::bf16: return "ring";
    case CodecKind::qsgd:
    case CodecKind::sign: return "sra";
    case CodecKind::topk: return "allgather";
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
          case Algorithm::allgather:
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

TEST(AlgorithmChoice, ReduceScatterUsesSraForQsgdAndSignOrWhenAsked) {
  for (CodecKind codec : kElementCodecs) {
    for (Algorithm algo : kAlgorithms) {
      SCOPED_TRACE(::testing::Message() << codec_kind_name(codec) << " algo=" << algorithm_name(algo));
      const collectives::ShardedChoice choice = choose_reduce_scatter(spec_of(codec, algo), 0);
      const bool sra = algo == Algorithm::sra ||
                       (algo == Algorithm::auto_select &&
                        (codec == CodecKind::qsgd || codec == CodecKind::sign));
      EXPECT_EQ(choice.algorithm, sra ? Algorithm::sra : Algorithm::ring);
      EXPECT_EQ(choice.name, sra ? "sra" : "ring");
      EXPECT_FALSE(choice.warmup);
      // algo=allgather / hier / rhd / tree have no reduce-scatter: the note says the ring runs
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
      EXPECT_EQ(choice.algorithm, Algorithm::allgather);
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
