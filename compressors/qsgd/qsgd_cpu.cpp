// The qsgd payload loops (layout: compressors/qsgd/qsgd_cpu.h) and the scalar reference kernels.
// The loops work in tiles of kTile elements: draw the tile's Philox words, quantise each bucket
// segment of the tile into one byte per code, then pack the bytes into the bit stream. A tile
// starts at a multiple of kTile (a multiple of 8), so its codes start on a byte boundary of the
// stream whatever `bits` is. 8-bit codes are written to (and read from) the payload directly.
#include "compressors/qsgd/qsgd_cpu.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/convert.h"
#include "kernels/nonfinite_math.h"

namespace gradzip::kernels::cpu {
namespace {

// 2048 elements: the tile's words (8 KiB), converted values (8 KiB) and codes stay in L1, and
// the Philox bursts are short enough for the hardware prefetcher to keep streaming the input
// (measured: 4096-element tiles encode ~15% slower on the 16M-element benchmark).
constexpr std::size_t kTile = 2048;
static_assert(kTile % 64 == 0, "tiles must start on a byte of the code stream for every width");
static_assert(kTile <= kConvertBlock, "f16/bf16 inputs convert a tile at a time");

// Bits [index * bits, (index + 1) * bits) of the stream at `stream` (bits <= 8, so a code spans
// at most two bytes; the second is read only when the code reaches into it).
std::uint32_t read_code(const std::byte* stream, std::size_t index, int bits) noexcept {
  const std::size_t first_bit = index * static_cast<std::size_t>(bits);
  const std::size_t byte = first_bit / 8;
  const unsigned shift = static_cast<unsigned>(first_bit % 8);
  std::uint32_t window = std::to_integer<std::uint32_t>(stream[byte]);
  if (shift + static_cast<unsigned>(bits) > 8) {
    window |= std::to_integer<std::uint32_t>(stream[byte + 1]) << 8;
  }
  return (window >> shift) & ((1u << bits) - 1u);
}

float read_scale(const std::byte* payload, std::size_t bucket_index) noexcept {
  float scale;
  std::memcpy(&scale, payload + bucket_index * sizeof(float), sizeof scale);
  return scale;
}

// The bucket holding local element `index`: its first element and its length.
struct BucketRange {
  std::size_t index;
  std::size_t begin;
  std::size_t size;
};

BucketRange bucket_of(std::size_t element, std::size_t count, std::size_t bucket) noexcept {
  const std::size_t index = element / bucket;
  const std::size_t begin = index * bucket;
  return BucketRange{index, begin, std::min(bucket, count - begin)};
}

// max |x| bits over elements [begin, begin + size) of `in`. f16/bf16 inputs are converted in
// blocks (the conversion is exact, so the maximum is that of the original values).
std::uint32_t bucket_abs_max_bits(const QsgdKernels& kernels, ConstTensorView in,
                                  std::size_t begin, std::size_t size) {
  if (in.dtype == DType::f32) {
    return kernels.abs_max_bits(static_cast<const float*>(in.data) + begin, size);
  }
  alignas(64) float block[kConvertBlock];
  std::uint32_t result = 0;
  for (std::size_t done = 0; done < size; done += kConvertBlock) {
    const std::size_t n = std::min(kConvertBlock, size - done);
    load_as_f32(in, begin + done, n, block);
    result = std::max(result, kernels.abs_max_bits(block, n));
  }
  return result;
}

// ---- scalar reference kernels ----------------------------------------------------------------

std::uint32_t scalar_abs_max_bits(const float* x, std::size_t n) noexcept {
  std::uint32_t result = 0;
  for (std::size_t i = 0; i < n; ++i) result = std::max(result, qsgd_abs_bits(x[i]));
  return result;
}

void scalar_philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                         std::uint64_t first_block, std::size_t num_blocks,
                         std::uint32_t* out) noexcept {
  for (std::size_t b = 0; b < num_blocks; ++b) {
    const Philox4x32 words = philox_block(seed, step, tensor_id, first_block + b);
    for (int w = 0; w < 4; ++w) out[4 * b + static_cast<std::size_t>(w)] = words.v[w];
  }
}

void scalar_quantize(const float* x, const std::uint32_t* words, std::size_t n,
                     const QsgdEncodeBucket& bucket, std::uint8_t* codes) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = static_cast<std::uint8_t>(qsgd_encode_code(x[i], words[i], bucket));
  }
}

