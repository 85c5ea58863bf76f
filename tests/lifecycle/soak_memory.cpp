// Bounded resources: many steps with a tensor set that changes every few hundred
// steps, the way a model's set of gradients changes when layers are frozen or buckets are
// rebuilt. Two users of gradzip run side by side on every rank:
//   - a Reducer, replaced by a new one (new names, other sizes) at every change;
//   - direct Communicator calls whose names change at every change, so the communicator's
//     release rule (CommunicatorOptions::release_unused_after_calls) must let go of the old ones.
// Checks, printed by every rank, exit status 1 when one fails:
//   - the communicator's residuals hold the live set and at most the previous one, and never
//     more than two sets' bytes;
//   - the process's resident memory (/proc/self/statm), sampled 8 times per set after warm-up,
//     does not drift: the highest sample of the second half of the run is less than 1% above
//     the highest sample of the first half. Sets cycle through kLayouts layouts of sizes
//     (names are new in every set); warm-up is the first cycle. Comparing high-water marks of
//     the two halves, not single samples, keeps the allocator's normal ups and downs (a few
//     hundred KiB as buffers of another size are freed and taken, thread arenas included) from
//     reading as drift, while a leak per step or per set still grows the second half's mark.
//
//   soak_memory STEPS CHANGE_EVERY
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "collectives/communicator_state.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"

