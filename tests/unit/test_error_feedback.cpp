// Error feedback: the residual store (resize policies, checkpoint format, every load refusal)
// and the decorator (the definition bit for bit, conservation of the gradient sum, resuming
// from a checkpoint, chunks, and what feedback buys the biased codecs).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <new>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "error_feedback/checkpoint_file.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/host_device.h"
#include "tests/unit/test_support.h"

// Counts heap allocations while `g_count_allocations` is set, so a test can check that an
// encode allocates nothing. Replaces the global operator new/delete of this test program only.
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<std::size_t> g_allocations{0};

void* counted_allocation(std::size_t bytes) {
  if (g_count_allocations.load(std::memory_order_relaxed)) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t bytes) { return counted_allocation(bytes); }
void* operator new[](std::size_t bytes) { return counted_allocation(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace gradzip {
namespace {

namespace fs = std::filesystem;
using error_feedback::ErrorFeedbackCodec;
using error_feedback::ResidualStore;

// The codecs error feedback is tested with.
const std::vector<std::string> kEfCodecSpecs = {
    "none", "fp16", "bf16", "qsgd:bits=2", "sign", "topk:ratio=0.01",
    "topk:ratio=0.01,approx=on", "randk:ratio=0.05"};

std::shared_ptr<const Codec> built_codec(const std::string& spec) { return make_codec(spec); }

struct CaughtError {
  ErrorCode code = ErrorCode::internal;
  std::string what;
};

CaughtError error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return {error.code(), error.what()};
  }
  ADD_FAILURE() << "expected a gradzip::Error";
  return {};
}

void expect_mentions(const CaughtError& error, const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    EXPECT_NE(error.what.find(part), std::string::npos)
        << "the message does not mention '" << part << "': " << error.what;
  }
}


std::vector<float> copy_of(std::span<const float> values) {
  return std::vector<float>(values.begin(), values.end());
}

// Element-wise bit equality (NaN payloads and -0 included).
void expect_same_bits(std::span<const float> actual, std::span<const float> expected,
                      const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(kernels::float_bits(actual[i]), kernels::float_bits(expected[i])) << what << ", element " << i;
  }
}

double norm(std::span<const float> values) {
  double sum = 0;
  for (float v : values) sum += double{v} * v;
  return std::sqrt(sum);
}

double norm(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v * v;
  return std::sqrt(sum);
}

// A fresh directory under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    for (;;) {
      path_ = fs::temp_directory_path() / ("gradzip_test_error_feedback_" +
                                           std::to_string(::getpid()) + "_" +
                                           std::to_string(counter++));
      if (fs::create_directory(path_)) break;
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

using testing::append_le;
using testing::append_name;
using testing::fnv1a64_reference;
using testing::put_le;
using testing::read_file_bytes;
using testing::write_file_bytes;

// Rewrites the trailing checksum after a deliberate edit, so only the edit is wrong.
void rehash(std::vector<unsigned char>& bytes) { testing::rehash_checkpoint(bytes); }

// Field offsets of the header, the same in every format version (checkpoint_file.h), and the
// first tensor record of versions 1 and 2 (version 3's starts with its lane).
constexpr std::size_t kVersionOffset = 4;
constexpr std::size_t kWorldSizeOffset = 8;
constexpr std::size_t kRankOffset = 12;
constexpr std::size_t kTensorCountOffset = 16;
constexpr std::size_t kFirstRecordOffset = 24;

// Everything observable about a store: names, values (as bits) and where the values live.
struct StoreSnapshot {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<const float*> addresses;
};

StoreSnapshot snapshot_of(const ResidualStore& store) {
  StoreSnapshot snapshot;
  snapshot.names = store.names();
  for (const auto& name : snapshot.names) {
    snapshot.values.push_back(copy_of(store.residual(name)));
    snapshot.addresses.push_back(store.residual(name).data());
  }
  return snapshot;
}

void expect_unchanged(const ResidualStore& store, const StoreSnapshot& before) {
  const StoreSnapshot after = snapshot_of(store);
  ASSERT_EQ(after.names, before.names);
  EXPECT_EQ(after.addresses, before.addresses);
  for (std::size_t t = 0; t < before.names.size(); ++t) {
    expect_same_bits(after.values[t], before.values[t], "tensor " + before.names[t]);
  }
}

// Expects store.load(path) to throw `code` with a message mentioning `parts`, store unchanged.
void expect_load_refused(ResidualStore& store, const fs::path& path, ErrorCode code,
                         const std::vector<std::string>& parts) {
  const StoreSnapshot before = snapshot_of(store);
  const auto error = error_of([&] { store.load(path); });
  EXPECT_EQ(error.code, code) << error.what;
  expect_mentions(error, parts);
  expect_unchanged(store, before);
}

// Fills the residual of `name` with `count` distinct values.
void fill(ResidualStore& store, const std::string& name, std::size_t count, float first) {
  const auto residual = store.residual(name, count);
  for (std::size_t i = 0; i < count; ++i) residual[i] = first + 0.25f * static_cast<float>(i);
}

// ------------------------------------------------------------------------------------------
// ResidualStore

TEST(ResidualStore, CreatesZeroBuffersThatKeepTheirValuesAndAddress) {
  ResidualStore store(2, 1, ResizePolicy::error);
  EXPECT_EQ(store.size(), 0u);
  const auto b = store.residual("layer2.bias", 3);
  ASSERT_EQ(b.size(), 3u);
  for (float v : b) EXPECT_EQ(kernels::float_bits(v), 0u);
  b[1] = 4.5f;
  const auto a = store.residual("layer1.weight", 5);
  const auto b_again = store.residual("layer2.bias", 3);
  EXPECT_EQ(b_again.data(), b.data());
  EXPECT_EQ(b_again[1], 4.5f);
  EXPECT_EQ(store.residual("layer2.bias")[1], 4.5f);
  EXPECT_EQ(store.residual("layer1.weight").data(), a.data());

  EXPECT_TRUE(store.contains("layer1.weight"));
  EXPECT_FALSE(store.contains("layer1"));
  EXPECT_EQ(store.names(), (std::vector<std::string>{"layer1.weight", "layer2.bias"}));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.total_bytes(), (3u + 5u) * sizeof(float));

  store.residual("empty", 0);
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.total_bytes(), 32u);

  store.clear();
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.total_bytes(), 0u);
  EXPECT_FALSE(store.contains("layer2.bias"));
}

TEST(ResidualStore, RejectsBadRanksEmptyNamesAndUnknownLookups) {
  EXPECT_EQ(error_of([] { ResidualStore(0, 0, ResizePolicy::error); }).code,
            ErrorCode::invalid_argument);
  const auto rank_error = error_of([] { ResidualStore(4, 4, ResizePolicy::error); });
  EXPECT_EQ(rank_error.code, ErrorCode::invalid_argument);
  expect_mentions(rank_error, {"rank 4", "world size 4"});

  ResidualStore store(1, 0, ResizePolicy::error);
  EXPECT_EQ(error_of([&] { store.residual("", 3); }).code, ErrorCode::invalid_argument);
  const auto unknown = error_of([&] { store.residual("missing.weight"); });
  EXPECT_EQ(unknown.code, ErrorCode::invalid_argument);
  expect_mentions(unknown, {"missing.weight"});
  EXPECT_EQ(store.size(), 0u);
}

TEST(ResidualStore, ResizeUnderErrorPolicyThrowsAndKeepsTheBuffer) {
  ResidualStore store(1, 0, ResizePolicy::error);
  fill(store, "encoder.proj", 10, 1.0f);
  const StoreSnapshot before = snapshot_of(store);
  const auto error = error_of([&] { store.residual("encoder.proj", 11); });
  EXPECT_EQ(error.code, ErrorCode::size_mismatch);
  expect_mentions(error, {"encoder.proj", "10", "11"});
  expect_unchanged(store, before);
}

TEST(ResidualStore, ResizeUnderResetPolicyStartsAFreshZeroBuffer) {
  ResidualStore store(1, 0, ResizePolicy::reset);
  fill(store, "encoder.proj", 10, 1.0f);
  fill(store, "head", 4, -3.0f);
  const auto head_before = copy_of(store.residual("head"));
  const auto resized = store.residual("encoder.proj", 11);
  ASSERT_EQ(resized.size(), 11u);
  for (float v : resized) EXPECT_EQ(kernels::float_bits(v), 0u);
  expect_same_bits(store.residual("head"), head_before, "untouched tensor");
  EXPECT_EQ(store.total_bytes(), (11u + 4u) * sizeof(float));
}

