// The public Reducer under mpirun (np 1..5): buckets as the contract packs them, exact averages
// with `none` (f32, f16 and bf16 tensors, chunked groups, uneven counts), compressed specs equal
// to the compressed collective run on the documented chunks, ready orders that differ between
// ranks, errors (never marked, marked twice, unknown names, late add, mismatched
// registrations) without hangs, per-tensor rules and warm-up seen in the stats, the stats'
// bookkeeping, lane counts that do not change results, and error-feedback checkpoints.
//
// Reference layout (include/gradzip/reducer.h, and pipeline/bucket_layout.h for the chunk
// names): buckets are filled walking the registrations backwards; inside a bucket the tensors
// of one (spec, rule) form a group, in order of first appearance, packed into one f32 buffer
// in bucket order; a group of n elements is cut into C = ceil(n / (chunk_bytes / 4)) chunks,
// chunk c = [floor(c n / C), floor((c + 1) n / C)), each one all-reduce (ReduceOp::average)
// named "bucket<b>/group<g>/chunk<c>" at the Reducer's step. The reference runs those calls on
// a second, fresh Communicator, where the name's call number equals the Reducer's step as
// long as every chunk is called once per step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"
#include "pipeline/model_spec.h"
#include "tests/multirank/multirank_support.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

// The communicators of these tests share one given link, so that algo=auto (whose γ is per
// process) chooses alike in a Reducer's lanes and in the direct communicator the results are
// compared with, and in a Reducer resumed on another communicator.
Communicator world_with_given_link() {
  CommunicatorOptions options;
  options.link_latency_us = 20;
  options.link_gbps = 10;
  return Communicator::world(options);
}

using pipeline::ModelSpec;
using testing::identical_on_all_ranks;
using testing::world_rank;
using testing::world_size;

using BucketNames = std::vector<std::vector<std::string>>;
using TensorValues = std::vector<std::vector<float>>;  // per registered tensor, as f32

struct TensorDef {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::size_t> shape;
};

std::size_t element_count(const std::vector<std::size_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>());
}

// A model's gradients in registration (forward) order: 1-D biases and norms, a single-element
// scale, f16 and bf16 tensors, counts that are neither powers of two nor multiples of the rank
// counts, and an embedding larger than kSmallOptions' bucket and chunk sizes.
std::vector<TensorDef> mixed_model() {
  return {
      {"embed.weight", DType::f32, {67, 61}},     // 4087 elements, 16348 bytes
      {"block0.weight", DType::f32, {31, 29}},    // 899
      {"block0.bias", DType::f32, {31}},
      {"block0.norm", DType::bf16, {29}},
      {"block1.weight", DType::f16, {37, 23}},    // 851
      {"block1.bias", DType::f32, {37}},
      {"block1.scale", DType::f32, {1}},
      {"head.weight", DType::f32, {10, 203}},     // 2030 elements, 8120 bytes
      {"head.bias", DType::f32, {10}},
  };
}

// Small sizes, so that mixed_model() spans four buckets (by the contract's packing:
// [head.bias] [head.weight, block1.scale] [block1.bias .. block0.weight] [embed.weight]) and
// its larger groups several chunks of at most 1024 elements.
ReducerOptions small_options(std::string spec, int lanes = 2) {
  ReducerOptions options;
  options.spec = std::move(spec);
  options.first_bucket_bytes = 4096;
  options.bucket_bytes = 8192;
  options.chunk_bytes = 4096;
  options.lanes = lanes;
  return options;
}

// The registered gradient buffers. They never move: the Reducer holds views of them.
class Gradients {
 public:
  explicit Gradients(std::vector<TensorDef> defs) : defs_(std::move(defs)) {
    tensors_.reserve(defs_.size());
    for (const TensorDef& def : defs_) tensors_.emplace_back(def.dtype, element_count(def.shape));
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  std::size_t size() const { return defs_.size(); }
  const TensorDef& def(std::size_t i) const { return defs_[i]; }
  std::size_t count(std::size_t i) const { return tensors_[i].count(); }
  std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < defs_.size(); ++i)
      if (defs_[i].name == name) return i;
    ADD_FAILURE() << "no tensor '" << name << "'";
    return 0;
  }
  std::size_t total_count() const {
    std::size_t total = 0;
    for (const testing::HostTensor& tensor : tensors_) total += tensor.count();
    return total;
  }

  void register_with(Reducer& reducer) {
    for (std::size_t i = 0; i < defs_.size(); ++i)
      reducer.add(defs_[i].name, tensors_[i].view(), defs_[i].shape);
  }

  // Writes `values` (rounded to nearest even for f16 / bf16) into tensor i's buffer in place.
  void fill(std::size_t i, std::span<const float> values) {
    const testing::HostTensor rounded(defs_[i].dtype, values);
    std::memcpy(tensors_[i].view().data, rounded.view().data, rounded.view().size_bytes());
  }
  std::vector<float> values(std::size_t i) const { return tensors_[i].to_f32(); }
  TensorValues all_values() const {
    TensorValues all;
    for (std::size_t i = 0; i < size(); ++i) all.push_back(values(i));
    return all;
  }
  std::span<const std::byte> bytes(std::size_t i) const {
    const ConstTensorView view = tensors_[i].view();
    return {static_cast<const std::byte*>(view.data), view.size_bytes()};
  }

 private:
  std::vector<TensorDef> defs_;
  std::vector<testing::HostTensor> tensors_;
};

// Integers up to this magnitude, times up to 5 ranks, and their sums stay exact in the dtype
// (f16 holds integers up to 2048, bf16 up to 256).
int integer_range(DType dtype) {
  switch (dtype) {
    case DType::f16: return 400;
    case DType::bf16: return 50;
    default: return 1000;
  }
}

std::uint64_t tensor_seed(std::uint64_t seed, std::size_t i) { return seed * 100 + i; }

// Rank r contributes P * k_r with k_r small integers: dividing by P (ReduceOp::average divides
// each contribution first) gives k_r exactly, and the sum of the k_r is exact in any order, so
// the average is exactly sum_r k_r. Fills every tensor and returns those averages.
TensorValues fill_with_rank_multiples(Gradients& gradients, std::uint64_t seed) {
  const int ranks = world_size();
  TensorValues averages;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    const std::size_t count = gradients.count(i);
    const int range = integer_range(gradients.def(i).dtype);
    std::vector<float> average(count, 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> k = testing::integer_contribution(count, r, tensor_seed(seed, i), range);
      for (std::size_t j = 0; j < count; ++j) average[j] += k[j];
      if (r == world_rank()) {
        std::vector<float> mine = k;
        for (float& value : mine) value *= static_cast<float>(ranks);
        gradients.fill(i, mine);
      }
    }
    averages.push_back(std::move(average));
  }
  return averages;
}

