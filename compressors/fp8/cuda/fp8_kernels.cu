// The fp8 codec's kernels (compressors/fp8/cuda/fp8_kernels.h).
#include "compressors/fp8/cuda/fp8_kernels.h"

#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"

namespace gradzip::compressors::fp8::cuda {
namespace {

using kernels::cuda::detail::global_thread;
using kernels::cuda::detail::grid_threads;

static_assert(kernels::cuda::detail::kThreads % kFp8Block == 0,
              "a warp must cover exactly one block of 32 elements");

// One thread per element, one warp per block: the warp's lanes take the block's largest |x| by
// shuffles, lane 0 stores the scale, every lane its code. The loop runs over the count rounded
// up to whole blocks, so every lane of a warp takes part in each shuffle (the grid is a multiple
// of 32 threads, and a warp's 32 elements are one block).
__global__ void encode_kernel(const float* x, std::uint64_t count, Format format,
                              std::uint8_t* scales, std::uint8_t* codes) {
  const std::uint64_t padded = (count + kFp8Block - 1) / kFp8Block * kFp8Block;
  for (std::uint64_t i = global_thread(); i < padded; i += grid_threads()) {
    const bool live = i < count;
    const std::uint32_t bits = live ? kernels::float_bits(x[i]) : 0u;
    std::uint32_t amax = bits & 0x7fffffffu;
    for (int offset = 16; offset > 0; offset >>= 1)
      amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    const bool nonfinite = amax >= 0x7f800000u;
    const int s = nonfinite ? 0 : scale_exponent(amax, format);
    if (i % kFp8Block == 0)
      scales[i / kFp8Block] = nonfinite ? kNonfiniteScale : static_cast<std::uint8_t>(s + kScaleBias);
    if (live) {
      codes[i] = nonfinite ? std::uint8_t{0}
                           : static_cast<std::uint8_t>(((bits >> 24) & 0x80u) |
                                                       encode_magnitude(bits & 0x7fffffffu, s,
                                                                        format));
    }
  }
}

__global__ void decode_kernel(const std::uint8_t* scales, const std::uint8_t* codes,
                              std::uint64_t count, Format format, float* out, bool accumulate) {
  for (std::uint64_t i = global_thread(); i < count; i += grid_threads()) {
    const std::uint8_t scale = scales[i / kFp8Block];
    const float value = scale == kNonfiniteScale
                            ? kernels::bits_float(0x7fc00000u)
                            : decode_element(codes[i], static_cast<int>(scale) - kScaleBias, format);
    out[i] = accumulate ? out[i] + value : value;
  }
}

std::uint64_t blocks_of(std::size_t count) { return (count + kFp8Block - 1) / kFp8Block; }

}  // namespace

void encode(const float* d_in, std::size_t count, Format format, std::byte* d_payload,
            void* stream) {
  if (kernels::emulated::active()) return emulated::encode(d_in, count, format, d_payload, stream);
  if (!kernels::require_encode_buffers("cuda.fp8_encode", d_in, d_payload, count)) return;
  auto* scales = reinterpret_cast<std::uint8_t*>(d_payload);
  encode_kernel<<<kernels::cuda::detail::grid_for(blocks_of(count) * kFp8Block),
                  kernels::cuda::detail::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      d_in, count, format, scales, scales + blocks_of(count));
  kernels::cuda::detail::check_launch("cuda.fp8_encode", count);
}

void decode(const std::byte* d_payload, std::size_t count, Format format, float* d_out,
            bool accumulate, void* stream) {
  if (kernels::emulated::active())
    return emulated::decode(d_payload, count, format, d_out, accumulate, stream);
  if (count == 0) return;
  kernels::require_decode_buffers("cuda.fp8_decode", d_payload, d_out, count);
  const auto* scales = reinterpret_cast<const std::uint8_t*>(d_payload);
  decode_kernel<<<kernels::cuda::detail::grid_for(count), kernels::cuda::detail::kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(scales, scales + blocks_of(count), count,
                                                       format, d_out, accumulate);
  kernels::cuda::detail::check_launch("cuda.fp8_decode", count);
}

}  // namespace gradzip::compressors::fp8::cuda
