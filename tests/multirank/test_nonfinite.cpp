// The nonfinite= policy (include/gradzip/compression_spec.h) through
// Communicator::world() at any rank count (ctest runs 1..5), for every codec (error feedback on
// where it applies) and the algorithms ring, SRA, the all-gather and auto (min_bytes=0): the
// last rank (size - 1) puts a NaN or +Inf into its input.
//   propagate: every rank's result is byte-identical, equal to the exact (integer) sum except at
//              the bad index, which is NaN / +Inf; the residual store is unchanged byte for
//              byte and finite, and the next finite call gives exactly what it gives after a
//              skipped call (the bad call left no trace);
//   skip:      zeros everywhere, stats.skipped, residual store unchanged byte for byte, the
//              name's call number advanced;
//   error:     every rank throws ErrorCode::nonfinite naming rank size - 1, tensor untouched.
// The same for reduce-scatter and all-gather, and error feedback fed finite extremes
// (+-FLT_MAX) keeps every residual finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator_state.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "kernels/host_device.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using testing::identical_on_all_ranks;
using testing::integer_contribution;
using testing::world_rank;
using testing::world_size;

// Every codec; error feedback on where it applies (on by default for sign, topk, randk).
const char* const kCodecs[] = {"none",  "fp16:ef=on",     "bf16:ef=on",     "qsgd:bits=4,ef=on",
                               "sign",  "topk:ratio=0.1", "randk:ratio=0.1", "terngrad:ef=on"};
const char* const kAlgorithms[] = {"auto", "ring", "sra", "sparse"};
constexpr std::size_t kCount = 1003;
constexpr std::size_t kBadIndex = 17;

std::string spec_for(const std::string& codec, const std::string& algo, const char* policy) {
  std::string spec = codec + (codec.find(':') == std::string::npos ? ":" : ",") +
                     (algo == "auto" ? "min_bytes=0" : "algo=" + algo);
  if (policy != nullptr) spec += std::string(",nonfinite=") + policy;
  return spec;
}

// integer_contribution with its default range, as exact_sum takes it.
std::vector<float> contribution(std::size_t count, int rank, std::uint64_t seed) {
  return integer_contribution(count, rank, seed);
}

std::string fresh_name() {
  static int counter = 0;
  return "nonfinite." + std::to_string(counter++);
}

// The residual store's contents as bits, by name (worker- and server-side residuals alike).
using Snapshot = std::map<std::string, std::vector<std::uint32_t>>;
Snapshot snapshot(Communicator& comm) {
  const error_feedback::ResidualStore& store = collectives::state_of(comm).residuals();
  Snapshot out;
  for (const std::string& name : store.names()) {
    const std::span<const float> values = store.residual(name);
    std::vector<std::uint32_t>& bits = out[name];
    for (const float value : values) bits.push_back(kernels::float_bits(value));
  }
  return out;
}

// Number of non-finite residual elements in the store.
std::size_t nonfinite_residuals(const Snapshot& residuals) {
  std::size_t bad = 0;
  for (const auto& [name, bits] : residuals)
    for (const std::uint32_t b : bits) bad += (b & 0x7F800000u) == 0x7F800000u ? 1 : 0;
  return bad;
}

// This rank's finite input (integers: sums over ranks are exact in f32).
std::vector<float> input(std::uint64_t seed) {
  return integer_contribution(kCount, world_rank(), seed);
}
// The same, with `bad` at kBadIndex on the last rank.
std::vector<float> input(std::uint64_t seed, float bad) {
  std::vector<float> data = input(seed);
  if (world_rank() == world_size() - 1) data[kBadIndex] = bad;
  return data;
}