// The journal (ResidualStore::begin_journal): an undo gives back every value, forgets the names
// first registered inside it and restores the use stamps; a kept journal changes nothing; a
// resize under the reset policy is undone too.
TEST(ResidualStore, AJournalUndoesEveryChangeMadeWhileItWasOpen) {
  ResidualStore store(1, 0, ResizePolicy::reset);
  fill(store, "a", 6, 1.0f);
  fill(store, "b", 4, -2.0f);
  store.register_tensor("zeros", 3);
  store.set_use_clock(5);
  const StoreSnapshot before = snapshot_of(store);

  store.begin_journal();
  EXPECT_TRUE(store.journaling());
  EXPECT_EQ(error_of([&] { store.begin_journal(); }).code, ErrorCode::internal);
  fill(store, "a", 6, 100.0f);
  store.residual("a", 6)[0] = 7.0f;  // a second use: the journal keeps the first values
  std::span<float> b = store.residual("b", 9);  // reset: a fresh buffer of 9
  b[8] = 3.0f;
  store.residual("zeros", 3)[1] = 5.0f;
  fill(store, "new", 2, 4.0f);
  store.end_journal(/*undo=*/true);
  EXPECT_FALSE(store.journaling());
  expect_unchanged(store, before);
  EXPECT_FALSE(store.contains("new"));
  // The stamps are the old ones (0): the uses at clock 5 were undone with the rest.
  EXPECT_EQ(store.release_unused_before(5), 3u);

  ResidualStore kept(1, 0, ResizePolicy::error);
  fill(kept, "a", 3, 1.0f);
  kept.begin_journal();
  fill(kept, "a", 3, 2.0f);
  fill(kept, "new", 1, 4.0f);
  kept.end_journal(/*undo=*/false);
  EXPECT_EQ(kept.residual("a")[2], 2.0f + 0.25f * 2.0f);
  EXPECT_TRUE(kept.contains("new"));
  kept.end_journal(/*undo=*/true);  // none open: nothing
  EXPECT_TRUE(kept.contains("new"));
}

// ------------------------------------------------------------------------------------------
// Checkpoints

TEST(ResidualStoreCheckpoint, FileLayoutIsTheDocumentedOne) {
  TempDir dir;
  ResidualStore store(3, 2, ResizePolicy::error);
  const auto ab = store.residual("ab", 2);
  ab[0] = 1.5f;
  ab[1] = -2.0f;
  store.residual("c", 0);
  store.save(dir / "ef.bin");

  // Version 3 (checkpoint_file.h): the store's tensors are lane 0's; no owner state.
  std::vector<unsigned char> expected = {'G', 'Z', 'E', 'F'};
  append_le<std::uint32_t>(expected, 3);  // version
  append_le<std::uint32_t>(expected, 3);  // world size
  append_le<std::uint32_t>(expected, 2);  // rank
  append_le<std::uint64_t>(expected, 2);  // tensors
  append_le<std::uint32_t>(expected, 0);  // lane
  append_name(expected, "ab");
  append_le<std::uint64_t>(expected, 2);
  append_le<std::uint32_t>(expected, kernels::float_bits(1.5f));
  append_le<std::uint32_t>(expected, kernels::float_bits(-2.0f));
  append_le<std::uint32_t>(expected, 0);
  append_name(expected, "c");
  append_le<std::uint64_t>(expected, 0);
  const std::size_t owner_state_offset = expected.size();
  append_le<std::uint64_t>(expected, 0);  // call numbers
  append_le<std::uint8_t>(expected, 0);   // no step
  append_le<std::uint64_t>(expected, 0);
  append_le<std::uint8_t>(expected, 0);   // no link: four zero terms
  for (int term = 0; term < 4; ++term) append_le<double>(expected, 0.0);
  append_le<std::uint32_t>(expected, 0);  // node structures
  append_le<std::uint32_t>(expected, 0);  // codec costs
  append_le<std::uint64_t>(expected, fnv1a64_reference(expected.data(), expected.size()));

  EXPECT_EQ(read_file_bytes(dir / "ef.bin"), expected);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ef.bin"})) << "a temporary file was left";

  // With call numbers: they follow the tensors, sorted by name.
  error_feedback::CheckpointOwnerState owner;
  owner.call_numbers = {{"zz", 7}, {"a", std::uint64_t{1} << 40}};
  store.save(dir / "counted.bin", owner);
  expected.resize(owner_state_offset);
  append_le<std::uint64_t>(expected, 2);
  append_name(expected, "a");
  append_le<std::uint64_t>(expected, std::uint64_t{1} << 40);
  append_name(expected, "zz");
  append_le<std::uint64_t>(expected, 7);
  append_le<std::uint8_t>(expected, 0);
  append_le<std::uint64_t>(expected, 0);
  append_le<std::uint8_t>(expected, 0);
  for (int term = 0; term < 4; ++term) append_le<double>(expected, 0.0);
  append_le<std::uint32_t>(expected, 0);
  append_le<std::uint32_t>(expected, 0);
  append_le<std::uint64_t>(expected, fnv1a64_reference(expected.data(), expected.size()));
  EXPECT_EQ(read_file_bytes(dir / "counted.bin"), expected);
}

TEST(ResidualStoreCheckpoint, FilesOfVersionsOneAndTwoLoadAsTheyDid) {
  TempDir dir;
  // Version 2, byte by byte: tensors by name (no lane), then the counters, sorted by name.
  std::vector<unsigned char> v2 = {'G', 'Z', 'E', 'F'};
  append_le<std::uint32_t>(v2, 2);
  append_le<std::uint32_t>(v2, 3);
  append_le<std::uint32_t>(v2, 2);
  append_le<std::uint64_t>(v2, 2);
  append_name(v2, "ab");
  append_le<std::uint64_t>(v2, 2);
  append_le<std::uint32_t>(v2, kernels::float_bits(1.5f));
  append_le<std::uint32_t>(v2, kernels::float_bits(-2.0f));
  append_name(v2, "c");
  append_le<std::uint64_t>(v2, 0);
  append_le<std::uint64_t>(v2, 2);
  append_name(v2, "a");
  append_le<std::uint64_t>(v2, std::uint64_t{1} << 40);
  append_name(v2, "zz");
  append_le<std::uint64_t>(v2, 7);
  append_le<std::uint64_t>(v2, fnv1a64_reference(v2.data(), v2.size()));
  // The test fixture writes the same bytes.
  EXPECT_EQ(testing::legacy_checkpoint_bytes(2, 3, 2, {{"ab", {1.5f, -2.0f}}, {"c", {}}},
                                             {{"a", std::uint64_t{1} << 40}, {"zz", 7}}),
            v2);
  write_file_bytes(dir / "v2.bin", v2);
  ResidualStore store(3, 2, ResizePolicy::error);
  const error_feedback::CheckpointContents rest = store.load(dir / "v2.bin");
  EXPECT_EQ(rest.format_version, 2u);
  EXPECT_EQ(rest.version2_counters,
            (error_feedback::CheckpointCounters{{"a", std::uint64_t{1} << 40}, {"zz", 7}}));
  EXPECT_EQ(rest.owner_state, error_feedback::CheckpointOwnerState{}) << "version 2 has no typed sections";
  EXPECT_TRUE(rest.tensors.empty()) << "the tensors went into the store";
  EXPECT_EQ(store.names(), (std::vector<std::string>{"ab", "c"}));
  expect_same_bits(store.residual("ab"), std::vector<float>{1.5f, -2.0f}, "ab");
  EXPECT_TRUE(store.residual("c").empty());

  // Version 1 has no counters section: it loads, with no counters.
  std::vector<unsigned char> v1 = {'G', 'Z', 'E', 'F'};
  append_le<std::uint32_t>(v1, 1);
  append_le<std::uint32_t>(v1, 2);
  append_le<std::uint32_t>(v1, 0);
  append_le<std::uint64_t>(v1, 1);
  append_name(v1, "w");
  append_le<std::uint64_t>(v1, 1);
  append_le<std::uint32_t>(v1, kernels::float_bits(-3.5f));
  append_le<std::uint64_t>(v1, fnv1a64_reference(v1.data(), v1.size()));
  EXPECT_EQ(testing::legacy_checkpoint_bytes(1, 2, 0, {{"w", {-3.5f}}}), v1);
  write_file_bytes(dir / "v1.bin", v1);
  ResidualStore old(2, 0, ResizePolicy::error);
  const error_feedback::CheckpointContents old_rest = old.load(dir / "v1.bin");
  EXPECT_EQ(old_rest.format_version, 1u);
  EXPECT_TRUE(old_rest.version2_counters.empty());
  EXPECT_EQ(old.residual("w")[0], -3.5f);
}

TEST(ResidualStoreCheckpoint, OwnerStateRoundTripsAndWhatTheFormatCannotHoldIsRefused) {
  TempDir dir;
  ResidualStore store(2, 0, ResizePolicy::error);
  fill(store, "w", 3, 0.25f);
  error_feedback::CheckpointOwnerState owner;
  owner.call_numbers = {{"step", 123456789012ull}, {"w", 17}};
  owner.step = 5;
  store.save(dir / "ef.bin", owner);
  ResidualStore fresh(2, 0, ResizePolicy::error);
  EXPECT_EQ(fresh.load(dir / "ef.bin").owner_state, owner);
  EXPECT_EQ(fresh.residual("w")[2], 0.75f);  // fill: base + i/4

  // A call number with an empty name cannot be saved.
  error_feedback::CheckpointOwnerState empty_name;
  empty_name.call_numbers = {{"", 1}};
  const CaughtError refused = error_of([&] { store.save(dir / "bad.bin", empty_name); });
  EXPECT_EQ(refused.code, ErrorCode::invalid_argument);
  expect_mentions(refused, {"call number's tensor name of 0 bytes"});
  EXPECT_FALSE(fs::exists(dir / "bad.bin"));
}