// Eight codes of `bits` bits fill exactly `bits` bytes of the stream: they are packed in a
// 64-bit word (little-endian, so the word's bytes are the stream's bytes). Where 8 bytes fit
// before the end of the range, the whole word is stored: the bytes past the group are 0 and the
// next group overwrites them.
void scalar_pack_codes(const std::uint8_t* codes, std::size_t n, int bits, std::byte* out) noexcept {
  const std::size_t width = static_cast<std::size_t>(bits);  // bits per code = bytes per group
  const std::size_t total_bytes = (n * width + 7) / 8;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t group = 0;
    for (std::size_t k = 0; k < 8; ++k) group |= static_cast<std::uint64_t>(codes[i + k]) << (k * width);
    const std::size_t at = i / 8 * width;
    std::memcpy(out + at, &group, at + 8 <= total_bytes ? 8 : width);
  }
  if (i == n) return;
  std::uint64_t tail = 0;  // fewer than 8 codes, in the last total_bytes - at bytes
  for (std::size_t k = 0; i + k < n; ++k) tail |= static_cast<std::uint64_t>(codes[i + k]) << (k * width);
  const std::size_t at = i / 8 * width;
  std::memcpy(out + at, &tail, total_bytes - at);
}

void scalar_unpack_codes(const std::byte* in, std::size_t n, int bits, std::uint8_t* codes) noexcept {
  const std::size_t width = static_cast<std::size_t>(bits);  // bits per code = bytes per group
  const std::size_t total_bytes = (n * width + 7) / 8;
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1u;
  for (std::size_t i = 0; i < n; i += 8) {
    const std::size_t at = i / 8 * width;
    std::uint64_t group = 0;
    std::memcpy(&group, in + at, at + 8 <= total_bytes ? 8 : total_bytes - at);
    for (std::size_t k = 0; k < 8 && i + k < n; ++k) {
      codes[i + k] = static_cast<std::uint8_t>((group >> (k * width)) & mask);
    }
  }
}

void scalar_dequantize(const std::uint8_t* codes, std::size_t n, const QsgdDecodeBucket& bucket,
                       int bits, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = qsgd_decode_code(codes[i], bucket, bits);
}

void scalar_dequantize_add(const std::uint8_t* codes, std::size_t n,
                           const QsgdDecodeBucket& bucket, int bits, float* acc) noexcept {
  for (std::size_t i = 0; i < n; ++i) acc[i] += qsgd_decode_code(codes[i], bucket, bits);
}

// ---- decode loop shared by decode and decode_add ---------------------------------------------

// Walks the payload tile by tile; `emit(tile_begin, tile_n, codes)` receives one code byte per
// element of the tile (a pointer into the payload for 8-bit codes).
template <typename Emit>
void for_each_code_tile(const QsgdKernels& kernels, const std::byte* codes_stream,
                        std::size_t count, int bits, Emit&& emit) {
  alignas(64) std::uint8_t unpacked[kTile];
  for (std::size_t tile_begin = 0; tile_begin < count; tile_begin += kTile) {
    const std::size_t tile_n = std::min(kTile, count - tile_begin);
    const std::byte* tile_stream = codes_stream + tile_begin / 8 * static_cast<std::size_t>(bits);
    if (bits == 8) {
      emit(tile_begin, tile_n, reinterpret_cast<const std::uint8_t*>(tile_stream));
    } else {
      kernels.unpack_codes(tile_stream, tile_n, bits, unpacked);
      emit(tile_begin, tile_n, static_cast<const std::uint8_t*>(unpacked));
    }
  }
}

// Calls `segment(first, n, bucket_constants)` for each run of the tile inside one bucket.
template <typename Segment>
void for_each_bucket_segment(const std::byte* payload, std::size_t count, int bits,
                             std::size_t bucket, std::size_t tile_begin, std::size_t tile_n,
                             Segment&& segment) {
  std::size_t i = 0;
  while (i < tile_n) {
    const BucketRange range = bucket_of(tile_begin + i, count, bucket);
    const std::size_t end = std::min(tile_n, range.begin + range.size - tile_begin);
    segment(i, end - i, qsgd_decode_bucket(read_scale(payload, range.index), bits));
    i = end;
  }
}

}  // namespace

namespace scalar {
const QsgdKernels kQsgdKernels{scalar_abs_max_bits,  scalar_philox_words,  scalar_quantize,
                               scalar_pack_codes,    scalar_unpack_codes,  scalar_dequantize,
                               scalar_dequantize_add};
}  // namespace scalar

const QsgdKernels& qsgd_kernels(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512: return avx512::kQsgdKernels;
    case Isa::avx2: return avx2::kQsgdKernels;
    case Isa::scalar: break;
  }
  return scalar::kQsgdKernels;
}

