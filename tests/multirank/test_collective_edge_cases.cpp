// Numerical edge cases of the collectives, through
// gradzip::Communicator::world() at any rank count (ctest runs 1..5): all-zero tensors with
// every codec and every algorithm, f16-range values whose sum over ranks overflows f16 under
// ReduceOp::average, top-k / random-k ratios with ratio * n < 1 (k_for gives 1), ties in top-k
// across ranks, and tensors with fewer elements than ranks. Every expected value is exact or a
// bound derived in the comment above its check; every result must be byte-identical on all
// ranks. Each call uses a fresh tensor name, so error feedback (on by default for sign, top-k
// and random-k) starts from a zero residual and the result is the plain compressed reduction.
#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using testing::HostTensor;
using testing::identical_on_all_ranks;
using testing::world_rank;
using testing::world_size;

using testing::kAllCodecs;
// "auto" runs with min_bytes=0 so that small tensors take the codec's own algorithm instead of
// the uncompressed MPI all-reduce.
const char* const kAlgorithms[] = {"auto", "ring", "sra", "sparse", "hier", "rhd", "tree"};

std::string with_options(const std::string& codec, const std::string& options) {
  return codec + (codec.find(':') == std::string::npos ? ":" : ",") + options;
}
std::string spec_for(const std::string& codec, const std::string& algo) {
  return with_options(codec, algo == "auto" ? "min_bytes=0" : "algo=" + algo);
}

// A fresh tensor name for every call (same sequence on every rank).
std::string fresh_name() {
  static int counter = 0;
  return "edge." + std::to_string(counter++);
}

// -------------------------------------------------------------------------------------------
// All-zero tensors.
// -------------------------------------------------------------------------------------------

// Zeros on every rank, every codec, every algorithm, sum and average, counts below and above
// the rank count: every codec decodes +0 to +0 (tests/unit/test_edge_cases.cpp), f32 adds of
// +0 give +0 and 0 / P = +0, so the result is +0 bit for bit, with no NaN from a 0/0 scale.
TEST(CollectiveEdgeCases, ZerosGiveZerosWithEveryCodecAndAlgorithm) {
  Communicator comm = Communicator::world();
  const std::size_t counts[] = {1, 3, 7, 1000};
  for (const char* codec : kAllCodecs) {
    for (const char* algo : kAlgorithms) {
      const std::string spec = spec_for(codec, algo);
      for (const std::size_t n : counts) {
        for (const ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
          SCOPED_TRACE(spec + " n=" + std::to_string(n) +
                       (op == ReduceOp::sum ? " sum" : " average"));
          std::vector<float> data(n, 0.0f);
          const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), fresh_name(), spec, op);
          EXPECT_TRUE(testing::same_bits(data, std::vector<float>(n, 0.0f))) << stats.to_string();
        }
      }
      // 16-bit tensors: +0 in, +0 out.
      for (const DType dtype : {DType::f16, DType::bf16}) {
        SCOPED_TRACE(spec + " " + std::string(dtype_name(dtype)));
        HostTensor tensor(dtype, std::vector<float>(7, 0.0f));
        comm.allreduce(tensor.view(), fresh_name(), spec, ReduceOp::average);
        EXPECT_TRUE(testing::same_bits(tensor.to_f32(), std::vector<float>(7, 0.0f)));
      }
    }
  }
}

// -------------------------------------------------------------------------------------------
// Values near the f16 maximum under ReduceOp::average with fp16.
// -------------------------------------------------------------------------------------------

// Rank r's element i, every value in [32768, 65504] in magnitude and a multiple of 32 (exact in
// f16): so for P >= 2 ranks the f16 sum of same-signed elements overflows (>= 65536 > 65504),
// while the average stays within f16's range. Patterns by i % 4: 65504 on every rank; -65504 on
// every rank; 65504 - 32 ((i + 13 r) % 64) on every rank (all positive, differing); the same
// magnitude with the sign of (-1)^r (cancelling).
float near_max_value(std::size_t i, int r) {
  const float varied = 65504.0f - 32.0f * static_cast<float>((i + 13 * static_cast<std::size_t>(r)) % 64);
  switch (i % 4) {
    case 0: return 65504.0f;
    case 1: return -65504.0f;
    case 2: return varied;
    default: return r % 2 ? -varied : varied;
  }
}

