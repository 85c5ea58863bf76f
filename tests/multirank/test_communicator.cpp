// The public Communicator under mpirun (np 1..5): results of every codec through algo=auto,
// f16 / bf16 tensors, averages, stats, the mismatch check, error feedback through the
// collective over many steps, corrupted messages, residual checkpoints, reduce-scatter,
// all-gather and the hierarchical path.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/random_streams.h"
#include "collectives/segment_plan.h"
#include "collectives/job_encoder.h"
#include "collectives/communicator_state.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "error_feedback/residual_store.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;
using collectives::Transport;
using testing::identical_on_all_ranks;
using testing::world_rank;
using testing::world_size;

constexpr std::size_t kCounts[] = {0, 1, 7, 4097, 100003};
constexpr double kUnitRoundoff = 0x1p-24;  // f32 round to nearest

// Every element codec, as the specs the tests run (codec defaults otherwise).
const char* const kCodecSpecs[] = {"none",  "fp16",           "bf16",             "qsgd:bits=4",
                                   "sign",  "topk:ratio=0.01", "randk:ratio=0.01", "terngrad"};

// `codec` (a spec string) with one more option, e.g. ("topk:ratio=0.01", "min_bytes=0").
std::string with_option(const std::string& codec, const std::string& option) {
  if (option.empty()) return codec;
  return codec + (codec.find(':') == std::string::npos ? ":" : ",") + option;
}

std::vector<float> integers(std::size_t count, int rank, std::uint64_t seed, int range = 1000) {
  return testing::integer_contribution(count, rank, seed, range);
}

std::vector<double> exact_integer_sum(std::size_t count, std::uint64_t seed, int range = 1000) {
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < world_size(); ++r) {
    const std::vector<float> values = integers(count, r, seed, range);
    for (std::size_t i = 0; i < count; ++i) sum[i] += values[i];
  }
  return sum;
}

std::vector<float> mpi_allreduce_sum(std::vector<float> values) {
  if (!values.empty())
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  return values;
}

