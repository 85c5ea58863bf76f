// Element math of the `terngrad` codec (TernGrad, Wen et al., NIPS'17): every element becomes
// one of {-scale, 0, +scale} with scale = the bucket's max |x|, chosen stochastically so that
// the expectation is x. That is exactly qsgd's 2-bit code (compressors/qsgd/qsgd_math.h with bits = 2:
// one magnitude level, s = 1), so terngrad draws its codes with qsgd's math and kernels and
// decodes them to qsgd's bits; what it adds is the packing: a ternary digit ("trit") per element,
// five to a byte (3^5 = 243 <= 256), 1.6 bits per element instead of 2.
//
// The qsgd 2-bit code of an element is 0 (value +0), 1 (+scale) or 3 (sign bit | 1: -scale);
// encode never writes 2 ("-0"). Its trit is 0, 1 or 2:
//   trit = code == 0 ? 0 : code == 1 ? 1 : 2      code = trit == 2 ? 3 : trit
// Trit byte j holds elements 5j .. 5j + 4 of the message: byte = t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4
// (element 5j + d is digit d). A valid byte is below 243, and the digits of the last byte beyond
// the last element are 0 (so the last byte of n elements is below 3^(n mod 5) when n mod 5 != 0).
//
// Ten bits of the qsgd code stream (five 2-bit codes, LSB first) map to one trit byte and back;
// both directions are written here once, for the CPU loops (compressors/terngrad/terngrad_cpu.cpp) and the
// CUDA kernels (compressors/terngrad/cuda/terngrad_kernels.cu).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gradzip::kernels {

inline constexpr int kTerngradTritsPerByte = 5;
inline constexpr int kTerngradCodeBits = 2;  // qsgd's bits for the codes terngrad draws
inline constexpr std::uint32_t kTerngradBytesValid = 243;  // 3^5: trit bytes are below this

// The trit of one qsgd 2-bit code (0, 1 or 3; 2 is never written by encode and maps to 2's
// trit like 3, which the caller never relies on).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_trit_of_code(std::uint32_t code) {
  return code == 0u ? 0u : (code == 1u ? 1u : 2u);
}

// The qsgd 2-bit code of a trit (0, 1 or 2).
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_code_of_trit(std::uint32_t trit) {
  return trit == 2u ? 3u : trit;
}

// The trit byte of five 2-bit codes packed LSB first in the low 10 bits of `codes10`.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_pack_codes(std::uint32_t codes10) {
  std::uint32_t byte = 0;
  for (int d = kTerngradTritsPerByte - 1; d >= 0; --d) {
    byte = byte * 3u + terngrad_trit_of_code((codes10 >> (2 * d)) & 3u);
  }
  return byte;
}

// The inverse for a valid byte (< 243): five 2-bit codes, LSB first, in the low 10 bits.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_unpack_codes(std::uint32_t byte) {
  std::uint32_t codes10 = 0;
  for (int d = 0; d < kTerngradTritsPerByte; ++d) {
    codes10 |= terngrad_code_of_trit(byte % 3u) << (2 * d);
    byte /= 3u;
  }
  return codes10;
}

// Code byte t of the qsgd 2-bit payload (codes of elements 4t .. 4t + 3, LSB first; elements at
// or past `count` give 0 bits) read from the trit bytes `trits` (5 trits per byte, element 5j + d
// is digit d of byte j). A byte above 242 gives its digits all the same, which callers that
// validate (the decoders) never let reach an output.
GZ_HOST_DEVICE GZ_INLINE std::uint8_t terngrad_code_byte(const std::uint8_t* trits,
                                                         std::uint64_t count, std::uint64_t t) {
  std::uint32_t byte = 0;
  for (std::uint64_t i = 0; i < 4; ++i) {
    const std::uint64_t e = 4 * t + i;
    if (e >= count) break;
    std::uint32_t trit = trits[e / kTerngradTritsPerByte];
    for (std::uint64_t d = 0; d < e % kTerngradTritsPerByte; ++d) trit /= 3u;
    byte |= terngrad_code_of_trit(trit % 3u) << (2 * i);
  }
  return static_cast<std::uint8_t>(byte);
}