// Fills every tensor with this rank's N(0, 1) draws (deterministic in seed, tensor and rank).
void fill_with_gaussians(Gradients& gradients, std::uint64_t seed) {
  for (std::size_t i = 0; i < gradients.size(); ++i)
    gradients.fill(i, testing::gaussian_contribution(gradients.count(i), world_rank(),
                                                     tensor_seed(seed, i)));
}

std::vector<std::size_t> backward_order(const Gradients& gradients) {
  std::vector<std::size_t> order(gradients.size());
  std::iota(order.rbegin(), order.rend(), std::size_t{0});
  return order;
}

// A ready order that differs between ranks (and from the backward order, with 3+ tensors).
std::vector<std::size_t> rank_shuffled_order(const Gradients& gradients, std::uint64_t seed) {
  std::vector<std::size_t> order = backward_order(gradients);
  std::mt19937_64 engine(seed * 7919 + static_cast<std::uint64_t>(world_rank()));
  std::shuffle(order.begin(), order.end(), engine);
  return order;
}

// One step of a training loop: the tensors become ready in `order`, then wait().
void run_step(Reducer& reducer, const Gradients& gradients, const std::vector<std::size_t>& order) {
  for (std::size_t i : order) reducer.mark_ready(gradients.def(i).name);
  reducer.wait();
}

// The buckets the contract packs: walking the registrations backwards, a tensor joins the
// current bucket while it stays within first_bucket_bytes (bucket 0) or bucket_bytes (later
// buckets), else it starts the next; an empty bucket takes any tensor.
BucketNames contract_buckets(const Gradients& gradients, const ReducerOptions& options) {
  BucketNames buckets;
  std::size_t bytes = 0;
  for (std::size_t i = gradients.size(); i-- > 0;) {
    const std::size_t tensor_bytes = 4 * gradients.count(i);
    const std::size_t limit = buckets.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    if (buckets.empty() || bytes + tensor_bytes > limit) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(gradients.def(i).name);
    bytes += tensor_bytes;
  }
  return buckets;
}

