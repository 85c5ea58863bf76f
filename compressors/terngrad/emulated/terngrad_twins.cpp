// The CPU twins of terngrad's kernels (cuda/terngrad_kernels.h): the repacking math of
// terngrad_math.h, queued as one operation on the emulated device's stream.
#include <cstdint>
#include <cstring>

#include "compressors/terngrad/cuda/terngrad_kernels.h"
#include "compressors/terngrad/terngrad_math.h"
#include "kernels/emulated/emulated_device.h"

namespace gradzip::kernels::emulated {

void terngrad_trits_from_codes(const std::byte* d_codes, std::size_t count, std::byte* d_trits,
                               void* stream) {
  if (count == 0) return;
  cuda::require_trits_from_codes_buffers(d_codes, count, d_trits);
  const cuda::TerngradRepackBytes bytes = cuda::terngrad_repack_bytes(count);
  const std::uint64_t trit_bytes = bytes.trit_bytes, code_bytes = bytes.code_bytes;
  enqueue(stream, "cuda.terngrad_trits_from_codes", [d_codes, d_trits, trit_bytes, code_bytes] {
    require_device_range(d_codes, code_bytes, "cuda.terngrad_trits_from_codes codes");
    require_device_range(d_trits, trit_bytes, "cuda.terngrad_trits_from_codes trits");
    const auto* codes = reinterpret_cast<const std::uint8_t*>(d_codes);
    auto* trits = reinterpret_cast<std::uint8_t*>(d_trits);
    for (std::uint64_t j = 0; j < trit_bytes; ++j)
      trits[j] = static_cast<std::uint8_t>(
          terngrad_pack_codes(terngrad_read_codes10(codes, code_bytes, 10 * j)));
  });
}

void terngrad_codes_from_trits(const std::byte* d_trits, std::size_t count, std::byte* d_codes,
                               int* d_status, std::byte* d_poison_scale, void* stream) {
  if (count == 0) return;
  cuda::require_codes_from_trits_buffers(d_trits, count, d_codes, d_status, d_poison_scale);
  const cuda::TerngradRepackBytes bytes = cuda::terngrad_repack_bytes(count);
  const std::uint64_t trit_bytes = bytes.trit_bytes, code_bytes = bytes.code_bytes;
  enqueue(stream, "cuda.terngrad_codes_from_trits",
          [d_trits, count, d_codes, d_status, d_poison_scale, trit_bytes, code_bytes] {
    require_device_range(d_trits, trit_bytes, "cuda.terngrad_codes_from_trits trits");
    require_device_range(d_codes, code_bytes, "cuda.terngrad_codes_from_trits codes");
    require_device_accessible_range(d_status, sizeof(int), "cuda.terngrad_codes_from_trits status");
    require_device_range(d_poison_scale, sizeof(float), "cuda.terngrad_codes_from_trits scale");
    const auto* trits = reinterpret_cast<const std::uint8_t*>(d_trits);
    auto* codes = reinterpret_cast<std::uint8_t*>(d_codes);
    for (std::uint64_t t = 0; t < trit_bytes; ++t) {
      if (trits[t] > terngrad_byte_limit(count, t)) {
        *d_status = cuda::kTerngradStatusBadTrit;
        const std::uint32_t minus_one = 0xBF800000u;  // -1.0f: no scale encode writes
        std::memcpy(d_poison_scale, &minus_one, sizeof minus_one);
        break;
      }
    }
    // Every code byte from the trits, as the kernel computes it (also from a bad trit byte).
    for (std::uint64_t t = 0; t < code_bytes; ++t) codes[t] = terngrad_code_byte(trits, count, t);
  });
}

}  // namespace gradzip::kernels::emulated