// average = sum_r x_r / P. Each rank divides by P before encoding (ReduceOp::average), so every
// value any algorithm encodes is a partial sum of the y_r = x_r / P, bounded in magnitude by
// S = sum_r |x_r| / P <= 65504 (up to the accumulated errors below), and f16 rounds it to at
// most 65504: no Inf. Error: an fp16 encode of v errs by at most 2^-11 |v| (v in f16's normal
// range) or 2^-25 (subnormal; negligible against the bound). The ring encodes P partial sums
// along a chunk's chain (P - 1 hops plus the all-gather), SRA 2 (the shards and the reduced
// shard), the sparse all-reduce 1 per rank (the sum of those is <= 2^-11 P S), hier within one
// node none or one of the above. So |result - average| <= (P + 1) 2^-11 S + 2^-16 S (second
// order terms and f32 adds), plus 2^-11 |average| when the tensor is f16 (the final rounding),
// and the result is finite: on the wire every narrowing saturates. An f16 TENSOR is written
// with IEEE rounding (kernels/cast_math.h, as PyTorch writes it), so there an element may be
// +-Inf, but only where a value inside the bound reaches f16's overflow threshold 65520 (the
// codec's rounding error, not the data, crossed it), and with the average's sign.
// Runs the average of near_max_value over every rank with spec fp16 + `algo` on a tensor of
// `dtype` and checks the bound above on every element.
void check_near_max_average(Communicator& comm, const std::string& algo, DType dtype) {
  const int ranks = world_size();
  const std::size_t n = 1001;
  std::vector<double> average(n, 0.0);
  std::vector<double> spread(n, 0.0);  // S
  for (std::size_t i = 0; i < n; ++i) {
    for (int r = 0; r < ranks; ++r) {
      average[i] += near_max_value(i, r);
      spread[i] += std::fabs(near_max_value(i, r));
    }
    average[i] /= ranks;
    spread[i] /= ranks;
  }
  const std::string spec = spec_for("fp16", algo);
  SCOPED_TRACE(spec + " " + std::string(dtype_name(dtype)) + " ranks=" + std::to_string(ranks));
  std::vector<float> mine(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = near_max_value(i, world_rank());
  HostTensor tensor(dtype, mine);
  const CollectiveStats stats = comm.allreduce(tensor.view(), fresh_name(), spec, ReduceOp::average);
  const std::vector<float> result = tensor.to_f32();
  EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(result)));
  // One failure per call (how many elements are bad, the first one), so that every algorithm
  // and dtype is reported.
  std::size_t bad = 0;
  std::size_t first_bad = n;
  for (std::size_t i = 0; i < n; ++i) {
    const double bound = ((ranks + 1) * 0x1p-11 + 0x1p-16) * spread[i] +
                         (dtype == DType::f16 ? 0x1p-11 * std::fabs(average[i]) : 0.0);
    // !(error <= bound) also catches Inf and NaN.
    const bool close = std::isfinite(result[i]) && std::fabs(result[i] - average[i]) <= bound;
    const bool rounded_to_inf = dtype == DType::f16 && std::isinf(result[i]) &&
                                (result[i] > 0) == (average[i] > 0) &&
                                std::fabs(average[i]) + bound >= 65520.0;
    if (!close && !rounded_to_inf) {
      if (bad++ == 0) first_bad = i;
    }
  }
  EXPECT_EQ(bad, 0u) << bad << " bad, first bad element " << first_bad << ": "
                     << (first_bad < n ? result[first_bad] : 0.0f) << " vs exact "
                     << (first_bad < n ? average[first_bad] : 0.0) << "; " << stats.to_string();
}

TEST(CollectiveEdgeCases, Fp16AverageOfNearMaxValuesIsFiniteAndClose) {
  Communicator comm = Communicator::world();
  for (const char* algo : {"auto", "ring", "hier"}) {
    for (const DType dtype : {DType::f32, DType::f16}) check_near_max_average(comm, algo, dtype);
  }
  check_near_max_average(comm, "sparse", DType::f32);
}