TEST(ResidualStoreCheckpoint, AVersion3FileOfAnotherWorldRankOrLaneIsRefused) {
  TempDir dir;
  const std::vector<float> values{1.0f, 2.0f};
  const error_feedback::CheckpointTensorView lanes[] = {{0, "w", values}, {2, "w", values}};
  error_feedback::write_checkpoint_file(dir / "lanes.bin", 2, 1, lanes, {});
  error_feedback::write_checkpoint_file(dir / "lane0.bin", 2, 1, std::span(lanes, 1), {});
  ResidualStore store(2, 1, ResizePolicy::error);
  expect_load_refused(store, dir / "lanes.bin", ErrorCode::invalid_argument,
                      {"holds tensor 'w' in lane 2", "lane 0 only"});
  ResidualStore wider(3, 1, ResizePolicy::error);
  expect_load_refused(wider, dir / "lane0.bin", ErrorCode::size_mismatch,
                      {"world of 2 ranks", "world of 3"});
  ResidualStore other_rank(2, 0, ResizePolicy::error);
  expect_load_refused(other_rank, dir / "lane0.bin", ErrorCode::invalid_argument,
                      {"rank 1", "rank 0"});
  store.load(dir / "lane0.bin");
  expect_same_bits(store.residual("w"), values, "lane 0's w");
}

TEST(ResidualStore, ReleasesExactlyTheTensorsUnusedSinceTheGivenClock) {
  ResidualStore store(1, 0, ResizePolicy::error);
  store.set_use_clock(5);
  fill(store, "a", 2, 1.0f);
  fill(store, "b", 2, 2.0f);
  store.set_use_clock(9);
  store.residual("b", 2);  // b used again at 9
  fill(store, "c", 2, 3.0f);
  EXPECT_EQ(store.release_unused_before(5), 0u);  // nothing older than 5
  EXPECT_EQ(store.release_unused_before(9), 1u);  // a (last used at 5)
  EXPECT_EQ(store.names(), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(store.residual("b")[1], 2.25f) << "kept tensors keep their values (fill: base + i/4)";
  EXPECT_EQ(store.total_bytes(), 4 * sizeof(float));
  // A released name comes back as a fresh zero residual.
  store.set_use_clock(10);
  EXPECT_EQ(store.residual("a", 2)[0], 0.0f);
  EXPECT_EQ(store.release_unused_before(10), 2u);  // b and c (9)
  EXPECT_EQ(store.names(), (std::vector<std::string>{"a"}));
  // Tensors a load brings in count as used at the load's clock.
  TempDir dir;
  store.save(dir / "ef.bin");
  ResidualStore loaded(1, 0, ResizePolicy::error);
  loaded.set_use_clock(20);
  loaded.load(dir / "ef.bin");
  EXPECT_EQ(loaded.release_unused_before(20), 0u);
  EXPECT_EQ(loaded.release_unused_before(21), 1u);
  EXPECT_EQ(loaded.size(), 0u);
}

// Fills a residual with value(i) for its elements.
void fill_residual(ResidualStore& store, const std::string& name, std::size_t count,
                   float (*value)(std::size_t)) {
  const std::span<float> values = store.residual(name, count);
  for (std::size_t i = 0; i < count; ++i) values[i] = value(i);
}

// Two trees of placed residuals: x (8), x@hier at [2, 6) of x, sra-server:x@hier at [1, 3) of
// x@hier; y with tree-root:y placed in it.
void fill_chains(ResidualStore& store) {
  fill_residual(store, "x", 8, [](std::size_t i) { return 1.0f + static_cast<float>(i); });
  fill_residual(store, "x@hier", 4, [](std::size_t i) { return 100.0f * static_cast<float>(i + 1); });
  fill_residual(store, "sra-server:x@hier", 2, [](std::size_t i) { return 0.5f + static_cast<float>(i); });
  store.set_placement("x@hier", "x", 2);
  store.set_placement("sra-server:x@hier", "x@hier", 1);
  fill_residual(store, "y", 3, [](std::size_t) { return 7.0f; });
  fill_residual(store, "tree-root:y", 3, [](std::size_t) { return 2.0f; });
  store.set_placement("tree-root:y", "y", 0);
}

TEST(ResidualStore, FoldIntoAddsEveryPlacedResidualAtItsElementsThroughChains) {
  ResidualStore store(2, 0, ResizePolicy::error);
  fill_chains(store);  // y's tree is placed elsewhere: untouched

  EXPECT_EQ(store.fold_into("x", 8), 2u);
  const std::vector<float> x(store.residual("x").begin(), store.residual("x").end());
  // x[i] = 1 + i, plus x@hier at [2, 6): 100, 200, 300, 400, plus the server residual at
  // x@hier's [1, 3), i.e. x's [3, 5): 0.5, 1.5.
  const std::vector<float> expected = {1, 2, 3 + 100, 4 + 200 + 0.5f, 5 + 300 + 1.5f, 6 + 400, 7, 8};
  EXPECT_EQ(x, expected);
  EXPECT_FALSE(store.contains("x@hier"));
  EXPECT_FALSE(store.contains("sra-server:x@hier"));
  EXPECT_EQ(store.residual("tree-root:y")[0], 2.0f);
  EXPECT_EQ(store.residual("y")[0], 7.0f);
  // Folded residuals are released, and their placements with them: a second fold finds none.
  EXPECT_EQ(store.fold_into("x", 8), 0u);
}

TEST(ResidualStore, FoldedCopyIsWhatFoldIntoMakesAndChangesNothing) {
  ResidualStore store(2, 0, ResizePolicy::error);
  fill_chains(store);
  // placed_in: every residual whose chain ends in x, with its offset in x.
  using Placed = std::vector<std::pair<std::string, std::size_t>>;
  EXPECT_EQ(store.placed_in("x"), (Placed{{"sra-server:x@hier", 3}, {"x@hier", 2}}));
  EXPECT_EQ(store.placed_in("y"), (Placed{{"tree-root:y", 0}}));
  // Only chains that end in the root count: x@hier is itself placed, so nothing ends in it.
  EXPECT_TRUE(store.placed_in("x@hier").empty());
  const std::optional<std::vector<float>> copy = store.folded_copy("x", 8);
  ASSERT_TRUE(copy.has_value());
  const std::vector<float> expected = {1, 2, 3 + 100, 4 + 200 + 0.5f, 5 + 300 + 1.5f, 6 + 400, 7, 8};
  EXPECT_EQ(*copy, expected);
  // Nothing moved: the residuals and their placements are as they were ...
  EXPECT_EQ(store.residual("x")[3], 4.0f);
  EXPECT_EQ(store.residual("sra-server:x@hier")[1], 1.5f);
  EXPECT_EQ(store.placed_in("x").size(), 2u);
  // ... and folding for real gives the same values.
  store.fold_into("x", 8);
  EXPECT_EQ(std::vector<float>(store.residual("x").begin(), store.residual("x").end()), expected);
  // A root that is not registered: zeros plus what is placed in it; nothing at all: none.
  fill_residual(store, "owner:z", 2, [](std::size_t) { return 3.0f; });
  store.set_placement("owner:z", "z", 1);
  EXPECT_EQ(store.folded_copy("z", 4), (std::optional<std::vector<float>>(std::vector<float>{0, 3, 3, 0})));
  EXPECT_FALSE(store.contains("z"));
  EXPECT_FALSE(store.folded_copy("nothing", 4).has_value());
  // A placement outside its root is refused, as fold_into refuses it.
  store.set_placement("owner:z", "z", 3);
  EXPECT_EQ(error_of([&] { (void)store.folded_copy("z", 4); }).code, ErrorCode::internal);
}

TEST(ResidualStore, EraseTreeForgetsARootAndEverythingPlacedInItOnly) {
  ResidualStore store(2, 0, ResizePolicy::error);
  fill_chains(store);
  EXPECT_EQ(store.erase_tree("x"), 3u);
  EXPECT_EQ(store.names(), (std::vector<std::string>{"tree-root:y", "y"}));
  EXPECT_TRUE(store.placed_in("x").empty());
  // A name registered again starts from zeros, with no placement left over to fold into it.
  fill_residual(store, "x@hier", 4, [](std::size_t) { return 9.0f; });
  EXPECT_TRUE(store.placed_in("x").empty());
  EXPECT_EQ(store.erase_tree("absent"), 0u);
  EXPECT_EQ(store.erase_tree("y"), 2u);
}

TEST(ResidualStore, FoldIntoRegistersAMissingRootOnlyWhenSomethingIsPlacedInIt) {
  ResidualStore store(2, 0, ResizePolicy::error);
  EXPECT_EQ(store.fold_into("z", 5), 0u);
  EXPECT_FALSE(store.contains("z"));
  fill_residual(store, "tree-root:z", 5, [](std::size_t i) { return -1.0f * static_cast<float>(i); });
  store.set_placement("tree-root:z", "z", 0);
  EXPECT_EQ(store.fold_into("z", 5), 1u);
  const std::vector<float> z(store.residual("z").begin(), store.residual("z").end());
  EXPECT_EQ(z, (std::vector<float>{0, -1, -2, -3, -4}));
}

TEST(ResidualStore, FoldIntoRefusesAPlacementOutsideItsRootAndChangesNothing) {
  ResidualStore store(2, 0, ResizePolicy::error);
  fill_residual(store, "w", 4, [](std::size_t) { return 1.0f; });
  fill_residual(store, "rhd-owner:w", 3, [](std::size_t) { return 5.0f; });
  store.set_placement("rhd-owner:w", "w", 2);  // [2, 5) of a 4-element residual
  const CaughtError outside = error_of([&] { store.fold_into("w", 4); });
  EXPECT_EQ(outside.code, ErrorCode::internal) << outside.what;
  expect_mentions(outside, {"rhd-owner:w", "does not fit"});
  EXPECT_TRUE(store.contains("rhd-owner:w"));
  EXPECT_EQ(store.residual("w")[3], 1.0f);
  const CaughtError self = error_of([&] { store.set_placement("w", "w", 0); });
  EXPECT_EQ(self.code, ErrorCode::invalid_argument) << self.what;
  expect_mentions(self, {"different"});
}

TEST(ResidualStoreCheckpoint, RoundTripRestoresEveryValueBitForBit) {
  TempDir dir;
  ResidualStore store(4, 3, ResizePolicy::error);
  const std::vector<float> specials = {0.0f,
                                       -0.0f,
                                       std::numeric_limits<float>::denorm_min(),
                                       -std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::quiet_NaN(),
                                       1e-30f};
  std::copy(specials.begin(), specials.end(), store.residual("a/special", specials.size()).begin());
  const auto random = testing::gaussian(4099, 5);
  std::copy(random.begin(), random.end(), store.residual("layers.0.weight", 4099).begin());
  store.residual("zero.count", 0);
  store.save(dir / "ef.bin");
  const StoreSnapshot saved = snapshot_of(store);

  // Into an empty store: it takes the file's tensors.
  ResidualStore fresh(4, 3, ResizePolicy::error);
  fresh.load(dir / "ef.bin");
  ASSERT_EQ(fresh.names(), saved.names);
  for (std::size_t t = 0; t < saved.names.size(); ++t) {
    expect_same_bits(fresh.residual(saved.names[t]), saved.values[t], saved.names[t]);
  }

  // Into a store that already has these tensors: values are copied into the existing buffers.
  ResidualStore registered(4, 3, ResizePolicy::error);
  const auto weight = registered.residual("layers.0.weight", 4099);
  registered.residual("a/special", specials.size());
  registered.residual("zero.count", 0);
  registered.load(dir / "ef.bin");
  EXPECT_EQ(registered.residual("layers.0.weight").data(), weight.data());
  expect_same_bits(weight, random, "pre-registered tensor after load");
  expect_same_bits(registered.residual("a/special"), specials, "a/special");

  // Saving over an existing checkpoint replaces it and leaves no temporary file.
  fill(store, "layers.0.weight", 4099, 7.0f);
  store.save(dir / "ef.bin");
  fresh.clear();
  fresh.load(dir / "ef.bin");
  EXPECT_EQ(fresh.residual("layers.0.weight")[3], 7.75f);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ef.bin"}));
}

TEST(ResidualStoreCheckpoint, SaveFailuresAreIoErrorsThatLeaveNothingBehind) {
  TempDir dir;
  ResidualStore store(1, 0, ResizePolicy::error);
  fill(store, "w", 5, 1.0f);

  const fs::path no_directory = dir / "missing" / "ef.bin";
  const auto missing = error_of([&] { store.save(no_directory); });
  EXPECT_EQ(missing.code, ErrorCode::io_error);
  expect_mentions(missing, {no_directory.string()});

  // The target is a directory: the rename fails after the temporary file was written.
  fs::create_directory(dir / "occupied");
  const auto occupied = error_of([&] { store.save(dir / "occupied"); });
  EXPECT_EQ(occupied.code, ErrorCode::io_error);
  expect_mentions(occupied, {(dir / "occupied").string(), "rename"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"occupied"})) << "a temporary file was left";
  EXPECT_TRUE(fs::is_empty(dir / "occupied"));
}