std::uint64_t sum_over_ranks(std::uint64_t value) {
  std::uint64_t total = 0;
  MPI_Allreduce(&value, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

bool same_bytes(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// The result the Communicator must produce, computed without it: the contribution divided by
// P for averages, then MPI_Allreduce when algo=auto and count * 4 < min_bytes, else the flat
// algorithm run directly on a ReduceJob with a fresh residual store (zero residuals: the first
// call of a name, or error feedback off), the tensor id of the name and the name's call number
// `step`. The flat algorithm is spec.algo, or for algo=auto `chosen` (the stats name of what
// the communicator's model chose: ring, sra, allgather, rhd, tree; empty or randk: the codec's
// default).
struct Reference {
  std::vector<float> values;
  CollectiveStats stats;
};

Reference reference_allreduce(MpiTransport& transport, const CompressionSpec& spec,
                              std::vector<float> data, const std::string& name, ReduceOp op,
                              std::uint32_t step = 0, const std::string& chosen = "") {
  Reference reference{std::move(data), {}};
  if (op == ReduceOp::average)
    for (float& value : reference.values) value /= static_cast<float>(transport.size());
  if (spec.algo == Algorithm::auto_select && reference.values.size() * 4 < spec.min_bytes) {
    transport.allreduce_f32_sum(reference.values);
    reference.stats.algorithm = "mpi";
    return reference;
  }
  error_feedback::ResidualStore store(static_cast<std::uint32_t>(transport.size()),
                                      static_cast<std::uint32_t>(transport.rank()), spec.ef_resize);
  const std::unique_ptr<Codec> codec = make_codec(spec);
  const collectives::RandomStream stream = collectives::random_stream_of(spec.seed, name);
  const EncodeContext ctx{stream.key, step, stream.tensor_id, 0};
  collectives::ReduceJob job{transport, *codec, reference.values, name,
                             spec.error_feedback ? &store : nullptr, ctx, reference.stats};
  job.segment_bytes = spec.segment_bytes;  // as the Communicator's make_job sets it
  Algorithm algorithm = spec.algo;
  if (algorithm == Algorithm::auto_select && !chosen.empty() && chosen != "randk")
    algorithm = CompressionSpec::parse("none:algo=" + chosen).algo;
  collectives::run_flat_allreduce(job, algorithm);
  return reference;
}

// Bytes of f32 input per encoded byte the codec reaches on long chunks, from its payload
// layout (compressors/*.cpp): an upper bound of CollectiveStats::compression_ratio, which
// headers and per-bucket scales only lower.
double nominal_ratio(CodecKind codec) {
  switch (codec) {
    case CodecKind::fp16:
    case CodecKind::bf16: return 2.0;
    case CodecKind::qsgd: return 8.0;     // 4 bits per element (bits=4)
    case CodecKind::sign: return 32.0;    // 1 bit per element
    case CodecKind::terngrad: return 20.0;  // 5 elements per byte
    case CodecKind::topk: return 50.0;    // k = 1% of n entries of u32 index + f32 value
    case CodecKind::randk: return 100.0;  // k = 1% of n f32 values, shared-seed indices
    default: return 1.0;
  }
}

// What algo=auto may choose for `spec`'s codec (collectives/cost_model.h auto_candidates), by
// stats name, in the model's order.
std::vector<std::string> auto_choices(const CompressionSpec& spec) {
  std::vector<std::string> names;
  for (collectives::AlgorithmId candidate : collectives::auto_candidates(spec.codec))
    names.emplace_back(collectives::algorithm_id_name(candidate));
  return names;
}

bool is_auto_choice(const CompressionSpec& spec, const std::string& algorithm) {
  const std::vector<std::string> names = auto_choices(spec);
  return std::find(names.begin(), names.end(), algorithm) != names.end();
}

// Stats every call must satisfy, summed over ranks where a single rank's share depends on the
// algorithm's schedule. Collective.
void expect_consistent_stats(const CollectiveStats& stats, const CompressionSpec& spec,
                             std::size_t count, const std::string& algorithm) {
  EXPECT_EQ(stats.algorithm, algorithm);
  EXPECT_EQ(stats.spec, spec.to_string());
  EXPECT_EQ(stats.count, count);
  EXPECT_EQ(stats.ranks, world_size());
  EXPECT_EQ(stats.sent_bytes(),
            stats.sent_header_bytes + stats.sent_index_bytes + stats.sent_payload_bytes);
  EXPECT_GE(stats.total_seconds, stats.encode_seconds);
  EXPECT_GE(stats.total_seconds, stats.communicate_seconds);
  EXPECT_GE(stats.total_seconds, stats.decode_seconds);
  EXPECT_FALSE(stats.to_string().empty());
  // Every byte one rank sends, another receives.
  const std::uint64_t sent = sum_over_ranks(stats.sent_bytes());
  const std::uint64_t received = sum_over_ranks(stats.received_bytes);
  EXPECT_EQ(sent, received) << stats.to_string();
  if (algorithm == "mpi") {
    EXPECT_EQ(sent, 0u);
    EXPECT_EQ(stats.compression_ratio, 1.0);
    EXPECT_NE(stats.note, "");
    return;
  }
  if (world_size() == 1) {
    EXPECT_EQ(sent, 0u) << "one rank sends nothing";
  }
  // (The tree's ranks send f32 partial sums; only rank 0 encodes, once: no per-rank ratio.)
  if (count >= 100000 && algorithm.find("->") == std::string::npos && algorithm != "tree") {
    // Long chunks: the ratio is within 10% below the codec's nominal ratio (headers and
    // scales cost at most: fp16 32 B per 20000-element chunk; qsgd 4 B scale per 256 B bucket
    // (1.5%); sign 4 B per 64 B bucket (6%); top-k / random-k ceil(0.01 n) entries).
    const double nominal = nominal_ratio(spec.codec);
    EXPECT_LE(stats.compression_ratio, nominal) << stats.to_string();
    EXPECT_GE(stats.compression_ratio, 0.9 * nominal) << stats.to_string();
  }
}

TEST(Communicator, NoneEqualsTheExactSumAndMpiAllreduce) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  // algo=auto (the model chooses among exact algorithms for codec none) and the ring pinned.
  for (const char* text : {"none", "none:min_bytes=0", "none:algo=ring,min_bytes=0"}) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << text << " count=" << count);
      std::vector<float> data = integers(count, world_rank(), count + 1);
      const std::vector<float> by_mpi = mpi_allreduce_sum(data);
      const CollectiveStats stats = comm.allreduce(host_view(data.data(), count), "t", spec);
      const std::vector<double> exact = exact_integer_sum(count, count + 1);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], exact[i]) << "element " << i;
      EXPECT_TRUE(same_bytes(data, by_mpi));
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
      const bool small = spec.algo == Algorithm::auto_select && count * 4 < spec.min_bytes;
      if (!small && spec.algo == Algorithm::auto_select) {
        EXPECT_TRUE(world_size() == 1 ? stats.algorithm == "ring" : is_auto_choice(spec, stats.algorithm))
            << stats.to_string();
      }
      expect_consistent_stats(stats, spec, count, small ? "mpi" : stats.algorithm);
      if (stats.algorithm == "ring") {
        // The ring sends each of the P chunks P - 1 times in each of its two phases, as S
        // segment messages (collectives/segment_plan.h; 1 for small chunks and below
        // kMinRanksForPipelinedRing ranks) of a 32-byte header each, none codec payload = 4
        // bytes per element.
        std::vector<std::size_t> chunks;
        for (int c = 0; c < ranks; ++c)
          chunks.push_back(collectives::shard_begin(count, ranks, c + 1) -
                           collectives::shard_begin(count, ranks, c));
        const auto none = make_codec(spec);
        const std::uint64_t segments =
            ranks < collectives::kMinRanksForPipelinedRing
                ? 1
                : collectives::segments_per_chunk(*none, chunks, spec.segment_bytes,
                                                  collectives::kMaxRingSegmentsPerChunk);
        EXPECT_EQ(sum_over_ranks(stats.sent_payload_bytes), 2u * (ranks - 1) * 4u * count);
        EXPECT_EQ(sum_over_ranks(stats.sent_header_bytes),
                  2u * static_cast<unsigned>(ranks * (ranks - 1)) * segments * 32u);
        EXPECT_EQ(stats.sent_index_bytes, 0u);
      }
    }
  }
}

TEST(Communicator, EveryCodecThroughAutoIsItsAlgorithmRunDirectly) {
  Communicator comm = Communicator::world();
  MpiTransport transport(MPI_COMM_WORLD);
  for (const char* codec : kCodecSpecs) {
    for (const bool small_tensors_compressed : {false, true}) {
      const std::string text =
          with_option(codec, small_tensors_compressed ? "min_bytes=0" : "");
      const CompressionSpec spec = CompressionSpec::parse(text);
      for (std::size_t count : kCounts) {
        // The large count once per codec (it dominates the run time at 5 ranks on 2 cores).
        if (count > 10000 && small_tensors_compressed) continue;
        SCOPED_TRACE(::testing::Message() << text << " count=" << count);
        // A name per (spec, count): every call is the first of its name (step 0, zero residual),
        // like the reference.
        const std::string name = text + "/" + std::to_string(count);
        const std::vector<float> input = testing::gaussian_contribution(count, world_rank(), count);
        std::vector<float> data = input;
        const CollectiveStats stats = comm.allreduce(host_view(data.data(), count), name, spec);
        // The model's choice (one of the codec's candidates; the default at one rank), run
        // directly, gives the same bytes.
        const Reference reference =
            reference_allreduce(transport, spec, input, name, ReduceOp::sum, 0, stats.algorithm);
        if (stats.algorithm != "mpi" && spec.codec != CodecKind::randk) {
          EXPECT_TRUE(world_size() == 1 ? stats.algorithm == auto_choices(spec).front()
                                        : is_auto_choice(spec, stats.algorithm))
              << stats.to_string();
          if (world_size() > 1) {
            EXPECT_NE(stats.note.find("auto: model ms: "), std::string::npos) << stats.note;
          }
        }
        EXPECT_TRUE(same_bytes(data, reference.values));
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
        expect_consistent_stats(stats, spec, count, reference.stats.algorithm);
        EXPECT_EQ(stats.sent_bytes(), reference.stats.sent_bytes());
        EXPECT_EQ(stats.sent_index_bytes, reference.stats.sent_index_bytes);
        EXPECT_EQ(stats.received_bytes, reference.stats.received_bytes);
        if (spec.codec == CodecKind::topk && world_size() > 1 && stats.algorithm == "sparse") {
          // This rank's message, received by the P - 1 others, has k u32 indices.
          EXPECT_EQ(stats.sent_index_bytes, (world_size() - 1) * 4 * spec.k_for(count));
        }
      }
    }
  }
}