// Every rank's buckets, hashed and compared. Collective.
bool buckets_identical_on_all_ranks(const BucketNames& buckets) {
  std::string text;
  for (const auto& bucket : buckets) {
    for (const std::string& name : bucket) text += name + ",";
    text += ";";
  }
  return identical_on_all_ranks(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

// One group of a bucket as the contract forms it.
struct ExpectedGroup {
  CompressionSpec spec;
  std::string rule;
  std::vector<std::size_t> tensors;  // registration indices, in bucket order
  std::size_t count = 0;
  std::size_t chunks = 0;
};

std::vector<std::vector<ExpectedGroup>> contract_groups(const Gradients& gradients,
                                                        const BucketNames& buckets,
                                                        const ModelSpec& model,
                                                        std::size_t chunk_bytes) {
  std::vector<std::vector<ExpectedGroup>> groups(buckets.size());
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (const std::string& name : buckets[b]) {
      const std::size_t i = gradients.index_of(name);
      const ModelSpec::Choice choice =
          model.spec_for(name, gradients.count(i), true, gradients.def(i).shape);
      auto group = std::find_if(groups[b].begin(), groups[b].end(), [&](const ExpectedGroup& g) {
        return g.spec == *choice.spec && g.rule == choice.rule;
      });
      if (group == groups[b].end()) {
        groups[b].push_back(ExpectedGroup{*choice.spec, choice.rule, {}, 0, 0});
        group = groups[b].end() - 1;
      }
      group->tensors.push_back(i);
      group->count += gradients.count(i);
    }
    for (ExpectedGroup& group : groups[b]) {
      const std::size_t per_chunk = chunk_bytes / 4;
      group.chunks = (group.count + per_chunk - 1) / per_chunk;
    }
  }
  return groups;
}

// The results the Reducer must give for the tensors' current contents: each group packed,
// cut into the documented chunks and reduced chunk by chunk by `direct` (a Communicator of its
// own, used only for this reference) with spec `effective(group spec)`, then written back and
// rounded to each tensor's dtype. Collective.
// `direct` is an ordinary Communicator (blocking waits), while the Reducer's lanes use idle
// waits; Transport::set_idle_waits promises the same results either way, so chunks that go
// through MPI's own all-reduce ("mpi": under min_bytes) must match bit for bit too.
TensorValues reference_results(Communicator& direct, const Gradients& gradients,
                               const std::vector<std::vector<ExpectedGroup>>& groups,
                               const std::function<CompressionSpec(const CompressionSpec&)>& effective) {
  TensorValues results(gradients.size());
  for (std::size_t b = 0; b < groups.size(); ++b) {
    for (std::size_t g = 0; g < groups[b].size(); ++g) {
      const ExpectedGroup& group = groups[b][g];
      std::vector<float> packed;
      for (std::size_t i : group.tensors) {
        const std::vector<float> values = gradients.values(i);
        packed.insert(packed.end(), values.begin(), values.end());
      }
      const CompressionSpec spec = effective(group.spec);
      for (std::size_t c = 0; c < group.chunks; ++c) {
        const std::size_t begin = c * group.count / group.chunks;
        const std::size_t end = (c + 1) * group.count / group.chunks;
        const std::string name = "bucket" + std::to_string(b) + "/group" + std::to_string(g) +
                                 "/chunk" + std::to_string(c);
        direct.allreduce(host_view(packed.data() + begin, end - begin), name, spec,
                         ReduceOp::average);
      }
      std::size_t offset = 0;
      for (std::size_t i : group.tensors) {
        const std::span<const float> part(packed.data() + offset, gradients.count(i));
        results[i] = testing::HostTensor(gradients.def(i).dtype, part).to_f32();
        offset += gradients.count(i);
      }
    }
  }
  return results;
}

CompressionSpec as_is(const CompressionSpec& spec) { return spec; }

// Every tensor equals its expected values bit for bit (the first difference is reported).
void expect_results(const Gradients& gradients, const TensorValues& expected) {
  for (std::size_t i = 0; i < gradients.size(); ++i)
    EXPECT_TRUE(testing::same_bits(gradients.values(i), expected[i])) << gradients.def(i).name;
}

// Every tensor's bytes are the same on every rank. Collective.
void expect_identical_on_all_ranks(const Gradients& gradients) {
  for (std::size_t i = 0; i < gradients.size(); ++i)
    EXPECT_TRUE(identical_on_all_ranks(gradients.bytes(i))) << gradients.def(i).name;
}

const ReducerGroupStats* group_of(const ReducerStats& stats, const std::string& tensor) {
  for (const ReducerBucketStats& bucket : stats.buckets)
    for (const ReducerGroupStats& group : bucket.groups)
      if (std::find(group.tensors.begin(), group.tensors.end(), tensor) != group.tensors.end())
        return &group;
  return nullptr;
}

bool starts_with(const std::string& text, std::string_view prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// The groups of the last step's stats are the contract's groups, with the spec of the step.
void expect_stats_groups(const ReducerStats& stats, const Gradients& gradients,
                         const std::vector<std::vector<ExpectedGroup>>& groups) {
  ASSERT_EQ(stats.buckets.size(), groups.size());
  for (std::size_t b = 0; b < groups.size(); ++b) {
    SCOPED_TRACE(::testing::Message() << "bucket " << b);
    EXPECT_EQ(stats.buckets[b].index, b);
    ASSERT_EQ(stats.buckets[b].groups.size(), groups[b].size());
    for (std::size_t g = 0; g < groups[b].size(); ++g) {
      const ReducerGroupStats& actual = stats.buckets[b].groups[g];
      const ExpectedGroup& expected = groups[b][g];
      std::vector<std::string> names;
      for (std::size_t i : expected.tensors) names.push_back(gradients.def(i).name);
      EXPECT_EQ(actual.tensors, names) << "group " << g;
      EXPECT_EQ(actual.rule, expected.rule) << "group " << g;
      EXPECT_EQ(actual.count, expected.count) << "group " << g;
      EXPECT_EQ(actual.chunks, expected.chunks) << "group " << g;
    }
  }
}

ModelSpec parse_model(const Communicator& comm, const ReducerOptions& options) {
  return ModelSpec::parse(options.spec, options.default_rules, comm.default_spec());
}

TEST(Reducer, BucketsFollowTheContractsPacking) {
  Communicator comm = world_with_given_link();
  Gradients gradients(mixed_model());
  const ReducerOptions options = small_options("none");
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  EXPECT_TRUE(reducer.buckets().empty()) << "not frozen before the first mark_ready";
  fill_with_rank_multiples(gradients, 1);
  run_step(reducer, gradients, backward_order(gradients));
  const BucketNames expected = {
      {"head.bias"},
      {"head.weight", "block1.scale"},
      {"block1.bias", "block1.weight", "block0.norm", "block0.bias", "block0.weight"},
      {"embed.weight"}};
  EXPECT_EQ(contract_buckets(gradients, options), expected) << "the test's own packing";
  EXPECT_EQ(reducer.buckets(), expected);
  EXPECT_TRUE(buckets_identical_on_all_ranks(reducer.buckets()));

  // Default sizes: everything fits the 1 MiB first bucket.
  Gradients defaults(mixed_model());
  Reducer default_reducer(comm, {});
  defaults.register_with(default_reducer);
  fill_with_rank_multiples(defaults, 2);
  run_step(default_reducer, defaults, backward_order(defaults));
  ASSERT_EQ(default_reducer.buckets().size(), 1u);
  EXPECT_EQ(default_reducer.buckets()[0], contract_buckets(defaults, ReducerOptions{})[0]);
}

TEST(Reducer, NoneGivesTheExactAverageOnEveryRank) {
  Communicator comm = world_with_given_link();
  // "none": every chunk is under min_bytes (MPI's all-reduce); min_bytes=0: the ring.
  for (const char* spec : {"none", "none:min_bytes=0"}) {
    for (const int lanes : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << spec << " lanes=" << lanes);
      Gradients gradients(mixed_model());
      const ReducerOptions options = small_options(spec, lanes);
      Reducer reducer(comm, options);
      gradients.register_with(reducer);
      for (std::uint64_t step = 0; step < 3; ++step) {
        SCOPED_TRACE(::testing::Message() << "step " << step);
        const TensorValues averages = fill_with_rank_multiples(gradients, 10 + step);
        run_step(reducer, gradients, backward_order(gradients));
        expect_results(gradients, averages);
        expect_identical_on_all_ranks(gradients);
        EXPECT_EQ(reducer.current_step(), step);
        EXPECT_EQ(reducer.stats().step, step);
        reducer.step();
      }
      EXPECT_EQ(reducer.current_step(), 3u);
      EXPECT_EQ(reducer.buckets(), contract_buckets(gradients, options));
      const ModelSpec model = parse_model(comm, options);
      expect_stats_groups(reducer.stats(), gradients,
                          contract_groups(gradients, reducer.buckets(), model, options.chunk_bytes));
    }
  }
}

TEST(Reducer, CompressedSpecsEqualTheCollectiveOnTheDocumentedChunks) {
  Communicator comm = world_with_given_link();
  // min_bytes=0 so that the small test groups are compressed; the 1-D tensors still go to
  // "dims<=1->none" (a group of their own in bucket 2). Three steps: the step seeds qsgd's
  // rounding, and top-k's error-feedback residuals carry over from step to step.
  for (const char* spec : {"fp16:min_bytes=0", "topk:ratio=0.1,min_bytes=0", "qsgd:bits=4,min_bytes=0"}) {
    SCOPED_TRACE(spec);
    Communicator direct = world_with_given_link();
    Gradients gradients(mixed_model());
    const ReducerOptions options = small_options(spec);
    Reducer reducer(comm, options);
    gradients.register_with(reducer);
    const ModelSpec model = parse_model(comm, options);
    for (std::uint64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      fill_with_gaussians(gradients, 20 + step);
      // The groups come from the contract's buckets, not from the Reducer's, so that a wrong
      // packing cannot make its own reference.
      const auto groups = contract_groups(gradients, contract_buckets(gradients, options), model,
                                          options.chunk_bytes);
      const TensorValues expected = reference_results(direct, gradients, groups, as_is);
      run_step(reducer, gradients, backward_order(gradients));
      expect_results(gradients, expected);
      expect_identical_on_all_ranks(gradients);
      expect_stats_groups(reducer.stats(), gradients, groups);
      for (const auto& bucket : groups)
        for (const ExpectedGroup& group : bucket) {
          const ReducerGroupStats* stats =
              group_of(reducer.stats(), gradients.def(group.tensors[0]).name);
          EXPECT_NE(stats, nullptr);
          if (stats != nullptr) {
            EXPECT_EQ(stats->spec, group.spec.to_string());
          }
        }
      reducer.step();
    }
  }
}

TEST(Reducer, ReadyOrderDifferingBetweenRanksGivesTheSameBucketsAndResults) {
  Communicator comm = world_with_given_link();
  for (const char* spec : {"none:min_bytes=0", "topk:ratio=0.1,min_bytes=0"}) {
    SCOPED_TRACE(spec);
    const ReducerOptions options = small_options(spec);
    Gradients in_order(mixed_model());
    Gradients shuffled(mixed_model());
    Reducer in_order_reducer(comm, options);
    Reducer shuffled_reducer(comm, options);
    in_order.register_with(in_order_reducer);
    shuffled.register_with(shuffled_reducer);
    for (std::uint64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      fill_with_gaussians(in_order, 30 + step);
      fill_with_gaussians(shuffled, 30 + step);
      run_step(in_order_reducer, in_order, backward_order(in_order));
      run_step(shuffled_reducer, shuffled, rank_shuffled_order(shuffled, step));
      EXPECT_EQ(shuffled_reducer.buckets(), in_order_reducer.buckets());
      EXPECT_EQ(shuffled_reducer.buckets(), contract_buckets(shuffled, options));
      EXPECT_TRUE(buckets_identical_on_all_ranks(shuffled_reducer.buckets()));
      expect_results(shuffled, in_order.all_values());
      expect_identical_on_all_ranks(shuffled);
      in_order_reducer.step();
      shuffled_reducer.step();
    }
  }
}

TEST(Reducer, ATensorNeverMarkedReadyFailsWaitOnEveryRankAndTheNextStepIsClean) {
  Communicator comm = world_with_given_link();
  const ReducerOptions options = small_options("none:min_bytes=0");
  Gradients gradients(mixed_model());
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  const int last = world_size() - 1;
  // One rank leaves one tensor unmarked: in the first bucket (no bucket can launch on that
  // rank), in a middle one, in the last one. Between the failures, and after them, clean steps
  // give the exact average.
  const struct {
    int rank;
    const char* tensor;
  } failures[] = {{last, "block0.bias"}, {0, "embed.weight"}, {last, "head.bias"}};
  std::uint64_t seed = 40;
  for (const auto& failure : failures) {
    SCOPED_TRACE(::testing::Message() << "rank " << failure.rank << " leaves " << failure.tensor);
    const bool deviant = world_rank() == failure.rank;
    fill_with_gaussians(gradients, seed++);
    std::string message;
    // Every rank throws (error_code_of records a failure where wait() returns).
    testing::error_code_of(
        [&] {
          for (std::size_t i : backward_order(gradients))
            if (!(deviant && gradients.def(i).name == failure.tensor))
              reducer.mark_ready(gradients.def(i).name);
          reducer.wait();
        },
        &message);
    if (deviant) {
      EXPECT_NE(message.find(failure.tensor), std::string::npos) << "not named: " << message;
    } else {
      // The others see their calls of that bucket fail: the error names the failed call's
      // tensors (which of the bucket's groups failed first is up to the lanes).
      const BucketNames buckets = contract_buckets(gradients, options);
      const auto bucket = std::find_if(buckets.begin(), buckets.end(), [&](const auto& names) {
        return std::find(names.begin(), names.end(), failure.tensor) != names.end();
      });
      EXPECT_TRUE(bucket != buckets.end() &&
                  std::any_of(bucket->begin(), bucket->end(), [&](const std::string& name) {
                    return message.find(name) != std::string::npos;
                  }))
          << "no tensor of the failed bucket named: " << message;
    }
    reducer.step();

    const TensorValues averages = fill_with_rank_multiples(gradients, seed++);
    run_step(reducer, gradients, backward_order(gradients));
    expect_results(gradients, averages);
    expect_identical_on_all_ranks(gradients);
    reducer.step();
  }
}

TEST(Reducer, MarkingTwiceOrAnUnknownNameIsRefusedAtOnceAndTheStepGoesOn) {
  Communicator comm = world_with_given_link();
  Gradients gradients(mixed_model());
  Reducer reducer(comm, small_options("none"));
  gradients.register_with(reducer);
  const TensorValues averages = fill_with_rank_multiples(gradients, 60);

  std::string message;
  reducer.mark_ready("head.bias");
  EXPECT_EQ(testing::error_code_of([&] { reducer.mark_ready("head.bias"); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("head.bias"), std::string::npos) << message;
  EXPECT_EQ(testing::error_code_of([&] { reducer.mark_ready("no.such.tensor"); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("no.such.tensor"), std::string::npos) << message;
  EXPECT_EQ(testing::error_code_of([&] { reducer.mark_ready(""); }), ErrorCode::invalid_argument);
  // Registration closes at the first mark_ready.
  std::vector<float> late(5, 1.0f);
  EXPECT_EQ(testing::error_code_of([&] { reducer.add("late", host_view(late.data(), 5)); }, &message),
            ErrorCode::invalid_argument)
      << message;
  // The step counter moves only between steps.
  EXPECT_EQ(testing::error_code_of([&] { reducer.step(); }), ErrorCode::invalid_argument);
  EXPECT_EQ(reducer.current_step(), 0u);

  // The refused calls changed nothing: the rest of the step runs as usual.
  for (std::size_t i : backward_order(gradients))
    if (gradients.def(i).name != "head.bias") reducer.mark_ready(gradients.def(i).name);
  reducer.wait();
  expect_results(gradients, averages);
  expect_identical_on_all_ranks(gradients);
  reducer.step();

  // A tensor marked in one step may be marked again in the next.
  const TensorValues next = fill_with_rank_multiples(gradients, 61);
  reducer.mark_all_ready();
  reducer.wait();
  expect_results(gradients, next);
}

TEST(Reducer, BadRegistrationsAreRefused) {
  Communicator comm = world_with_given_link();
  Reducer reducer(comm, small_options("none"));
  std::vector<float> a(12, 0.0f), b(12, 0.0f);
  reducer.add("a", host_view(a.data(), 12), {3, 4});
  std::string message;
  EXPECT_EQ(testing::error_code_of([&] { reducer.add("a", host_view(b.data(), 12)); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("'a'"), std::string::npos) << "the duplicate is named: " << message;
  EXPECT_EQ(testing::error_code_of([&] { reducer.add("", host_view(b.data(), 12)); }),
            ErrorCode::invalid_argument);
  // A shape that does not multiply to the count: the contract names no error code (a bad size
  // passed by the caller, or a size that does not match), so either is accepted.
  const ErrorCode shape_error =
      testing::error_code_of([&] { reducer.add("b", host_view(b.data(), 12), {5, 2}); }, &message);
  EXPECT_TRUE(shape_error == ErrorCode::invalid_argument || shape_error == ErrorCode::size_mismatch)
      << error_code_name(shape_error);
  EXPECT_NE(message.find("'b'"), std::string::npos) << message;
  // The refused calls registered nothing: "b" is still free, and "a" is there once.
  reducer.add("b", host_view(b.data(), 12), {2, 6});
  reducer.mark_all_ready();
  reducer.wait();
  EXPECT_EQ(reducer.buckets(), (BucketNames{{"b", "a"}}));
}

TEST(Reducer, BadOptionsAreRefusedAtConstruction) {
  Communicator comm = world_with_given_link();
  std::string message;
  // The model spec is parsed at construction; the error names the rule.
  EXPECT_EQ(testing::error_code_of([&] { Reducer reducer(comm, small_options("topk;dims<=2->none")); },
                                   &message),
            ErrorCode::invalid_spec);
  EXPECT_NE(message.find("dims<=2"), std::string::npos) << message;
  EXPECT_EQ(testing::error_code_of([&] { Reducer reducer(comm, small_options("zip")); }),
            ErrorCode::invalid_spec);
  // lanes >= 1 (a bad option: invalid_argument).
  EXPECT_EQ(testing::error_code_of([&] { Reducer reducer(comm, small_options("none", 0)); }),
            ErrorCode::invalid_argument);
}

TEST(Reducer, ATimelineThatCannotBeWrittenFailsTheLastRecordedWaitAndTrainingGoesOn) {
  Communicator comm = world_with_given_link();
  ReducerOptions options = small_options("none", 2);
  options.timeline_steps = 0;
  std::string message;
  EXPECT_EQ(testing::error_code_of([&] { Reducer reducer(comm, options); }, &message),
            ErrorCode::invalid_argument);
  EXPECT_NE(message.find("timeline_steps = 0"), std::string::npos) << message;

  // Steps 1 and 2 recorded into a folder that does not exist: wait() of step 2 (the last
  // recorded) throws io_error naming this rank's file, on every rank; the results are there and
  // the next step runs normally.
  options.timeline_steps = 2;
  options.timeline_path = "/nonexistent-folder-of-gradzip/trace-{rank}.json";
  Gradients gradients(mixed_model());
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  for (std::uint64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const TensorValues averages = fill_with_rank_multiples(gradients, 20 + step);
    if (step == 2) {
      const ErrorCode code = testing::error_code_of(
          [&] { run_step(reducer, gradients, backward_order(gradients)); }, &message);
      EXPECT_EQ(code, ErrorCode::io_error);
      EXPECT_NE(message.find("/nonexistent-folder-of-gradzip/trace-" +
                             std::to_string(world_rank()) + ".json"),
                std::string::npos)
          << message;
    } else {
      run_step(reducer, gradients, backward_order(gradients));
    }
    expect_results(gradients, averages);
    reducer.step();
  }
}

TEST(Reducer, RanksRegisteringDifferentTensorsAllThrowAtTheFirstMarkReady) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  Communicator comm = world_with_given_link();
  const int deviant = world_size() - 1;
  std::vector<TensorDef> defs = mixed_model();
  if (world_rank() == deviant) defs[1].shape = {31, 28};  // block0.weight: 868 elements, not 899
  Gradients gradients(defs);
  Reducer reducer(comm, small_options("none"));
  gradients.register_with(reducer);
  std::string message;
  EXPECT_EQ(testing::error_code_of([&] { reducer.mark_ready("head.bias"); }, &message),
            ErrorCode::size_mismatch);
  EXPECT_NE(message.find("rank " + std::to_string(deviant)), std::string::npos) << message;
}

// The groups of RulesSendOneDimensionalAndSmallTensorsUncompressed's step.
void expect_rule_groups(const ReducerStats& stats) {
  const ReducerGroupStats* norm = group_of(stats, "norm.weight");
  const ReducerGroupStats* small = group_of(stats, "small.weight");
  const ReducerGroupStats* big = group_of(stats, "big.weight");
  ASSERT_TRUE(norm != nullptr && small != nullptr && big != nullptr) << "a tensor in no group";
  // 80000 bytes: not under min_bytes, so only the dims rule can have taken it.
  EXPECT_TRUE(starts_with(norm->spec, "none")) << norm->spec;
  EXPECT_TRUE(starts_with(norm->rule, "dims<=1->none")) << norm->rule;
  EXPECT_TRUE(starts_with(small->spec, "none")) << small->spec;
  EXPECT_TRUE(starts_with(small->rule, "bytes<65536->none")) << small->rule;
  EXPECT_TRUE(starts_with(big->spec, "topk")) << big->spec;
  EXPECT_EQ(big->rule, "model");
  EXPECT_EQ(big->tensors, std::vector<std::string>{"big.weight"});
  if (world_size() > 1) {
    EXPECT_NE(std::find(big->algorithms.begin(), big->algorithms.end(), "sparse"),
              big->algorithms.end());
    EXPECT_GT(big->encoded_input_bytes, big->encoded_message_bytes);
  }
}

TEST(Reducer, RulesSendOneDimensionalAndSmallTensorsUncompressed) {
  Communicator comm = world_with_given_link();
  ReducerOptions options;
  options.spec = "topk:ratio=0.01";  // default rules: dims<=1->none, bytes<65536->none
  options.first_bucket_bytes = 65536;
  options.bucket_bytes = 102400;
  // Buckets: [norm.weight] (80000 bytes, alone in the first bucket), then [small.weight (400
  // bytes), big.weight (80000 bytes)].
  Gradients gradients({{"big.weight", DType::f32, {200, 100}},
                       {"small.weight", DType::f32, {10, 10}},
                       {"norm.weight", DType::f32, {20000}}});
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  const TensorValues averages = fill_with_rank_multiples(gradients, 70);
  run_step(reducer, gradients, backward_order(gradients));
  EXPECT_EQ(reducer.buckets(), (BucketNames{{"norm.weight"}, {"small.weight", "big.weight"}}));

  expect_rule_groups(reducer.stats());

  // Uncompressed means exact; top-k keeps k = ceil(0.01 * 20000) = 200 entries per rank, so the
  // average has at most P * 200 non-zero entries (of 20000 non-zero exact ones, almost all).
  const std::size_t norm_index = gradients.index_of("norm.weight");
  const std::size_t small_index = gradients.index_of("small.weight");
  const std::size_t big_index = gradients.index_of("big.weight");
  EXPECT_TRUE(testing::same_bits(gradients.values(norm_index), averages[norm_index]));
  EXPECT_TRUE(testing::same_bits(gradients.values(small_index), averages[small_index]));
  const std::vector<float> sparse = gradients.values(big_index);
  const auto nonzero = static_cast<std::size_t>(
      std::count_if(sparse.begin(), sparse.end(), [](float v) { return v != 0.0f; }));
  EXPECT_GT(nonzero, 0u);
  EXPECT_LE(nonzero, 200u * static_cast<std::size_t>(world_size()));
  expect_identical_on_all_ranks(gradients);
}

TEST(Reducer, WarmUpStepsAreExactlyNoneThenTheCodecRuns) {
  Communicator comm = world_with_given_link();
  Communicator direct = world_with_given_link();
  ReducerOptions options;
  options.spec = "topk:ratio=0.05,warmup=2";
  Gradients gradients({{"w", DType::f32, {100, 200}}, {"b", DType::f32, {100}}});
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  const std::size_t w = gradients.index_of("w");
  for (std::uint64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "warm-up step " << step);
    const TensorValues averages = fill_with_rank_multiples(gradients, 80 + step);
    run_step(reducer, gradients, backward_order(gradients));
    expect_results(gradients, averages);
    const ReducerGroupStats* group = group_of(reducer.stats(), "w");
    EXPECT_NE(group, nullptr);
    if (group != nullptr) {
      EXPECT_TRUE(starts_with(group->spec, "none")) << group->spec;
      EXPECT_EQ(group->rule, "model");
    }
    reducer.step();
  }
  // Step 2: top-k of the chunk with a zero residual (warm-up keeps none), i.e. the collective
  // called directly for the first time, with the warm-up taken off.
  const TensorValues averages = fill_with_rank_multiples(gradients, 82);
  const ModelSpec model = parse_model(comm, options);
  const auto groups = contract_groups(gradients, contract_buckets(gradients, options), model,
                                      options.chunk_bytes);
  const TensorValues expected = reference_results(direct, gradients, groups, [](const CompressionSpec& spec) {
    CompressionSpec compressed = spec;
    compressed.warmup = 0;
    return compressed;
  });
  run_step(reducer, gradients, backward_order(gradients));
  const ReducerGroupStats* group = group_of(reducer.stats(), "w");
  EXPECT_NE(group, nullptr);
  if (group != nullptr) {
    EXPECT_TRUE(starts_with(group->spec, "topk")) << group->spec;
  }
  expect_results(gradients, expected);
  EXPECT_FALSE(testing::same_bits(gradients.values(w), averages[w]))
      << "top-k of 5% changed nothing";
  expect_identical_on_all_ranks(gradients);
}

// Braces and brackets outside strings balance and the text is one object.
TEST(Reducer, RatioRampFallsGeometricallyFromAQuarterToTheTargetAfterWarmUp) {
  // warmup=1, ramp=4, target 0.01: step 0 is none; steps 1..4 use 0.25^(1-t) * 0.01^t with
  // t = (step - warmup + 1) / 4, so step 4 reaches the target, which then stays.
  Communicator comm = world_with_given_link();
  ReducerOptions options;
  options.spec = "topk:ratio=0.01,warmup=1,ramp=4";
  Gradients gradients({{"w", DType::f32, {100, 200}}});
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  for (std::uint64_t step = 0; step < 7; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    fill_with_gaussians(gradients, 300 + step);
    run_step(reducer, gradients, backward_order(gradients));
    const ReducerGroupStats* group = group_of(reducer.stats(), "w");
    EXPECT_NE(group, nullptr);
    // No early return here: every rank must reach the next step's collectives.
    const CompressionSpec used = CompressionSpec::parse(group != nullptr ? group->spec : "sign");
    if (step == 0) {
      EXPECT_EQ(used.codec, CodecKind::none);
    } else {
      EXPECT_EQ(used.codec, CodecKind::topk);
      const double t = std::min(1.0, static_cast<double>(step) / 4.0);
      const double expected = std::pow(0.25, 1.0 - t) * std::pow(0.01, t);
      // The ratio travels through the canonical spec text (shortest round-trip digits).
      EXPECT_NEAR(used.ratio, expected, 1e-12 * expected);
      if (step >= 4) {
        EXPECT_EQ(used.ratio, 0.01);
      }
    }
    reducer.step();
  }
}

TEST(Reducer, PowersgdCompressesMatricesAndSendsBiasesAsTheyAre) {
  // Rank r's matrix is U * V_r^T with U (rows x 2) the same on every rank, so the average
  // U * mean(V_r)^T has rank 2 and rank-2 PowerSGD recovers it: P = A Q spans U's columns
  // whatever Q is (tests/multirank/test_powersgd.cpp derives the f32 bound; here the loose
  // 1e-3 relative Frobenius error only separates "reconstructed" from "not"). The bias goes
  // uncompressed by the default dims<=1 rule and must be exact. warmup=1: step 0 is exact too.
  constexpr std::size_t rows = 160, cols = 128, rank = 2;
  Communicator comm = world_with_given_link();
  ReducerOptions options;
  options.spec = "powersgd:rank=2,warmup=1,ef=off";
  Gradients gradients({{"w", DType::f32, {rows, cols}}, {"b", DType::f32, {rows}}});
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  const int ranks = world_size();
  for (std::uint64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const std::vector<float> u = testing::gaussian(rows * rank, 500 + step);
    std::vector<double> average(rows * cols, 0.0);
    std::vector<float> mine;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> v = testing::gaussian(cols * rank, 600 + 10 * step + r);
      std::vector<float> m(rows * cols);
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
          m[i * cols + j] = u[i * rank] * v[j * rank] + u[i * rank + 1] * v[j * rank + 1];
      for (std::size_t e = 0; e < m.size(); ++e) average[e] += static_cast<double>(m[e]) / ranks;
      if (r == world_rank()) mine = m;
    }
    gradients.fill(0, mine);
    // Bias: rank r contributes ranks * (r + i % 5), whose average is exact in f32.
    std::vector<float> bias(rows), bias_average(rows);
    for (std::size_t i = 0; i < rows; ++i) {
      bias[i] = static_cast<float>(ranks * (world_rank() + static_cast<int>(i % 5)));
      bias_average[i] = static_cast<float>((ranks - 1) * ranks / 2 + ranks * static_cast<int>(i % 5));
    }
    gradients.fill(1, bias);
    run_step(reducer, gradients, backward_order(gradients));

    const std::vector<float> result = gradients.values(0);
    double error = 0.0, norm = 0.0;
    for (std::size_t e = 0; e < result.size(); ++e) {
      error += (result[e] - average[e]) * (result[e] - average[e]);
      norm += average[e] * average[e];
    }
    EXPECT_LT(std::sqrt(error / norm), step == 0 ? 1e-6 : 1e-3);
    EXPECT_TRUE(testing::same_bits(gradients.values(1), bias_average));
    expect_identical_on_all_ranks(gradients);
    const ReducerGroupStats* group = group_of(reducer.stats(), "w");
    EXPECT_NE(group, nullptr);
    if (group != nullptr && step > 0) {
      EXPECT_TRUE(starts_with(group->spec, "powersgd")) << group->spec;
      EXPECT_EQ(group->algorithms, std::vector<std::string>{"powersgd"});
      // (rows x cols) / ((rows + cols) x rank) f32 values.
      EXPECT_DOUBLE_EQ(static_cast<double>(group->encoded_input_bytes) /
                           static_cast<double>(group->encoded_message_bytes),
                       static_cast<double>(rows * cols) / static_cast<double>((rows + cols) * rank));
    }
    reducer.step();
  }
}

bool looks_like_one_json_object(const std::string& json) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth < 0) return false;
      if (depth == 0 && json.find_first_not_of(" \n\r\t", i + 1) != std::string::npos) return false;
    }
  }
  return depth == 0 && !in_string && json.find_first_not_of(" \n\r\t") != std::string::npos &&
         json[json.find_first_not_of(" \n\r\t")] == '{';
}

