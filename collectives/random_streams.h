// The random streams of named tensors: which Philox key and counter word a name draws from,
// and the process-wide claim that keeps two names from drawing the same numbers.
//
// Stochastic rounding (qsgd, terngrad), random-k's indices, approximate top-k's samples and
// PowerSGD's first Q draw from Philox 4x32-10 with key EncodeContext::seed and counter
// (element block, step, EncodeContext::tensor_id) (kernels/philox_math.h). A named tensor's
// stream is
//   h = FNV-1a 64 of the name,
//   key = spec.seed XOR mix64(h),        tensor_id = low 32 bits of h,
// with mix64 the bijective 64-bit finaliser below. Under one seed, two names draw the same
// numbers only if their 64-bit hashes are equal (mix64 is a bijection, so the keys differ
// otherwise), a chance of about 3e-12 among 10,000 names; across seeds the keys coincide only if
// seed_a ^ seed_b == mix64(h_a) ^ mix64(h_b). Either way the claim below refuses the second
// name, so no two names in use in one process ever share a key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace gradzip::collectives {

struct RandomStream {
  std::uint64_t key = 0;        // EncodeContext::seed
  std::uint32_t tensor_id = 0;  // EncodeContext::tensor_id
};

// The stream of `name` under `seed`: the same on every rank, in every run and every process.
RandomStream random_stream_of(std::uint64_t seed, std::string_view name) noexcept;

// Why `name` may not draw from its stream under `seed`: `other`, a different name in use in the
// process, holds the same key (the refusal's message, after the caller's own words).
std::string stream_conflict(std::uint64_t seed, std::string_view name, std::string_view other);

// One owner's claims on stream keys (a communicator's, for the names its calls use), entered
// in a process-wide table shared by every owner, so that names used by different communicators
// of one process (the Reducer's lanes, a user's second communicator) are checked against each
// other too. The same name may hold a key from several owners at once; a different name may
// not. Thread-safe across owners; one owner is used by one thread at a time.
class RandomStreamClaims {
 public:
  RandomStreamClaims() = default;
  RandomStreamClaims(const RandomStreamClaims&) = delete;
  RandomStreamClaims& operator=(const RandomStreamClaims&) = delete;
  ~RandomStreamClaims();  // gives back every key this owner holds

  // Records that `name` draws from random_stream_of(seed, name), last used at `use` (a call
  // number of the owner, for release_unused_before), and returns nothing; or, when a different
  // name in use anywhere in the process holds that key, returns that name and records nothing.
  std::optional<std::string> claim(std::uint64_t seed, std::string_view name, std::uint64_t use);

  // Gives back the keys whose last use is before `oldest_kept`.
  void release_unused_before(std::uint64_t oldest_kept);

  std::size_t size() const noexcept { return held_.size(); }

 private:
  struct Held {
    std::string name;
    std::uint64_t last_use = 0;
  };
  std::map<std::uint64_t, Held> held_;  // key -> the name holding it here
};

}  // namespace gradzip::collectives
