// Error-feedback kernels: grid-stride loops over the element functions of ef_cuda.h. When every
// pointer is 16-byte aligned (8 for the f16/bf16 output) the loop moves 4 elements per
// iteration with vector loads and stores (float4 / ushort4), then finishes the count % 4 tail
// element by element; otherwise it goes element by element throughout. The arithmetic per
// element is the same either way.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/ef_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

// Sub = false: out = a + b; Sub = true (the residual update): out = a - b, stored as 0 when
// it is not finite (kernels/nonfinite_math.h: residuals never hold NaN or Inf).
template <bool Sub>
__device__ __forceinline__ float combine(float a, float b) {
  if constexpr (Sub) {
    return finite_or_zero(a - b);
  } else {
    return a + b;
  }
}

template <bool Sub, bool Vector>
__global__ void combine_kernel(const float* a, const float* b, float* out, std::size_t count) {
  std::size_t scalar_begin = 0;
  if constexpr (Vector) {
    const std::size_t groups = count / 4;
    const auto* a4 = reinterpret_cast<const float4*>(a);
    const auto* b4 = reinterpret_cast<const float4*>(b);
    auto* out4 = reinterpret_cast<float4*>(out);
    for (std::size_t v = global_thread(); v < groups; v += grid_threads()) {
      const float4 x = a4[v];
      const float4 y = b4[v];
      out4[v] = make_float4(combine<Sub>(x.x, y.x), combine<Sub>(x.y, y.y),
                            combine<Sub>(x.z, y.z), combine<Sub>(x.w, y.w));
    }
    scalar_begin = groups * 4;
  }
  for (std::size_t i = scalar_begin + global_thread(); i < count; i += grid_threads())
    out[i] = combine<Sub>(a[i], b[i]);
}

__device__ __forceinline__ bool non_finite(float value) {
  return f32_bits_nonfinite(float_bits(value));
}

// out = a + b, and *flag = 1 when some sum is not finite (one atomic per thread that saw one).
template <bool Vector>
__global__ void compensate_flagging_kernel(const float* a, const float* b, float* out,
                                           std::size_t count, int* flag) {
  bool any_non_finite = false;
  std::size_t scalar_begin = 0;
  if constexpr (Vector) {
    const std::size_t groups = count / 4;
    const auto* a4 = reinterpret_cast<const float4*>(a);
    const auto* b4 = reinterpret_cast<const float4*>(b);
    auto* out4 = reinterpret_cast<float4*>(out);
    for (std::size_t v = global_thread(); v < groups; v += grid_threads()) {
      const float4 x = a4[v];
      const float4 y = b4[v];
      const float4 sum = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
      any_non_finite |= non_finite(sum.x) || non_finite(sum.y) || non_finite(sum.z) ||
                        non_finite(sum.w);
      out4[v] = sum;
    }
    scalar_begin = groups * 4;
  }
  for (std::size_t i = scalar_begin + global_thread(); i < count; i += grid_threads()) {
    const float sum = a[i] + b[i];
    any_non_finite |= non_finite(sum);
    out[i] = sum;
  }
  if (any_non_finite) atomicOr(flag, 1);
}

__global__ void zero_nonfinite_if_flagged_kernel(float* data, std::size_t count, const int* flag) {
  if (*flag == 0) return;
  for (std::size_t i = global_thread(); i < count; i += grid_threads())
    data[i] = finite_or_zero(data[i]);
}

template <bool Bf16, bool Vector>
__global__ void cast_fused_kernel(const float* g, float* e, std::uint16_t* half_out,
                                  std::size_t count) {
  std::size_t scalar_begin = 0;
  if constexpr (Vector) {
    const std::size_t groups = count / 4;
    const auto* g4 = reinterpret_cast<const float4*>(g);
    auto* e4 = reinterpret_cast<float4*>(e);
    auto* h4 = reinterpret_cast<ushort4*>(half_out);
    for (std::size_t v = global_thread(); v < groups; v += grid_threads()) {
      const float4 grad = g4[v];
      float4 residual = e4[v];
      ushort4 halves;
      halves.x = ef_cast_element(grad.x, residual.x, Bf16);
      halves.y = ef_cast_element(grad.y, residual.y, Bf16);
      halves.z = ef_cast_element(grad.z, residual.z, Bf16);
      halves.w = ef_cast_element(grad.w, residual.w, Bf16);
      e4[v] = residual;
      h4[v] = halves;
    }
    scalar_begin = groups * 4;
  }
  for (std::size_t i = scalar_begin + global_thread(); i < count; i += grid_threads()) {
    float residual = e[i];
    half_out[i] = ef_cast_element(g[i], residual, Bf16);
    e[i] = residual;
  }
}

