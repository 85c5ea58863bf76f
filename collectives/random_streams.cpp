#include "collectives/random_streams.h"

#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "gradzip/error.h"
#include "kernels/fnv1a.h"

namespace gradzip::collectives {
namespace {

// A bijection of 64-bit words that spreads every input bit over the output (the finaliser of
// the SplitMix64 generator: xor-shifts and odd multipliers, each invertible).
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Every key held in the process: the name holding it and how many owners hold it. Never
// destroyed (a communicator alive at exit, say one owned by a Python object, may give its keys
// back after static destructors ran).
struct ProcessTable {
  struct Entry {
    std::string name;
    std::size_t owners = 0;
  };
  std::mutex mutex;
  std::unordered_map<std::uint64_t, Entry> entries;
};

ProcessTable& process_table() {
  static ProcessTable* const table = new ProcessTable;
  return *table;
}

void give_back(ProcessTable& table, std::uint64_t key) {
  const auto found = table.entries.find(key);
  if (found != table.entries.end() && --found->second.owners == 0) table.entries.erase(found);
}

}  // namespace

RandomStream random_stream_of(std::uint64_t seed, std::string_view name) noexcept {
  const std::uint64_t hash = fnv1a64(name);
  return RandomStream{seed ^ mix64(hash), static_cast<std::uint32_t>(hash)};
}

std::string stream_conflict(std::uint64_t seed, std::string_view name, std::string_view other) {
  char key[24];
  std::snprintf(key, sizeof key, "0x%016llx",
                static_cast<unsigned long long>(random_stream_of(seed, name).key));
  return detail::concat("the random stream of '", name, "' (seed ", seed, ", key ", key,
                        ", from the 64-bit hash of the name) is also that of '", other,
                        "', which this process uses: the two would draw the same random numbers. "
                        "Rename one of them or change the seed");
}

RandomStreamClaims::~RandomStreamClaims() {
  ProcessTable& table = process_table();
  const std::lock_guard lock(table.mutex);
  for (const auto& [key, held] : held_) give_back(table, key);
}

std::optional<std::string> RandomStreamClaims::claim(std::uint64_t seed, std::string_view name,
                                                     std::uint64_t use) {
  const std::uint64_t key = random_stream_of(seed, name).key;
  if (const auto found = held_.find(key); found != held_.end()) {
    if (found->second.name != name) return found->second.name;
    found->second.last_use = use;
    return std::nullopt;
  }
  ProcessTable& table = process_table();
  const std::lock_guard lock(table.mutex);
  auto [entry, inserted] = table.entries.try_emplace(key);
  if (!inserted && entry->second.name != name) return entry->second.name;
  if (inserted) entry->second.name = std::string(name);
  ++entry->second.owners;
  held_.emplace(key, Held{std::string(name), use});
  return std::nullopt;
}

void RandomStreamClaims::release_unused_before(std::uint64_t oldest_kept) {
  ProcessTable& table = process_table();
  const std::lock_guard lock(table.mutex);
  std::erase_if(held_, [&](const auto& entry) {
    if (entry.second.last_use >= oldest_kept) return false;
    give_back(table, entry.first);
    return true;
  });
}

}  // namespace gradzip::collectives