TEST(Reducer, StatsAddUp) {
  Communicator comm = world_with_given_link();
  const int ranks = world_size();
  const ReducerOptions options = small_options("fp16:min_bytes=0");
  Gradients gradients(mixed_model());
  Reducer reducer(comm, options);
  gradients.register_with(reducer);
  const ModelSpec model = parse_model(comm, options);
  for (std::uint64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    fill_with_gaussians(gradients, 90 + step);
    run_step(reducer, gradients, backward_order(gradients));
    const ReducerStats& stats = reducer.stats();
    EXPECT_EQ(stats.step, step);
    EXPECT_EQ(stats.gradient_bytes, 4 * gradients.total_count());
    expect_stats_groups(stats, gradients,
                        contract_groups(gradients, reducer.buckets(), model, options.chunk_bytes));
    if (ranks > 1) {
      EXPECT_GT(stats.sent_bytes, 0u);
    } else {
      EXPECT_EQ(stats.sent_bytes, 0u) << "one rank sends nothing";
    }

    // Bytes add up: groups into buckets into the step; the encoded bytes give the ratio.
    std::uint64_t bucket_sum = 0, input = 0, message = 0;
    double previous_launch = 0, previous_done = 0;
    for (const ReducerBucketStats& bucket : stats.buckets) {
      SCOPED_TRACE(::testing::Message() << "bucket " << bucket.index);
      std::uint64_t group_sum = 0;
      std::size_t bucket_count = 0;
      for (const ReducerGroupStats& group : bucket.groups) {
        group_sum += group.sent_bytes;
        input += group.encoded_input_bytes;
        message += group.encoded_message_bytes;
        bucket_count += group.count;
        EXPECT_FALSE(group.algorithms.empty());
        if (starts_with(group.spec, "none") && group.count * 4 < 65536) {
          // MPI's all-reduce of each chunk counted as 2(P-1)/P of its bytes (one byte of
          // rounding per chunk at most).
          const double counted = 2.0 * (ranks - 1) / ranks * 4.0 * static_cast<double>(group.count);
          EXPECT_LE(std::fabs(static_cast<double>(group.sent_bytes) - counted),
                    static_cast<double>(group.chunks))
              << group.rule;
          EXPECT_EQ(group.algorithms, std::vector<std::string>{"mpi"});
        }
      }
      EXPECT_EQ(bucket.sent_bytes, group_sum);
      EXPECT_EQ(bucket.bytes, 4 * bucket_count);
      bucket_sum += bucket.sent_bytes;
      // Buckets launch and finish in order, within the step's communication time.
      EXPECT_LE(bucket.launch_seconds, bucket.done_seconds);
      EXPECT_GE(bucket.launch_seconds, previous_launch);
      EXPECT_GE(bucket.done_seconds, previous_done);
      EXPECT_LE(bucket.done_seconds, stats.communication_seconds + 1e-9);
      previous_launch = bucket.launch_seconds;
      previous_done = bucket.done_seconds;
    }
    EXPECT_EQ(stats.sent_bytes, bucket_sum);
    if (message > 0) {
      EXPECT_DOUBLE_EQ(stats.compression_ratio, static_cast<double>(input) / message);
      // fp16 halves every value; headers only lower the ratio.
      EXPECT_GT(stats.compression_ratio, 1.0);
      EXPECT_LE(stats.compression_ratio, 2.0);
    } else {
      EXPECT_EQ(stats.compression_ratio, 1.0);
    }

    // Times: communication splits into hidden and exposed.
    EXPECT_GT(stats.communication_seconds, 0.0);
    EXPECT_GE(stats.exposed_seconds, 0.0);
    EXPECT_GE(stats.hidden_seconds, 0.0);
    EXPECT_NEAR(stats.hidden_seconds + stats.exposed_seconds, stats.communication_seconds, 1e-9);

    const std::string json = stats.to_json();
    EXPECT_TRUE(looks_like_one_json_object(json)) << json;
    for (const char* key : {"\"step\"", "\"sent_bytes\"", "\"gradient_bytes\"", "\"compression_ratio\"",
                            "\"communication_seconds\"", "\"exposed_seconds\"", "\"hidden_seconds\"",
                            "\"last_ready_seconds\"", "\"buckets\"", "\"groups\"", "\"rule\"", "\"tensors\""})
      EXPECT_NE(json.find(key), std::string::npos) << key << " not in " << json;
    reducer.step();
  }
}