std::string bad_ranks_text() { return "rank(s) " + std::to_string(world_size() - 1); }

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// All-reduce, every codec and algorithm, NaN and +Inf. Communicator `propagating` runs
// finite / bad / finite calls under nonfinite=propagate (the default: no key), `skipping` the
// same name and inputs under nonfinite=skip; the third results must agree bit for bit.
TEST(Nonfinite, AllreducePropagateAndSkip) {
  // One given link for both, so that algo=auto chooses alike in the two (γ is per process).
  CommunicatorOptions options;
  options.link_latency_us = 20;
  options.link_gbps = 10;
  Communicator propagating = Communicator::world(options);
  Communicator skipping = Communicator::world(options);
  const std::vector<double> exact = testing::exact_sum(kCount, world_size(), 2, contribution);
  for (const char* codec : kCodecs) {
    for (const char* algo : kAlgorithms) {
      for (const float bad : {kNaN, kInf}) {
        const std::string spec = spec_for(codec, algo, nullptr);
        const std::string skip_spec = spec_for(codec, algo, "skip");
        const std::string name = fresh_name();
        SCOPED_TRACE(spec + (std::isnan(bad) ? " NaN" : " +Inf"));

        // 1. Finite: registers (and fills) the residuals.
        std::vector<float> a = input(1);
        std::vector<float> b = a;
        propagating.allreduce(host_view(a.data(), kCount), name, spec);
        skipping.allreduce(host_view(b.data(), kCount), name, skip_spec);
        const Snapshot propagating_before = snapshot(propagating);
        const Snapshot skipping_before = snapshot(skipping);

        // 2. The last rank's input holds `bad` at kBadIndex.
        a = input(2, bad);
        b = a;
        const CollectiveStats pa = propagating.allreduce(host_view(a.data(), kCount), name, spec);
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(a)));
        EXPECT_EQ(pa.algorithm, "mpi");
        EXPECT_FALSE(pa.skipped);
        EXPECT_NE(pa.note.find("non-finite input on " + bad_ranks_text()), std::string::npos) << pa.note;
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < kCount; ++i) {
          if (i == kBadIndex) {
            EXPECT_TRUE(std::isnan(bad) ? std::isnan(a[i]) : a[i] == kInf) << a[i];
          } else if (a[i] != exact[i]) {
            ++wrong;
          }
        }
        EXPECT_EQ(wrong, 0u);
        const Snapshot propagating_after = snapshot(propagating);
        EXPECT_EQ(propagating_after, propagating_before);
        EXPECT_EQ(nonfinite_residuals(propagating_after), 0u);

        const std::uint32_t step = collectives::state_of(skipping).names().call_number_of(name);
        const CollectiveStats sb = skipping.allreduce(host_view(b.data(), kCount), name, skip_spec);
        EXPECT_TRUE(sb.skipped);
        EXPECT_EQ(sb.algorithm, "skip");
        EXPECT_NE(sb.note.find("non-finite input on " + bad_ranks_text()), std::string::npos) << sb.note;
        EXPECT_TRUE(testing::same_bits(b, std::vector<float>(kCount, 0.0f)));
        EXPECT_EQ(snapshot(skipping), skipping_before);
        EXPECT_EQ(collectives::state_of(skipping).names().call_number_of(name), step + 1);

        // 3. Finite again: the bad call left no trace in either.
        a = input(3);
        b = a;
        propagating.allreduce(host_view(a.data(), kCount), name, spec);
        skipping.allreduce(host_view(b.data(), kCount), name, skip_spec);
        EXPECT_TRUE(testing::same_bits(a, b));
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(a)));
        std::size_t nonfinite = 0;
        for (const float value : a) nonfinite += std::isfinite(value) ? 0 : 1;
        EXPECT_EQ(nonfinite, 0u);
        EXPECT_EQ(nonfinite_residuals(snapshot(propagating)), 0u);
      }
    }
  }
}