std::optional<QsgdLayout> qsgd_layout(std::size_t count, int bits, std::size_t bucket) noexcept {
  if (bits < kQsgdMinBits || bits > kQsgdMaxBits || bucket == 0 || count > kQsgdMaxCount) {
    return std::nullopt;
  }
  QsgdLayout layout;
  layout.num_buckets = count / bucket + (count % bucket != 0 ? 1 : 0);
  layout.scale_bytes = layout.num_buckets * sizeof(float);
  layout.code_bytes = (count * static_cast<std::size_t>(bits) + 7) / 8;
  return layout;
}

void philox_words(std::uint64_t seed, std::uint32_t step, std::uint32_t tensor_id,
                  std::uint64_t first_block, std::size_t num_blocks, std::uint32_t* out) noexcept {
  qsgd_kernels(active_isa()).philox_words(seed, step, tensor_id, first_block, num_blocks, out);
}

namespace {

// Encodes elements [begin, end) of `in` (count = in.count elements in all) into the payload of
// the whole tensor: the scales of the buckets that start in the range and the code bytes of the
// range. `begin` is a multiple of 8 (the range's codes start on a byte of the stream) and the
// range holds whole buckets but for a last partial one at `count`. With `residual`, each tile's
// x (f32 input only) is then replaced, element by element, by finite_or_zero(x - D(message)),
// D from the tile's codes and its buckets' scales as written: the residual update of error
// feedback, the same bits as a decode of the message.
void encode_range(const QsgdKernels& kernels, ConstTensorView in, std::size_t begin,
                  std::size_t end, int bits, std::size_t bucket, const EncodeContext& ctx,
                  std::byte* payload, float* residual) {
  const std::size_t count = in.count;
  const QsgdLayout layout = *qsgd_layout(count, bits, bucket);
  std::byte* const codes_stream = payload + layout.scale_bytes;

  alignas(64) float converted[kTile];
  // Words of the tile's Philox blocks; the tile's first element may sit inside its block.
  alignas(64) std::uint32_t words[kTile + 4];
  alignas(64) std::uint8_t tile_codes[kTile];
  alignas(64) float decoded[kTile];

  std::size_t current_bucket = 0;
  bool have_bucket = false;
  QsgdEncodeBucket constants{};
  QsgdDecodeBucket decode_constants{};  // the same bucket's, for the residual
  for (std::size_t tile_begin = begin; tile_begin < end; tile_begin += kTile) {
    const std::size_t tile_n = std::min(kTile, end - tile_begin);
    const float* x = converted;
    if (in.dtype == DType::f32) {
      x = static_cast<const float*>(in.data) + tile_begin;
    } else {
      load_as_f32(in, tile_begin, tile_n, converted);
    }
    const std::uint64_t first_element = ctx.element_offset + tile_begin;
    const std::size_t lead = static_cast<std::size_t>(first_element & 3u);
    kernels.philox_words(ctx.seed, ctx.step, ctx.tensor_id, first_element >> 2,
                         (lead + tile_n + 3) / 4, words);
    std::byte* const tile_stream = codes_stream + tile_begin / 8 * static_cast<std::size_t>(bits);
    std::uint8_t* const codes =
        bits == 8 ? reinterpret_cast<std::uint8_t*>(tile_stream) : tile_codes;

    std::size_t i = 0;
    while (i < tile_n) {
      const BucketRange range = bucket_of(tile_begin + i, count, bucket);
      if (!have_bucket || range.index != current_bucket) {
        // A bucket inside the tile takes its maximum from the (converted) tile; one that
        // reaches outside reads the input.
        const bool inside = range.begin >= tile_begin && range.begin + range.size <= tile_begin + tile_n;
        const std::uint32_t abs_max =
            inside ? kernels.abs_max_bits(x + (range.begin - tile_begin), range.size)
                   : bucket_abs_max_bits(kernels, in, range.begin, range.size);
        const float scale = qsgd_scale_from_abs_max_bits(abs_max);
        std::memcpy(payload + range.index * sizeof(float), &scale, sizeof scale);
        constants = qsgd_encode_bucket(scale, bits);
        if (residual != nullptr) decode_constants = qsgd_decode_bucket(scale, bits);
        current_bucket = range.index;
        have_bucket = true;
      }
      const std::size_t run_end = std::min(tile_n, range.begin + range.size - tile_begin);
      if (constants.finite) {
        kernels.quantize(x + i, words + lead + i, run_end - i, constants, codes + i);
      } else {
        std::memset(codes + i, 0, run_end - i);
      }
      if (residual != nullptr) {
        if (decode_constants.finite) {
          kernels.dequantize(codes + i, run_end - i, decode_constants, bits, decoded + i);
        } else {
          std::fill_n(decoded + i, run_end - i, bits_float(kQsgdCanonicalNan));
        }
      }
      i = run_end;
    }
    if (bits != 8) kernels.pack_codes(tile_codes, tile_n, bits, tile_stream);
    if (residual != nullptr) {
      float* const e = residual + tile_begin;
      for (std::size_t k = 0; k < tile_n; ++k) e[k] = finite_or_zero(e[k] - decoded[k]);
    }
  }
}

}  // namespace