template <bool Sub>
void launch_combine(const char* op, const float* a, const float* b, float* out, std::size_t count,
                    void* stream) {
  if (count == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(out, 16) && count >= 4) {
    combine_kernel<Sub, true><<<grid_for(count / 4), kThreads, 0, cuda_stream>>>(a, b, out, count);
  } else {
    combine_kernel<Sub, false><<<grid_for(count), kThreads, 0, cuda_stream>>>(a, b, out, count);
  }
  check_launch(op, count);
}

template <bool Bf16>
void launch_cast_fused(const float* g, float* e, std::uint16_t* half_out, std::size_t count,
                       cudaStream_t stream) {
  if (aligned_to(g, 16) && aligned_to(e, 16) && aligned_to(half_out, 8) && count >= 4) {
    cast_fused_kernel<Bf16, true><<<grid_for(count / 4), kThreads, 0, stream>>>(g, e, half_out, count);
  } else {
    cast_fused_kernel<Bf16, false><<<grid_for(count), kThreads, 0, stream>>>(g, e, half_out, count);
  }
}

}  // namespace

void ef_compensate(const float* d_grad, const float* d_residual, float* d_out, std::size_t count,
                   void* stream) {
  if (emulated::active()) return emulated::ef_compensate(d_grad, d_residual, d_out, count, stream);
  launch_combine<false>("cuda.ef_compensate", d_grad, d_residual, d_out, count, stream);
}

void ef_update(const float* d_compensated, const float* d_decoded, float* d_residual,
               std::size_t count, void* stream) {
  if (emulated::active())
    return emulated::ef_update(d_compensated, d_decoded, d_residual, count, stream);
  launch_combine<true>("cuda.ef_update", d_compensated, d_decoded, d_residual, count, stream);
}

void ef_compensate_flagging(const float* d_grad, const float* d_residual, float* d_out,
                            std::size_t count, int* d_flag, void* stream) {
  if (emulated::active())
    return emulated::ef_compensate_flagging(d_grad, d_residual, d_out, count, d_flag, stream);
  if (count == 0) return;
  GZ_REQUIRE(d_flag != nullptr, ErrorCode::invalid_argument, "cuda.ef_compensate_flagging: null flag");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (aligned_to(d_grad, 16) && aligned_to(d_residual, 16) && aligned_to(d_out, 16) && count >= 4) {
    compensate_flagging_kernel<true><<<grid_for(count / 4), kThreads, 0, cuda_stream>>>(
        d_grad, d_residual, d_out, count, d_flag);
  } else {
    compensate_flagging_kernel<false><<<grid_for(count), kThreads, 0, cuda_stream>>>(
        d_grad, d_residual, d_out, count, d_flag);
  }
  check_launch("cuda.ef_compensate_flagging", count);
}

void ef_zero_nonfinite_if_flagged(float* d_residual, std::size_t count, const int* d_flag,
                                  void* stream) {
  if (emulated::active())
    return emulated::ef_zero_nonfinite_if_flagged(d_residual, count, d_flag, stream);
  if (count == 0) return;
  GZ_REQUIRE(d_flag != nullptr, ErrorCode::invalid_argument,
             "cuda.ef_zero_nonfinite_if_flagged: null flag");
  zero_nonfinite_if_flagged_kernel<<<grid_for(count), kThreads, 0,
                                     static_cast<cudaStream_t>(stream)>>>(d_residual, count, d_flag);
  check_launch("cuda.ef_zero_nonfinite_if_flagged", count);
}

void ef_cast_fused(const float* d_grad, float* d_residual, std::uint16_t* d_half_out, bool bf16,
                   std::size_t count, void* stream) {
  if (emulated::active())
    return emulated::ef_cast_fused(d_grad, d_residual, d_half_out, bf16, count, stream);
  if (count == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (bf16) launch_cast_fused<true>(d_grad, d_residual, d_half_out, count, cuda_stream);
  else launch_cast_fused<false>(d_grad, d_residual, d_half_out, count, cuda_stream);
  check_launch(bf16 ? "cuda.ef_cast_fused(bf16)" : "cuda.ef_cast_fused(fp16)", count);
}

}  // namespace gradzip::kernels::cuda