// Overlap: a bucket goes out when its last tensor is marked, not at wait(). Backward is
// simulated by a sleep of kLayer before each mark_ready, so by the Reducer's own clock the step's
// last mark comes at least kLayer x (the marks after bucket 0's last tensor) after the first
// launch. sleep_for never returns early, so this is an ordering, not a race between two timings:
// a Reducer that held its buckets back until wait() (or until the last mark) fails it with
// last_ready_seconds <= 0 whatever the machine's load.
TEST(Reducer, BucketsLaunchWhileBackwardIsStillMarkingGradients) {
  constexpr auto kLayer = std::chrono::milliseconds(5);
  Communicator comm = world_with_given_link();
  Gradients gradients(mixed_model());
  Reducer reducer(comm, small_options("fp16:min_bytes=0"));
  gradients.register_with(reducer);
  const std::vector<std::size_t> order = backward_order(gradients);
  for (std::uint64_t step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    fill_with_gaussians(gradients, 300 + step);
    for (const std::size_t i : order) {
      std::this_thread::sleep_for(kLayer);
      reducer.mark_ready(gradients.def(i).name);
    }
    reducer.wait();
    const ReducerStats& stats = reducer.stats();
    const BucketNames buckets = reducer.buckets();
    ASSERT_EQ(buckets.size(), 4u);
    ASSERT_EQ(stats.buckets.size(), 4u);
    // Marks after the one that completed bucket 0 (the backward order fills buckets in order).
    const std::size_t later_marks = order.size() - buckets[0].size();
    const double at_least = std::chrono::duration<double>(kLayer).count() * later_marks;
    EXPECT_GE(stats.last_ready_seconds, at_least);
    EXPECT_EQ(stats.buckets[0].launch_seconds, 0.0);
    for (std::size_t b = 0; b + 1 < stats.buckets.size(); ++b)
      EXPECT_LT(stats.buckets[b].launch_seconds, stats.last_ready_seconds) << "bucket " << b;
    if (world_rank() == 0)
      std::printf("[ overlap  ] step %llu: last mark %.1f ms after the first launch; "
                  "communication %.1f ms, %.0f%% of it hidden behind the marks\n",
                  static_cast<unsigned long long>(step), 1e3 * stats.last_ready_seconds,
                  1e3 * stats.communication_seconds,
                  stats.communication_seconds > 0
                      ? 100 * stats.hidden_seconds / stats.communication_seconds
                      : 0.0);
    reducer.step();
  }
}

