// Division of an f32 array by a scalar on the device: ReduceOp::average's "divide every
// contribution by the rank count before it is encoded", the same IEEE division (round to
// nearest even, __fdiv_rn) as the host's `value /= divisor`, so both give the same bits.
// Host-callable; no CUDA headers needed by includers (the stream is a cudaStream_t cast to
// void*, nullptr = the default stream). Asynchronous, no allocation. count == 0 launches
// nothing. Launch failures: gradzip::Error(unsupported).
#pragma once

#include <cstddef>

namespace gradzip::kernels::cuda {

// d_data[i] = d_data[i] / divisor for i < count.
void divide_f32(float* d_data, std::size_t count, float divisor, void* stream);

}  // namespace gradzip::kernels::cuda