TEST(Communicator, RandomStreamsAreKeyedBySeedNameAndCallNumber) {
  Communicator comm = Communicator::world();
  MpiTransport transport(MPI_COMM_WORLD);
  constexpr std::size_t kCount = 4097;
  const std::vector<float> input = testing::gaussian_contribution(kCount, world_rank(), 77);
  // qsgd's stochastic rounding and random-k's indices draw from (seed, step, tensor id).
  for (const char* text : {"qsgd:bits=2,min_bytes=0,algo=sra", "randk:ratio=0.05,ef=off,min_bytes=0"}) {
    SCOPED_TRACE(text);
    const CompressionSpec spec = CompressionSpec::parse(text);
    // Names per spec: the call number counts every call of a name, whatever its spec.
    const std::string name = std::string("keyed/") + text;
    std::vector<std::vector<float>> outputs;
    for (std::uint32_t step = 0; step < 3; ++step) {
      std::vector<float> data = input;
      comm.allreduce(host_view(data.data(), kCount), name, spec);
      const Reference reference = reference_allreduce(transport, spec, input, name, ReduceOp::sum, step);
      EXPECT_TRUE(same_bytes(data, reference.values)) << "call " << step;
      outputs.push_back(std::move(data));
    }
    // The same input gives other draws at every call of the name ...
    EXPECT_FALSE(same_bytes(outputs[0], outputs[1]));
    EXPECT_FALSE(same_bytes(outputs[1], outputs[2]));
    // ... and under another name or seed, at the same call number.
    std::vector<float> other_name = input;
    comm.allreduce(host_view(other_name.data(), kCount), name + "/other", spec);
    EXPECT_FALSE(same_bytes(other_name, outputs[0]));
    CompressionSpec reseeded = spec;
    reseeded.seed = 12345;
    std::vector<float> other_seed = input;
    comm.allreduce(host_view(other_seed.data(), kCount), name + "/reseeded", reseeded);
    const Reference reseeded_reference =
        reference_allreduce(transport, reseeded, input, name + "/reseeded", ReduceOp::sum);
    EXPECT_TRUE(same_bytes(other_seed, reseeded_reference.values));
    EXPECT_FALSE(same_bytes(other_seed, outputs[0]));
  }
}

TEST(Communicator, HalfPrecisionTensorsAreReducedInF32AndRoundedBack) {
  Communicator comm = Communicator::world();
  MpiTransport transport(MPI_COMM_WORLD);
  // Small integers are exact in both formats as long as every sum is: f16 holds integers up
  // to 2048 (range 400, |sum| <= 5 * 400), bf16 up to 256 (range 50, |sum| <= 250).
  for (DType dtype : {DType::f16, DType::bf16}) {
    const int range = dtype == DType::f16 ? 400 : 50;
    for (const char* text : {"none", "none:min_bytes=0"}) {
      for (std::size_t count : kCounts) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << text << " count=" << count);
        testing::HostTensor tensor(dtype, integers(count, world_rank(), count + 7, range));
        comm.allreduce(tensor.view(), "half", CompressionSpec::parse(text));
        const std::vector<double> exact = exact_integer_sum(count, count + 7, range);
        for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(tensor.at(i), exact[i]) << "element " << i;
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(tensor.to_f32())));
      }
    }
  }
  // A lossy codec on an f16 tensor: the f32 algorithm on the widened values, rounded back to
  // nearest even.
  const CompressionSpec spec = CompressionSpec::parse("fp16:min_bytes=0,algo=ring");
  for (std::size_t count : kCounts) {
    SCOPED_TRACE(::testing::Message() << "fp16 codec on f16 tensor, count=" << count);
    const std::string name = "f16-tensor/" + std::to_string(count);
    testing::HostTensor tensor(DType::f16, testing::gaussian_contribution(count, world_rank(), 3));
    const Reference reference = reference_allreduce(transport, spec, tensor.to_f32(), name, ReduceOp::sum);
    comm.allreduce(tensor.view(), name, spec);
    const testing::HostTensor expected(DType::f16, reference.values);
    for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(tensor.at(i), expected.at(i)) << "element " << i;
  }
}

