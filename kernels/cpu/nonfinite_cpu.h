// Counting the non-finite elements (NaN, +-Inf) of a host tensor, on the raw bits
// (kernels/nonfinite_math.h): what every rank does before a collective's call check so that
// all ranks learn who holds non-finite input (the nonfinite= policy of compression_spec.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/tensor_view.h"

namespace gradzip::kernels::cpu {

struct NonfiniteCount {
  std::uint64_t count = 0;  // non-finite elements
  std::uint64_t first = 0;  // index of the first one (relative to `begin`); 0 when count == 0
};

// Elements [begin, begin + count) of `tensor` (host memory; f32, f16 or bf16; any alignment
// of the data that the dtype allows). A branch-free counting loop the compiler vectorises; the
// first index is searched only when the count is non-zero.
NonfiniteCount count_nonfinite(ConstTensorView tensor, std::size_t begin, std::size_t count) noexcept;

// The same count, and in the same pass the finite elements whose magnitude exceeds `limit`
// (> 0, finite): what a narrowing to a 16-bit wire type would saturate (the Communicator's
// overflow check; see its use in collectives/call.cpp). Exact: the comparison is on the
// bits, against the first 16- or 32-bit pattern whose value exceeds `limit`.
struct RangeCount {
  NonfiniteCount nonfinite;
  std::uint64_t beyond = 0;  // finite elements with |x| > limit
};
RangeCount count_nonfinite_and_beyond(ConstTensorView tensor, std::size_t begin, std::size_t count,
                                      float limit) noexcept;

// The first magnitude bit pattern of `dtype` (f32: 31 bits, f16 / bf16: 15 bits) whose value
// exceeds `limit`: the `above` of the *_bits_beyond tests (kernels/nonfinite_math.h) that this
// count and the CUDA count (kernels/cuda/nonfinite_cuda.h) share. The infinity pattern when no
// finite value exceeds `limit`.
std::uint32_t beyond_threshold_bits(DType dtype, float limit) noexcept;

}  // namespace gradzip::kernels::cpu
