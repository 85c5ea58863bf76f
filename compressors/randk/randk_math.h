// Element math of the `randk` codec: which k of a chunk's n elements are kept. Shared by the
// CPU loops (compressors/randk/randk_cpu.cpp) and the CUDA kernels, so every rank and every device
// picks the same indices from the same key.
//
// The index rule (the contract):
//   Stratified random-k. Entry j (0 <= j < k, 1 <= k <= n) owns the stratum
//     [floor(j*n/k), floor((j+1)*n/k))
//   of the chunk, and keeps the element
//     index_j = stratum_start + mulhi64(r_j, stratum_length)
//   where r_j = v[0] | v[1] << 32 of philox_block(seed, step, tensor_id, element_offset + j)
//   (Philox block numbers wrap modulo 2^64).
// Consequences:
//   - strata are non-empty (k <= n), so indices are distinct and strictly increasing;
//   - every stratum is floor(n/k) or ceil(n/k) long, so each element is kept with probability
//     1/stratum_length, about k/n (exactly k/n when k divides n, up to the 2^-64 bias of
//     mulhi64: index value v is hit by floor or ceil of 2^64/length of the 2^64 words);
//   - a chunk at element_offset o draws Philox blocks o .. o+k-1, inside [o, o+n) because
//     k <= n: the chunks of one tensor never share a counter.
//
// j*n needs 128 bits for large chunks (n up to 2^64-1). The helpers below do the 64x64->128
// multiply and the 128/64 division with a native unsigned __int128 on the host, __umul64hi on
// the device, and portable 32-bit-limb versions otherwise; the portable versions are exposed
// under their own names so that the host tests cover what a device without 128-bit integers runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"
#include "kernels/philox_math.h"

namespace gradzip::kernels {

#if !defined(__CUDA_ARCH__) && defined(__SIZEOF_INT128__)
#define GZ_RANDK_HOST_INT128 1
__extension__ typedef unsigned __int128 RandkU128;  // __extension__: quiet under -Wpedantic
#endif

// High 64 bits of a * b, from 32-bit limbs: the reference for targets without 128-bit integers.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t mulhi64_portable(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t a_lo = a & 0xFFFFFFFFu, a_hi = a >> 32;
  const std::uint64_t b_lo = b & 0xFFFFFFFFu, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo;
  const std::uint64_t hi_lo = a_hi * b_lo;
  const std::uint64_t lo_hi = a_lo * b_hi;
  const std::uint64_t hi_hi = a_hi * b_hi;
  // Each term below is < 2^32 + 2^32 + 2^32, so `middle` cannot overflow.
  const std::uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + (lo_hi & 0xFFFFFFFFu);
  return hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (middle >> 32);
}

// High 64 bits of the 128-bit product a * b.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(GZ_RANDK_HOST_INT128)
  return static_cast<std::uint64_t>((static_cast<RandkU128>(a) * b) >> 64);
#else
  return mulhi64_portable(a, b);
#endif
}

// Leading zero bits of a non-zero 64-bit value, by binary search (plain arithmetic).
GZ_HOST_DEVICE GZ_INLINE int leading_zeros64_portable(std::uint64_t value) {
  int zeros = 0;
  for (int width = 32; width > 0; width /= 2) {
    if ((value >> (64 - width)) == 0) {  // the top `width` bits are clear
      zeros += width;
      value <<= width;
    }
  }
  return zeros;
}

// floor((hi * 2^64 + lo) / divisor) for hi < divisor (so the quotient fits in 64 bits).
// Knuth's algorithm D on 32-bit digits (Hacker's Delight, divlu): normalise the divisor so its
// top bit is set, then estimate and correct two 32-bit quotient digits.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t div128_by_64_portable(std::uint64_t hi, std::uint64_t lo,
                                                             std::uint64_t divisor) {
  constexpr std::uint64_t kBase = std::uint64_t{1} << 32;
  const int shift = leading_zeros64_portable(divisor);
  divisor <<= shift;
  const std::uint64_t divisor_hi = divisor >> 32, divisor_lo = divisor & 0xFFFFFFFFu;
  // shift == 0 would make lo >> 64, which is undefined: that case contributes no bits.
  const std::uint64_t numerator_hi = (hi << shift) | (shift == 0 ? 0 : lo >> (64 - shift));
  const std::uint64_t numerator_lo = lo << shift;
  const std::uint64_t digit1 = numerator_lo >> 32, digit0 = numerator_lo & 0xFFFFFFFFu;

  std::uint64_t q1 = numerator_hi / divisor_hi;
  std::uint64_t rhat = numerator_hi - q1 * divisor_hi;
  while (q1 >= kBase || q1 * divisor_lo > kBase * rhat + digit1) {
    --q1;
    rhat += divisor_hi;
    if (rhat >= kBase) break;
  }
  const std::uint64_t partial = numerator_hi * kBase + digit1 - q1 * divisor;  // mod 2^64: exact

  std::uint64_t q0 = partial / divisor_hi;
  rhat = partial - q0 * divisor_hi;
  while (q0 >= kBase || q0 * divisor_lo > kBase * rhat + digit0) {
    --q0;
    rhat += divisor_hi;
    if (rhat >= kBase) break;
  }
  return q1 * kBase + q0;
}

// floor((hi * 2^64 + lo) / divisor) for hi < divisor.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t div128_by_64(std::uint64_t hi, std::uint64_t lo,
                                                    std::uint64_t divisor) {
#if defined(GZ_RANDK_HOST_INT128)
  return static_cast<std::uint64_t>(((static_cast<RandkU128>(hi) << 64) | lo) / divisor);
#else
  return div128_by_64_portable(hi, lo, divisor);
#endif
}