// What fill(store, name, count, first) puts in a residual.
std::vector<float> filled(std::size_t count, float first) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = first + 0.25f * static_cast<float>(i);
  return values;
}

// A small checkpoint of format version 2 (as earlier builds wrote it: the test fixture) and
// stores to load it into, for the refusal tests of the reader of old files. Version 3's are in
// test_checkpoint_file.cpp.
class CheckpointRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_legacy_checkpoint(good_path(), 2, 3, 1,
                                     {{"decoder.bias", filled(7, 0.5f)},
                                      {"encoder.weight", filled(5, -1.0f)}});
    good_ = read_file_bytes(good_path());
    ASSERT_EQ(good_.size(), 24u + (4 + 12 + 8 + 28) + (4 + 14 + 8 + 20) + 8 + 8);
    // A store with other values for the same tensors, and an empty store.
    fill(populated_, "decoder.bias", 7, 9.0f);
    fill(populated_, "encoder.weight", 5, 19.0f);
  }

  fs::path good_path() const { return dir_ / "good.bin"; }

  // Writes `bytes` as a checkpoint and expects every store to refuse it with `code` and a
  // message mentioning `parts`, unchanged.
  void expect_refused(const std::vector<unsigned char>& bytes, ErrorCode code,
                      const std::vector<std::string>& parts, const std::string& what) {
    SCOPED_TRACE(what);
    const fs::path path = dir_ / "bad.bin";
    write_file_bytes(path, bytes);
    expect_refused_path(path, code, parts);
  }

  void expect_refused_path(const fs::path& path, ErrorCode code,
                           const std::vector<std::string>& parts) {
    for (ResidualStore* store : {&empty_, &populated_}) {
      expect_load_refused(*store, path, code, parts);
    }
  }

  // The good file with the field at `offset` set to `value` and the checksum rewritten, so
  // that only the field is wrong.
  template <typename T>
  std::vector<unsigned char> good_with(std::size_t offset, T value) const {
    auto bytes = good_;
    put_le(bytes, offset, value);
    rehash(bytes);
    return bytes;
  }

  TempDir dir_;
  std::vector<unsigned char> good_;
  ResidualStore empty_{3, 1, ResizePolicy::error};
  ResidualStore populated_{3, 1, ResizePolicy::error};
};

TEST_F(CheckpointRefusal, TheUnmodifiedFileLoads) {
  // The control for every refusal below: the same stores accept the good file.
  empty_.load(good_path());
  populated_.load(good_path());
  EXPECT_EQ(empty_.residual("encoder.weight")[1], -0.75f);
  EXPECT_EQ(populated_.residual("decoder.bias")[2], 1.0f);
}

TEST_F(CheckpointRefusal, NonexistentPathAndDirectory) {
  expect_refused_path(dir_ / "nothing-here.bin", ErrorCode::io_error,
                      {(dir_ / "nothing-here.bin").string(), "No such file"});
  expect_refused_path(dir_.path(), ErrorCode::io_error, {"not a regular file"});
}

TEST_F(CheckpointRefusal, AnotherFormatVersion) {
  expect_refused(good_with<std::uint32_t>(kVersionOffset, 4), ErrorCode::invalid_argument,
                 {"version 4", "reads versions 1, 2 and 3"}, "version 4");
}

TEST_F(CheckpointRefusal, AnotherWorldSize) {
  expect_refused(good_with<std::uint32_t>(kWorldSizeOffset, 4), ErrorCode::size_mismatch, {"world of 4 ranks", "world of 3"},
                 "world size 4");
}

TEST_F(CheckpointRefusal, AnotherRank) {
  expect_refused(good_with<std::uint32_t>(kRankOffset, 2), ErrorCode::invalid_argument, {"rank 2", "rank 1"}, "rank 2");
}

TEST_F(CheckpointRefusal, AnotherTensorSetInANonEmptyStore) {
  // The file holds {decoder.bias: 7, encoder.weight: 5}.
  const auto refuses = [&](ResidualStore& store, ErrorCode code,
                           const std::vector<std::string>& parts) {
    expect_load_refused(store, good_path(), code, parts);
  };
  ResidualStore missing_one(3, 1, ResizePolicy::error);
  fill(missing_one, "encoder.weight", 5, 0.0f);
  refuses(missing_one, ErrorCode::invalid_argument, {"'decoder.bias'", "store does not have"});

  ResidualStore extra_one(3, 1, ResizePolicy::error);
  fill(extra_one, "decoder.bias", 7, 0.0f);
  fill(extra_one, "decoder.extra", 2, 0.0f);
  fill(extra_one, "encoder.weight", 5, 0.0f);
  refuses(extra_one, ErrorCode::invalid_argument, {"'decoder.extra'", "does not hold"});

  ResidualStore renamed(3, 1, ResizePolicy::error);
  fill(renamed, "decoder.bias", 7, 0.0f);
  fill(renamed, "encoder.weights", 5, 0.0f);
  refuses(renamed, ErrorCode::invalid_argument, {"'encoder.weight'"});

  ResidualStore resized(3, 1, ResizePolicy::reset);
  fill(resized, "decoder.bias", 8, 0.0f);
  fill(resized, "encoder.weight", 5, 0.0f);
  refuses(resized, ErrorCode::size_mismatch, {"'decoder.bias'", "7 elements", "8 in this store"});
}

TEST_F(CheckpointRefusal, EveryTruncation) {
  for (std::size_t length = 0; length < good_.size(); ++length) {
    const std::vector<unsigned char> prefix(good_.begin(), good_.begin() + length);
    expect_refused(prefix, ErrorCode::io_error, {"bad.bin"},
                   "truncated to " + std::to_string(length) + " bytes");
  }
}