TEST(Reducer, LaneCountDoesNotChangeResults) {
  Communicator comm = world_with_given_link();
  for (const char* spec : {"none:min_bytes=0", "fp16:min_bytes=0", "qsgd:bits=4,min_bytes=0",
                           "topk:ratio=0.1,min_bytes=0"}) {
    SCOPED_TRACE(spec);
    std::vector<std::vector<TensorValues>> results;  // [lanes option][step]
    for (const int lanes : {2, 1, 3}) {
      Gradients gradients(mixed_model());
      Reducer reducer(comm, small_options(spec, lanes));
      gradients.register_with(reducer);
      results.emplace_back();
      for (std::uint64_t step = 0; step < 2; ++step) {
        fill_with_gaussians(gradients, 100 + step);
        run_step(reducer, gradients, backward_order(gradients));
        results.back().push_back(gradients.all_values());
        reducer.step();
      }
    }
    for (std::size_t run = 1; run < results.size(); ++run)
      for (std::size_t step = 0; step < 2; ++step)
        for (std::size_t i = 0; i < results[0][step].size(); ++i)
          EXPECT_TRUE(testing::same_bits(results[run][step][i], results[0][step][i]))
              << (run == 1 ? "lanes=1" : "lanes=3") << " step " << step << " tensor " << i;
  }
}

