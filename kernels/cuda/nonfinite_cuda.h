// Counting the non-finite elements (NaN, +-Inf) of a device array on the raw bits
// (kernels/nonfinite_math.h), the CUDA twin of kernels/cpu/nonfinite_cpu.h. Host-callable; no
// CUDA headers needed by includers (the stream is a cudaStream_t cast to void*, nullptr = the
// default stream). count_nonfinite and count_nonfinite_and_beyond are synchronous: they return
// the count, so they wait for the stream; queue_count_nonfinite only queues. count == 0
// launches nothing. Launch failures: gradzip::Error(unsupported).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/dtype.h"

namespace gradzip::kernels::cuda {

struct DeviceNonfiniteCount {
  std::uint64_t count = 0;  // non-finite elements
  std::uint64_t first = 0;  // index of the first one; 0 when count == 0
  std::uint64_t beyond = 0;  // finite elements beyond the wire range (count_nonfinite_and_beyond)
};

// Elements [0, count) of d_data, of `dtype` (f32, f16 or bf16).
DeviceNonfiniteCount count_nonfinite(const void* d_data, std::size_t count, DType dtype, void* stream);

// The same count and, in the same pass, the finite elements whose magnitude pattern is at or
// above `above_bits` (kernels/cpu/nonfinite_cpu.h, beyond_threshold_bits: |x| > limit), with
// the bit tests the CPU count uses (kernels/nonfinite_math.h).
DeviceNonfiniteCount count_nonfinite_and_beyond(const void* d_data, std::size_t count, DType dtype,
                                                std::uint32_t above_bits, void* stream);

// Queues the same count on `stream` without waiting: d_result (3 u64 of device memory) receives
// {non-finite count, index of the first one (all ones when none), finite elements at or above
// `above_bits` (0 unless count_beyond)}; they are set before the count (count == 0 sets them
// only). For a reader later in stream order (a stream-ordered call's completion flags).
void queue_count_nonfinite(const void* d_data, std::size_t count, DType dtype, bool count_beyond,
                           std::uint32_t above_bits, std::uint64_t* d_result, void* stream);

}  // namespace gradzip::kernels::cuda