TEST_F(CheckpointRefusal, TrailingBytes) {
  auto bytes = good_;
  bytes.insert(bytes.end() - 8, {0, 0, 0, 0});
  rehash(bytes);
  expect_refused(bytes, ErrorCode::io_error, {"4 unexpected bytes between the last record"},
                 "4 extra bytes");
}

TEST_F(CheckpointRefusal, EveryFlippedByte) {
  // A flipped version byte reads as another format version (checked before the checksum,
  // because another version may checksum differently); any other flip is corruption. Version
  // 2 with its lowest bit flipped is 3, which this build reads: the file is then corrupt.
  for (std::size_t offset = 0; offset < good_.size(); ++offset) {
    auto bytes = good_;
    bytes[offset] ^= 0x01;
    const bool unknown_version = offset > kVersionOffset && offset < kVersionOffset + 4;
    expect_refused(bytes, unknown_version ? ErrorCode::invalid_argument : ErrorCode::io_error,
                   {unknown_version ? "version" : "bad.bin"},
                   "byte " + std::to_string(offset) + " flipped");
  }
  auto checksum_only = good_;
  checksum_only[good_.size() - 1] ^= 0x80;
  expect_refused(checksum_only, ErrorCode::io_error, {"checksum mismatch"}, "checksum flipped");
  auto value_flipped = good_;
  value_flipped[kFirstRecordOffset + 4 + 12 + 8] ^= 0x01;
  expect_refused(value_flipped, ErrorCode::io_error, {"checksum mismatch"}, "value flipped");
}

TEST_F(CheckpointRefusal, CorruptLengthsAreBoundedByTheFileSizeBeforeAllocating) {
  // Each edit keeps a valid checksum: only the bounds checks can catch it. Allocating the
  // claimed 4 TiB would fail with std::bad_alloc (or abort under AddressSanitizer), not with
  // the expected gradzip::Error.
  expect_refused(good_with<std::uint64_t>(kFirstRecordOffset + 4 + 12, std::uint64_t{1} << 40),
                 ErrorCode::io_error, {"'decoder.bias' claims 1099511627776"},
                 "element count 2^40");
  expect_refused(good_with<std::uint32_t>(kFirstRecordOffset, 0xFFFFFFFFu), ErrorCode::io_error,
                 {"name length of 4294967295"}, "name length 2^32-1");
  expect_refused(good_with<std::uint32_t>(kFirstRecordOffset, 0), ErrorCode::io_error,
                 {"name length of 0"}, "empty name");
  expect_refused(good_with<std::uint64_t>(kTensorCountOffset, ~std::uint64_t{0}),
                 ErrorCode::io_error, {"18446744073709551615 tensors cannot fit"},
                 "tensor count 2^64-1");
  expect_refused(good_with<std::uint64_t>(kTensorCountOffset, 3), ErrorCode::io_error,
                 {"bad.bin"}, "tensor count 3 of 2");
  // The counter count sits just before the checksum (the file has no counters).
  expect_refused(good_with<std::uint64_t>(good_.size() - 16, ~std::uint64_t{0}),
                 ErrorCode::io_error, {"18446744073709551615 counters cannot fit"},
                 "counter count 2^64-1");
}

TEST_F(CheckpointRefusal, CountersOutOfOrderOrWithEmptyNames) {
  const auto counted = testing::legacy_checkpoint_bytes(
      2, 3, 1, {{"decoder.bias", filled(7, 0.5f)}, {"encoder.weight", filled(5, -1.0f)}},
      {{"a", 1}, {"b", 2}});
  // Counter records: 8-byte count, then (4 + 1 + 8) bytes each, then the checksum.
  const std::size_t first_name = counted.size() - 8 - 2 * 13 + 4;
  auto swapped = counted;
  std::swap(swapped[first_name], swapped[first_name + 13]);  // "b" before "a"
  rehash(swapped);
  expect_refused(swapped, ErrorCode::io_error, {"counter 'a'", "strictly increasing"},
                 "unsorted counters");
  auto empty_name = counted;
  put_le<std::uint32_t>(empty_name, first_name - 4, 0);
  rehash(empty_name);
  expect_refused(empty_name, ErrorCode::io_error, {"counter 0 has a name length of 0"},
                 "empty counter name");
}

TEST_F(CheckpointRefusal, NamesOutOfOrder) {
  // Swap the names' first letters: "eecoder.bias" now precedes "dncoder.weight". With a valid
  // checksum only the order check refuses it.
  auto bytes = good_;
  std::swap(bytes[kFirstRecordOffset + 4], bytes[kFirstRecordOffset + 4 + 12 + 8 + 28 + 4]);
  rehash(bytes);
  expect_refused(bytes, ErrorCode::io_error, {"strictly increasing"}, "unsorted names");
}

// ------------------------------------------------------------------------------------------
// ErrorFeedbackCodec

// A codec that fails on demand, to check the decorator's state after a failure.
class FailingCodec final : public Codec {
 public:
  FailingCodec() : none_(make_codec("none")) {}
  const CompressionSpec& spec() const noexcept override { return none_->spec(); }
  std::size_t max_encoded_bytes(std::size_t count) const override {
    return none_->max_encoded_bytes(count);
  }
  std::size_t encode(ConstTensorView in, std::span<std::byte> out,
                     const EncodeContext& ctx) const override {
    if (fail_encode) GZ_THROW(ErrorCode::internal, "FailingCodec.encode");
    return none_->encode(in, out, ctx);
  }
  void decode(std::span<const std::byte> in, TensorView out) const override {
    if (fail_decode) GZ_THROW(ErrorCode::malformed_message, "FailingCodec.decode");
    none_->decode(in, out);
  }
  void decode_add(std::span<const std::byte> in, float* acc, std::size_t count) const override {
    none_->decode_add(in, acc, count);
  }
  bool additive() const noexcept override { return true; }
  bool sparse() const noexcept override { return false; }

  bool fail_encode = false;
  bool fail_decode = false;

 private:
  std::unique_ptr<Codec> none_;
};

TEST(ErrorFeedback, RejectsBadArgumentsBeforeTouchingTheStore) {
  ResidualStore store(1, 0, ResizePolicy::error);
  EXPECT_EQ(error_of([&] { ErrorFeedbackCodec(nullptr, store); }).code,
            ErrorCode::invalid_argument);
  ErrorFeedbackCodec ef(make_codec("none"), store);
  const std::vector<float> grad(10, 1.0f);
  std::vector<std::byte> out(ef.max_encoded_bytes(10));

  EncodeContext offset_ctx;
  offset_ctx.element_offset = 1;
  const auto whole_with_offset = error_of([&] { ef.encode("w", host_view(grad.data(), 10), out, offset_ctx); });
  EXPECT_EQ(whole_with_offset.code, ErrorCode::invalid_argument);
  expect_mentions(whole_with_offset, {"'w'", "element_offset is 1"});

  const auto outside = error_of(
      [&] { ef.encode_chunk("w", 10, host_view(grad.data(), 10), out, offset_ctx); });
  EXPECT_EQ(outside.code, ErrorCode::invalid_argument);
  expect_mentions(outside, {"10 elements at offset 1", "'w' of 10 elements"});
  EncodeContext wrapping_ctx;
  wrapping_ctx.element_offset = ~std::uint64_t{0};
  EXPECT_EQ(error_of([&] { ef.encode_chunk("w", 10, host_view(grad.data(), 1), out, wrapping_ctx); }).code,
            ErrorCode::invalid_argument);

  std::vector<std::byte> small(ef.max_encoded_bytes(10) - 1);
  EXPECT_EQ(error_of([&] { ef.encode("w", host_view(grad.data(), 10), small, {}); }).code,
            ErrorCode::invalid_argument);
  const ConstTensorView on_gpu{grad.data(), 10, DType::f32, Device{DeviceKind::cuda, 0}};
  EXPECT_EQ(error_of([&] { ef.encode("w", on_gpu, out, {}); }).code, testing::fake_cuda_view_error());
  EXPECT_EQ(store.size(), 0u) << "a refused call registered a residual";
}

TEST(ErrorFeedback, AFailingCodecLeavesTheResidualAsItWas) {
  ResidualStore store(1, 0, ResizePolicy::error);
  const auto codec = std::make_shared<FailingCodec>();
  ErrorFeedbackCodec ef(codec, store);
  fill(store, "w", 6, 2.0f);
  const auto before = copy_of(store.residual("w"));
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6};
  std::vector<std::byte> out(ef.max_encoded_bytes(6));
  codec->fail_encode = true;
  EXPECT_EQ(error_of([&] { ef.encode("w", host_view(grad.data(), 6), out, {}); }).code,
            ErrorCode::internal);
  expect_same_bits(store.residual("w"), before, "after a failed encode");
  codec->fail_encode = false;
  codec->fail_decode = true;
  EXPECT_EQ(error_of([&] { ef.encode("w", host_view(grad.data(), 6), out, {}); }).code,
            ErrorCode::malformed_message);
  expect_same_bits(store.residual("w"), before, "after a failed decode");
}

