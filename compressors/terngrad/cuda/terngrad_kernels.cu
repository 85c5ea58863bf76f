#include "compressors/terngrad/cuda/terngrad_kernels.h"

#include "compressors/terngrad/terngrad_math.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"

namespace gradzip::kernels::cuda {
namespace {

using detail::global_thread;
using detail::grid_threads;

__global__ void trits_from_codes_kernel(const std::uint8_t* codes, std::uint64_t code_bytes,
                                        std::uint64_t trit_bytes, std::uint8_t* trits) {
  for (std::uint64_t j = global_thread(); j < trit_bytes; j += grid_threads()) {
    trits[j] = static_cast<std::uint8_t>(
        terngrad_pack_codes(terngrad_read_codes10(codes, code_bytes, 10 * j)));
  }
}

// One thread per code byte (codes 4k .. 4k + 3, from trit bytes (4k) / 5 and (4k + 3) / 5) and
// per trit byte (its check).
__global__ void codes_from_trits_kernel(const std::uint8_t* trits, std::uint64_t count,
                                        std::uint64_t trit_bytes, std::uint64_t code_bytes,
                                        std::uint8_t* codes, int* status,
                                        std::uint8_t* poison_scale) {
  const std::uint64_t work = trit_bytes > code_bytes ? trit_bytes : code_bytes;
  for (std::uint64_t t = global_thread(); t < work; t += grid_threads()) {
    if (t < trit_bytes && trits[t] > terngrad_byte_limit(count, t)) {
      *status = kTerngradStatusBadTrit;
      const std::uint32_t minus_one = 0xBF800000u;  // -1.0f: no scale encode writes
      for (int b = 0; b < 4; ++b) poison_scale[b] = static_cast<std::uint8_t>(minus_one >> (8 * b));
    }
    if (t < code_bytes) codes[t] = terngrad_code_byte(trits, count, t);
  }
}

}  // namespace

void terngrad_trits_from_codes(const std::byte* d_codes, std::size_t count, std::byte* d_trits,
                               void* stream) {
  if (emulated::active())
    return emulated::terngrad_trits_from_codes(d_codes, count, d_trits, stream);
  if (count == 0) return;
  require_trits_from_codes_buffers(d_codes, count, d_trits);
  const auto [trit_bytes, code_bytes] = terngrad_repack_bytes(count);
  trits_from_codes_kernel<<<detail::grid_for(trit_bytes), detail::kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const std::uint8_t*>(d_codes), code_bytes, trit_bytes,
      reinterpret_cast<std::uint8_t*>(d_trits));
  detail::check_launch("cuda.terngrad_trits_from_codes", count);
}

void terngrad_codes_from_trits(const std::byte* d_trits, std::size_t count, std::byte* d_codes,
                               int* d_status, std::byte* d_poison_scale, void* stream) {
  if (emulated::active())
    return emulated::terngrad_codes_from_trits(d_trits, count, d_codes, d_status, d_poison_scale,
                                               stream);
  if (count == 0) return;
  require_codes_from_trits_buffers(d_trits, count, d_codes, d_status, d_poison_scale);
  const auto [trit_bytes, code_bytes] = terngrad_repack_bytes(count);
  const std::uint64_t work = trit_bytes > code_bytes ? trit_bytes : code_bytes;
  codes_from_trits_kernel<<<detail::grid_for(work), detail::kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const std::uint8_t*>(d_trits), count, trit_bytes, code_bytes,
      reinterpret_cast<std::uint8_t*>(d_codes), d_status,
      reinterpret_cast<std::uint8_t*>(d_poison_scale));
  detail::check_launch("cuda.terngrad_codes_from_trits", count);
}

}  // namespace gradzip::kernels::cuda