// nonfinite=error: every rank throws nonfinite naming the last rank, its count and first
// index; the tensor is left as passed and the residuals as they were.
TEST(Nonfinite, ErrorPolicyThrowsOnEveryRank) {
  Communicator comm = Communicator::world();
  for (const char* codec : kCodecs) {
    for (const char* algo : kAlgorithms) {
      const std::string spec = spec_for(codec, algo, "error");
      const std::string name = fresh_name();
      SCOPED_TRACE(spec);
      std::vector<float> data = input(1);
      comm.allreduce(host_view(data.data(), kCount), name, spec);
      const Snapshot before = snapshot(comm);
      data = input(2, -kInf);
      const std::vector<float> passed = data;
      std::string message;
      EXPECT_EQ(testing::error_code_of(
                    [&] { comm.allreduce(host_view(data.data(), kCount), name, spec); }, &message),
                ErrorCode::nonfinite);
      EXPECT_NE(message.find("NaN or Inf in the input of " + bad_ranks_text()), std::string::npos) << message;
      EXPECT_NE(message.find("rank " + std::to_string(world_size() - 1) +
                             ": 1 non-finite element(s), the first at index 17"),
                std::string::npos)
          << message;
      EXPECT_TRUE(testing::same_bits(data, passed));
      EXPECT_EQ(snapshot(comm), before);
    }
  }
  // The communicator still works afterwards, for the same name too.
  std::vector<float> data = input(4);
  comm.allreduce(host_view(data.data(), kCount), "nonfinite.after_error", "topk:ratio=0.1,nonfinite=error");
  EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
}

// Reduce-scatter and all-gather: propagate runs the ring / all-gather with codec none (exact
// integer sums, and the owners' data), skip gives zeros; neither touches the residuals.
TEST(Nonfinite, ReduceScatterAndAllgather) {
  Communicator comm = Communicator::world();
  const int ranks = world_size();
  const int rank = world_rank();
  const std::vector<double> exact = testing::exact_sum(kCount, ranks, 2, contribution);
  const std::size_t my_begin = comm.shard_begin(kCount, rank);
  const std::size_t my_end = comm.shard_begin(kCount, rank + 1);
  // The last rank's shard starts at last_begin: its bad element for the all-gather.
  const std::size_t last_begin = comm.shard_begin(kCount, ranks - 1);
  for (const char* codec : kCodecs) {
    for (const char* algo : {"auto", "ring", "sra"}) {
      const CompressionSpec spec = CompressionSpec::parse(spec_for(codec, algo, "propagate"));
      const std::string name = fresh_name();
      SCOPED_TRACE(spec.to_string());
      std::vector<float> data = input(1);
      comm.reduce_scatter(host_view(data.data(), kCount), name, spec);
      const Snapshot before = snapshot(comm);
      data = input(2, kNaN);
      const CollectiveStats stats = comm.reduce_scatter(host_view(data.data(), kCount), name, spec);
      EXPECT_EQ(stats.algorithm, "ring");
      EXPECT_NE(stats.note.find("non-finite input on " + bad_ranks_text()), std::string::npos);
      for (std::size_t i = my_begin; i < my_end; ++i) {
        if (i == kBadIndex) {
          EXPECT_TRUE(std::isnan(data[i]));
        } else {
          EXPECT_EQ(data[i], exact[i]) << i;
        }
      }
      EXPECT_EQ(snapshot(comm), before);

      data = input(2, kInf);
      const CollectiveStats skipped =
          comm.reduce_scatter(host_view(data.data(), kCount), name,
                              CompressionSpec::parse(spec_for(codec, algo, "skip")));
      EXPECT_TRUE(skipped.skipped);
      EXPECT_TRUE(testing::same_bits(data, std::vector<float>(kCount, 0.0f)));
      EXPECT_EQ(snapshot(comm), before);
    }

    // All-gather: the last rank's NaN sits in its own shard (index last_begin).
    const CompressionSpec spec = CompressionSpec::parse(spec_for(codec, "auto", nullptr));
    const std::string name = fresh_name();
    SCOPED_TRACE("allgather " + spec.to_string());
    std::vector<float> data = input(1);
    comm.allgather(host_view(data.data(), kCount), name, spec);
    const Snapshot before = snapshot(comm);
    std::vector<std::vector<float>> owners;
    for (int r = 0; r < ranks; ++r) owners.push_back(integer_contribution(kCount, r, 5));
    owners[ranks - 1][last_begin] = kNaN;
    data = owners[rank];
    const CollectiveStats stats = comm.allgather(host_view(data.data(), kCount), name, spec);
    EXPECT_EQ(stats.algorithm, "allgather");
    EXPECT_NE(stats.note.find("non-finite input on " + bad_ranks_text()), std::string::npos);
    EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
    for (int r = 0; r < ranks; ++r) {
      for (std::size_t i = comm.shard_begin(kCount, r); i < comm.shard_begin(kCount, r + 1); ++i) {
        if (r == ranks - 1 && i == last_begin) {
          EXPECT_TRUE(std::isnan(data[i]));
        } else {
          EXPECT_EQ(data[i], owners[r][i]) << i;
        }
      }
    }
    EXPECT_EQ(snapshot(comm), before);
    // A NaN outside the rank's own shard is not its input: the call runs compressed as usual.
    if (ranks > 1) {
      data = owners[rank];
      data[last_begin] = 1.0f;
      if (rank == 0) data[my_end] = kNaN;  // rank 1's shard, in rank 0's buffer
      const CollectiveStats normal = comm.allgather(host_view(data.data(), kCount), name, spec);
      EXPECT_EQ(normal.note.find("non-finite"), std::string::npos) << normal.note;
      EXPECT_FALSE(normal.skipped);
    }
  }
}

