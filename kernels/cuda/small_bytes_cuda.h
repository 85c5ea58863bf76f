// A few host bytes (a message header, random-k's key) written into, or compared with, device
// memory without a copy from or to pageable host memory: cudaMemcpyAsync with pageable memory
// waits for the stream (a host wait, kernels/cuda/device_runtime.h). Here the bytes travel as a
// kernel argument, so the work is ordered on the stream like any kernel and the host does not
// wait; a comparison leaves its answer in a device status word that the caller reads when it
// waits anyway (kernels/cuda/stream_ordered_call.h). Host-callable; no CUDA headers needed by
// includers (stream: a cudaStream_t as void*).
#pragma once

#include <cstddef>

namespace gradzip::kernels::cuda {

// The most bytes one call writes.
inline constexpr std::size_t kSmallBytesMax = 64;

// d_out[0, count) = host[0, count), asynchronously on `stream`; d_out may sit at any address.
// count == 0 launches nothing. Throws gradzip::Error(invalid_argument) when count exceeds
// kSmallBytesMax or a pointer is null, gradzip::Error(unsupported) when the launch fails.
void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream);

// *d_status = 0 when d_bytes[0, count) equals expected[0, count) (host bytes, taken as of the
// call), else `mismatch` (non-zero); asynchronously on `stream`. count == 0 stores 0. Throws
// like write_small_bytes (and invalid_argument when mismatch is 0 or d_status is null).
void compare_small_bytes(const std::byte* d_bytes, const std::byte* expected, std::size_t count,
                         int mismatch, int* d_status, void* stream);

// Words (device or pinned host memory) whose any-non-zero is one flag of write_rank_flags.
struct FlagWords {
  const int* words = nullptr;
  std::size_t count = 0;
};
inline constexpr std::size_t kMaxFlagGroups = 3;

// What one rank contributes to the all-reduce that tells every rank whether any check failed
// anywhere, in one launch, asynchronously on `stream`: d_flags[first + g] = 1.0f when any word of
// groups[g] is non-zero, else 0.0f (g < group_count <= kMaxFlagGroups; groups is a host array,
// taken as of the call), and every other element of d_flags[0, total) = 0.0f. Throws
// invalid_argument for a null pointer, group_count > kMaxFlagGroups or first + group_count >
// total; unsupported when the launch fails.
void write_rank_flags(const FlagWords* groups, std::size_t group_count, float* d_flags,
                      std::size_t total, std::size_t first, void* stream);

// d_words[i] = (d_flags[i] != 0) for i in [0, count), asynchronously on `stream`: the
// all-reduced flags of every rank, back into status words (which may be pinned host memory).
// count == 0 launches nothing. Throws like write_rank_flags.
void words_from_flags(const float* d_flags, std::size_t count, int* d_words, void* stream);

}  // namespace gradzip::kernels::cuda