TEST(Reducer, SavedErrorFeedbackStateResumesInANewReducer) {
  const testing::ScratchDirectory scratch("gradzip-test-reducer");
  const std::string path = scratch.file("state-rank" + std::to_string(world_rank()));
  const ReducerOptions options = small_options("topk:ratio=0.1,min_bytes=0");

  Communicator comm = world_with_given_link();
  Gradients original(mixed_model());
  Reducer reducer(comm, options);
  original.register_with(reducer);
  fill_with_gaussians(original, 110);
  run_step(reducer, original, backward_order(original));
  reducer.step();
  reducer.save_state(path);
  fill_with_gaussians(original, 111);
  run_step(reducer, original, backward_order(original));

  // A new Reducer on a new communicator, from the checkpoint: the same step-1 results.
  Communicator resumed_comm = world_with_given_link();
  Gradients resumed(mixed_model());
  Reducer resumed_reducer(resumed_comm, options);
  resumed.register_with(resumed_reducer);
  EXPECT_EQ(resumed_reducer.current_step(), 0u);
  resumed_reducer.load_state(path);
  EXPECT_EQ(resumed_reducer.current_step(), 1u) << "the checkpoint holds the step";
  fill_with_gaussians(resumed, 111);
  run_step(resumed_reducer, resumed, backward_order(resumed));
  expect_results(resumed, original.all_values());

  // Without the checkpoint the residuals are zero and top-k of 10% selects otherwise: the
  // state was really carried (the comparison above could not pass by accident).
  Gradients fresh(mixed_model());
  Reducer fresh_reducer(resumed_comm, options);
  fresh.register_with(fresh_reducer);
  fill_with_gaussians(fresh, 111);
  run_step(fresh_reducer, fresh, backward_order(fresh));
  const std::size_t embed = fresh.index_of("embed.weight");
  EXPECT_FALSE(testing::same_bits(fresh.values(embed), original.values(embed)));
}

}  // namespace
}  // namespace gradzip

