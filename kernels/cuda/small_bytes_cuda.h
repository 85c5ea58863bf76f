// Writing a few host bytes (a message header, random-k's key) into device memory without a copy
// from pageable host memory: cudaMemcpyAsync from pageable memory waits for the stream before it
// starts (an uncounted host wait, kernels/cuda/device_runtime.h). Here the bytes travel as a
// kernel argument, so the write is ordered on the stream like any kernel and the host does not
// wait. Host-callable; no CUDA headers needed by includers (stream: a cudaStream_t as void*).
#pragma once

#include <cstddef>

namespace gradzip::kernels::cuda {

// The most bytes one call writes.
inline constexpr std::size_t kSmallBytesMax = 64;

// d_out[0, count) = host[0, count), asynchronously on `stream`; d_out may sit at any address.
// count == 0 launches nothing. Throws gradzip::Error(invalid_argument) when count exceeds
// kSmallBytesMax or a pointer is null, gradzip::Error(unsupported) when the launch fails.
void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream);

}  // namespace gradzip::kernels::cuda