namespace {

using gradzip::Communicator;

constexpr std::size_t kTensors = 6;
// Element counts of a set, rotated by the set's number modulo kLayouts: every set has the same
// total, so the memory it needs is the same and a drift is a leak, not a bigger model.
constexpr std::size_t kSizes[kTensors] = {4096, 65536, 1000, 32768, 16384, 9000};
constexpr std::uint64_t kLayouts = 3;
constexpr std::size_t kDirectTensors = 3;
constexpr std::size_t kDirectSizes[kDirectTensors] = {20000, 5000, 12000};

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

std::string set_name(std::uint64_t set, const char* kind, std::size_t i) {
  return "set" + std::to_string(set) + "." + kind + std::to_string(i);
}

// Cheap step-dependent values (the content does not matter here, only that it changes).
void fill(std::vector<float>& values, std::uint64_t step, int rank) {
  const float base = static_cast<float>((step * 7 + static_cast<std::uint64_t>(rank)) % 13) - 6.0f;
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = base + static_cast<float>(i % 97) * 0.01f;
}

int run(std::uint64_t steps, std::uint64_t change_every) {
  gradzip::CommunicatorOptions options;
  // Three direct calls per step: a name unused for 50 steps' worth of calls is released.
  options.release_unused_after_calls = 50 * kDirectTensors;
  Communicator comm = Communicator::world(options);
  const int rank = comm.rank();
  gradzip::collectives::CommunicatorState& state = gradzip::collectives::state_of(comm);
  std::size_t direct_set_bytes = 0;
  for (std::size_t size : kDirectSizes) direct_set_bytes += size * sizeof(float);

  std::vector<std::vector<float>> gradients(kTensors), direct(kDirectTensors);
  std::vector<std::size_t> samples;  // resident bytes after warm-up
  int failures = 0;
  const std::uint64_t sets = (steps + change_every - 1) / change_every;
  for (std::uint64_t set = 0; set < sets; ++set) {
    gradzip::ReducerOptions reducer_options;
    reducer_options.spec = "topk:ratio=0.01,min_bytes=0; name=*.w1->qsgd:bits=4,ef=on,min_bytes=0";
    reducer_options.chunk_bytes = 64 << 10;
    gradzip::Reducer reducer(comm, reducer_options);
    for (std::size_t t = 0; t < kTensors; ++t) {
      gradients[t].assign(kSizes[(t + set % kLayouts) % kTensors], 0.0f);
      reducer.add(set_name(set, "w", t), gradzip::host_view(gradients[t].data(), gradients[t].size()));
    }
    for (std::size_t t = 0; t < kDirectTensors; ++t)
      direct[t].assign(kDirectSizes[(t + set % kLayouts) % kDirectTensors], 0.0f);

    const std::uint64_t end = std::min(steps, (set + 1) * change_every);
    for (std::uint64_t step = set * change_every; step < end; ++step) {
      for (auto& g : gradients) fill(g, step, rank);
      reducer.mark_all_ready();
      reducer.wait();
      reducer.step();
      for (std::size_t t = 0; t < kDirectTensors; ++t) {
        fill(direct[t], step, rank);
        // algo=sparse, not auto: auto's choice follows the measured link (under load, rhd or
        // the tree, whose per-step and root residuals this count is not about).
        comm.allreduce(gradzip::host_view(direct[t].data(), direct[t].size()),
                       set_name(set, "direct", t), "topk:ratio=0.02,min_bytes=0,algo=sparse",
                       gradzip::ReduceOp::average);
      }
      // The communicator's residuals: the live set, and the previous one until released.
      const std::size_t held = state.residuals().total_bytes();
      for (const std::string& key : state.residuals().names()) {
        // A role's residual carries a prefix ("sra-server:", "rhd-step1:", ...:
        // collectives/job_encoder.cpp); which roles exist depends on what algo=auto chose.
        const std::string tensor = key.substr(key.rfind(':') + 1);
        const std::size_t dot = tensor.find('.');
        if (tensor.rfind("set", 0) != 0 || dot == std::string::npos || dot <= 3 ||
            tensor.find_first_not_of("0123456789", 3) != dot) {
          std::printf("rank %d FAIL: step %llu holds '%s', not a residual of this test's names\n",
                      rank, static_cast<unsigned long long>(step), key.c_str());
          ++failures;
          continue;
        }
        const std::uint64_t owner = std::stoull(tensor.substr(3, dot - 3));
        if (owner != set && owner + 1 != set) {
          std::printf("rank %d FAIL: step %llu holds '%s' of set %llu (live set %llu)\n", rank,
                      static_cast<unsigned long long>(step), key.c_str(),
                      static_cast<unsigned long long>(owner), static_cast<unsigned long long>(set));
          ++failures;
        }
      }
      if (held > 2 * direct_set_bytes) {
        std::printf("rank %d FAIL: step %llu holds %zu residual bytes, more than two sets (%zu)\n",
                    rank, static_cast<unsigned long long>(step), held, 2 * direct_set_bytes);
        ++failures;
      }
      if (failures > 10) return 1;
      const std::uint64_t sample_every = std::max<std::uint64_t>(1, change_every / 8);
      if (set >= kLayouts && (step + 1) % sample_every == 0) samples.push_back(resident_bytes());
    }
    const std::size_t rss = resident_bytes();
    std::printf("rank %d set %llu steps %llu rss %.3f MiB residual bytes %zu\n", rank,
                static_cast<unsigned long long>(set), static_cast<unsigned long long>(end),
                static_cast<double>(rss) / (1 << 20), state.residuals().total_bytes());
  }
  if (sets < kLayouts + 2 || samples.size() < 2) {
    std::printf("rank %d FAIL: %llu sets; at least %llu are needed (%llu of warm-up)\n", rank,
                static_cast<unsigned long long>(sets), static_cast<unsigned long long>(kLayouts + 2),
                static_cast<unsigned long long>(kLayouts));
    return 1;
  }
  const auto half = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
  const std::size_t first_high = *std::max_element(samples.begin(), half);
  const std::size_t second_high = *std::max_element(half, samples.end());
  const std::size_t lowest = *std::min_element(samples.begin(), samples.end());
  const double drift = (static_cast<double>(second_high) - static_cast<double>(first_high)) /
                       static_cast<double>(first_high);
  std::printf("rank %d steps %llu change_every %llu: %zu rss samples after warm-up, lowest %.3f "
              "MiB, highest of the first half %.3f MiB, of the second half %.3f MiB: drift %+.3f%%\n",
              rank, static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(change_every), samples.size(),
              static_cast<double>(lowest) / (1 << 20), static_cast<double>(first_high) / (1 << 20),
              static_cast<double>(second_high) / (1 << 20), 100.0 * drift);
  if (drift >= 0.01) {
    std::printf("rank %d FAIL: resident memory grew %.3f%% after warm-up (limit 1%%)\n", rank,
                100.0 * drift);
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s STEPS CHANGE_EVERY\n", argv[0]);
    return 2;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  try {
    status = run(std::strtoull(argv[1], nullptr, 10), std::strtoull(argv[2], nullptr, 10));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "soak_memory: %s\n", error.what());
    status = 1;
  }
  std::fflush(stdout);
  MPI_Finalize();
  return status;
}
