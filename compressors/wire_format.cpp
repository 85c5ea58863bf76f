#include "compressors/wire_format.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "compressors/codec_descriptor.h"
#include "gradzip/error.h"

static_assert(std::endian::native == std::endian::little,
              "gradzip's wire format is little-endian and written with memcpy");

namespace gradzip::compressors {
namespace {

template <typename T>
void put(std::span<std::byte> out, std::size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof value);
}

template <typename T>
T get(std::span<const std::byte> in, std::size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof value);
  return value;
}

}  // namespace

std::string_view wire_codec_name(WireCodec codec) noexcept {
  const CodecDescriptor* row = find_wire_descriptor(static_cast<std::uint8_t>(codec));
  return row != nullptr ? row->name : "unknown";
}

void write_header(const WireHeader& header, std::span<std::byte> out) {
  GZ_REQUIRE(out.size() >= kWireHeaderBytes, ErrorCode::invalid_argument,
             "write_header: output buffer holds ", out.size(), " bytes, the header needs ",
             kWireHeaderBytes);
  put<std::uint32_t>(out, 0, kWireMagic);
  put<std::uint8_t>(out, 4, kWireVersion);
  put<std::uint8_t>(out, 5, static_cast<std::uint8_t>(header.codec));
  put<std::uint8_t>(out, 6, header.flags);
  put<std::uint8_t>(out, 7, header.small_param);
  put<std::uint64_t>(out, 8, header.count);
  put<std::uint64_t>(out, 16, header.payload_bytes);
  put<std::uint64_t>(out, 24, header.large_param);
}

std::uint64_t index_bytes(const WireHeader& header) noexcept {
  if (header.codec != WireCodec::topk) return 0;
  return entry_count_of(header) * (has_wide_indices(header) ? 8u : 4u);
}

std::uint64_t announced_payload_bytes(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= kWireHeaderBytes ? get<std::uint64_t>(bytes, 16) : 0;
}

WireHeader read_header(std::span<const std::byte> in, std::string_view op) {
  return read_header_copy(in.first(std::min(in.size(), kWireHeaderBytes)), in.size(), op);
}

WireHeader read_header_copy(std::span<const std::byte> in, std::size_t message_bytes,
                            std::string_view op) {
  GZ_REQUIRE(message_bytes >= kWireHeaderBytes, ErrorCode::malformed_message, op, ": message of ",
             message_bytes, " bytes is shorter than the ", kWireHeaderBytes, "-byte header");
  GZ_REQUIRE(in.size() >= kWireHeaderBytes, ErrorCode::internal, op, ": a header copy of ",
             in.size(), " bytes");
  const auto magic = get<std::uint32_t>(in, 0);
  GZ_REQUIRE(magic == kWireMagic, ErrorCode::malformed_message, op, ": bad magic 0x", std::hex,
             magic, " (expected 0x", kWireMagic, ")");
  const auto version = get<std::uint8_t>(in, 4);
  GZ_REQUIRE(version == kWireVersion, ErrorCode::malformed_message, op, ": wire version ",
             int{version}, " is not supported (this build reads version ", int{kWireVersion}, ")");
  const auto codec_id = get<std::uint8_t>(in, 5);
  GZ_REQUIRE(find_wire_descriptor(codec_id) != nullptr, ErrorCode::malformed_message, op, ": unknown codec id ",
             int{codec_id});
  WireHeader header;
  header.codec = static_cast<WireCodec>(codec_id);
  header.flags = get<std::uint8_t>(in, 6);
  header.small_param = get<std::uint8_t>(in, 7);
  header.count = get<std::uint64_t>(in, 8);
  header.payload_bytes = get<std::uint64_t>(in, 16);
  header.large_param = get<std::uint64_t>(in, 24);
  const std::size_t available = message_bytes - kWireHeaderBytes;
  GZ_REQUIRE(header.payload_bytes == available, ErrorCode::malformed_message, op,
             ": header says the payload has ", header.payload_bytes, " bytes, the message has ",
             available, " after the header");
  return header;
}

WireHeader read_header_for(std::span<const std::byte> in, WireCodec expected,
                           std::size_t expected_count, std::string_view op) {
  return check_header_for(read_header(in, op), expected, expected_count, op);
}

WireHeader check_header_for(const WireHeader& header, WireCodec expected,
                            std::size_t expected_count, std::string_view op) {
  GZ_REQUIRE(header.codec == expected, ErrorCode::malformed_message, op, ": message is ",
             wire_codec_name(header.codec), ", this codec decodes ", wire_codec_name(expected));
  GZ_REQUIRE(header.count == expected_count, ErrorCode::malformed_message, op, ": message holds ",
             header.count, " elements, the output has ", expected_count);
  return header;
}

}  // namespace gradzip::compressors