// f16 tensors: the NaN / Inf come back in the tensor's own dtype, identical on every rank.
TEST(Nonfinite, HalfTensorsPropagate) {
  Communicator comm = Communicator::world();
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const char* codec : {"fp16:ef=on", "sign"}) {
      const std::string spec = spec_for(codec, "auto", nullptr);
      SCOPED_TRACE(spec + " " + std::string(dtype_name(dtype)));
      const std::vector<float> values = input(6, kInf);
      testing::HostTensor tensor(dtype, values);
      comm.allreduce(tensor.view(), fresh_name(), spec, ReduceOp::average);
      const std::vector<float> result = tensor.to_f32();
      EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(result)));
      EXPECT_EQ(result[kBadIndex], kInf);
      for (std::size_t i = 0; i < kCount; ++i) {
        if (i != kBadIndex) {
          EXPECT_TRUE(std::isfinite(result[i])) << i;
        }
      }
    }
  }
}

// Error feedback fed finite extremes: +-FLT_MAX on every rank mixed with small values. Scales
// and partial sums may overflow f32 inside the codecs, but the residual guard keeps every
// residual finite, over several calls. sign's first results are finite too: its bucket scale
// (the mean |x|, about FLT_MAX / 2 here) is rescued when the bucket's f32 sum overflows
// (compressors/sign/sign_math.h), and `average` divides before summing, so no sum exceeds FLT_MAX.
// (Later calls add residuals of about FLT_MAX / 2 to +-FLT_MAX, which does overflow.)
TEST(Nonfinite, ExtremeFiniteInputsKeepResidualsFinite) {
  Communicator comm = Communicator::world();
  const float max = std::numeric_limits<float>::max();
  for (const char* codec : {"qsgd:bits=4,ef=on", "qsgd:bits=8,ef=on", "sign", "fp16:ef=on", "bf16:ef=on", "topk:ratio=0.5"}) {
    for (const char* algo : kAlgorithms) {
      const std::string spec = spec_for(codec, algo, nullptr);
      const std::string name = fresh_name();
      SCOPED_TRACE(spec);
      for (int call = 0; call < 3; ++call) {
        std::vector<float> data(kCount);
        for (std::size_t i = 0; i < kCount; ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(world_rank() + call)) % 4;
          data[i] = k == 0 ? max : k == 1 ? -max : k == 2 ? 0.5f : -3.0f;
        }
        comm.allreduce(host_view(data.data(), kCount), name, spec, ReduceOp::average);
        EXPECT_TRUE(identical_on_all_ranks(std::span<const float>(data)));
        EXPECT_EQ(nonfinite_residuals(snapshot(comm)), 0u) << "call " << call;
        if (std::string_view(codec) == "sign" && call == 0) {
          EXPECT_EQ(std::count_if(data.begin(), data.end(), [](float v) { return !std::isfinite(v); }), 0)
              << "call " << call;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradzip
