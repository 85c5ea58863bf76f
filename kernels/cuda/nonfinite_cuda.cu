// One grid-stride pass: each thread counts its non-finite elements and remembers its first
// (a thread visits its indices in increasing order); then one atomicAdd and one atomicMin per
// thread that found any. Non-finite gradients are rare, so the atomics cost nothing in the
// common case.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/nonfinite_cuda.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;

__device__ __forceinline__ bool nonfinite_at(const std::uint32_t* d_data, std::uint64_t i) {
  return f32_bits_nonfinite(d_data[i]);
}

template <DType Kind>
__device__ __forceinline__ bool nonfinite_at(const std::uint16_t* d_data, std::uint64_t i) {
  return Kind == DType::bf16 ? bf16_bits_nonfinite(d_data[i]) : f16_bits_nonfinite(d_data[i]);
}

__device__ __forceinline__ bool beyond_at(const std::uint32_t* d_data, std::uint64_t i,
                                          std::uint32_t above) {
  return f32_bits_beyond(d_data[i], above);
}

template <DType Kind>
__device__ __forceinline__ bool beyond_at(const std::uint16_t* d_data, std::uint64_t i,
                                          std::uint32_t above) {
  const auto above16 = static_cast<std::uint16_t>(above);
  return Kind == DType::bf16 ? bf16_bits_beyond(d_data[i], above16)
                             : f16_bits_beyond(d_data[i], above16);
}

// d_result[0] += non-finite count; d_result[1] = min(d_result[1], first index); with
// CountBeyond, d_result[2] += the finite elements beyond `above` (the wire range).
template <DType Kind, bool CountBeyond, typename Bits>
__global__ void count_nonfinite_kernel(const Bits* d_data, std::size_t count, std::uint32_t above,
                                       unsigned long long* d_result) {
  unsigned long long found = 0;
  unsigned long long beyond = 0;
  unsigned long long first = ~0ull;
  for (std::uint64_t i = global_thread(); i < count; i += grid_threads()) {
    bool nonfinite;
    if constexpr (Kind == DType::f32) nonfinite = nonfinite_at(d_data, i);
    else nonfinite = nonfinite_at<Kind>(d_data, i);
    if (nonfinite) {
      if (found == 0) first = i;
      ++found;
    }
    if constexpr (CountBeyond) {
      bool out_of_range;
      if constexpr (Kind == DType::f32) out_of_range = beyond_at(d_data, i, above);
      else out_of_range = beyond_at<Kind>(d_data, i, above);
      beyond += out_of_range ? 1 : 0;
    }
  }
  if (found != 0) {
    atomicAdd(&d_result[0], found);
    atomicMin(&d_result[1], first);
  }
  if (CountBeyond && beyond != 0) atomicAdd(&d_result[2], beyond);
}

template <bool CountBeyond>
void launch_count(const void* d_data, std::size_t count, DType dtype, std::uint32_t above,
                  unsigned long long* d_result, cudaStream_t stream) {
  const unsigned blocks = detail::grid_for(count);
  switch (dtype) {
    case DType::f32:
      count_nonfinite_kernel<DType::f32, CountBeyond><<<blocks, detail::kThreads, 0, stream>>>(
          static_cast<const std::uint32_t*>(d_data), count, above, d_result);
      break;
    case DType::f16:
      count_nonfinite_kernel<DType::f16, CountBeyond><<<blocks, detail::kThreads, 0, stream>>>(
          static_cast<const std::uint16_t*>(d_data), count, above, d_result);
      break;
    case DType::bf16:
      count_nonfinite_kernel<DType::bf16, CountBeyond><<<blocks, detail::kThreads, 0, stream>>>(
          static_cast<const std::uint16_t*>(d_data), count, above, d_result);
      break;
  }
}

