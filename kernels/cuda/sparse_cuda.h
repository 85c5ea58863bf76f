// Device side of the sparse (`topk`) decoders (compressors/topk/topk_codec.cpp): validate payloads of
// (index, value) pairs, then scatter-add them into a dense f32 accumulator, or decode one into
// a dense output.
//
// A payload is what follows a topk message's 32-byte header, for m entries:
//   offset 0        m indices, u32 (or u64 when wide_indices), strictly increasing, each < n
//   offset m * iw   m values, f32 bits (or f16 bits when half_values)
// little-endian, at any alignment. The header itself (flags, m, n, payload size) is parsed and
// checked on the host by the caller; these functions check what only the payload holds.
//
// Validation on the device: the functions first set *d_status = 0, then every payload's
// indices are checked and the bits below are OR-ed into *d_status; the writing kernels that
// follow write nothing when *d_status != 0. The caller reads *d_status when it synchronises
// (0 = everything was applied; otherwise nothing was written to the output). So a malformed
// payload anywhere in the batch leaves the output untouched, as the CPU decoders do.
//
// Host-callable; no CUDA headers needed by includers (the stream is a cudaStream_t cast to
// void*, nullptr = the default stream). Asynchronous, no allocation, no workspace needed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradzip::kernels::cuda {

// Bits of *d_status.
inline constexpr int kSparseIndexOutOfRange = 1;   // some index >= n
inline constexpr int kSparseIndexNotIncreasing = 2;  // some index <= the one before it

// Payload bytes of m entries.
inline constexpr std::size_t sparse_payload_bytes(std::size_t m, bool wide_indices,
                                                  bool half_values) noexcept {
  return m * ((wide_indices ? 8 : 4) + (half_values ? 2 : 4));
}

// d_acc[index] += value for every entry of every payload, payloads in array order: one kernel
// per payload, in order on the stream, so each element gets
//   acc[i] = ((acc[i] + v_0) + v_1) + ...
// over the payloads that hold i, in array (rank) order: exactly the f32 sums of the CPU loop
//   for r in ranks: codec.decode_add(message_r, acc, n).
// d_payloads: host array of payload_count device pointers; entries: host array of their entry
// counts m_r. All payloads share wide_indices / half_values (one spec) and n.
// Host-side refusals, before anything is launched or written (gradzip::Error):
//   malformed_message: m_r > n, or 32-bit indices with n > 2^32;
//   invalid_argument: d_status null, or a null payload / d_acc with entries to apply.
// Launch failures: gradzip::Error(unsupported).
void sparse_decode_add(const std::byte* const* d_payloads, const std::uint64_t* entries,
                       std::size_t payload_count, bool wide_indices, bool half_values,
                       std::size_t n, float* d_acc, int* d_status, void* stream);

// Decode of one payload: d_out = +0.0 everywhere except d_out[index] = value. Validation,
// status and refusals as sparse_decode_add (with payload_count = 1); nothing is written to
// d_out when *d_status != 0.
void sparse_decode(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                   bool half_values, std::size_t n, float* d_out, int* d_status, void* stream);

// Error feedback's residual update for a top-k payload this rank just encoded (not a received
// one, so not validated): d_residual[index_j] = finite_or_zero(d_residual[index_j] - value_j)
// for every entry, other elements untouched (the decode writes +0.0 there). This is
// topk.subtract_decoded (compressors/topk/topk_codec.cpp) on the device. An index >= n is skipped (the
// encode's own entry check reports a selection that went wrong). Refusals as sparse_decode's
// host-side ones; d_residual may be null only when entries == 0.
void sparse_subtract_own(const std::byte* d_payload, std::uint64_t entries, bool wide_indices,
                         bool half_values, std::size_t n, float* d_residual, void* stream);

}  // namespace gradzip::kernels::cuda