TEST(ErrorFeedback, NoneCodecSendsGPlusEAndLeavesAZeroResidual) {
  // D(C(x)) == x for `none`, so e = g' - g' = +0 exactly and the message carries g + e.
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(make_codec("none"), store);
  fill(store, "w", 1000, -4.0f);
  const auto e0 = copy_of(store.residual("w"));
  const auto grad = testing::gaussian(1000, 3);
  const auto message = [&] {
    std::vector<std::byte> out(ef.max_encoded_bytes(1000));
    out.resize(ef.encode("w", host_view(grad.data(), 1000), out, {}));
    return out;
  }();
  const auto sent = testing::decode_to_f32(ef.codec(), message, 1000);
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(sent[i], grad[i] + e0[i]) << i;
  for (float e : store.residual("w")) ASSERT_EQ(kernels::float_bits(e), 0u);
}

TEST(ErrorFeedback, NonFiniteValuesNeverEnterTheResidual) {
  // Residuals never hold NaN or Inf: an element whose residual comes out non-finite
  // (NaN - NaN, inf - inf) is stored as +0, the others are unaffected. fp16: 1 + 2^-12 encodes
  // as 1 (the residual is 2^-12, exact); 1e6 saturates to 65504 (residual 1e6 - 65504, finite).
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(make_codec("fp16"), store);
  const float small = 1.0f + 0x1p-12f;
  std::vector<float> grad(8, small);
  grad[2] = std::numeric_limits<float>::quiet_NaN();
  grad[5] = -std::numeric_limits<float>::infinity();
  grad[6] = 1.0e6f;
  std::vector<std::byte> out(ef.max_encoded_bytes(8));
  ef.encode("w", host_view(grad.data(), 8), out, {});
  const auto residual = store.residual("w");
  for (std::size_t i = 0; i < 8; ++i) {
    if (i == 2 || i == 5) {
      EXPECT_EQ(kernels::float_bits(residual[i]), 0u) << i;
    } else if (i == 6) {
      EXPECT_EQ(residual[i], 1.0e6f - 65504.0f) << i;
    } else {
      EXPECT_EQ(residual[i], 0x1p-12f) << i;
    }
  }
  // The next finite step starts those elements from 0: 1 + 2^-12 + 2^-12 = 1 + 2^-11, a tie
  // between 1 and 1 + 2^-10 that rounds to even (1), residual 2^-11; elements 2 and 5 hold 2^-12.
  std::fill(grad.begin(), grad.end(), small);
  ef.encode("w", host_view(grad.data(), 8), out, {});
  for (std::size_t i = 0; i < 8; ++i) {
    if (i == 2 || i == 5) {
      EXPECT_EQ(residual[i], 0x1p-12f) << i;
    } else if (i != 6) {
      EXPECT_EQ(residual[i], 0x1p-11f) << i;
    }
  }
}

TEST(ErrorFeedback, ReusesItsScratchWithoutAllocating) {
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(make_codec("none"), store);
  const auto grad = testing::gaussian(5000, 9);
  std::vector<std::byte> out(ef.max_encoded_bytes(5000));
  ef.encode("w", host_view(grad.data(), 5000), out, {});
  EXPECT_EQ(ef.scratch_bytes(), 5000 * sizeof(float));

  g_allocations = 0;
  g_count_allocations = true;
  ef.encode("w", host_view(grad.data(), 5000), out, {});
  EncodeContext ctx;
  ctx.element_offset = 1000;
  ef.encode_chunk("w", 5000, host_view(grad.data(), 3000), out, ctx);  // smaller: reuses
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0u);
  EXPECT_EQ(ef.scratch_bytes(), 5000 * sizeof(float));
  ef.release_scratch();
  EXPECT_EQ(ef.scratch_bytes(), 0u);
}

TEST(ErrorFeedback, ResizeFollowsTheStorePolicy) {
  const std::vector<float> grad(11, 0.5f);
  std::vector<std::byte> out(1024);
  for (const ResizePolicy policy : {ResizePolicy::error, ResizePolicy::reset}) {
    ResidualStore store(1, 0, policy);
    ErrorFeedbackCodec ef(make_codec("none"), store);
    fill(store, "w", 10, 0.125f);
    const StoreSnapshot before = snapshot_of(store);
    if (policy == ResizePolicy::error) {
      const auto error = error_of([&] { ef.encode("w", host_view(grad.data(), 11), out, {}); });
      EXPECT_EQ(error.code, ErrorCode::size_mismatch);
      expect_mentions(error, {"'w'", "from 10 to 11"});
      expect_unchanged(store, before);
    } else {
      // A fresh zero residual: the message carries g exactly.
      const std::size_t bytes = ef.encode("w", host_view(grad.data(), 11), out, {});
      const auto sent = testing::decode_to_f32(ef.codec(), std::span(out).first(bytes), 11);
      EXPECT_EQ(sent, grad);
      EXPECT_EQ(store.residual("w").size(), 11u);
    }
  }
}

// Parameterised over the codecs error feedback is used with.
class ErrorFeedbackCodecTest : public ::testing::TestWithParam<std::string> {};

std::string spec_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name;
  for (char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

// One step of the definition, computed directly: g' = g + e; m = C(g'); e = g' - D(m).
std::vector<std::byte> reference_step(const Codec& codec, std::span<const float> grad,
                                      std::span<float> residual, const EncodeContext& ctx) {
  std::vector<float> corrected(grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) corrected[i] = grad[i] + residual[i];
  const auto message = testing::encode_message(codec, host_view(corrected.data(), grad.size()), ctx);
  const auto decoded = testing::decode_to_f32(codec, message, grad.size());
  for (std::size_t i = 0; i < grad.size(); ++i) residual[i] = corrected[i] - decoded[i];
  return message;
}

EncodeContext step_context(std::uint32_t step, std::uint32_t tensor_id) {
  EncodeContext ctx;
  ctx.seed = 20240611;
  ctx.step = step;
  ctx.tensor_id = tensor_id;
  return ctx;
}

std::vector<std::byte> ef_step(ErrorFeedbackCodec& ef, const std::string& name,
                               ConstTensorView grad, const EncodeContext& ctx) {
  std::vector<std::byte> out(ef.max_encoded_bytes(grad.count));
  out.resize(ef.encode(name, grad, out, ctx));
  return out;
}

TEST_P(ErrorFeedbackCodecTest, MatchesTheDefinitionBitForBit) {
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{4099}}) {
    ResidualStore store(1, 0, ResizePolicy::error);
    ErrorFeedbackCodec ef(codec, store);
    std::vector<float> reference_residual(n, 0.0f);
    for (std::uint32_t step = 0; step < 5; ++step) {
      const auto grad = testing::gaussian(n, 100 * n + step);
      const auto message = ef_step(ef, "w", host_view(grad.data(), n), step_context(step, 1));
      const auto expected = reference_step(*codec, grad, reference_residual, step_context(step, 1));
      ASSERT_EQ(message, expected) << "n " << n << ", step " << step;
      expect_same_bits(store.residual("w"), reference_residual,
                       "residual, n " + std::to_string(n) + ", step " + std::to_string(step));
    }
  }
}

TEST_P(ErrorFeedbackCodecTest, ConservesTheGradientSum) {
  // Claim: sum_t D(m_t) + e_T == sum_t g_t (e_0 = 0), up to f32 rounding.
  // Derivation. Each step computes g' = fl(g + e) and e' = fl(g' - d) with d = D(m) exactly
  // what receivers decode. Round to nearest gives fl(x) = x / (1 + delta), |delta| <= u = 2^-24
  // (also for subnormal results: sums of floats that underflow are exact), so
  //   g' = g + e + r1, |r1| <= u |g'|;   e' = g' - d + r2, |r2| <= u |e'|.
  // Telescoping over T steps: e_T = sum_t (g_t - d_t) + sum_t (r1_t + r2_t), hence per element
  //   |sum_t d_t + e_T - sum_t g_t| <= u * sum_t (|g'_t| + |e_t|).
  // The left side is evaluated in double: 2T + 1 exact terms summed with rounding at most
  // (2T + 1) * 2^-53 * sum of |terms|, which is added to the bound.
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  constexpr int kSteps = 100;
  const double u = std::ldexp(1.0, -24);
  const double u_double = std::ldexp(1.0, -53);
  for (const std::size_t n : {std::size_t{1000}, std::size_t{4099}}) {
    ResidualStore store(1, 0, ResizePolicy::error);
    ErrorFeedbackCodec ef(codec, store);
    std::vector<double> sum_sent(n, 0.0), sum_grad(n, 0.0), sum_abs_terms(n, 0.0);
    std::vector<double> f32_bound(n, 0.0);
    std::vector<float> previous(n, 0.0f);
    for (int step = 0; step < kSteps; ++step) {
      const auto grad = testing::gaussian(n, 7000 + step);
      const auto message = ef_step(ef, "w", host_view(grad.data(), n), step_context(step, 2));
      const auto sent = testing::decode_to_f32(*codec, message, n);
      const auto residual = store.residual("w");
      for (std::size_t i = 0; i < n; ++i) {
        const float corrected = grad[i] + previous[i];  // the decorator's g', same operation
        f32_bound[i] += std::fabs(double{corrected}) + std::fabs(double{residual[i]});
        sum_sent[i] += sent[i];
        sum_grad[i] += grad[i];
        sum_abs_terms[i] += std::fabs(double{sent[i]}) + std::fabs(double{grad[i]});
      }
      previous = copy_of(residual);
    }
    const auto residual = store.residual("w");
    double worst_ratio = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double gap = sum_sent[i] + residual[i] - sum_grad[i];
      const double bound =
          u * f32_bound[i] +
          (2 * kSteps + 1) * u_double * (sum_abs_terms[i] + std::fabs(double{residual[i]}));
      ASSERT_TRUE(std::isfinite(gap)) << "n " << n << ", element " << i << ": residual "
                                      << residual[i] << ", sum sent " << sum_sent[i];
      ASSERT_LE(std::fabs(gap), bound) << "n " << n << ", element " << i;
      worst_ratio = std::max(worst_ratio, std::fabs(gap) / bound);
    }
    std::cout << "  " << GetParam() << ", n " << n << ": worst |gap| / bound = " << worst_ratio
              << ", ||e_T|| = " << norm(residual) << "\n";
  }
}

