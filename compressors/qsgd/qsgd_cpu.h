// Host loops of the `qsgd` codec (element math: compressors/qsgd/qsgd_math.h) and the vectorised Philox
// they draw from. Internal to gradzip: compressors/qsgd/qsgd_codec.cpp writes and validates the message
// header and calls the payload functions below.
//
// Payload (little-endian, no padding, any alignment):
//   [0, 4 * num_buckets)            f32 scale of each bucket, num_buckets = ceil(count / bucket)
//   [4 * num_buckets, +code_bytes)  codes, packed LSB-first: element i occupies bits
//                                   [i * bits, (i + 1) * bits) of the stream, byte j holds stream
//                                   bits [8j, 8j + 8); code_bytes = ceil(count * bits / 8); the
//                                   unused high bits of the last byte are 0.
//
// Every ISA (scalar, AVX2, AVX-512; picked by active_isa()) writes the same bytes and decodes
// to the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>

#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"
#include "kernels/cpu/cpu_features.h"
#include "compressors/qsgd/qsgd_math.h"

namespace gradzip::kernels::cpu {

// Element counts above this are refused (payload arithmetic stays far from overflow).
inline constexpr std::size_t kQsgdMaxCount = std::size_t{1} << 60;

struct QsgdLayout {
  std::size_t num_buckets = 0;
  std::size_t scale_bytes = 0;  // 4 * num_buckets
  std::size_t code_bytes = 0;   // ceil(count * bits / 8)
  std::size_t payload_bytes() const noexcept { return scale_bytes + code_bytes; }
};

// The payload layout for `count` elements; nullopt when bits is outside 1..8, bucket is 0 or
// count exceeds kQsgdMaxCount.
std::optional<QsgdLayout> qsgd_layout(std::size_t count, int bits, std::size_t bucket) noexcept;

// Writes the payload of `in` (host f32/f16/bf16) into payload[0, layout.payload_bytes()).
// Preconditions: bits in 1..8, bucket >= 1, in.count <= kQsgdMaxCount.
void qsgd_encode_payload(ConstTensorView in, int bits, std::size_t bucket,
                         const EncodeContext& ctx, std::byte* payload);

// Error feedback fused into the encode (compressors/fused_feedback.h): the payload of
// encode(g + e) and e = finite_or_zero(g + e - D(payload)), bit for bit those of the separate
// passes, block by block (kQsgdFusedBlock elements of whole buckets, a multiple of 8, so g + e
// stays in cache between the add, the encode and the update). g and e are host f32 (not
// overlapping the payload); preconditions as qsgd_encode_payload, and
// qsgd_fuses_bucket(bucket) (the caller declines otherwise, before writing anything).
inline constexpr std::size_t kQsgdFusedBlock = 4096;
inline constexpr std::size_t kQsgdMaxFusedBlock = std::size_t{1} << 16;
constexpr bool qsgd_fuses_bucket(std::size_t bucket) noexcept {
  return bucket >= 1 && std::lcm(bucket, std::size_t{8}) <= kQsgdMaxFusedBlock;
}
void qsgd_encode_payload_with_feedback(const float* g, float* e, std::size_t count, int bits,
                                       std::size_t bucket, const EncodeContext& ctx,
                                       std::byte* payload);

// The first offence qsgd_check_payload() found.
struct QsgdPayloadProblem {
  std::size_t bucket_index = 0;
  std::uint32_t scale_bits = 0;
  bool nonzero_code = false;  // true: a non-finite bucket has a non-zero code; false: bad scale
};

// Checks what the header cannot: every scale is one encode can write (qsgd_scale_is_valid) and
// every code of a non-finite bucket is 0. Returns false with the first offence in `problem`.
// Preconditions: the payload holds qsgd_layout(count, bits, bucket)->payload_bytes() bytes.
bool qsgd_check_payload(const std::byte* payload, std::size_t count, int bits, std::size_t bucket,
                        QsgdPayloadProblem& problem) noexcept;

// Decodes a checked payload into `out` (host f32/f16/bf16, `count` elements), or adds it to acc.
void qsgd_decode_payload(const std::byte* payload, std::size_t count, int bits, std::size_t bucket,
                         TensorView out);
void qsgd_decode_add_payload(const std::byte* payload, std::size_t count, int bits,
                             std::size_t bucket, float* acc);

// Philox words of blocks [first_block, first_block + num_blocks) under gradzip's keying
// (kernels/philox_math.h), in element order: out[4 b + w] = word w of block first_block + b.
// Vectorised on AVX2 / AVX-512; every path gives philox_block()'s words.
void philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                  std::uint64_t first_block, std::size_t num_blocks, std::uint32_t* out) noexcept;

// The per-ISA building blocks, exposed for the tests and the dispatch table. Each pointer
// computes exactly what the scalar one does.
struct QsgdKernels {
  // max over i < n of qsgd_abs_bits(x[i]); 0 when n == 0.
  std::uint32_t (*abs_max_bits)(const float* x, std::size_t n) noexcept;
  // See philox_words() above.
  void (*philox_words)(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                       std::uint64_t first_block, std::size_t num_blocks,
                       std::uint32_t* out) noexcept;
  // codes[i] = qsgd_encode_code(x[i], words[i], bucket) for a finite bucket.
  void (*quantize)(const float* x, const std::uint32_t* words, std::size_t n,
                   const QsgdEncodeBucket& bucket, std::uint8_t* codes) noexcept;
  // Packs n one-byte codes (each < 2^bits) into ceil(n * bits / 8) bytes of the bit stream.
  void (*pack_codes)(const std::uint8_t* codes, std::size_t n, int bits, std::byte* out) noexcept;
  // The inverse: codes[i] = bits [i * bits, (i + 1) * bits) of the stream at `in`.
  void (*unpack_codes)(const std::byte* in, std::size_t n, int bits, std::uint8_t* codes) noexcept;
  // out[i] = qsgd_decode_code(codes[i], bucket, bits) for a finite bucket; or acc[i] += that.
  void (*dequantize)(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                     int bits, float* out) noexcept;
  void (*dequantize_add)(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                         int bits, float* acc) noexcept;
};

// The kernels of `isa` (which must not exceed detected_isa()).
const QsgdKernels& qsgd_kernels(Isa isa) noexcept;

namespace scalar {
extern const QsgdKernels kQsgdKernels;
}
namespace avx2 {
extern const QsgdKernels kQsgdKernels;
}
namespace avx512 {
extern const QsgdKernels kQsgdKernels;
}

}  // namespace gradzip::kernels::cpu