TEST(Communicator, AverageDividesEachContributionBeforeSumming) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  for (const char* text : {"none", "none:min_bytes=0"}) {
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << text << " count=" << count);
      std::vector<float> data = testing::gaussian_contribution(count, world_rank(), 11);
      comm.allreduce(host_view(data.data(), count), "avg", CompressionSpec::parse(text),
                     ReduceOp::average);
      // Each rank contributes y_r = fl(x_r / P) = (x_r / P)(1 + d_r), |d_r| <= u, and the P
      // values are summed in f32 in some order: recursive summation adds at most
      // (P - 1) u sum_r |y_r| (first order). So
      //   |out - sum_r x_r / P| <= u sum_r |x_r| / P + (P - 1) u (1 + u) sum_r |x_r| / P
      //                         <= P u (1 + u) sum_r |x_r| / P,
      // with a 1% margin for the second-order terms.
      std::vector<double> exact(count, 0.0), magnitude(count, 0.0);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> x = testing::gaussian_contribution(count, r, 11);
        for (std::size_t i = 0; i < count; ++i) {
          exact[i] += static_cast<double>(x[i]) / ranks;
          magnitude[i] += std::fabs(static_cast<double>(x[i])) / ranks;
        }
      }
      for (std::size_t i = 0; i < count; ++i) {
        const double bound = 1.01 * ranks * kUnitRoundoff * magnitude[i];
        ASSERT_LE(std::fabs(data[i] - exact[i]), bound) << "element " << i;
      }
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
    }
  }
  // Divide before summing: 60000 on every rank is finite in f16 (max 65504), but a sum of two
  // or more is not. The fp16 ring encodes each element at most P times (P - 1 partial sums on
  // the chain, then the owner's result), each of magnitude <= 60000 once divided, and an f16
  // rounding moves a value in [32768, 65504] by at most half its spacing of 32: 16 per encode.
  std::vector<float> large(4097, 60000.0f);
  const CollectiveStats stats =
      comm.allreduce(host_view(large.data(), large.size()), "avg-fp16",
                     CompressionSpec::parse("fp16:min_bytes=0,algo=ring"), ReduceOp::average);
  EXPECT_EQ(stats.algorithm, "ring");
  for (std::size_t i = 0; i < large.size(); ++i)
    ASSERT_LE(std::fabs(large[i] - 60000.0f), 16.0 * ranks) << "element " << i;
}

// A sum beyond an f16 / bf16 tensor's range is written back as +-Inf, as IEEE rounding and
// PyTorch's all-reduce give (a loss scaler then sees the overflow), not clipped to the largest
// finite value; a sum inside the range is exact. At one rank nothing overflows.
TEST(Communicator, HalfPrecisionSumsBeyondTheRangeBecomeInfinity) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    DType dtype;
    float big;  // exact in the dtype; two of them overflow it
  };
  for (const Case& c : {Case{DType::f16, 40000.0f}, Case{DType::bf16, 3.0e38f}}) {
    for (const char* text : {"none", "none:min_bytes=0", "none:min_bytes=0,algo=sra"}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " " << text);
      const testing::HostTensor exact(c.dtype, std::vector<float>{c.big});
      const float big = exact.at(0);  // the value the tensor holds
      // Element 0: +big on every rank; 1: -big; 2: 1 (an exact small sum); the rest zeros, so
      // that the ring and SRA have a chunk per rank.
      std::vector<float> values(64, 0.0f);
      values[0] = big;
      values[1] = -big;
      values[2] = 1.0f;
      testing::HostTensor tensor(c.dtype, values);
      comm.allreduce(tensor.view(), std::string("overflow/") + text, CompressionSpec::parse(text));
      EXPECT_EQ(tensor.at(0), ranks == 1 ? big : inf);
      EXPECT_EQ(tensor.at(1), ranks == 1 ? -big : -inf);
      EXPECT_EQ(tensor.at(2), static_cast<float>(ranks));
      for (std::size_t i = 3; i < values.size(); ++i) ASSERT_EQ(tensor.at(i), 0.0f) << i;
    }
  }
}

// Runs `call` on every rank; `deviant` makes it differently. Expects every rank to throw
// `code` with every fragment of `expected` in its message.
void expect_every_rank_throws(const std::function<void()>& call, ErrorCode code,
                              const std::vector<std::string>& expected) {
  std::string message;
  EXPECT_EQ(testing::error_code_of(call, &message), code);
  for (const std::string& fragment : expected)
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
}

TEST(Communicator, MismatchedCallsThrowOnEveryRankNamingTheRankAndTheField) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Communicator comm = Communicator::world();
  const int rank = world_rank();
  // The deviating rank is chosen by rank 0 and broadcast, so every case has exactly one.
  int deviant = world_size() - 1;
  MPI_Bcast(&deviant, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const bool me = rank == deviant;
  const std::string d = "rank " + std::to_string(deviant) + ": ";
  std::vector<float> data(4097, 1.0f);

  expect_every_rank_throws(
      [&] { comm.allreduce(host_view(data.data(), me ? 4096 : 4097), "layer1.weight", "none"); },
      ErrorCode::size_mismatch,
      {"allreduce of 'layer1.weight'", "ranks disagree on count", d + "4096", ": 4097"});
  expect_every_rank_throws(
      [&] { comm.allreduce(host_view(data.data(), 4097), "layer1.weight", me ? "topk" : "none"); },
      ErrorCode::size_mismatch, {"ranks disagree on spec", d + "'topk:"});
  testing::HostTensor half(DType::f16, data);
  expect_every_rank_throws(
      [&] {
        comm.allreduce(me ? half.view() : host_view(data.data(), 4097), "layer1.weight", "none");
      },
      ErrorCode::size_mismatch, {"ranks disagree on dtype", d + "f16", ": f32"});
  expect_every_rank_throws(
      [&] { comm.allreduce(host_view(data.data(), 4097), me ? "layer2.bias" : "layer1.weight", "none"); },
      ErrorCode::size_mismatch, {"ranks disagree on name", d + "'layer2.bias'", ": 'layer1.weight'"});
  expect_every_rank_throws(
      [&] {
        comm.allreduce(host_view(data.data(), 4097), "layer1.weight", "none",
                       me ? ReduceOp::average : ReduceOp::sum);
      },
      ErrorCode::size_mismatch, {"ranks disagree on reduce op", d + "average"});
  expect_every_rank_throws(
      [&] {
        if (me)
          comm.reduce_scatter(host_view(data.data(), 4097), "layer1.weight", CompressionSpec{});
        else
          comm.allreduce(host_view(data.data(), 4097), "layer1.weight", "none");
      },
      ErrorCode::size_mismatch, {"ranks disagree on collective", d + "reduce_scatter"});

  // A failed check leaves every rank's state as it was: the same call, made alike, now runs
  // (and, being the first call of the name that passed, uses the same step everywhere).
  std::fill(data.begin(), data.end(), 1.0f);
  comm.allreduce(host_view(data.data(), 4097), "layer1.weight", "none");
  for (float value : data) ASSERT_EQ(value, static_cast<float>(world_size()));
}