// floor(j * n / k), the first element of stratum j. Preconditions: 1 <= k, j <= k (then
// j * n < k * 2^64, so the quotient fits in 64 bits and is <= n).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t randk_stratum_start(std::uint64_t j, std::uint64_t n,
                                                           std::uint64_t k) {
  return div128_by_64(mulhi64(j, n), j * n, k);
}

// What the index draw is keyed by: the EncodeContext of the chunk, also carried in the payload.
struct RandkKey {
  std::uint64_t seed;
  std::uint32_t step;
  std::uint32_t tensor_id;
  std::uint64_t element_offset;
};

// The 64-bit random number of entry j.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t randk_word(const RandkKey& key, std::uint64_t j) {
  const Philox4x32 block = philox_block(key.seed, key.step, key.tensor_id, key.element_offset + j);
  return static_cast<std::uint64_t>(block.v[0]) | (static_cast<std::uint64_t>(block.v[1]) << 32);
}

// The element of the stratum [start, start + length) that a random word picks (length >= 1).
GZ_HOST_DEVICE GZ_INLINE std::uint64_t randk_pick(std::uint64_t word, std::uint64_t start,
                                                  std::uint64_t length) {
  return start + mulhi64(word, length);
}

// Index kept by entry j, computed on its own (what one GPU thread per entry does).
// Preconditions: 1 <= k <= n, j < k.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t randk_index(const RandkKey& key, std::uint64_t n,
                                                   std::uint64_t k, std::uint64_t j) {
  const std::uint64_t start = randk_stratum_start(j, n, k);
  const std::uint64_t end = randk_stratum_start(j + 1, n, k);
  return randk_pick(randk_word(key, j), start, end - start);
}

// Walks the strata j, j+1, ... without a division per step (what sequential loops use):
// with n = quotient * k + remainder and j * n = start * k + fraction (0 <= fraction < k),
// (j + 1) * n = (start + quotient) * k + fraction + remainder, so the next start is
// start + quotient, plus one when fraction + remainder >= k. Gives exactly randk_stratum_start.
struct RandkStrata {
  std::uint64_t k;
  std::uint64_t quotient;   // n / k
  std::uint64_t remainder;  // n % k
  std::uint64_t start;      // floor(j * n / k) of the current stratum j
  std::uint64_t fraction;   // (j * n) mod k

  // Positions the walk at stratum j. Preconditions: 1 <= k <= n, j <= k.
  GZ_HOST_DEVICE GZ_INLINE static RandkStrata at(std::uint64_t j, std::uint64_t n,
                                                 std::uint64_t k) {
    RandkStrata strata;
    strata.k = k;
    strata.quotient = n / k;
    strata.remainder = n % k;
    strata.start = randk_stratum_start(j, n, k);
    // j*n - start*k lies in [0, k), so the difference of the low words (mod 2^64) is exact.
    strata.fraction = j * n - strata.start * k;
    return strata;
  }

  // Length of the current stratum; advances to the next one. Written so that no sum
  // overflows even when k > 2^63.
  GZ_HOST_DEVICE GZ_INLINE std::uint64_t advance() {
    const std::uint64_t gap = k - remainder;  // fraction + remainder >= k  <=>  fraction >= gap
    std::uint64_t length = quotient;
    if (fraction >= gap) {
      fraction -= gap;
      length += 1;
    } else {
      fraction += remainder;
    }
    start += length;
    return length;
  }
};

// The key as it travels at the start of a randk payload (compressors/randk/randk_codec.cpp,
// docs/wire_format.md): u64 seed, u32 step, u32 tensor id, u64 element offset, little-endian.
inline constexpr std::size_t kRandkKeyBytes = 24;

inline void randk_write_key(const RandkKey& key, std::byte* out) noexcept {
  std::memcpy(out + 0, &key.seed, 8);
  std::memcpy(out + 8, &key.step, 4);
  std::memcpy(out + 12, &key.tensor_id, 4);
  std::memcpy(out + 16, &key.element_offset, 8);
}

inline RandkKey randk_read_key(const std::byte* in) noexcept {
  RandkKey key;
  std::memcpy(&key.seed, in + 0, 8);
  std::memcpy(&key.step, in + 8, 4);
  std::memcpy(&key.tensor_id, in + 12, 4);
  std::memcpy(&key.element_offset, in + 16, 8);
  return key;
}

// Index kept by entry j on its own (what one GPU thread computes): equal to randk_index(key, n, k, j), but
// with one 128/64 division instead of two, n / k and n % k being computed once by the caller.
// It positions the division-free strata walk (RandkStrata) at stratum j and takes one step,
// which is how the CPU loops derive every stratum length.
// Preconditions: 1 <= k <= n, j < k, quotient = n / k, remainder = n % k.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t randk_entry_index(const RandkKey& key, std::uint64_t n,
                                                         std::uint64_t k, std::uint64_t quotient,
                                                         std::uint64_t remainder,
                                                         std::uint64_t j) {
  RandkStrata strata;
  strata.k = k;
  strata.quotient = quotient;
  strata.remainder = remainder;
  strata.start = randk_stratum_start(j, n, k);
  strata.fraction = j * n - strata.start * k;  // in [0, k): exact modulo 2^64
  const std::uint64_t start = strata.start;
  const std::uint64_t length = strata.advance();
  return randk_pick(randk_word(key, j), start, length);
}

}  // namespace gradzip::kernels