TEST_P(ErrorFeedbackCodecTest, ResumingFromACheckpointGivesIdenticalMessages) {
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  struct Tensor {
    std::string name;
    std::size_t count;
  };
  const std::vector<Tensor> tensors = {
      {"block0.attn.weight", 1000}, {"block0.bias", 7}, {"empty", 0}, {"head.weight", 4099}};
  const auto gradient = [](std::size_t t, std::size_t n, int step) {
    return testing::gaussian(n, 1000 * t + static_cast<std::uint64_t>(step));
  };
  const auto run_steps = [&](ErrorFeedbackCodec& ef, int first, int last,
                             std::vector<std::vector<std::byte>>* messages) {
    for (int step = first; step < last; ++step) {
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        const auto grad = gradient(t, tensors[t].count, step);
        auto message = ef_step(ef, tensors[t].name, host_view(grad.data(), grad.size()),
                               step_context(static_cast<std::uint32_t>(step),
                                            static_cast<std::uint32_t>(t)));
        if (messages) messages->push_back(std::move(message));
      }
    }
  };

  TempDir dir;
  ResidualStore original(2, 1, ResizePolicy::error);
  ErrorFeedbackCodec original_ef(codec, original);
  run_steps(original_ef, 0, 30, nullptr);
  original.save(dir / "step30.gzef");
  std::vector<std::vector<std::byte>> uninterrupted;
  run_steps(original_ef, 30, 50, &uninterrupted);

  // A restarted rank: either an empty store, or one whose tensors were registered first.
  for (const bool preregistered : {false, true}) {
    SCOPED_TRACE(preregistered ? "pre-registered store" : "empty store");
    ResidualStore restarted(2, 1, ResizePolicy::error);
    if (preregistered) {
      for (const auto& tensor : tensors) restarted.residual(tensor.name, tensor.count);
    }
    restarted.load(dir / "step30.gzef");
    ErrorFeedbackCodec restarted_ef(codec, restarted);
    std::vector<std::vector<std::byte>> resumed;
    run_steps(restarted_ef, 30, 50, &resumed);
    ASSERT_EQ(resumed.size(), uninterrupted.size());
    for (std::size_t m = 0; m < resumed.size(); ++m) {
      ASSERT_EQ(resumed[m], uninterrupted[m])
          << "step " << 30 + m / tensors.size() << ", tensor " << tensors[m % tensors.size()].name;
    }
    for (const auto& tensor : tensors) {
      expect_same_bits(restarted.residual(tensor.name), original.residual(tensor.name),
                       tensor.name);
    }
  }
}

TEST_P(ErrorFeedbackCodecTest, HalfPrecisionInputsActAsTheirF32Values) {
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  for (const DType dtype : {DType::f16, DType::bf16}) {
    ResidualStore half_store(1, 0, ResizePolicy::error), f32_store(1, 0, ResizePolicy::error);
    ErrorFeedbackCodec half_ef(codec, half_store), f32_ef(codec, f32_store);
    // 2 * kConvertBlock + 5 elements: several conversion blocks and a partial one.
    const std::size_t n = 8197;
    for (std::uint32_t step = 0; step < 3; ++step) {
      const testing::HostTensor half(dtype, testing::gaussian(n, 300 + step));
      const auto as_f32 = half.to_f32();
      const auto half_message = ef_step(half_ef, "w", half.view(), step_context(step, 4));
      const auto f32_message = ef_step(f32_ef, "w", host_view(as_f32.data(), n), step_context(step, 4));
      ASSERT_EQ(half_message, f32_message) << dtype_name(dtype) << ", step " << step;
    }
    expect_same_bits(half_store.residual("w"), f32_store.residual("w"),
                     std::string(dtype_name(dtype)) + " residual");
  }
}

TEST_P(ErrorFeedbackCodecTest, ChunksReadAndUpdateSlicesOfOneResidual) {
  // A tensor of 4099 elements sent as chunks [0, 1500), [1500, 1501), [1501, 4099) keyed by one
  // name: each chunk must be the definition applied to its slice of the tensor's residual.
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  constexpr std::size_t kCount = 4099;
  const std::size_t bounds[] = {0, 1500, 1501, kCount};
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(codec, store);
  std::vector<float> reference(kCount, 0.0f);
  for (std::uint32_t step = 0; step < 4; ++step) {
    const auto grad = testing::gaussian(kCount, 500 + step);
    // Chunks in reverse order: the order must not matter.
    for (std::size_t c = 3; c-- > 0;) {
      const std::size_t begin = bounds[c], count = bounds[c + 1] - bounds[c];
      EncodeContext ctx = step_context(step, 5);
      ctx.element_offset = begin;
      std::vector<std::byte> out(ef.max_encoded_bytes(count));
      out.resize(ef.encode_chunk("w", kCount, host_view(grad.data() + begin, count), out, ctx));
      const auto expected = reference_step(
          *codec, std::span(grad).subspan(begin, count),
          std::span(reference).subspan(begin, count), ctx);
      ASSERT_EQ(out, expected) << "step " << step << ", chunk " << c;
    }
    expect_same_bits(store.residual("w"), reference, "residual after step " + std::to_string(step));
  }
  EXPECT_EQ(store.names(), (std::vector<std::string>{"w"}));
}

INSTANTIATE_TEST_SUITE_P(Codecs, ErrorFeedbackCodecTest, ::testing::ValuesIn(kEfCodecSpecs),
                         spec_test_name);

TEST(ErrorFeedback, InPlacePathMatchesTheGeneralPathOnEveryIsa) {
  // encode_chunk runs top-k and sign in place (Codec::subtracts_decoded_in_place): top-k
  // updates only the entries its message carries, sign decodes block by block. A caller that
  // asks for `decoded` gets the general path, which decodes in full. Both must give the same
  // message and the same residual, bit for bit, on every ISA: over chunked steps, with f16
  // values that overflow (g' - inf: the residual element becomes 0), with infinite and NaN
  // gradient elements, some of them not sent (the in-place path's full update), with a -0.0
  // input, and with finite elements near FLT_MAX whose bucket sum overflows (sign's rescue of
  // the scale, which reads g' again after the encoder's pass).
  using kernels::cpu::Isa;
  for (const Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    testing::ScopedIsa forced(isa);
    for (const std::string spec : {"topk:ratio=0.01", "topk:ratio=0.05,approx=on",
                                   "topk:ratio=0.02,values=fp16", "topk:k=3", "sign",
                                   "sign:bucket=64", "sign:bucket=7"}) {
      const std::shared_ptr<const Codec> codec = built_codec(spec);
      ResidualStore in_place_store(1, 0, ResizePolicy::error), general_store(1, 0, ResizePolicy::error);
      ErrorFeedbackCodec in_place(codec, in_place_store), general(codec, general_store);
      // Chunks of several of sign's 4096-element decode blocks (kernels/cpu/convert.h), the
      // second starting inside a sign bucket.
      constexpr std::size_t kCount = 20011, kSplit = 8200;
      for (std::uint32_t step = 0; step < 7; ++step) {
        auto grad = testing::gaussian(kCount, 7000 + step);
        if (step == 2) grad[11] = 1.0e6f;  // beyond f16: values=fp16 sends inf
        if (step == 3) {  // more infinities than top-k:k=3 sends, and a NaN
          for (std::size_t i = 40; i < 44; ++i) grad[i] = std::numeric_limits<float>::infinity();
          grad[44] = std::numeric_limits<float>::quiet_NaN();
        }
        if (step == 4) grad[5] = -0.0f;
        if (step == 5) {
          for (std::size_t i = 100; i < 110; ++i) grad[i] = 3.0e38f;
        }
        for (const auto& [offset, count] : {std::pair{std::size_t{0}, kSplit},
                                            std::pair{kSplit, kCount - kSplit}}) {
          EncodeContext ctx = step_context(step, 3);
          ctx.element_offset = offset;
          const ConstTensorView chunk = host_view(grad.data() + offset, count);
          std::vector<std::byte> a(codec->max_encoded_bytes(count)), b(a.size());
          std::vector<float> decoded(count);
          a.resize(in_place.encode_chunk("w", kCount, chunk, a, ctx));
          b.resize(general.encode_chunk("w", kCount, chunk, b, ctx, decoded));
          const std::string where = spec + ", isa " + std::string(kernels::cpu::isa_name(isa)) +
                                    ", step " + std::to_string(step) + ", offset " +
                                    std::to_string(offset);
          ASSERT_EQ(a, b) << where;
          expect_same_bits(in_place_store.residual("w"), general_store.residual("w"),
                           "residual, " + where);
        }
      }
      // The overflow and the infinite element left 0 where they went, not a non-finite value.
      for (const float value : in_place_store.residual("w")) ASSERT_TRUE(std::isfinite(value)) << spec;
    }
  }
}