TEST(Communicator, ArgumentErrorOnOneRankReachesEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  Communicator comm = Communicator::world();
  const int deviant = 1 % world_size();
  const bool me = world_rank() == deviant;
  std::vector<float> data(7, 1.0f);
  const std::string rejected = "rank " + std::to_string(deviant) + " rejected its arguments";
  // The deviant's own error names the problem; the others name the deviant and quote it.
  expect_every_rank_throws([&] { comm.allreduce(host_view(data.data(), 7), me ? "" : "x", "none"); },
                           ErrorCode::invalid_argument,
                           {me ? "tensor name is empty" : rejected, "tensor name is empty"});
  // Names checkpoints reserve (their call numbers would be read back as algo=auto's inputs).
  expect_every_rank_throws(
      [&] { comm.allreduce(host_view(data.data(), 7), me ? "gradzip.auto/link/x" : "x", "none"); },
      ErrorCode::invalid_argument, {me ? "reserve for algo=auto" : rejected, "gradzip.auto/link/x"});
  expect_every_rank_throws(
      [&] { comm.allreduce(host_view(data.data(), 7), "x", me ? "nonsense:ratio=2" : "none"); },
      ErrorCode::invalid_spec, {me ? "nonsense" : rejected});
  TensorView on_device = host_view(data.data(), 7);
  if (me) on_device.device = Device{DeviceKind::cuda, 0};
  // Host memory labelled CUDA: refused as not device memory where CUDA runs, as unsupported
  // where it cannot (no CUDA in the build, or no device).
  expect_every_rank_throws([&] { comm.allreduce(on_device, "x", "none"); },
                           testing::fake_cuda_view_error(), {"CUDA"});
  comm.allreduce(host_view(data.data(), 7), "x", "none");
  for (float value : data) ASSERT_EQ(value, static_cast<float>(world_size()));
}

