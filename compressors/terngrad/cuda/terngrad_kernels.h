// Device kernels of the `terngrad` codec: the repacking between qsgd's 2-bit code stream and
// terngrad's trit bytes (terngrad_math.h, shared with the CPU loops). The codes themselves are
// drawn and decoded by qsgd's kernels (compressors/qsgd/cuda/qsgd_kernels.h, bits = 2), so a terngrad
// payload on the device is the CPU codec's, byte for byte. Host-callable; no CUDA headers
// needed by includers (the stream is a cudaStream_t cast to void*, nullptr = the default
// stream). Asynchronous on `stream`, no allocation, no wait; count == 0 launches nothing.
// Launch failures: gradzip::Error(unsupported); null pointers with count > 0: invalid_argument.
// (Its functions keep the kernels:: namespace they had before the codec had a folder.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "compressors/terngrad/terngrad_math.h"
#include "gradzip/error.h"

namespace gradzip::kernels::cuda {

// What terngrad_codes_from_trits() writes to *d_status when a trit byte is above
// terngrad_byte_limit() (one encode never writes). 0 otherwise.
inline constexpr int kTerngradStatusBadTrit = 4;

// The byte counts the repacking wrappers below work on for `count` elements: the trit bytes,
// ceil(count / 5), and the 2-bit code stream, ceil(count / 4).
struct TerngradRepackBytes {
  std::uint64_t trit_bytes;
  std::uint64_t code_bytes;
};
inline TerngradRepackBytes terngrad_repack_bytes(std::size_t count) {
  return {terngrad_trit_bytes(count), (std::uint64_t{count} * 2 + 7) / 8};
}

// The wrappers' pointer checks, host-side and shared with their twins (count > 0).
inline void require_trits_from_codes_buffers(const std::byte* d_codes, std::size_t count,
                                             const std::byte* d_trits) {
  GZ_REQUIRE(d_codes != nullptr && d_trits != nullptr, ErrorCode::invalid_argument,
             "cuda.terngrad_trits_from_codes: null codes or trits for ", count, " elements");
}
inline void require_codes_from_trits_buffers(const std::byte* d_trits, std::size_t count,
                                             const std::byte* d_codes, const int* d_status,
                                             const std::byte* d_poison_scale) {
  GZ_REQUIRE(d_trits != nullptr && d_codes != nullptr && d_status != nullptr &&
                 d_poison_scale != nullptr,
             ErrorCode::invalid_argument, "cuda.terngrad_codes_from_trits: null pointer for ",
             count, " elements");
}

// The launch wrappers, declared once for the CUDA kernels (namespace cuda) and for their CPU
// twins on the emulated device (namespace emulated, compressors/terngrad/emulated/
// terngrad_twins.cpp; same contracts, queued as one operation on the emulated device's stream):
//   terngrad_trits_from_codes: d_trits[j] = the trit byte of elements 5j .. 5j + 4, read from
//     the 2-bit code stream at d_codes (ceil(count / 4) bytes, its unused high bits 0), for
//     j < ceil(count / 5).
//   terngrad_codes_from_trits: the inverse: writes the whole 2-bit code stream
//     d_codes[0, ceil(count / 4)) from the trit bytes d_trits[0, ceil(count / 5)). When a trit
//     byte is above its limit it sets *d_status (device int, which the caller cleared) to
//     kTerngradStatusBadTrit and *d_poison_scale (a device f32 the caller passes to qsgd_decode,
//     e.g. the first bucket scale of the qsgd payload being built) to -1.0f, a scale qsgd_decode
//     refuses, so that the decode after it writes nothing.
#define GZ_TERNGRAD_KERNEL_DECLARATIONS                                                       \
  void terngrad_trits_from_codes(const std::byte* d_codes, std::size_t count,                \
                                 std::byte* d_trits, void* stream);                          \
  void terngrad_codes_from_trits(const std::byte* d_trits, std::size_t count,                \
                                 std::byte* d_codes, int* d_status, std::byte* d_poison_scale, \
                                 void* stream);
GZ_TERNGRAD_KERNEL_DECLARATIONS

}  // namespace gradzip::kernels::cuda

namespace gradzip::kernels::emulated {
GZ_TERNGRAD_KERNEL_DECLARATIONS
}  // namespace gradzip::kernels::emulated
#undef GZ_TERNGRAD_KERNEL_DECLARATIONS
