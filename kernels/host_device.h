// GZ_HOST_DEVICE marks element math that both the CPU loops and the CUDA kernels call, so
// the two give the same bits. Functions marked with it use only integer and IEEE
// round-to-nearest float operations whose results nvcc and g++ agree on (no FMA contraction:
// the build passes -ffp-contract=off and --fmad=false).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GZ_HOST_DEVICE __host__ __device__
#define GZ_INLINE __forceinline__
#else
#define GZ_HOST_DEVICE
#define GZ_INLINE inline __attribute__((always_inline))
#endif

namespace gradzip::kernels {

GZ_HOST_DEVICE GZ_INLINE std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

GZ_HOST_DEVICE GZ_INLINE float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

}  // namespace gradzip::kernels