// ||v||_2 in f64.
double norm(std::span<const double> v) {
  double sum = 0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// A unique file for this rank, removed on destruction.
struct RankFile {
  std::filesystem::path path;
  explicit RankFile(const std::string& stem) {
    int id = static_cast<int>(getpid());
    MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path = std::filesystem::temp_directory_path() /
           (stem + "." + std::to_string(id) + "." + std::to_string(world_rank()) + ".gzef");
  }
  ~RankFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
};

// The sum over ranks of every residual of `name` (worker, plus SRA's owner-side residual placed
// at the owner's shard), read back from a checkpoint the communicator writes. Collective.
std::vector<double> total_residual(const Communicator& comm, const std::string& name, std::size_t count) {
  RankFile file("test_communicator_residuals");
  comm.save_residuals(file.path.string());
  error_feedback::ResidualStore store(static_cast<std::uint32_t>(world_size()),
                                      static_cast<std::uint32_t>(world_rank()), ResizePolicy::error);
  store.load(file.path);
  std::vector<double> total(count, 0.0);
  if (store.contains(name)) {
    const std::span<const float> worker = store.residual(name);
    for (std::size_t i = 0; i < count; ++i) total[i] += worker[i];
  }
  const std::string server = collectives::residual_key(collectives::ResidualRole::sra_server, name);
  if (store.contains(server)) {
    const std::span<const float> owned = store.residual(server);
    const std::size_t begin = collectives::shard_begin(count, world_size(), world_rank());
    for (std::size_t i = 0; i < owned.size(); ++i) total[begin + i] += owned[i];
  }
  MPI_Allreduce(MPI_IN_PLACE, total.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return total;
}

// A fixed sequence of N(0, 1) gradients (rank r, step t: seed 5000 + t) for steps 1..200:
// this rank's gradient and the true average over all ranks (f64).
struct GradientSequence {
  std::vector<std::vector<float>> mine;
  std::vector<std::vector<double>> average;
};

GradientSequence make_gradient_sequence(std::size_t count, int steps) {
  const int ranks = world_size();
  GradientSequence sequence;
  for (int step = 1; step <= steps; ++step) {
    const std::uint64_t seed = 5000 + static_cast<std::uint64_t>(step);
    std::vector<double> average(count, 0.0);
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> g = testing::gaussian_contribution(count, r, seed);
      for (std::size_t i = 0; i < count; ++i) average[i] += static_cast<double>(g[i]) / ranks;
      if (r == world_rank()) sequence.mine.push_back(std::move(g));
    }
    sequence.average.push_back(std::move(average));
  }
  return sequence;
}

struct Drift {
  std::map<int, double> distance;  // ||sum_{t<=T} (out_t - true_t)||_2 at T = 50, 100, 150, 200
  std::vector<double> sum;         // sum_{t<=200} (out_t - true_t)
  double max_magnitude = 0;        // max |out_t|, |true_t| over all steps and elements
};

// The sequence averaged through the communicator step by step: how far the running sum of
// outputs drifts from the running sum of true averages.
Drift run_drift(Communicator& comm, const CompressionSpec& spec, const std::string& name,
                const GradientSequence& sequence) {
  const std::size_t count = sequence.average.front().size();
  Drift drift;
  drift.sum.assign(count, 0.0);
  for (std::size_t t = 0; t < sequence.mine.size(); ++t) {
    std::vector<float> data = sequence.mine[t];
    comm.allreduce(host_view(data.data(), count), name, spec, ReduceOp::average);
    for (std::size_t i = 0; i < count; ++i) {
      drift.sum[i] += data[i] - sequence.average[t][i];
      drift.max_magnitude = std::max({drift.max_magnitude, std::fabs(static_cast<double>(data[i])),
                                      std::fabs(sequence.average[t][i])});
    }
    const int step = static_cast<int>(t) + 1;
    if (step % 50 == 0) drift.distance[step] = norm(drift.sum);
  }
  return drift;
}

TEST(Communicator, ErrorFeedbackKeepsTheRunningSumOnTrack) {
  constexpr std::size_t kCount = 2000;
  const int ranks = world_size();
  const GradientSequence sequence = make_gradient_sequence(kCount, 200);
  for (const char* codec : {"topk:ratio=0.01,algo=sparse", "sign:algo=sra"}) {
    SCOPED_TRACE(codec);
    Communicator comm = Communicator::world();
    const CompressionSpec with_ef = CompressionSpec::parse(std::string(codec) + ",ef=on");
    const CompressionSpec without_ef = CompressionSpec::parse(std::string(codec) + ",ef=off");
    const Drift on = run_drift(comm, with_ef, "ef-on", sequence);
    const Drift off = run_drift(comm, without_ef, "ef-off", sequence);

    // Conservation (error_feedback_codec.h, sra_allreduce.cpp): every step's output is
    // sum_r (g_r / P + e_r^{t-1} - e_r^t) (+ E^{t-1} - E^t for SRA's owner residual), so the
    // drift telescopes to  sum_t (out_t - true_t) = -(sum_r e_r^T + E^T) =: -R,  up to f32
    // rounding. Per step and element there are at most 4 P + 4 roundings (per rank: the
    // division by P, the EF add g + e, the residual update, one add of the decoded sum; the
    // owner's EF add and update), each at most u times a magnitude this rank does not see
    // directly (per-rank residuals, earlier steps). It is bounded here by 4 P (M + max |R|),
    // M = max |out_t|, |true_t|: four times what P ranks' values of the observed size add up
    // to. Over 200 steps: |drift + R| <= 200 (4 P + 4) u 4 P (M + max |R|) (about 1e-2 at
    // P = 5; a residual missing from the sum would leave an error of the size of R, ~1 to 10).
    const std::vector<double> residual = total_residual(comm, "ef-on", kCount);
    double max_residual = 0;
    for (double value : residual) max_residual = std::max(max_residual, std::fabs(value));
    const double rounding = 200.0 * (4 * ranks + 4) * kUnitRoundoff * 4 * ranks *
                            (on.max_magnitude + max_residual);
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_LE(std::fabs(on.sum[i] + residual[i]), rounding) << "element " << i;
    // So the drift is the total residual's norm, which error feedback keeps bounded whatever
    // the step count: from step 100 to step 200 it may not grow by a quarter (a random walk
    // grows by sqrt(2)). Without error feedback the drift is a random walk of what the codec
    // drops each step, sqrt(4) = 2 times longer at step 200 than at step 50 (asserted with
    // margin: 1.5).
    EXPECT_LE(on.distance.at(200), norm(residual) + std::sqrt(kCount) * rounding);
    EXPECT_LE(on.distance.at(200), 1.25 * on.distance.at(100))
        << "EF drift at 50/100/150/200: " << on.distance.at(50) << " " << on.distance.at(100)
        << " " << on.distance.at(150) << " " << on.distance.at(200);
    EXPECT_GE(off.distance.at(200), 1.5 * off.distance.at(50))
        << "no-EF drift at 50/100/150/200: " << off.distance.at(50) << " " << off.distance.at(100)
        << " " << off.distance.at(150) << " " << off.distance.at(200);
    EXPECT_LT(on.distance.at(200), off.distance.at(200));
    if (world_rank() == 0)
      std::printf("[ drift    ] %s P=%d: EF %.1f %.1f %.1f %.1f | no EF %.1f %.1f %.1f %.1f\n",
                  codec, ranks, on.distance.at(50), on.distance.at(100), on.distance.at(150),
                  on.distance.at(200), off.distance.at(50), off.distance.at(100),
                  off.distance.at(150), off.distance.at(200));
  }
}

// A transport that damages every message it receives (point-to-point receives, and the first
// non-empty block of every allgatherv / alltoallv), on every rank alike, so every rank meets a
// bad message in the same step. Metadata (allgather_u64) and f32 sums pass unchanged.
class CorruptingTransport final : public testing::ForwardingTransport {
 public:
  enum class Damage {
    header_count,  // flips the lowest bit of the header's element count (byte 8)
    topk_index,    // sets the top byte of a top-k message's first u32 index: index >= 2^24
  };

  CorruptingTransport(std::unique_ptr<Transport> inner, Damage damage)
      : ForwardingTransport(std::move(inner)), damage_(damage) {}

  std::string describe() const override { return "corrupting " + inner().describe(); }

  Request irecv(int peer, int tag, std::span<std::byte> buffer) override {
    const Request request = inner().irecv(peer, tag, buffer);
    receives_[request.id] = buffer;
    return request;
  }
  std::size_t wait(Request request) override {
    const std::size_t bytes = inner().wait(request);
    if (const auto found = receives_.find(request.id); found != receives_.end()) {
      damage(found->second.first(bytes));
      receives_.erase(found);
    }
    return bytes;
  }
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    inner().allgatherv(mine, all, counts);
    damage_first_block(all, counts);
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    inner().alltoallv(send, send_counts, recv, recv_counts);
    damage_first_block(recv, recv_counts);
  }
  std::unique_ptr<Transport> split(int color, int key) override {
    return std::make_unique<CorruptingTransport>(inner().split(color, key), damage_);
  }
  std::unique_ptr<Transport> split_by_node() override {
    return std::make_unique<CorruptingTransport>(inner().split_by_node(), damage_);
  }

  int damaged() const { return damaged_; }

 private:
  void damage_first_block(std::span<std::byte> all, std::span<const std::size_t> counts) {
    std::size_t offset = 0;
    for (std::size_t count : counts) {
      if (count > 0) return damage(all.subspan(offset, count));
      offset += count;
    }
  }
  void damage(std::span<std::byte> message) {
    if (message.size() < 36) return;
    if (damage_ == Damage::header_count) {
      message[8] ^= std::byte{1};
      ++damaged_;
    } else if (message[5] == std::byte{6} /* WireCodec::topk */) {
      message[35] = std::byte{0xFF};
      ++damaged_;
    }
  }

  Damage damage_;
  std::map<std::size_t, std::span<std::byte>> receives_;
  int damaged_ = 0;
};

