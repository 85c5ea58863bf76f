// Random-k gather / scatter kernels: one thread per kept entry j (grid-stride), its index from
// randk_entry_index (compressors/randk/randk_math.h), its value converted by
// kernels/cast_math.h. The values area of a message may sit at any alignment: the kernels
// use typed loads and stores when it is aligned to the value width and byte-wise little-endian
// ones otherwise (chosen on the host).
#include <cuda_runtime.h>

#include "compressors/randk/cuda/randk_kernels.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

// Value j of the values area, widened exactly to f32.
template <bool Half, bool Aligned>
__device__ __forceinline__ float load_value(const std::byte* values, std::size_t j) {
  if constexpr (Half) {
    return f16_bits_to_f32(load_word<std::uint16_t, Aligned>(values, j));
  } else {
    return bits_float(load_word<std::uint32_t, Aligned>(values, j));
  }
}

struct Strata {
  RandkKey key;
  std::uint64_t n, k, quotient, remainder;
};

__device__ __forceinline__ std::uint64_t entry_index(const Strata& s, std::uint64_t j) {
  return randk_entry_index(s.key, s.n, s.k, s.quotient, s.remainder, j);
}

template <bool Half, bool Aligned>
__global__ void gather_kernel(const float* d_in, Strata s, std::byte* d_values) {
  for (std::size_t j = global_thread(); j < s.k; j += grid_threads()) {
    const float value = d_in[entry_index(s, j)];
    if constexpr (Half) {
      store_word<std::uint16_t, Aligned>(d_values, j, f32_to_f16_bits(value));
    } else {
      store_word<std::uint32_t, Aligned>(d_values, j, float_bits(value));
    }
  }
}

// What a scatter does with value j at index j.
enum class Scatter { set, add, subtract_own };

// set: d_acc[index_j] = value_j; add: d_acc[index_j] += value_j; subtract_own (the residual
// update): d_acc[index_j] = finite_or_zero(d_acc[index_j] - value_j).
template <bool Half, bool Aligned, Scatter Mode>
__global__ void scatter_kernel(const std::byte* d_values, Strata s, float* d_acc) {
  for (std::size_t j = global_thread(); j < s.k; j += grid_threads()) {
    const float value = load_value<Half, Aligned>(d_values, j);
    const std::uint64_t index = entry_index(s, j);
    if constexpr (Mode == Scatter::add) {
      d_acc[index] += value;
    } else if constexpr (Mode == Scatter::subtract_own) {
      d_acc[index] = finite_or_zero(d_acc[index] - value);
    } else {
      d_acc[index] = value;
    }
  }
}

Strata strata_for(const RandkKey& key, std::size_t n, std::size_t k) {
  return Strata{key, n, k, n / k, n % k};
}

template <Scatter Mode>
void launch_scatter(const char* op, const std::byte* d_values, std::size_t k, bool half_values,
                    const RandkKey& key, std::size_t n, float* d_acc, cudaStream_t stream) {
  const Strata s = strata_for(key, n, k);
  const unsigned grid = grid_for(k);
  const bool aligned = aligned_to(d_values, half_values ? 2 : 4);
  if (half_values) {
    if (aligned) scatter_kernel<true, true, Mode><<<grid, kThreads, 0, stream>>>(d_values, s, d_acc);
    else scatter_kernel<true, false, Mode><<<grid, kThreads, 0, stream>>>(d_values, s, d_acc);
  } else {
    if (aligned) scatter_kernel<false, true, Mode><<<grid, kThreads, 0, stream>>>(d_values, s, d_acc);
    else scatter_kernel<false, false, Mode><<<grid, kThreads, 0, stream>>>(d_values, s, d_acc);
  }
  check_launch(op, k, "entries");
}

}  // namespace

void randk_gather(const float* d_in, std::size_t n, const RandkKey& key, std::size_t k,
                  bool half_values, std::byte* d_values_out, void* stream) {
  if (emulated::active())
    return emulated::randk_gather(d_in, n, key, k, half_values, d_values_out, stream);
  check_randk_sizes("cuda.randk_gather", n, k);
  if (k == 0) return;
  const Strata s = strata_for(key, n, k);
  const unsigned grid = grid_for(k);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const bool aligned = aligned_to(d_values_out, half_values ? 2 : 4);
  if (half_values) {
    if (aligned) gather_kernel<true, true><<<grid, kThreads, 0, cuda_stream>>>(d_in, s, d_values_out);
    else gather_kernel<true, false><<<grid, kThreads, 0, cuda_stream>>>(d_in, s, d_values_out);
  } else {
    if (aligned) gather_kernel<false, true><<<grid, kThreads, 0, cuda_stream>>>(d_in, s, d_values_out);
    else gather_kernel<false, false><<<grid, kThreads, 0, cuda_stream>>>(d_in, s, d_values_out);
  }
  check_launch("cuda.randk_gather", k, "entries");
}

void randk_scatter_add(const std::byte* d_values, std::size_t k, bool half_values,
                       const RandkKey& key, std::size_t n, float* d_acc, void* stream) {
  if (emulated::active())
    return emulated::randk_scatter_add(d_values, k, half_values, key, n, d_acc, stream);
  check_randk_sizes("cuda.randk_scatter_add", n, k);
  if (k == 0) return;
  launch_scatter<Scatter::add>("cuda.randk_scatter_add", d_values, k, half_values, key, n, d_acc,
                       static_cast<cudaStream_t>(stream));
}

void randk_scatter(const std::byte* d_values, std::size_t k, bool half_values,
                   const RandkKey& key, std::size_t n, float* d_out, void* stream) {
  if (emulated::active())
    return emulated::randk_scatter(d_values, k, half_values, key, n, d_out, stream);
  check_randk_sizes("cuda.randk_scatter", n, k);
  if (n == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  const cudaError_t status = cudaMemsetAsync(d_out, 0, n * sizeof(float), cuda_stream);
  GZ_REQUIRE(status == cudaSuccess, ErrorCode::unsupported, "cuda.randk_scatter: zero fill of ",
             n, " elements failed: ", cudaGetErrorString(status));
  launch_scatter<Scatter::set>("cuda.randk_scatter", d_values, k, half_values, key, n, d_out, cuda_stream);
}

void randk_subtract_own(const std::byte* d_values, std::size_t k, bool half_values,
                        const RandkKey& key, std::size_t n, float* d_residual, void* stream) {
  if (emulated::active())
    return emulated::randk_subtract_own(d_values, k, half_values, key, n, d_residual, stream);
  check_randk_sizes("cuda.randk_subtract_own", n, k);
  if (k == 0) return;
  launch_scatter<Scatter::subtract_own>("cuda.randk_subtract_own", d_values, k, half_values, key,
                                        n, d_residual, static_cast<cudaStream_t>(stream));
}

}  // namespace gradzip::kernels::cuda