TEST(ErrorFeedback, ChunkedElementwiseCodecsMatchTheWholeTensor) {
  // For element-wise deterministic codecs a chunk boundary changes nothing: encoding in chunks
  // leaves exactly the residual of encoding the whole tensor.
  for (const std::string spec : {"none", "fp16", "bf16"}) {
    const auto codec = built_codec(spec);
    ResidualStore whole_store(1, 0, ResizePolicy::error), chunk_store(1, 0, ResizePolicy::error);
    ErrorFeedbackCodec whole(codec, whole_store), chunked(codec, chunk_store);
    for (std::uint32_t step = 0; step < 3; ++step) {
      const auto grad = testing::gaussian(3000, 40 + step);
      ef_step(whole, "w", host_view(grad.data(), 3000), step_context(step, 0));
      for (std::size_t begin = 0; begin < 3000; begin += 1024) {
        const std::size_t count = std::min<std::size_t>(1024, 3000 - begin);
        EncodeContext ctx = step_context(step, 0);
        ctx.element_offset = begin;
        std::vector<std::byte> out(chunked.max_encoded_bytes(count));
        chunked.encode_chunk("w", 3000, host_view(grad.data() + begin, count), out, ctx);
      }
    }
    expect_same_bits(chunk_store.residual("w"), whole_store.residual("w"), spec);
  }
}

// ------------------------------------------------------------------------------------------
// What feedback buys the biased codecs.

class BiasedCodecFeedback : public ::testing::TestWithParam<std::string> {};

TEST_P(BiasedCodecFeedback, ResidualIsNonzeroAndFarBelowTheErrorWithoutFeedback) {
  // Gradients with a fixed mean, g_t = m + xi_t (m ~ N(0, 0.5^2) per element, xi_t ~ N(0, 1)):
  // a biased codec without feedback drops part of m every step, so its accumulated error
  //   E_T = sum_t (g_t - D(C(g_t)))
  // grows like T. With feedback the accumulated error of what was sent is exactly e_T
  // (conservation, up to rounding), and e_T stays bounded because C is a contraction.
  // Asserted, after T = 300 steps of n = 1000 elements:
  //   (1) e_T != 0: the residual holds what has not been sent yet;
  //   (2) ||e_T|| < ||E_T|| / 4: the time average of what was sent, (1/T) sum_t D(C(g'_t)),
  //       is more than 4x closer to the average gradient (1/T) sum_t g_t than without
  //       feedback (the measured ratios are printed; they are far below 1/4).
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  constexpr std::size_t kCount = 1000;
  constexpr int kSteps = 300;
  std::vector<float> mean = testing::gaussian(kCount, 77, 0.5f);
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(codec, store);
  std::vector<double> error_without_feedback(kCount, 0.0);
  for (int step = 0; step < kSteps; ++step) {
    auto grad = testing::gaussian(kCount, 9000 + step);
    for (std::size_t i = 0; i < kCount; ++i) grad[i] += mean[i];
    const EncodeContext ctx = step_context(static_cast<std::uint32_t>(step), 6);
    ef_step(ef, "w", host_view(grad.data(), kCount), ctx);
    const auto plain = testing::encode_message(*codec, host_view(grad.data(), kCount), ctx);
    const auto plain_sent = testing::decode_to_f32(*codec, plain, kCount);
    for (std::size_t i = 0; i < kCount; ++i) error_without_feedback[i] += grad[i] - plain_sent[i];
  }
  const auto residual = store.residual("w");
  const double with_feedback = norm(residual);
  const double without_feedback = norm(error_without_feedback);
  std::cout << "  " << GetParam() << ": ||e_T|| = " << with_feedback
            << ", ||E_T|| without feedback = " << without_feedback
            << ", ratio = " << with_feedback / without_feedback << "\n";
  EXPECT_GT(with_feedback, 0.0);
  EXPECT_LT(with_feedback, without_feedback / 4);
}

INSTANTIATE_TEST_SUITE_P(Codecs, BiasedCodecFeedback,
                         ::testing::Values("sign", "topk:ratio=0.01", "topk:ratio=0.01,approx=on"),
                         spec_test_name);

class TopKFeedback : public ::testing::TestWithParam<std::string> {};

TEST_P(TopKFeedback, ResidualKeepsExactlyTheUnsentElements) {
  // Top-k with f32 values sends m elements of g' unchanged (exact: m = k; approx: the exact
  // top-m for some ceil(k/2) <= m <= k, compressors/topk/topk_codec.cpp), so per step, exactly:
  //   e_i = +0 for the m sent elements and e_i = g'_i (bit for bit) for the others, and every
  //   sent element is at least as large in magnitude as every kept one;
  // hence ||e||^2 <= (1 - m/n) ||g'||^2, the contraction that keeps the residual bounded.
  // n = 100003 > kTopkSampleAllCount, so approx really samples its threshold.
  const std::shared_ptr<const Codec> codec = built_codec(GetParam());
  constexpr std::size_t kCount = 100003;
  const std::size_t k = codec->spec().k_for(kCount);
  ASSERT_EQ(k, 1001u);
  const std::size_t fewest = codec->spec().approx ? (k + 1) / 2 : k;
  ResidualStore store(1, 0, ResizePolicy::error);
  ErrorFeedbackCodec ef(codec, store);
  std::vector<float> previous(kCount, 0.0f);
  for (std::uint32_t step = 0; step < 8; ++step) {
    const auto grad = testing::gaussian(kCount, 600 + step);
    ef_step(ef, "w", host_view(grad.data(), kCount), step_context(step, 7));
    const auto residual = store.residual("w");
    std::size_t sent = 0;
    float smallest_sent = std::numeric_limits<float>::infinity();
    float largest_kept = 0;
    double corrected_sq = 0, residual_sq = 0;
    for (std::size_t i = 0; i < kCount; ++i) {
      const float corrected = grad[i] + previous[i];
      ASSERT_NE(corrected, 0.0f) << "the data must not hold zeros for the sent/kept split";
      corrected_sq += double{corrected} * corrected;
      residual_sq += double{residual[i]} * residual[i];
      if (kernels::float_bits(residual[i]) == 0) {
        ++sent;
        smallest_sent = std::min(smallest_sent, std::fabs(corrected));
      } else {
        ASSERT_EQ(kernels::float_bits(residual[i]), kernels::float_bits(corrected)) << "step " << step << ", element " << i;
        largest_kept = std::max(largest_kept, std::fabs(corrected));
      }
    }
    ASSERT_GE(sent, fewest) << "step " << step;
    ASSERT_LE(sent, k) << "step " << step;
    ASSERT_GE(smallest_sent, largest_kept) << "step " << step;
    // The sums of squares are summed in double: relative rounding below n * 2^-53 < 1e-10.
    ASSERT_LE(residual_sq, (1.0 - double(sent) / kCount) * corrected_sq * (1 + 1e-10))
        << "step " << step;
    previous = copy_of(residual);
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, TopKFeedback,
                         ::testing::Values("topk:ratio=0.01", "topk:ratio=0.01,approx=on"),
                         spec_test_name);


// The optional `decoded` output is exactly D(message), the residual is the one the plain call
// leaves, and it may be the chunk's own memory (the ring owner's and the sparse paths' use).
TEST(ErrorFeedback, DecodedOutputEqualsTheDecodeAndLeavesTheSameResidual) {
  for (const std::string spec : {"qsgd:bits=4", "topk:ratio=0.05", "sign"}) {
    SCOPED_TRACE(spec);
    const auto codec = built_codec(spec);
    ResidualStore plain_store(1, 0, ResizePolicy::error), decoded_store(1, 0, ResizePolicy::error);
    ErrorFeedbackCodec plain(codec, plain_store), with_decoded(codec, decoded_store);
    std::vector<std::byte> plain_out(codec->max_encoded_bytes(3000)),
        decoded_out(codec->max_encoded_bytes(3000));
    for (std::uint32_t step = 0; step < 3; ++step) {
      std::vector<float> grad = testing::gaussian(3000, 70 + step);
      const std::size_t plain_bytes =
          plain.encode("w", host_view(grad.data(), 3000), plain_out, step_context(step, 0));
      // In place: the gradient's own memory receives D(message).
      const std::size_t decoded_bytes = with_decoded.encode_chunk(
          "w", 3000, host_view(grad.data(), 3000), decoded_out, step_context(step, 0), grad);
      ASSERT_EQ(decoded_bytes, plain_bytes);
      ASSERT_EQ(std::memcmp(decoded_out.data(), plain_out.data(), plain_bytes), 0);
      const auto reference = testing::decode_to_f32(
          *codec, std::span<const std::byte>(plain_out.data(), plain_bytes), 3000);
      EXPECT_TRUE(testing::same_bits(grad, reference));
      EXPECT_TRUE(testing::same_bits(decoded_store.residual("w"), plain_store.residual("w")));
    }
    std::vector<float> wrong_size(10);
    std::vector<float> grad(3000, 1.0f);
    EXPECT_EQ(testing::error_code_of([&] {
                with_decoded.encode_chunk("w", 3000, host_view(grad.data(), 3000), decoded_out,
                                          step_context(9, 0), wrong_size);
              }),
              ErrorCode::invalid_argument);
  }
}

}  // namespace
}  // namespace gradzip