TEST(Communicator, CorruptedMessagesThrowMalformedMessageOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "one rank receives no message";
  struct Case {
    const char* spec;
    CorruptingTransport::Damage damage;
  };
  // ring (none), SRA (qsgd), sparse all-reduce (topk), shared-index (randk), header damage;
  // top-k with a damaged index.
  for (const Case& c : {Case{"none:min_bytes=0,algo=ring", CorruptingTransport::Damage::header_count},
                        Case{"qsgd:min_bytes=0,algo=sra", CorruptingTransport::Damage::header_count},
                        Case{"topk:min_bytes=0,algo=sparse", CorruptingTransport::Damage::header_count},
                        Case{"randk:min_bytes=0", CorruptingTransport::Damage::header_count},
                        Case{"topk:min_bytes=0,algo=sparse", CorruptingTransport::Damage::topk_index}}) {
    SCOPED_TRACE(::testing::Message() << c.spec << (c.damage == CorruptingTransport::Damage::topk_index
                                                        ? " (index)"
                                                        : " (header)"));
    auto transport = std::make_unique<CorruptingTransport>(
        std::make_unique<MpiTransport>(MPI_COMM_WORLD), c.damage);
    const CorruptingTransport& corrupting = *transport;
    Communicator comm = collectives::make_communicator(std::move(transport));
    std::vector<float> data = testing::gaussian_contribution(4097, world_rank(), 1);
    std::string message;
    EXPECT_EQ(testing::error_code_of(
                  [&] { comm.allreduce(host_view(data.data(), data.size()), "bad", c.spec); },
                  &message),
              ErrorCode::malformed_message);
    EXPECT_GT(corrupting.damaged(), 0);
    EXPECT_FALSE(message.empty());
  }
}

TEST(Communicator, ResidualsSurviveACheckpointRoundTrip) {
  constexpr std::size_t kCount = 4097;
  // top-k (worker residuals) and sign through SRA (worker and owner-side residuals); both
  // codecs are deterministic, so a restored communicator continues bit for bit.
  for (const char* text : {"topk:ratio=0.01,min_bytes=0", "sign:min_bytes=0"}) {
    SCOPED_TRACE(text);
    const CompressionSpec spec = CompressionSpec::parse(text);
    ASSERT_TRUE(spec.error_feedback);
    RankFile file("test_communicator_checkpoint");
    Communicator original = Communicator::world();
    for (int step = 0; step < 3; ++step) {
      std::vector<float> data = testing::gaussian_contribution(kCount, world_rank(), 40 + step);
      original.allreduce(host_view(data.data(), kCount), "w", spec);
    }
    original.save_residuals(file.path.string());

    Communicator restored = Communicator::world();
    restored.load_residuals(file.path.string());
    std::vector<float> next = testing::gaussian_contribution(kCount, world_rank(), 99);
    std::vector<float> again = next;
    original.allreduce(host_view(next.data(), kCount), "w", spec);
    restored.allreduce(host_view(again.data(), kCount), "w", spec);
    EXPECT_TRUE(same_bytes(next, again));

    // A fresh communicator without the residuals gives another result.
    Communicator forgetful = Communicator::world();
    std::vector<float> fresh = testing::gaussian_contribution(kCount, world_rank(), 99);
    forgetful.allreduce(host_view(fresh.data(), kCount), "w", spec);
    EXPECT_FALSE(same_bytes(next, fresh));
  }
}

TEST(Communicator, ReduceScatterShardsAreSlicesOfTheExactAllreduce) {
  Communicator comm = Communicator::world();
  const int rank = world_rank(), ranks = world_size();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const int range = dtype == DType::f32 ? 1000 : 50;
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " count=" << count);
      testing::HostTensor tensor(dtype, integers(count, rank, count + 3, range));
      const CollectiveStats stats = comm.reduce_scatter(tensor.view(), "rs", CompressionSpec{});
      EXPECT_EQ(stats.algorithm, "ring");
      const std::vector<double> exact = exact_integer_sum(count, count + 3, range);
      const std::size_t begin = comm.shard_begin(count, rank), end = comm.shard_begin(count, rank + 1);
      // Shards are floor(r n / P) apart: uneven when P does not divide n.
      EXPECT_EQ(begin, count * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks));
      for (std::size_t i = begin; i < end; ++i) ASSERT_EQ(tensor.at(i), exact[i]) << "element " << i;
    }
  }
  // A lossy codec through SRA's first half: the shard equals the direct sra_reduce_scatter's.
  MpiTransport transport(MPI_COMM_WORLD);
  const CompressionSpec sign = CompressionSpec::parse("sign:ef=off");
  for (std::size_t count : kCounts) {
    SCOPED_TRACE(::testing::Message() << "sign count=" << count);
    std::vector<float> data = testing::gaussian_contribution(count, rank, 8);
    std::vector<float> direct = data;
    const CollectiveStats stats = comm.reduce_scatter(host_view(data.data(), count), "rs-sign", sign);
    EXPECT_EQ(stats.algorithm, "sra");
    const std::unique_ptr<Codec> codec = make_codec(sign);
    CollectiveStats direct_stats;
    collectives::ReduceJob job{transport, *codec, direct, "rs-sign", nullptr,
                               EncodeContext{collectives::random_stream_of(0, "rs-sign").key, 0,
                                             collectives::random_stream_of(0, "rs-sign").tensor_id, 0}, direct_stats};
    collectives::sra_reduce_scatter(job);
    const std::size_t begin = comm.shard_begin(count, rank), end = comm.shard_begin(count, rank + 1);
    EXPECT_TRUE(same_bytes(std::span<const float>(data).subspan(begin, end - begin),
                           std::span<const float>(direct).subspan(begin, end - begin)));
  }
}

