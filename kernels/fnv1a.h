// FNV-1a 64: the one hash gradzip uses where a value must be the same on every rank, host and
// build (it is not a keyed or cryptographic hash). Users: the call check's fingerprints and the
// tensor ids of the random streams (collectives/call_check.cpp, fingerprint64), the checkpoint
// file's checksum (error_feedback/residual_store.cpp), and the host-name groups of the NCCL
// transport's node split (collectives/transport/nccl/nccl_transport.cpp). Changing it changes
// tensor ids and so every random stream, and makes old checkpoint files fail their checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradzip {

// Incremental: update() with the bytes in order, then value().
class Fnv1a64 {
 public:
  void update(const void* data, std::size_t bytes) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    std::uint64_t h = hash_;
    for (std::size_t i = 0; i < bytes; ++i) {
      h ^= p[i];
      h *= kPrime;
    }
    hash_ = h;
  }
  std::uint64_t value() const noexcept { return hash_; }

 private:
  static constexpr std::uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  static constexpr std::uint64_t kPrime = 0x100000001b3ull;
  std::uint64_t hash_ = kOffsetBasis;
};

inline std::uint64_t fnv1a64(std::string_view text) noexcept {
  Fnv1a64 hash;
  hash.update(text.data(), text.size());
  return hash.value();
}

}  // namespace gradzip
