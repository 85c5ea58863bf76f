// The one-pass compaction of the CUDA top-k (KernelVariant::fast, compressors/topk/cuda/topk_kernels.cu),
// run on the host tile by tile with the index arithmetic the kernel calls
// (compressors/topk/cuda/topk_plan.h: tile items, packed counts, kept positions, look-back windows):
//  - the small functions against worked examples (tail tiles, count limits, need cut-offs,
//    which lanes of a look-back window count what);
//  - the candidate pass against the CPU's candidate pass (kernels::cpu::topk_collect) for the
//    same threshold and capacity, overflow included;
//  - the whole fast pipeline (sample threshold, candidate pass, decision, final compaction)
//    against the CPU codec's selection (kernels::cpu::topk_select, what compressors/topk/topk_codec.cpp
//    encodes): the same entry count, indices and value bits, over sizes around tile multiples,
//    tie-heavy and all-zero data, exact and approx.
// The look-back is emulated as blocks see it: tiles take tickets in order, and when a tile
// looks back, each earlier tile has published its aggregate and, at random, its inclusive
// counts too (never, sometimes, always), so walks of one window, of many windows and down to
// tile 0 all occur. The emulation follows the kernel's lane structure (32 lanes, lane L reads
// tile nearest - L) and its thread structure (256 threads of 16 consecutive items).
// The radix select is not re-derived here: the final rule's threshold K and `need` come from a
// host sort, as the device's select computes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gradzip/tensor_view.h"
#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/cuda/topk_plan.h"
#include "kernels/host_device.h"
#include "compressors/topk/topk_math.h"