TEST(Communicator, AllgatherDeliversEveryShardToEveryRank) {
  Communicator comm = Communicator::world();
  const int rank = world_rank(), ranks = world_size();
  for (const char* text : {"none", "fp16"}) {
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << text << " count=" << count);
      // Rank r's shard holds values of rank r's N(0, 1) draw; the rest of the tensor is NaN
      // and must be overwritten.
      std::vector<float> data(count, std::nanf(""));
      std::vector<std::vector<float>> owner_data(static_cast<std::size_t>(ranks));
      for (int r = 0; r < ranks; ++r) owner_data[r] = testing::gaussian_contribution(count, r, 21);
      for (std::size_t i = comm.shard_begin(count, rank); i < comm.shard_begin(count, rank + 1); ++i)
        data[i] = owner_data[rank][i];
      const CollectiveStats stats =
          comm.allgather(host_view(data.data(), count), "params", CompressionSpec::parse(text));
      EXPECT_EQ(stats.algorithm, "allgather");
      // none: the owners' values exactly; fp16: rounded to f16 (nearest even) and back.
      for (int r = 0; r < ranks; ++r) {
        for (std::size_t i = comm.shard_begin(count, r); i < comm.shard_begin(count, r + 1); ++i) {
          float expected = owner_data[r][i];
          if (std::strcmp(text, "fp16") == 0) {
            std::uint16_t half = 0;
            kernels::cpu::f32_to_f16(&expected, &half, 1);
            kernels::cpu::f16_to_f32(&half, &expected, 1);
          }
          ASSERT_EQ(data[i], expected) << "element " << i << " of rank " << r << "'s shard";
        }
      }
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
    }
  }
}

TEST(Communicator, HierarchicalEqualsTheFlatResultForNone) {
  Communicator comm = Communicator::world();
  for (const char* text : {"none:algo=hier,ranks_per_node=2", "none:algo=hier,ranks_per_node=0"}) {
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << text << " count=" << count);
      std::vector<float> hier = integers(count, world_rank(), count + 5);
      std::vector<float> flat = hier;
      const CollectiveStats stats =
          comm.allreduce(host_view(hier.data(), count), "h", CompressionSpec::parse(text));
      comm.allreduce(host_view(flat.data(), count), "f", CompressionSpec::parse("none:algo=ring"));
      EXPECT_EQ(stats.algorithm, "hier/ring");
      EXPECT_TRUE(same_bytes(hier, flat));
      const std::vector<double> exact = exact_integer_sum(count, count + 5);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(hier[i], exact[i]) << "element " << i;
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(hier)));
    }
  }
}

TEST(Communicator, WarmupCallsRunUncompressed) {
  Communicator comm = Communicator::world();
  const CompressionSpec spec = CompressionSpec::parse("topk:ratio=0.01,min_bytes=0,warmup=2,algo=sparse");
  const std::vector<double> exact = exact_integer_sum(4097, 9);
  for (int call = 0; call < 3; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call);
    std::vector<float> data = integers(4097, world_rank(), 9);
    const CollectiveStats stats = comm.allreduce(host_view(data.data(), data.size()), "warm", spec);
    if (call < 2) {
      // The first two calls of the name are dense and exact, and leave no residual behind.
      EXPECT_EQ(stats.algorithm, "mpi");
      EXPECT_NE(stats.note.find("warm-up call " + std::to_string(call + 1) + " of 2"),
                std::string::npos) << stats.note;
      for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], exact[i]) << "element " << i;
    } else {
      EXPECT_EQ(stats.algorithm, "sparse");
      // Top-k of 1% keeps at most P * 41 of the 4097 sums.
      const auto nonzero = std::count_if(data.begin(), data.end(), [](float v) { return v != 0; });
      EXPECT_LE(nonzero, static_cast<std::ptrdiff_t>(world_size() * spec.k_for(4097)));
    }
  }
  // Reduce-scatter warms up with the dense ring: exact shards.
  std::vector<float> data = integers(4097, world_rank(), 9);
  const CollectiveStats stats = comm.reduce_scatter(host_view(data.data(), data.size()), "warm-rs", spec);
  EXPECT_EQ(stats.algorithm, "ring");
  for (std::size_t i = comm.shard_begin(4097, world_rank()); i < comm.shard_begin(4097, world_rank() + 1); ++i)
    ASSERT_EQ(data[i], exact[i]) << "element " << i;
}

TEST(Communicator, DefaultSpecComesFromOptionsOrGradzipCompressor) {
  CommunicatorOptions options;
  options.default_spec = "fp16:min_bytes=0,algo=ring";
  Communicator comm = Communicator::world(options);
  EXPECT_EQ(comm.default_spec(), CompressionSpec::parse("fp16:min_bytes=0,algo=ring"));
  std::vector<float> data = integers(4097, world_rank(), 2, 100);
  const CollectiveStats stats = comm.allreduce(host_view(data.data(), data.size()), "default");
  EXPECT_EQ(stats.spec, CompressionSpec::parse("fp16:min_bytes=0,algo=ring").to_string());
  EXPECT_EQ(stats.algorithm, "ring");
  const std::string line = stats.to_string();
  EXPECT_NE(line.find("ring"), std::string::npos) << line;
  EXPECT_NE(line.find("count=4097"), std::string::npos) << line;
  EXPECT_NE(line.find("sent=" + std::to_string(stats.sent_bytes()) + " B"), std::string::npos) << line;

  // GRADZIP_COMPRESSOR, when set, wins over the options.
  ASSERT_EQ(setenv("GRADZIP_COMPRESSOR", "bf16:min_bytes=4", 1), 0);
  Communicator from_environment = Communicator::world(options);
  unsetenv("GRADZIP_COMPRESSOR");
  EXPECT_EQ(from_environment.default_spec(), CompressionSpec::parse("bf16:min_bytes=4"));

  options.default_spec = "fp17";
  EXPECT_EQ(testing::error_code_of([&] { Communicator::world(options); }), ErrorCode::invalid_spec);
}

}  // namespace
}  // namespace gradzip