namespace gradzip {
namespace {

// A Reducer holds tensors of one place: a CUDA tensor after host ones is refused naming both,
// and a host pointer labelled CUDA is refused as the codecs refuse it (no device here: the
// device path itself is covered by tests/gpu/test_reducer_cuda.cpp).
TEST(Reducer, TensorsOfDifferentPlacesAndFakeCudaPointersAreRefused) {
  Communicator comm = world_with_given_link();
  std::vector<float> host(16, 1.0f);
  {
    Reducer reducer(comm, ReducerOptions{});
    reducer.add("a", host_view(host.data(), host.size()));
    std::string message;
    EXPECT_EQ(testing::error_code_of(
                  [&] {
                    reducer.add("b", TensorView{host.data(), host.size(), DType::f32,
                                                Device{DeviceKind::cuda, 0}});
                  },
                  &message),
              ErrorCode::invalid_argument);
    EXPECT_NE(message.find("cuda:0, the tensors added before it in host memory"), std::string::npos)
        << message;
  }
  Reducer reducer(comm, ReducerOptions{});
  EXPECT_EQ(testing::error_code_of([&] {
              reducer.add("c", TensorView{host.data(), host.size(), DType::f32, Device{DeviceKind::cuda, 0}});
            }),
            testing::fake_cuda_view_error());
}

}  // namespace
}  // namespace gradzip