// The same check for SRA (f32 and f16 tensors) and the sparse all-reduce into an f16 tensor.
// The elements equal to +-65504 on every rank are the hard case: each rank encodes
// y = 65504 / P, which f16 rounds up for P = 3 (21834.67 -> 21840) and P = 5 (13100.8 ->
// 13104), so the sum of the P decoded values is 65520 = P * f16(65504 / P), f16's IEEE
// overflow threshold. SRA re-encodes that reduced shard in fp16 (the wire saturates: 65504),
// so its result is 65504, the exact average, at every rank count. The sparse all-reduce adds
// the P decoded values in f32 (65520) and writes that into the f16 tensor with IEEE rounding:
// +-Inf at 3 and 5 ranks, as PyTorch's fp16_compress_hook gives there too; the check above
// allows that only because 65520 lies inside the codec's error bound around 65504.
TEST(CollectiveEdgeCases, Fp16AverageOfMaxValuesThroughSraAndAllgather) {
  Communicator comm = Communicator::world();
  for (const DType dtype : {DType::f32, DType::f16}) check_near_max_average(comm, "sra", dtype);
  check_near_max_average(comm, "sparse", DType::f16);
}

// Values a 16-bit wire type would saturate somewhere in the reduction run uncompressed in f32
// (the wire-range fallback): an fp16 SUM of 40000 (x P ranks) at one element, or a top-k with
// values=fp16 carrying 70000, returns the true f32 sum, not 65504, on every rank, and says so in
// the note; the same values as an AVERAGE (each divided by P first, no partial sum above 40000)
// stay compressed. Integers: every f32 sum is exact.
TEST(CollectiveEdgeCases, ValuesBeyondA16BitWireTypeFallBackToF32InsteadOfSaturating) {
  Communicator comm = Communicator::world();
  const int ranks = world_size(), rank = world_rank();
  const std::size_t n = 40000;  // past min_bytes: the compressed path would run
  const auto input = [&](float peak) {
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((i + static_cast<std::size_t>(rank)) % 7);
    data[5] = peak;
    return data;
  };
  const auto exact_sum = [&](float peak, std::size_t i) {
    if (i == 5) return static_cast<double>(peak) * ranks;
    double total = 0;
    for (int r = 0; r < ranks; ++r) total += static_cast<double>((i + static_cast<std::size_t>(r)) % 7);
    return total;
  };
  for (const char* spec : {"fp16", "fp16:algo=sra", "topk:ratio=1,values=fp16,algo=sparse"}) {
    SCOPED_TRACE(spec);
    const float peak = std::string(spec).starts_with("topk") ? 70000.0f : 40000.0f;
    std::vector<float> data = input(peak);
    const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), std::string("wire.") + spec, spec);
    const bool beyond = peak > 65504.0f / static_cast<float>(ranks);
    EXPECT_EQ(stats.note.find("reduced uncompressed in f32") != std::string::npos, beyond) << stats.note;
    EXPECT_TRUE(testing::identical_on_all_ranks(std::span<const float>(data)));
    if (beyond) {
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(static_cast<double>(data[i]), exact_sum(peak, i)) << "element " << i;
    }
  }
  // As an average, 40000 needs no fallback: every partial sum of values divided by P is at most
  // 40000, inside fp16's range.
  std::vector<float> data = input(40000.0f);
  const CollectiveStats stats =
      comm.allreduce(host_view(data.data(), n), "wire.average", "fp16", ReduceOp::average);
  EXPECT_EQ(stats.note.find("reduced uncompressed"), std::string::npos) << stats.note;
  EXPECT_NEAR(data[5], 40000.0f, 40000.0f * 0x1p-10f * ranks);
}

// -------------------------------------------------------------------------------------------
// k rounding: ratio * n < 1.
// -------------------------------------------------------------------------------------------

// k_for(7) = 1 for ratio=0.001 (ceil(0.007) = 1; k_for never returns 0 for n > 0). Rank r's
// tensor: small positive integers 1 + (i + r) % 3 and one peak 100 + r at index j_r = r % 7.
// Sparse all-reduce (top-k: algo=sparse, or auto when it chose it): every rank keeps its peak
// only, so the result is sum_r (100 + r) e_{j_r}: exact, zero elsewhere. Random-k's shared-index
// path (auto): every rank keeps the same single index j, so the result is sum_r x_r[j] at j and
// 0 elsewhere (exactly one nonzero, since every x_r[j] > 0). Other algorithms (ring, sra, hier,
// and sparse for random-k) keep one entry
// per encoded chunk of a partial sum of positive values, so every result element satisfies
// 0 <= result_i <= sum_r x_r[i], and at least one is > 0 (each nonempty chunk's final encode
// keeps one positive entry).
TEST(CollectiveEdgeCases, RatioBelowOneElementKeepsOne) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  const std::size_t n = 7;
  EXPECT_EQ(CompressionSpec::parse("topk:ratio=0.001").k_for(n), 1u);
  auto value = [](std::size_t i, int r) {
    return i == static_cast<std::size_t>(r) % 7 ? 100.0f + static_cast<float>(r)
                                                 : 1.0f + static_cast<float>((i + static_cast<std::size_t>(r)) % 3);
  };
  std::vector<double> exact(n, 0.0);
  std::vector<double> peaks(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) exact[i] += value(i, r);
    peaks[static_cast<std::size_t>(r) % 7] += 100.0 + r;
  }
  for (const char* codec : {"topk:ratio=0.001", "topk:ratio=0.001,approx=on",
                            "topk:ratio=0.001,values=fp16", "randk:ratio=0.001",
                            "randk:ratio=0.001,values=fp16"}) {
    for (const char* algo : kAlgorithms) {
      const std::string spec = spec_for(codec, algo);
      SCOPED_TRACE(spec);
      std::vector<float> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = value(i, world_rank());
      const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), fresh_name(), spec);
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
      const bool topk = std::string(codec).rfind("topk", 0) == 0;
      // The sparse all-reduce (algo=sparse, or what algo=auto chose) adds every rank's
      // exact top-k.
      if (stats.algorithm == "sparse" && topk) {
        for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(data[i], peaks[i]) << i << " " << stats.to_string();
        continue;
      }
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(data[i]));
        EXPECT_GE(data[i], 0.0f) << i;
        EXPECT_LE(data[i], exact[i]) << i;
        if (data[i] != 0.0f) ++nonzero;
        if (stats.algorithm == "randk" && data[i] != 0.0f) {
          EXPECT_EQ(data[i], exact[i]) << i;
        }
      }
      EXPECT_GE(nonzero, 1u) << stats.to_string();
      if (stats.algorithm == "randk") {
        EXPECT_EQ(nonzero, 1u) << stats.to_string();
      }
    }
  }
}

// -------------------------------------------------------------------------------------------
// Ties in top-k across ranks.
// -------------------------------------------------------------------------------------------

// Every rank's 11 elements have one magnitude, r + 1, with signs (-1)^(i + r): exact top-k
// (k = 3) keeps indices 0, 1, 2 on every rank (lowest indices win), so the sparse all-reduce
// gives sum_r x_r[i] for i < 3 and 0 elsewhere, exactly (small integers), identical on every
// rank. approx=on keeps a prefix of m_r elements, 2 <= m_r <= 3: indices 0 and 1 are exact sums,
// index 2 a partial sum of the ranks' values, indices >= 3 are 0.
TEST(CollectiveEdgeCases, TopkTiesKeepLowestIndicesOnEveryRank) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  const std::size_t n = 11;
  auto value = [](std::size_t i, int r) {
    return static_cast<float>((i + static_cast<std::size_t>(r)) % 2 ? -(r + 1) : (r + 1));
  };
  for (const char* codec : {"topk:k=3", "topk:k=3,values=fp16", "topk:k=3,approx=on"}) {
    const std::string spec = spec_for(codec, "auto");
    SCOPED_TRACE(spec);
    std::vector<float> data(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = value(i, world_rank());
    comm.allreduce(host_view(data.data(), n), fresh_name(), spec);
    EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
    const bool approx = std::string(codec).find("approx") != std::string::npos;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int r = 0; r < ranks; ++r) exact += value(i, r);
      if (i < (approx ? 2u : 3u)) {
        EXPECT_EQ(data[i], exact) << i;
      } else if (i >= 3) {
        EXPECT_EQ(data[i], 0.0f) << i;
      }
    }
  }
}

// -------------------------------------------------------------------------------------------
// Fewer elements than ranks, odd sizes.
// -------------------------------------------------------------------------------------------

// Rank r's element i: the integer ((7 r + 3 i) % 11) - 5 in [-5, 5]. Counts 1, 2, 3 (below the
// rank count at 4 and 5 ranks: some ring / SRA chunks are empty) and 5, 7.
//   none, fp16, bf16, topk:ratio=1 (k = n, fp32 or fp16 values) and randk:ratio=1: every partial
//     sum is an integer of magnitude <= 25, exact in f16 and bf16, so the result is the exact
//     sum (compared as a value: a cancelling sum may be +0 where the f64 sum is 0).
//   every other codec: each decoded element is at most max |v| of the vector encoded (qsgd:
//     <= scale = max |v|; sign: mean |v|; top-k / random-k: a kept value), so by induction over
//     the hops every result element is at most P * M in magnitude, M = 5; and it is finite.
TEST(CollectiveEdgeCases, FewerElementsThanRanks) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  auto value = [](std::size_t i, int r) {
    return static_cast<float>((7 * static_cast<std::size_t>(r) + 3 * i) % 11) - 5.0f;
  };
  std::vector<std::string> codecs(std::begin(kAllCodecs), std::end(kAllCodecs));
  for (const char* extra : {"topk:ratio=1", "topk:ratio=1,values=fp16", "randk:ratio=1",
                            "randk:ratio=1,values=fp16"})
    codecs.emplace_back(extra);
  for (const std::string& codec : codecs) {
    const bool exact_codec = codec == "none" || codec == "fp16" || codec == "bf16" ||
                             codec.find("ratio=1") != std::string::npos;
    for (const char* algo : kAlgorithms) {
      const std::string spec = spec_for(codec, algo);
      for (const std::size_t n : {1u, 2u, 3u, 5u, 7u}) {
        SCOPED_TRACE(spec + " n=" + std::to_string(n));
        std::vector<float> data(n);
        for (std::size_t i = 0; i < n; ++i) data[i] = value(i, world_rank());
        const CollectiveStats stats = comm.allreduce(host_view(data.data(), n), fresh_name(), spec);
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
        for (std::size_t i = 0; i < n; ++i) {
          double exact = 0;
          for (int r = 0; r < ranks; ++r) exact += value(i, r);
          ASSERT_TRUE(std::isfinite(data[i])) << i << " " << stats.to_string();
          if (exact_codec) {
            EXPECT_EQ(data[i], exact) << i << " " << stats.to_string();
          } else {
            EXPECT_LE(std::fabs(data[i]), 5.0 * ranks) << i << " " << stats.to_string();
          }
        }
      }
    }
  }
}

// Reduce-scatter and all-gather with count < ranks (empty shards): with none / fp16 / bf16 and
// the integers above, this rank's shard [shard_begin(r), shard_begin(r + 1)) holds the exact
// sum after reduce_scatter; after allgather every element holds its owner's value exactly
// (integers exact in f16 / bf16), identical on every rank.
TEST(CollectiveEdgeCases, ShardedCallsWithEmptyShards) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  const int me = world_rank();
  auto value = [](std::size_t i, int r) {
    return static_cast<float>((7 * static_cast<std::size_t>(r) + 3 * i) % 11) - 5.0f;
  };
  for (const char* codec : {"none", "fp16", "bf16"}) {
    for (const std::size_t n : {1u, 2u, 3u}) {
      SCOPED_TRACE(std::string(codec) + " n=" + std::to_string(n));
      std::vector<float> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = value(i, me);
      comm.reduce_scatter(host_view(data.data(), n), fresh_name(), CompressionSpec::parse(codec));
      for (std::size_t i = comm.shard_begin(n, me); i < comm.shard_begin(n, me + 1); ++i) {
        double exact = 0;
        for (int r = 0; r < ranks; ++r) exact += value(i, r);
        EXPECT_EQ(data[i], exact) << i;
      }
      // All-gather: shard owners hold (i + 1) * (owner + 1) before the call.
      std::vector<float> gathered(n, -99.0f);
      auto owner_of = [&](std::size_t i) {
        int owner = 0;
        while (comm.shard_begin(n, owner + 1) <= i) ++owner;
        return owner;
      };
      for (std::size_t i = comm.shard_begin(n, me); i < comm.shard_begin(n, me + 1); ++i)
        gathered[i] = static_cast<float>((i + 1) * static_cast<std::size_t>(me + 1));
      comm.allgather(host_view(gathered.data(), n), fresh_name(), CompressionSpec::parse(codec));
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(gathered)));
      for (std::size_t i = 0; i < n; ++i)
        EXPECT_EQ(gathered[i], static_cast<float>((i + 1) * static_cast<std::size_t>(owner_of(i) + 1))) << i;
    }
  }
}

}  // namespace
}  // namespace gradzip