// The largest valid value of the trit byte holding elements 5j .. 5j + 4 of a message of
// `count` elements: 242 for a full byte, 3^r - 1 for a last byte holding r < 5 elements.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_byte_limit(std::uint64_t count, std::uint64_t j) {
  const std::uint64_t remaining = count - j * kTerngradTritsPerByte;
  if (remaining >= static_cast<std::uint64_t>(kTerngradTritsPerByte)) return kTerngradBytesValid - 1u;
  std::uint32_t limit = 1;
  for (std::uint64_t d = 0; d < remaining; ++d) limit *= 3u;
  return limit - 1u;
}

// ceil(count / 5): the trit bytes of `count` elements.
GZ_HOST_DEVICE GZ_INLINE std::uint64_t terngrad_trit_bytes(std::uint64_t count) {
  return count / kTerngradTritsPerByte + (count % kTerngradTritsPerByte != 0u);
}

// The most elements a terngrad message holds: qsgd's limit (2^60), since its codes are drawn by
// qsgd's loops (compressors/qsgd/qsgd_cpu.h kQsgdMaxCount, compressors/qsgd/cuda/qsgd_kernels.h
// kQsgdCudaMaxCount; both files assert that they agree with this).
inline constexpr std::uint64_t kTerngradMaxCount = std::uint64_t{1} << 60;

// The payload of `count` elements in buckets of `bucket`:
//   [0, scale_bytes)                       f32 scale of each bucket (max |x|), as qsgd writes them
//   [scale_bytes, scale_bytes + trit_bytes) the trit bytes, five elements each
struct TerngradLayout {
  std::uint64_t num_buckets = 0;  // ceil(count / bucket)
  std::uint64_t scale_bytes = 0;  // 4 * num_buckets
  std::uint64_t trit_bytes = 0;   // ceil(count / 5)
  GZ_HOST_DEVICE GZ_INLINE std::uint64_t payload_bytes() const { return scale_bytes + trit_bytes; }
};

// True when terngrad_layout(count, bucket) is defined: bucket >= 1 and count <= kTerngradMaxCount.
GZ_HOST_DEVICE GZ_INLINE bool terngrad_layout_fits(std::uint64_t count, std::uint64_t bucket) {
  return bucket >= 1u && count <= kTerngradMaxCount;
}

// The one definition of the payload layout, for the host codec and the device routing.
// Preconditions: terngrad_layout_fits(count, bucket).
GZ_HOST_DEVICE GZ_INLINE TerngradLayout terngrad_layout(std::uint64_t count, std::uint64_t bucket) {
  TerngradLayout layout;
  layout.num_buckets = count / bucket + (count % bucket != 0u);
  layout.scale_bytes = layout.num_buckets * sizeof(float);
  layout.trit_bytes = terngrad_trit_bytes(count);
  return layout;
}

// Bits [bit, bit + 10) of a little-endian bit stream of `stream_bytes` bytes (missing bytes
// beyond its end read as 0). `bit` is even (a 2-bit code boundary), so bit % 8 <= 6 and the ten
// bits lie within two bytes.
GZ_HOST_DEVICE GZ_INLINE std::uint32_t terngrad_read_codes10(const std::uint8_t* stream,
                                                             std::uint64_t stream_bytes,
                                                             std::uint64_t bit) {
  const std::uint64_t first = bit / 8;
  std::uint32_t window = 0;
  for (std::uint64_t b = 0; b < 2 && first + b < stream_bytes; ++b) {
    window |= static_cast<std::uint32_t>(stream[first + b]) << (8 * b);
  }
  return (window >> (bit % 8)) & 0x3FFu;
}

}  // namespace gradzip::kernels
