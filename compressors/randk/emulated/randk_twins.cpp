// The CPU twins of random-k's kernels (cuda/randk_kernels.h): the CPU codec's loops
// (randk_cpu.h), each call queued as one operation on the emulated device's stream, with the
// wrappers' host-side refusals.
#include <cstddef>

#include "compressors/randk/cuda/randk_kernels.h"
#include "compressors/randk/randk_cpu.h"
#include "gradzip/tensor_view.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/twin_support.h"

namespace gradzip::kernels::emulated {
namespace {

using cuda::check_randk_sizes;

DType randk_value_dtype(bool half_values) { return half_values ? DType::f16 : DType::f32; }

}  // namespace

void randk_gather(const float* d_in, std::size_t n, const RandkKey& key, std::size_t k,
                  bool half_values, std::byte* d_values_out, void* stream) {
  constexpr const char* kOp = "cuda.randk_gather";
  check_randk_sizes(kOp, n, k);
  if (k == 0) return;
  enqueue(stream, kOp, [d_in, n, key, k, half_values, d_values_out] {
    require_device_range(d_in, n * sizeof(float), "cuda.randk_gather input");
    require_device_range(d_values_out, cuda::randk_values_bytes(k, half_values),
                         "cuda.randk_gather values");
    cpu::randk_gather(f32_view(d_in, n), k, key, randk_value_dtype(half_values), d_values_out);
  });
}

void randk_scatter_add(const std::byte* d_values, std::size_t k, bool half_values,
                       const RandkKey& key, std::size_t n, float* d_acc, void* stream) {
  constexpr const char* kOp = "cuda.randk_scatter_add";
  check_randk_sizes(kOp, n, k);
  if (k == 0) return;
  enqueue(stream, kOp, [d_values, k, half_values, key, n, d_acc] {
    require_device_range(d_values, cuda::randk_values_bytes(k, half_values),
                         "cuda.randk_scatter_add values");
    require_device_range(d_acc, n * sizeof(float), "cuda.randk_scatter_add accumulator");
    cpu::randk_scatter_add(d_values, randk_value_dtype(half_values), k, key, d_acc, n);
  });
}

void randk_scatter(const std::byte* d_values, std::size_t k, bool half_values,
                   const RandkKey& key, std::size_t n, float* d_out, void* stream) {
  constexpr const char* kOp = "cuda.randk_scatter";
  check_randk_sizes(kOp, n, k);
  if (n == 0) return;
  enqueue(stream, kOp, [d_values, k, half_values, key, n, d_out] {
    require_device_range(d_values, cuda::randk_values_bytes(k, half_values),
                         "cuda.randk_scatter values");
    require_device_range(d_out, n * sizeof(float), "cuda.randk_scatter output");
    cpu::randk_scatter(d_values, randk_value_dtype(half_values), k, key, f32_view(d_out, n));
  });
}

void randk_subtract_own(const std::byte* d_values, std::size_t k, bool half_values,
                        const RandkKey& key, std::size_t n, float* d_residual, void* stream) {
  constexpr const char* kOp = "cuda.randk_subtract_own";
  check_randk_sizes(kOp, n, k);
  if (k == 0) return;
  enqueue(stream, kOp, [d_values, k, half_values, key, n, d_residual] {
    require_device_range(d_values, cuda::randk_values_bytes(k, half_values),
                         "cuda.randk_subtract_own values");
    require_device_range(d_residual, n * sizeof(float), "cuda.randk_subtract_own residual");
    cpu::randk_subtract_from(d_values, randk_value_dtype(half_values), k, key, d_residual, n);
  });
}

}  // namespace gradzip::kernels::emulated