namespace gradzip {
namespace {

namespace k = kernels::cuda;
using k::kTopkNeedAll;
using k::kTopkNotKept;
using k::kTopkTile;
using k::TopkCounts;
using k::TopkTileStatus;

// ---- the small functions ------------------------------------------------------------------

TEST(TopkOnePass, TilesCoverTheSourceWithAShortTail) {
  EXPECT_EQ(kTopkTile, 4096u);
  EXPECT_EQ(k::topk_tile_count(0), 0u);
  EXPECT_EQ(k::topk_tile_items(0, 0), 0u);
  EXPECT_EQ(k::topk_tile_count(1), 1u);
  EXPECT_EQ(k::topk_tile_items(1, 0), 1u);
  EXPECT_EQ(k::topk_tile_items(1, 1), 0u);
  EXPECT_EQ(k::topk_tile_count(4095), 1u);
  EXPECT_EQ(k::topk_tile_items(4095, 0), 4095u);
  EXPECT_EQ(k::topk_tile_count(4096), 1u);
  EXPECT_EQ(k::topk_tile_items(4096, 0), 4096u);
  EXPECT_EQ(k::topk_tile_items(4096, 1), 0u);
  EXPECT_EQ(k::topk_tile_count(4097), 2u);
  EXPECT_EQ(k::topk_tile_items(4097, 0), 4096u);
  EXPECT_EQ(k::topk_tile_items(4097, 1), 1u);
  EXPECT_EQ(k::topk_tile_count(8192), 2u);
  EXPECT_EQ(k::topk_tile_items(8192, 1), 4096u);
  const std::uint64_t wide = (std::uint64_t{1} << 32) + 5;
  EXPECT_EQ(k::topk_tile_count(wide), (std::uint64_t{1} << 20) + 1);
  EXPECT_EQ(k::topk_tile_items(wide, std::uint64_t{1} << 20), 5u);
  EXPECT_EQ(k::topk_tile_items(wide, (std::uint64_t{1} << 20) - 1), 4096u);
  EXPECT_EQ(k::topk_tile_items(wide, (std::uint64_t{1} << 20) + 1), 0u);
  // Every count: the tiles' items add up to it, all full but the last.
  for (std::uint64_t count = 0; count < 3 * kTopkTile + 3; count += 37) {
    std::uint64_t sum = 0;
    const std::uint64_t tiles = k::topk_tile_count(count);
    for (std::uint64_t tile = 0; tile < tiles; ++tile) {
      const std::uint32_t items = k::topk_tile_items(count, tile);
      EXPECT_GT(items, 0u) << count;
      if (tile + 1 < tiles) {
        EXPECT_EQ(items, kTopkTile) << count;
      }
      sum += items;
    }
    EXPECT_EQ(sum, count);
  }
}

TEST(TopkOnePass, PackedCountsHoldAWholeTile) {
  EXPECT_EQ(k::topk_pack_counts(5, 4), 1u << 16);
  EXPECT_EQ(k::topk_pack_counts(4, 4), 1u);
  EXPECT_EQ(k::topk_pack_counts(3, 4), 0u);
  EXPECT_EQ(k::topk_pack_counts(0x7FFFFFFFu, 0x7FFFFFFEu), 1u << 16);
  EXPECT_EQ(k::topk_pack_counts(0, 0), 1u);
  std::uint32_t all_greater = 0, all_equal = 0, half = 0;
  for (std::uint64_t i = 0; i < kTopkTile; ++i) {
    all_greater += k::topk_pack_counts(9, 2);
    all_equal += k::topk_pack_counts(2, 2);
    half += k::topk_pack_counts(i % 2 == 0 ? 9 : 2, 2);
  }
  EXPECT_EQ(k::topk_unpack_counts(all_greater).greater, 4096u);
  EXPECT_EQ(k::topk_unpack_counts(all_greater).equal, 0u);
  EXPECT_EQ(k::topk_unpack_counts(all_equal).greater, 0u);
  EXPECT_EQ(k::topk_unpack_counts(all_equal).equal, 4096u);
  EXPECT_EQ(k::topk_unpack_counts(half).greater, 2048u);
  EXPECT_EQ(k::topk_unpack_counts(half).equal, 2048u);
}

// keys 5 3 5 3 3 1 7 against T = 3: keys > 3 always kept, the first `need` 3s kept.
TEST(TopkOnePass, KeepPositionsFollowIndexOrderAndNeed) {
  const std::uint32_t keys[] = {5, 3, 5, 3, 3, 1, 7};
  const auto positions = [&keys](std::uint64_t need, TopkCounts before) {
    std::vector<std::uint64_t> out;
    for (std::uint32_t key : keys) out.push_back(k::topk_keep_position(key, 3, need, before));
    return out;
  };
  const std::uint64_t x = kTopkNotKept;
  EXPECT_EQ(positions(kTopkNeedAll, {}), (std::vector<std::uint64_t>{0, 1, 2, 3, 4, x, 5}));
  EXPECT_EQ(positions(0, {}), (std::vector<std::uint64_t>{0, x, 1, x, x, x, 2}));
  EXPECT_EQ(positions(1, {}), (std::vector<std::uint64_t>{0, 1, 2, x, x, x, 3}));
  EXPECT_EQ(positions(2, {}), (std::vector<std::uint64_t>{0, 1, 2, 3, x, x, 4}));
  // After 10 greater and 4 equal keys in earlier tiles: need 5 leaves room for one more 3.
  EXPECT_EQ(positions(5, TopkCounts{10, 4}),
            (std::vector<std::uint64_t>{14, 15, 16, x, x, x, 17}));
  // Need already used up before the tile.
  EXPECT_EQ(positions(3, TopkCounts{10, 4}),
            (std::vector<std::uint64_t>{13, x, 14, x, x, x, 15}));
  TopkCounts before{};
  for (std::uint32_t key : keys) k::topk_keep_position(key, 3, 2, before);
  EXPECT_EQ(before.greater, 3u);  // counts every key, kept or not
  EXPECT_EQ(before.equal, 3u);
}

TEST(TopkOnePass, StatusWordsCarryFlagAndAggregate) {
  const std::uint32_t packed = (4096u << 16) | 4096u;  // both fields at a tile's largest count
  for (std::uint32_t flag : {k::kTopkTileUnset, k::kTopkTileAggregate, k::kTopkTileInclusive}) {
    const std::uint64_t word = k::topk_status_word(flag, packed);
    EXPECT_EQ(k::topk_status_flag(word), flag);
    EXPECT_EQ(k::topk_status_aggregate(word).greater, 4096u);
    EXPECT_EQ(k::topk_status_aggregate(word).equal, 4096u);
  }
  EXPECT_EQ(k::topk_status_word(k::kTopkTileUnset, 0), 0u);  // zeroed records are unset
  EXPECT_EQ(k::topk_status_flag(k::topk_status_word(k::kTopkTileAggregate, 0xFFFFFFFFu)),
            k::kTopkTileAggregate);
}

TEST(TopkOnePass, LookBackLanesCountUpToTheFirstInclusiveTile) {
  EXPECT_EQ(k::topk_lookback_stop_lane(0), 32u);
  EXPECT_EQ(k::topk_lookback_stop_lane(1), 0u);
  EXPECT_EQ(k::topk_lookback_stop_lane(0b1010), 1u);
  EXPECT_EQ(k::topk_lookback_stop_lane(0x80000000u), 31u);
  EXPECT_TRUE(k::topk_lookback_lane_reads(0, 0));
  EXPECT_FALSE(k::topk_lookback_lane_reads(0, 1));
  EXPECT_TRUE(k::topk_lookback_lane_reads(40, 31));
  EXPECT_FALSE(k::topk_lookback_lane_reads(30, 31));
  const std::uint64_t word = k::topk_status_word(k::kTopkTileAggregate, (7u << 16) | 2u);
  const TopkCounts inclusive{100, 50};
  const TopkCounts before = k::topk_lookback_lane_counts(2, 5, word, inclusive);
  EXPECT_EQ(before.greater, 7u);
  EXPECT_EQ(before.equal, 2u);
  const TopkCounts at = k::topk_lookback_lane_counts(5, 5, word, inclusive);
  EXPECT_EQ(at.greater, 100u);
  EXPECT_EQ(at.equal, 50u);
  const TopkCounts after = k::topk_lookback_lane_counts(6, 5, word, inclusive);
  EXPECT_EQ(after.greater, 0u);
  EXPECT_EQ(after.equal, 0u);
  const TopkCounts no_stop = k::topk_lookback_lane_counts(31, 32, word, inclusive);
  EXPECT_EQ(no_stop.greater, 7u);
}

// ---- the emulated pass --------------------------------------------------------------------

// A compaction source: keys in index order, each with its payload index and f32 bits.
struct Source {
  std::vector<std::uint64_t> index;
  std::vector<std::uint32_t> bits;
  std::uint64_t size() const { return bits.size(); }
};

Source tensor_source(const std::vector<float>& x) {
  Source source;
  for (std::size_t i = 0; i < x.size(); ++i) {
    source.index.push_back(i);
    source.bits.push_back(kernels::float_bits(x[i]));
  }
  return source;
}

struct PassResult {
  Source out;           // positions [0, capacity): what the pass wrote
  TopkCounts totals;    // what the last tile leaves in the state
  int windows = 0;      // look-back windows walked, all tiles together
  int long_walks = 0;   // look-backs that walked more than one window
};

// The look-back of `tile` (kernel: look_back), over records as they are when it runs.
TopkCounts look_back(std::vector<TopkTileStatus>& statuses, std::uint64_t tile,
                     std::uint32_t aggregate, PassResult& result) {
  if (tile == 0) return TopkCounts{};
  statuses[tile].word = k::topk_status_word(k::kTopkTileAggregate, aggregate);
  TopkCounts exclusive;
  std::uint64_t nearest = tile - 1;
  int windows = 0;
  for (;;) {
    ++windows;
    std::uint64_t words[32];
    std::uint32_t inclusive_lanes = 0;
    for (unsigned lane = 0; lane < 32; ++lane) {
      words[lane] = k::topk_status_word(k::kTopkTileInclusive, 0);
      if (k::topk_lookback_lane_reads(nearest, lane)) words[lane] = statuses[nearest - lane].word;
      // The kernel waits until every lane's tile has published something.
      EXPECT_NE(k::topk_status_flag(words[lane]), k::kTopkTileUnset);
      if (k::topk_status_flag(words[lane]) == k::kTopkTileInclusive) inclusive_lanes |= 1u << lane;
    }
    const unsigned stop = k::topk_lookback_stop_lane(inclusive_lanes);
    for (unsigned lane = 0; lane < 32; ++lane) {
      TopkCounts inclusive;
      if (k::topk_lookback_lane_reads(nearest, lane) && lane == stop) {
        inclusive.greater = statuses[nearest - lane].inclusive_greater;
        inclusive.equal = statuses[nearest - lane].inclusive_equal;
      }
      const TopkCounts mine = k::topk_lookback_lane_counts(lane, stop, words[lane], inclusive);
      exclusive.greater += mine.greater;
      exclusive.equal += mine.equal;
    }
    if (stop < 32) break;
    EXPECT_GE(nearest, 32u) << "a window without an inclusive tile reached past tile 0";
    if (nearest < 32) break;
    nearest -= 32;
  }
  result.windows += windows;
  if (windows > 1) ++result.long_walks;
  return exclusive;
}

// One compaction (kernel: one_pass_kernel) of `source` under (threshold, need), writing
// positions below `capacity` (the candidate buffer's; the payload's entry count for the final
// pass). publish_odds: the chance that a tile's inclusive counts are visible by the time a
// later tile looks back (tile 0's always are: it publishes them at once).
PassResult one_pass(const Source& source, std::uint32_t threshold, std::uint64_t need,
                    std::uint64_t capacity, double publish_odds, std::mt19937_64& random) {
  constexpr unsigned kThreads = k::kTopkBlockThreads;
  constexpr unsigned kItems = k::kTopkItemsPerThread;
  const std::uint64_t count = source.size();
  const std::uint64_t tiles = k::topk_tile_count(count);
  PassResult result;
  result.out.index.assign(capacity, ~std::uint64_t{0});
  result.out.bits.assign(capacity, 0);
  std::vector<bool> written(capacity, false);
  std::vector<TopkTileStatus> statuses(tiles, TopkTileStatus{0, 0, 0});
  std::vector<std::uint64_t> pending;  // tiles whose inclusive counts are not visible yet
  std::vector<TopkCounts> inclusive_of(tiles);
  std::bernoulli_distribution publish(publish_odds);
  for (std::uint64_t tile = 0; tile < tiles; ++tile) {  // ticket order
    // Tiles that finished their look-back since: their inclusive counts become visible.
    std::vector<std::uint64_t> still;
    for (std::uint64_t p : pending) {
      if (publish(random)) {
        statuses[p].inclusive_greater = inclusive_of[p].greater;
        statuses[p].inclusive_equal = inclusive_of[p].equal;
        statuses[p].word = k::topk_status_word(
            k::kTopkTileInclusive, static_cast<std::uint32_t>(statuses[p].word));
      } else {
        still.push_back(p);
      }
    }
    pending = still;
    const std::uint64_t base = tile * kTopkTile;
    const std::uint64_t valid = k::topk_tile_items(count, tile);
    // Per thread: packed counts of its 16 items; exclusive scan over the threads.
    std::uint32_t before[kThreads];
    std::uint32_t aggregate = 0;
    for (unsigned t = 0; t < kThreads; ++t) {
      before[t] = aggregate;
      for (unsigned q = 0; q < kItems; ++q) {
        const std::uint64_t item = std::uint64_t{t} * kItems + q;
        if (item < valid)
          aggregate += k::topk_pack_counts(kernels::topk_key_of_bits(source.bits[base + item]), threshold);
      }
    }
    const TopkCounts exclusive = look_back(statuses, tile, aggregate, result);
    TopkCounts inclusive = exclusive;
    inclusive.greater += k::topk_unpack_counts(aggregate).greater;
    inclusive.equal += k::topk_unpack_counts(aggregate).equal;
    inclusive_of[tile] = inclusive;
    if (tile == 0) {
      statuses[0].inclusive_greater = inclusive.greater;
      statuses[0].inclusive_equal = inclusive.equal;
      statuses[0].word = k::topk_status_word(k::kTopkTileInclusive, aggregate);
    } else {
      pending.push_back(tile);
    }
    if (tile == tiles - 1) result.totals = inclusive;
    for (unsigned t = 0; t < kThreads; ++t) {
      const TopkCounts in_tile = k::topk_unpack_counts(before[t]);
      TopkCounts running{exclusive.greater + in_tile.greater, exclusive.equal + in_tile.equal};
      for (unsigned q = 0; q < kItems; ++q) {
        const std::uint64_t item = std::uint64_t{t} * kItems + q;
        if (item >= valid) continue;
        const std::uint32_t bits = source.bits[base + item];
        const std::uint64_t position =
            k::topk_keep_position(kernels::topk_key_of_bits(bits), threshold, need, running);
        if (position == kTopkNotKept || position >= capacity) continue;
        EXPECT_FALSE(written[position]) << "position " << position << " written twice";
        written[position] = true;
        result.out.index[position] = source.index[base + item];
        result.out.bits[position] = bits;
      }
    }
  }
  // Every position below min(kept, capacity) was written.
  const std::uint64_t kept = result.totals.greater + std::min(result.totals.equal, need);
  for (std::uint64_t j = 0; j < std::min(kept, capacity); ++j) {
    EXPECT_TRUE(written[j]) << "position " << j << " of " << kept << " never written";
  }
  return result;
}

// ---- data -----------------------------------------------------------------------------------

enum class Data { gaussian, ties, zeros };

std::vector<float> make_data(Data data, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<float> x(n);
  if (data == Data::gaussian) {
    std::normal_distribution<float> normal;
    for (auto& v : x) v = normal(random);
    const float specials[] = {kernels::bits_float(0x7F800000u), kernels::bits_float(0xFF800000u),
                              kernels::bits_float(0x7FC00001u), kernels::bits_float(0xFFC12345u),
                              -0.0f, kernels::bits_float(0x00000001u), 70000.0f};
    for (std::size_t j = 0; j < std::size(specials) && n > 0; ++j) x[(j * 7919 + seed) % n] = specials[j];
  } else if (data == Data::ties) {
    const float set[] = {0.0f, -0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 2.0f, 0.25f};
    std::uniform_int_distribution<int> pick(0, 7);
    for (auto& v : x) v = set[pick(random)];
  } else {
    std::bernoulli_distribution negative(0.5);
    for (auto& v : x) v = negative(random) ? -0.0f : 0.0f;
  }
  return x;
}

const char* data_name(Data data) {
  return data == Data::gaussian ? "gaussian" : data == Data::ties ? "ties" : "zeros";
}

// The sample threshold t of the device's steps 1 (0 when r > s).
std::uint32_t sample_threshold(const std::vector<float>& x, const k::TopkPlan& plan,
                               std::uint64_t seed) {
  if (!plan.sample_used) return 0;
  const std::uint64_t n = x.size();
  std::vector<std::uint32_t> sample(plan.sample_count);
  for (std::uint64_t j = 0; j < plan.sample_count; ++j) {
    const std::uint64_t position =
        n <= kernels::kTopkSampleAllCount
            ? j
            : kernels::topk_sample_run_start(n, j / kernels::kTopkSampleRun, seed, 0, 0) +
                  j % kernels::kTopkSampleRun;
    sample[j] = kernels::topk_key(x[position]);
  }
  std::nth_element(sample.begin(), sample.begin() + (plan.sample_rank - 1), sample.end(),
                   std::greater<>());
  return sample[plan.sample_rank - 1];
}

// ---- tests against the CPU ------------------------------------------------------------------

// The candidate pass writes what the CPU's candidate pass collects for the same threshold and
// capacity, and counts c even when the buffer overflows.
TEST(TopkOnePass, CandidatePassIsTheCpuCollect) {
  std::mt19937_64 random(11);
  int overflows = 0;
  for (std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{4097},
                        std::size_t{3 * 4096 + 17}, std::size_t{200001}}) {
    for (Data data : {Data::gaussian, Data::ties}) {
      const std::vector<float> x = make_data(data, n, n);
      const Source source = tensor_source(x);
      for (std::uint32_t threshold : {0u, 0x3F000000u, 0x3F800000u, 0x40000000u, 0x7F800000u}) {
        for (std::uint64_t capacity : {std::uint64_t{n}, std::uint64_t{n / 3 + 1}, std::uint64_t{5}}) {
          SCOPED_TRACE(::testing::Message() << data_name(data) << " n=" << n << " t=" << threshold
                                            << " capacity=" << capacity);
          const PassResult pass = one_pass(source, threshold, kTopkNeedAll, capacity, 0.5, random);
          std::vector<std::uint32_t> cpu_index(capacity + kernels::cpu::kTopkCollectSlack);
          std::vector<std::uint32_t> cpu_bits(capacity + kernels::cpu::kTopkCollectSlack);
          const std::size_t cpu = kernels::cpu::topk_collect(x.data(), n, threshold, 0u,
                                                             cpu_index.data(), cpu_bits.data(), capacity);
          std::uint64_t expected_c = 0;
          for (float v : x) expected_c += kernels::topk_key(v) >= threshold ? 1 : 0;
          EXPECT_EQ(pass.totals.greater + pass.totals.equal, expected_c);
          if (cpu == kernels::cpu::kTopkCollectOverflow) {
            ++overflows;
            EXPECT_GT(expected_c, capacity);
            // The buffer holds the first `capacity` candidates.
            std::uint64_t j = 0;
            for (std::size_t i = 0; i < n && j < capacity; ++i) {
              if (kernels::topk_key(x[i]) < threshold) continue;
              EXPECT_EQ(pass.out.index[j], i);
              EXPECT_EQ(pass.out.bits[j], kernels::float_bits(x[i]));
              ++j;
            }
            continue;
          }
          ASSERT_EQ(cpu, expected_c);
          for (std::size_t j = 0; j < cpu; ++j) {
            ASSERT_EQ(pass.out.index[j], cpu_index[j]) << "entry " << j;
            ASSERT_EQ(pass.out.bits[j], cpu_bits[j]) << "entry " << j;
          }
        }
      }
    }
  }
  EXPECT_GT(overflows, 0);
}

enum class FinalSource { accepted, all_candidates, candidates, tensor };

// The fast pipeline on the host (sample threshold, candidate pass, decision, final compaction),
// its entries compared with the CPU codec's selection.
void expect_pipeline_matches_cpu(const std::vector<float>& x, std::uint64_t kk, bool approx,
                                 std::uint64_t seed, double publish_odds, std::mt19937_64& random,
                                 int (&paths)[4], int& long_walks, const std::string& what) {
  const std::uint64_t n = x.size();
  const k::TopkPlan plan = k::make_topk_plan(n, kk, approx, false, k::KernelVariant::fast, 0);
  ASSERT_EQ(plan.kind, k::TopkPlanKind::select) << what;
  const Source tensor = tensor_source(x);
  // Steps 1-3.
  const std::uint32_t t = sample_threshold(x, plan, seed);
  const PassResult candidates = one_pass(tensor, t, kTopkNeedAll, plan.gpu_capacity, publish_odds, random);
  long_walks += candidates.long_walks;
  const std::uint64_t c = candidates.totals.greater + candidates.totals.equal;
  const k::TopkDecision decision = k::topk_decide(c, kk, approx, plan.cpu_capacity, plan.gpu_capacity);
  // Step 5's rule, then step 6.
  Source source = tensor;
  if (decision.use_candidates) {
    source.index.assign(candidates.out.index.begin(), candidates.out.index.begin() + c);
    source.bits.assign(candidates.out.bits.begin(), candidates.out.bits.begin() + c);
  }
  std::uint32_t threshold = 0;
  std::uint64_t need = kTopkNeedAll;
  FinalSource path;
  if (decision.accept) {
    threshold = t;
    path = FinalSource::accepted;
  } else if (decision.use_candidates && c == kk) {
    path = FinalSource::all_candidates;
  } else {
    std::vector<std::uint32_t> keys;
    for (std::uint32_t bits : source.bits) keys.push_back(kernels::topk_key_of_bits(bits));
    std::nth_element(keys.begin(), keys.begin() + (kk - 1), keys.end(), std::greater<>());
    threshold = keys[kk - 1];
    std::uint64_t greater = 0;
    for (std::uint32_t bits : source.bits) greater += kernels::topk_key_of_bits(bits) > threshold ? 1 : 0;
    need = kk - greater;
    path = decision.use_candidates ? FinalSource::candidates : FinalSource::tensor;
  }
  ++paths[static_cast<int>(path)];
  const PassResult payload = one_pass(source, threshold, need, decision.entries, publish_odds, random);
  long_walks += payload.long_walks;
  EXPECT_EQ(payload.totals.greater + std::min(payload.totals.equal, need), decision.entries) << what;

  std::vector<std::uint32_t> cpu_index(kk);
  std::vector<float> cpu_values(kk);
  const kernels::cpu::TopkOptions options{approx, seed, 0, 0};
  const auto cpu = kernels::cpu::topk_select<std::uint32_t>(host_view(x.data(), x.size()), kk,
                                                            options, cpu_index.data(), cpu_values.data());
  ASSERT_EQ(decision.entries, cpu.count) << what;
  for (std::size_t j = 0; j < cpu.count; ++j) {
    ASSERT_EQ(payload.out.index[j], cpu_index[j]) << what << ": entry " << j;
    ASSERT_EQ(payload.out.bits[j], kernels::float_bits(cpu_values[j])) << what << ": entry " << j;
  }
}

TEST(TopkOnePass, PipelineSelectsWhatTheCpuCodecSelects) {
  std::mt19937_64 random(5);
  int paths[4] = {0, 0, 0, 0};
  int long_walks = 0;
  const std::uint64_t tile = kTopkTile;
  for (std::uint64_t n : {std::uint64_t{2}, std::uint64_t{3}, tile - 1, tile, tile + 1,
                          2 * tile - 1, 2 * tile + 1, std::uint64_t{65536}, std::uint64_t{65537},
                          std::uint64_t{70001}, 40 * tile + 1}) {
    for (Data data : {Data::gaussian, Data::ties, Data::zeros}) {
      const std::vector<float> x = make_data(data, n, 17 + n);
      for (std::uint64_t kk : {std::uint64_t{1}, (n + 99) / 100, n / 2 + 1, n - 1}) {
        if (kk == 0 || kk >= n) continue;
        for (bool approx : {false, true}) {
          for (double odds : {0.0, 0.3, 1.0}) {
            const std::string what = std::string(data_name(data)) + " n=" + std::to_string(n) +
                                     " k=" + std::to_string(kk) + (approx ? " approx" : " exact") +
                                     " odds=" + std::to_string(odds);
            expect_pipeline_matches_cpu(x, kk, approx, 3, odds, random, paths, long_walks, what);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  // Approx acceptance needs a sampled (n > 65536) tensor and a threshold that falls short.
  const std::vector<float> x = make_data(Data::gaussian, (std::size_t{1} << 20) + 3, 5);
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    for (std::uint64_t kk : {std::uint64_t{10486}, std::uint64_t{1000}}) {
      expect_pipeline_matches_cpu(x, kk, true, seed, 0.5, random, paths, long_walks,
                                  "approx seed " + std::to_string(seed) + " k=" + std::to_string(kk));
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(paths[static_cast<int>(FinalSource::accepted)], 0);
  EXPECT_GT(paths[static_cast<int>(FinalSource::all_candidates)], 0);
  EXPECT_GT(paths[static_cast<int>(FinalSource::candidates)], 0);
  EXPECT_GT(paths[static_cast<int>(FinalSource::tensor)], 0);
  EXPECT_GT(long_walks, 0) << "no look-back walked past its first window";
}

}  // namespace
}  // namespace gradzip
