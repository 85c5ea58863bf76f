// The wire format: every encoded chunk is one message, a fixed 32-byte header followed by the
// codec's payload. All fields are little-endian (gradzip runs on little-endian hosts only;
// the build checks this).
//
//   offset size field
//   0      4    magic          0x505A4447 ("GDZP" in memory order)
//   4      1    version        kWireVersion
//   5      1    codec          WireCodec
//   6      1    flags          codec-specific bits (e.g. top-k value/index widths)
//   7      1    small_param    codec-specific (qsgd: bits)
//   8      8    count          elements the message decodes to
//   16     8    payload_bytes  bytes after the header; the message is exactly 32 + payload_bytes
//   24     8    large_param    codec-specific (qsgd/sign: bucket; top-k/random-k: k)
//
// Decoders call read_header() first, then check every codec field and the exact payload size
// for the count and parameters before touching any memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "gradzip/codec_list.h"
#include "compressors/randk/randk_math.h"

namespace gradzip::compressors {

inline constexpr std::uint32_t kWireMagic = 0x505A4447u;
inline constexpr std::uint8_t kWireVersion = 1;
inline constexpr std::size_t kWireHeaderBytes = 32;

// The codec byte of a message: one enumerator per codec of gradzip/codec_list.h, whose line
// gives its value. 0 (powersgd's) means the codec sends no messages of its own: no header
// carries it, and read_header refuses it as it refuses any byte without a codec.
#define GRADZIP_WIRE_CODEC(name, wire_id) name = wire_id,
enum class WireCodec : std::uint8_t { GRADZIP_CODECS(GRADZIP_WIRE_CODEC) };
#undef GRADZIP_WIRE_CODEC

// The spec name of the codec whose messages carry `codec` ("unknown" for an id without a row).
std::string_view wire_codec_name(WireCodec codec) noexcept;

// A randk payload starts with its 24-byte index key (u64 seed, u32 step, u32 tensor id,
// u64 element offset; compressors/randk/randk_math.h reads and writes it); the k values follow
// (compressors/randk/randk_codec.cpp).
inline constexpr std::size_t kRandkKeyBytes = kernels::kRandkKeyBytes;

// Top-k's flag bits (compressors/topk/topk_codec.cpp has its message layout): indices are u64 (else u32);
// values are f16 (else f32).
inline constexpr std::uint8_t kTopkWideIndices = 0x1;
inline constexpr std::uint8_t kTopkHalfValues = 0x2;
// Top-k messages of more elements than this must carry u64 indices (kTopkWideIndices); up to
// it, the encoders write u32 ones.
inline constexpr std::uint64_t kTopkMaxNarrowCount = std::uint64_t{1} << 32;
// Random-k's flag bit (compressors/randk/randk_codec.cpp): values are f16 (else f32); no other
// bit is used.
inline constexpr std::uint8_t kRandkHalfValues = 0x2;

struct WireHeader {
  WireCodec codec = WireCodec::none;
  std::uint8_t flags = 0;
  std::uint8_t small_param = 0;
  std::uint64_t count = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t large_param = 0;
};

// The codec-specific fields by what the codecs keep in them (each codec's file documents its
// header): read a validated header through these, not through small_param / large_param.
// The bucket of qsgd, sign and terngrad (large_param).
inline std::uint64_t bucket_of(const WireHeader& header) noexcept { return header.large_param; }
// The bits per code of qsgd (small_param).
inline int qsgd_bits_of(const WireHeader& header) noexcept { return header.small_param; }
// The entries of a sparse message (large_param): top-k's m, random-k's k.
inline std::uint64_t entry_count_of(const WireHeader& header) noexcept { return header.large_param; }
// Top-k: u64 indices (else u32).
inline bool has_wide_indices(const WireHeader& header) noexcept {
  return (header.flags & kTopkWideIndices) != 0;
}
// Top-k and random-k (the same bit, 0x2): f16 values (else f32).
inline bool has_half_values(const WireHeader& header) noexcept {
  static_assert(kTopkHalfValues == kRandkHalfValues);
  return (header.flags & kTopkHalfValues) != 0;
}

// Writes the header into out[0, 32). Throws invalid_argument if out is shorter than that.
void write_header(const WireHeader& header, std::span<std::byte> out);

// Parses and validates the header of the message `in`: size, magic, version, a known codec,
// and in.size() == 32 + payload_bytes. Throws malformed_message naming `op` and the field.
WireHeader read_header(std::span<const std::byte> in, std::string_view op);

// read_header() of a message whose first bytes were copied to `in` (at least 32 of them, or
// all of a shorter message) and whose full size is `message_bytes`: how messages in device
// memory are checked on the host.
WireHeader read_header_copy(std::span<const std::byte> in, std::size_t message_bytes,
                            std::string_view op);

// read_header() plus: the codec is `expected`, and the count equals `expected_count`.
WireHeader read_header_for(std::span<const std::byte> in, WireCodec expected,
                           std::size_t expected_count, std::string_view op);
// The checks read_header_for() adds, on a parsed header.
WireHeader check_header_for(const WireHeader& header, WireCodec expected,
                            std::size_t expected_count, std::string_view op);

// The index bytes at the start of a validated header's payload: top-k's k indices (u32, or u64
// with kTopkWideIndices); 0 for every other codec (random-k's indices come from its key).
std::uint64_t index_bytes(const WireHeader& header) noexcept;

// payload_bytes as announced by the header at the start of `bytes` (at least kWireHeaderBytes of
// them), NOT validated: for splitting concatenated messages, each of which is then checked by
// read_header and its decoder.
std::uint64_t announced_payload_bytes(std::span<const std::byte> bytes) noexcept;

// The payload of a validated message.
inline std::span<const std::byte> payload_of(std::span<const std::byte> message) {
  return message.subspan(kWireHeaderBytes);
}
inline std::span<std::byte> payload_of(std::span<std::byte> message) {
  return message.subspan(kWireHeaderBytes);
}

}  // namespace gradzip::compressors
