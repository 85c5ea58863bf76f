// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator behind stochastic rounding and random-k. Stateless: the output
// is a pure function of (key, counter), so any element's random number can be computed
// anywhere, in any order, on the CPU or the GPU.
//
// gradzip's keying (the contract every codec and kernel follows):
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (block low 32 bits, block high 32 bits, step, tensor id), block = element / 4
//   element e uses output word e % 4 of its block.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::kernels {

struct Philox4x32 {
  std::uint32_t v[4];
};

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;
inline constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;

GZ_HOST_DEVICE GZ_INLINE Philox4x32 philox4x32_10(Philox4x32 counter, std::uint32_t key0,
                                                  std::uint32_t key1) {
  std::uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kPhiloxM0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kPhiloxM1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ key0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ key1;
    c3 = lo0;
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The four random words of the block holding `element` under gradzip's keying.
GZ_HOST_DEVICE GZ_INLINE Philox4x32 philox_block(std::uint64_t seed, std::uint32_t step,
                                                 std::uint32_t tensor_id, std::uint64_t block) {
  return philox4x32_10(
      Philox4x32{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), step,
                  tensor_id}},
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// The random word of one element. Loops that visit every element should call philox_block
// once per 4 elements instead.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t philox_element(std::uint64_t seed, std::uint32_t step,
                                                      std::uint32_t tensor_id,
                                                      std::uint64_t element) {
  return philox_block(seed, step, tensor_id, element >> 2).v[element & 3];
}

// Maps a random word to a float uniform on [0, 1) with 24 random bits (exact in f32).
GZ_HOST_DEVICE GZ_INLINE float uniform_unit(std::uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

}  // namespace gradzip::kernels