void qsgd_encode_payload(ConstTensorView in, int bits, std::size_t bucket,
                         const EncodeContext& ctx, std::byte* payload) {
  encode_range(qsgd_kernels(active_isa()), in, 0, in.count, bits, bucket, ctx, payload, nullptr);
}

void qsgd_encode_payload_with_feedback(const float* g, float* e, std::size_t count, int bits,
                                       std::size_t bucket, const EncodeContext& ctx,
                                       std::byte* payload) {
  const std::size_t unit = std::lcm(bucket, std::size_t{8});  // <= kQsgdMaxFusedBlock
  const std::size_t block = std::max(unit, kQsgdFusedBlock / unit * unit);
  const QsgdKernels& kernels = qsgd_kernels(active_isa());
  const ConstTensorView corrected{e, count, DType::f32, Device{}};
  for (std::size_t begin = 0; begin < count; begin += block) {
    const std::size_t n = std::min(block, count - begin);
    for (std::size_t i = begin; i < begin + n; ++i) e[i] = g[i] + e[i];
    encode_range(kernels, corrected, begin, begin + n, bits, bucket, ctx, payload, e);
  }
}

bool qsgd_check_payload(const std::byte* payload, std::size_t count, int bits, std::size_t bucket,
                        QsgdPayloadProblem& problem) noexcept {
  const QsgdLayout layout = *qsgd_layout(count, bits, bucket);
  const std::byte* const codes_stream = payload + layout.scale_bytes;
  for (std::size_t b = 0; b < layout.num_buckets; ++b) {
    const float scale = read_scale(payload, b);
    if (!qsgd_scale_is_valid(scale)) {
      problem = QsgdPayloadProblem{b, float_bits(scale), false};
      return false;
    }
    if (qsgd_scale_is_finite(scale)) continue;
    const std::size_t begin = b * bucket;
    const std::size_t end = begin + std::min(bucket, count - begin);
    for (std::size_t i = begin; i < end; ++i) {
      if (read_code(codes_stream, i, bits) != 0u) {
        problem = QsgdPayloadProblem{b, float_bits(scale), true};
        return false;
      }
    }
  }
  return true;
}

void qsgd_decode_payload(const std::byte* payload, std::size_t count, int bits, std::size_t bucket,
                         TensorView out) {
  const QsgdKernels& kernels = qsgd_kernels(active_isa());
  const QsgdLayout layout = *qsgd_layout(count, bits, bucket);
  alignas(64) float converted[kTile];
  for_each_code_tile(kernels, payload + layout.scale_bytes, count, bits,
                     [&](std::size_t tile_begin, std::size_t tile_n, const std::uint8_t* codes) {
    float* const values =
        out.dtype == DType::f32 ? static_cast<float*>(out.data) + tile_begin : converted;
    for_each_bucket_segment(payload, count, bits, bucket, tile_begin, tile_n,
                            [&](std::size_t first, std::size_t n, const QsgdDecodeBucket& constants) {
      if (constants.finite) {
        kernels.dequantize(codes + first, n, constants, bits, values + first);
      } else {
        std::fill_n(values + first, n, bits_float(kQsgdCanonicalNan));
      }
    });
    if (out.dtype != DType::f32) store_from_f32(converted, tile_n, out, tile_begin);
  });
}

void qsgd_decode_add_payload(const std::byte* payload, std::size_t count, int bits,
                             std::size_t bucket, float* acc) {
  const QsgdKernels& kernels = qsgd_kernels(active_isa());
  const QsgdLayout layout = *qsgd_layout(count, bits, bucket);
  for_each_code_tile(kernels, payload + layout.scale_bytes, count, bits,
                     [&](std::size_t tile_begin, std::size_t tile_n, const std::uint8_t* codes) {
    float* const values = acc + tile_begin;
    for_each_bucket_segment(payload, count, bits, bucket, tile_begin, tile_n,
                            [&](std::size_t first, std::size_t n, const QsgdDecodeBucket& constants) {
      if (constants.finite) {
        kernels.dequantize_add(codes + first, n, constants, bits, values + first);
      } else {
        for (std::size_t i = 0; i < n; ++i) values[first + i] += bits_float(kQsgdCanonicalNan);
      }
    });
  });
}

}  // namespace gradzip::kernels::cpu