// Both counts: the result words are set by memsets (a copy from pageable host memory would
// wait for the stream before it starts), one kernel, one read-back.
DeviceNonfiniteCount count_on_device(const void* d_data, std::size_t count, DType dtype,
                                     bool count_beyond, std::uint32_t above, void* stream) {
  if (count == 0) return {};
  const char* const op = count_beyond ? "cuda.count_nonfinite_and_beyond" : "cuda.count_nonfinite";
  GZ_REQUIRE(d_data != nullptr, ErrorCode::invalid_argument, op, ": null data for ", count,
             " elements");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  int device = 0;
  check_runtime(cudaGetDevice(&device), op, "cudaGetDevice");
  constexpr std::size_t kResultBytes = 3 * sizeof(unsigned long long);
  auto* const d_result = static_cast<unsigned long long*>(
      device_allocate(kResultBytes, device, cuda_stream, op, "allocating the result"));
  unsigned long long result[3] = {0, 0, 0};
  cudaError_t status = cudaMemsetAsync(d_result, 0, kResultBytes, cuda_stream);
  if (status == cudaSuccess)
    status = cudaMemsetAsync(d_result + 1, 0xFF, sizeof(unsigned long long), cuda_stream);
  if (status == cudaSuccess) {
    if (count_beyond) launch_count<true>(d_data, count, dtype, above, d_result, cuda_stream);
    else launch_count<false>(d_data, count, dtype, above, d_result, cuda_stream);
    status = cudaGetLastError();
    if (status == cudaSuccess)
      status = cudaMemcpyAsync(result, d_result, sizeof result, cudaMemcpyDeviceToHost, cuda_stream);
  }
  // The one wait of the call (its result is needed on the host); also when a step failed, so
  // that the result block is idle before it goes back to the cache.
  try {
    synchronize_stream(cuda_stream, op, "reading the count");
  } catch (...) {
    if (status == cudaSuccess) {
      device_release(d_result, kResultBytes, device, cuda_stream);
      throw;
    }
  }
  device_release(d_result, kResultBytes, device, cuda_stream);
  check_runtime(status, op, "counting non-finite elements");
  return DeviceNonfiniteCount{result[0], result[0] == 0 ? 0 : result[1], result[2]};
}

}  // namespace

void queue_count_nonfinite(const void* d_data, std::size_t count, DType dtype, bool count_beyond,
                           std::uint32_t above_bits, std::uint64_t* d_result, void* stream) {
  if (emulated::active()) {
    emulated::queue_count_nonfinite(d_data, count, dtype, count_beyond, above_bits, d_result, stream);
    return;
  }
  constexpr const char* kOp = "cuda.queue_count_nonfinite";
  GZ_REQUIRE(d_result != nullptr && (d_data != nullptr || count == 0), ErrorCode::invalid_argument,
             kOp, ": null pointer for ", count, " elements");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  auto* const result = reinterpret_cast<unsigned long long*>(d_result);
  cudaError_t status = cudaMemsetAsync(result, 0, 3 * sizeof(unsigned long long), cuda_stream);
  if (status == cudaSuccess)
    status = cudaMemsetAsync(result + 1, 0xFF, sizeof(unsigned long long), cuda_stream);
  check_runtime(status, kOp, "cudaMemsetAsync (the result words)");
  if (count == 0) return;
  if (count_beyond) launch_count<true>(d_data, count, dtype, above_bits, result, cuda_stream);
  else launch_count<false>(d_data, count, dtype, above_bits, result, cuda_stream);
  check_runtime(cudaGetLastError(), kOp, "counting non-finite elements");
}

DeviceNonfiniteCount count_nonfinite(const void* d_data, std::size_t count, DType dtype,
                                     void* stream) {
  if (emulated::active()) return emulated::count_nonfinite(d_data, count, dtype, stream);
  return count_on_device(d_data, count, dtype, false, 0, stream);
}

DeviceNonfiniteCount count_nonfinite_and_beyond(const void* d_data, std::size_t count, DType dtype,
                                                std::uint32_t above_bits, void* stream) {
  if (emulated::active())
    return emulated::count_nonfinite_and_beyond(d_data, count, dtype, above_bits, stream);
  return count_on_device(d_data, count, dtype, true, above_bits, stream);
}

}  // namespace gradzip::kernels::cuda
