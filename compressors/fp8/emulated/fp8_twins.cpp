// The CPU twins of the fp8 kernels (compressors/fp8/cuda/fp8_kernels.h): the CPU codec's loops
// (fp8_layout.cpp), queued as one operation on the emulated device's stream.
#include "compressors/fp8/cuda/fp8_kernels.h"
#include "compressors/fp8/fp8_codec.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/launch_checks.h"

namespace gradzip::compressors::fp8::emulated {

void encode(const float* d_in, std::size_t count, Format format, std::byte* d_payload,
            void* stream) {
  constexpr const char* kOp = "cuda.fp8_encode";
  if (!kernels::require_encode_buffers(kOp, d_in, d_payload, count)) return;
  kernels::emulated::enqueue(stream, kOp, [d_in, count, format, d_payload] {
    kernels::emulated::require_device_range(d_in, count * sizeof(float), "cuda.fp8_encode input");
    kernels::emulated::require_device_range(d_payload, payload_bytes(count),
                                            "cuda.fp8_encode payload");
    auto* scales = reinterpret_cast<std::uint8_t*>(d_payload);
    encode_blocks(d_in, count, format, scales, scales + block_count(count));
  });
}

void decode(const std::byte* d_payload, std::size_t count, Format format, float* d_out,
            bool accumulate, void* stream) {
  constexpr const char* kOp = "cuda.fp8_decode";
  if (count == 0) return;
  kernels::require_decode_buffers(kOp, d_payload, d_out, count);
  kernels::emulated::enqueue(stream, kOp, [d_payload, count, format, d_out, accumulate] {
    kernels::emulated::require_device_range(d_payload, payload_bytes(count),
                                            "cuda.fp8_decode payload");
    kernels::emulated::require_device_range(d_out, count * sizeof(float), "cuda.fp8_decode output");
    const auto* scales = reinterpret_cast<const std::uint8_t*>(d_payload);
    decode_range(scales, scales + block_count(count), 0, count, format, d_out, accumulate);
  });
}

}  // namespace gradzip::compressors::fp8::emulated
