// Grid-stride conversion kernels over kernels/cast_math.h. When both pointers are aligned for
// 4-element vectors (16 bytes for f32, 8 for the 16-bit side) each thread converts 4 elements
// per iteration with one float4 and one ushort4 access, then the count % 4 tail goes element
// by element; otherwise element by element throughout. The arithmetic per element is the same
// either way (the bits of the CPU's kernels/cpu/convert.h).
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

// f32 -> 16-bit bits (Bf16: bfloat16, else IEEE half), rounding to nearest even; Ieee: beyond
// the range to +-Inf (tensor stores), else saturating (message payloads: kernels/cast_math.h).
template <bool Bf16, bool Ieee>
__device__ __forceinline__ std::uint16_t narrow(float value) {
  if constexpr (Bf16 && Ieee) {
    return f32_to_bf16_bits_ieee(value);
  } else if constexpr (Bf16) {
    return f32_to_bf16_bits(value);
  } else if constexpr (Ieee) {
    return f32_to_f16_bits_ieee(value);
  } else {
    return f32_to_f16_bits(value);
  }
}

template <bool Bf16>
__device__ __forceinline__ float widen(std::uint16_t bits) {
  if constexpr (Bf16) {
    return bf16_bits_to_f32(bits);
  } else {
    return f16_bits_to_f32(bits);
  }
}

template <bool Bf16, bool Ieee, bool Vector>
__global__ void narrow_kernel(const float* d_in, std::uint16_t* d_out, std::size_t count) {
  std::size_t scalar_begin = 0;
  if constexpr (Vector) {
    const std::size_t groups = count / 4;
    const auto* in4 = reinterpret_cast<const float4*>(d_in);
    auto* out4 = reinterpret_cast<ushort4*>(d_out);
    for (std::size_t v = global_thread(); v < groups; v += grid_threads()) {
      const float4 x = in4[v];
      out4[v] = make_ushort4(narrow<Bf16, Ieee>(x.x), narrow<Bf16, Ieee>(x.y),
                             narrow<Bf16, Ieee>(x.z), narrow<Bf16, Ieee>(x.w));
    }
    scalar_begin = groups * 4;
  }
  for (std::size_t i = scalar_begin + global_thread(); i < count; i += grid_threads())
    d_out[i] = narrow<Bf16, Ieee>(d_in[i]);
}

template <bool Bf16, bool Vector>
__global__ void widen_kernel(const std::uint16_t* d_in, float* d_out, std::size_t count) {
  std::size_t scalar_begin = 0;
  if constexpr (Vector) {
    const std::size_t groups = count / 4;
    const auto* in4 = reinterpret_cast<const ushort4*>(d_in);
    auto* out4 = reinterpret_cast<float4*>(d_out);
    for (std::size_t v = global_thread(); v < groups; v += grid_threads()) {
      const ushort4 h = in4[v];
      out4[v] = make_float4(widen<Bf16>(h.x), widen<Bf16>(h.y), widen<Bf16>(h.z), widen<Bf16>(h.w));
    }
    scalar_begin = groups * 4;
  }
  for (std::size_t i = scalar_begin + global_thread(); i < count; i += grid_threads())
    d_out[i] = widen<Bf16>(d_in[i]);
}

// Launches Kernel<Vector> with Vector = both pointers aligned for 4-element vectors; the grid
// covers count / 4 groups on the vector path, count elements otherwise.
template <typename In, typename Out>
void launch(void (*vector_kernel)(const In*, Out*, std::size_t),
            void (*scalar_kernel)(const In*, Out*, std::size_t), const char* op, const In* d_in,
            Out* d_out, std::size_t count, void* stream) {
  if (count == 0) return;
  const bool vector = aligned_to(d_in, 4 * sizeof(In)) && aligned_to(d_out, 4 * sizeof(Out));
  const auto s = static_cast<cudaStream_t>(stream);
  if (vector) {
    vector_kernel<<<grid_for(count / 4 + 1), kThreads, 0, s>>>(d_in, d_out, count);
  } else {
    scalar_kernel<<<grid_for(count), kThreads, 0, s>>>(d_in, d_out, count);
  }
  check_launch(op, count);
}

}  // namespace

void f32_to_f16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::f32_to_f16(d_in, d_out, count, stream);
  launch(narrow_kernel<false, false, true>, narrow_kernel<false, false, false>, "cuda.f32_to_f16",
         d_in, d_out, count, stream);
}
void f32_to_f16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::f32_to_f16_ieee(d_in, d_out, count, stream);
  launch(narrow_kernel<false, true, true>, narrow_kernel<false, true, false>,
         "cuda.f32_to_f16_ieee", d_in, d_out, count, stream);
}
void f32_to_bf16_ieee(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::f32_to_bf16_ieee(d_in, d_out, count, stream);
  launch(narrow_kernel<true, true, true>, narrow_kernel<true, true, false>,
         "cuda.f32_to_bf16_ieee", d_in, d_out, count, stream);
}
void f32_to_bf16(const float* d_in, std::uint16_t* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::f32_to_bf16(d_in, d_out, count, stream);
  launch(narrow_kernel<true, false, true>, narrow_kernel<true, false, false>, "cuda.f32_to_bf16",
         d_in, d_out, count, stream);
}
void f16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::f16_to_f32(d_in, d_out, count, stream);
  launch(widen_kernel<false, true>, widen_kernel<false, false>, "cuda.f16_to_f32", d_in, d_out,
         count, stream);
}
void bf16_to_f32(const std::uint16_t* d_in, float* d_out, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::bf16_to_f32(d_in, d_out, count, stream);
  launch(widen_kernel<true, true>, widen_kernel<true, false>, "cuda.bf16_to_f32", d_in, d_out,
         count, stream);
}

int device_count(const char** reason) noexcept {
  if (emulated::active()) return emulated::device_count(reason);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr) *reason = cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device present";
  return count;
}

}  // namespace gradzip::kernels::cuda
