// libFuzzer target: the wire-format header parser (compressors/wire_format.h) on arbitrary
// bytes. The whole input is the message.
// Failures (abort(), or an ASan/UBSan report):
//   - read_header / read_header_copy / read_header_for throwing anything but gradzip::Error
//     with code malformed_message;
//   - read_header accepting a message that is not 32 + payload_bytes long, or whose codec
//     byte is unknown;
//   - an accepted header that write_header does not turn back into the input's first 32 bytes;
//   - read_header_copy (the device path: header copied to the host) disagreeing with
//     read_header;
//   - read_header_for disagreeing with read_header + the codec and count checks, for every
//     codec id of compressors/codec_descriptor.cpp and for the header's count and a different one.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "compressors/codec_descriptor.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace {

using gradzip::ErrorCode;
using gradzip::compressors::WireCodec;
using gradzip::compressors::WireHeader;

[[noreturn]] void fail(std::size_t size, const std::string& what) {
  std::fprintf(stderr, "fuzz_wire_header FAILURE (%zu-byte input): %s\n", size, what.c_str());
  std::abort();
}

// The header read_header-like `call` returns, or nullopt when it throws malformed_message.
template <typename Call>
std::optional<WireHeader> parse(std::size_t size, const char* op, Call&& call) {
  try {
    return call();
  } catch (const gradzip::Error& e) {
    if (e.code() != ErrorCode::malformed_message) {
      fail(size, std::string(op) + " threw code " + gradzip::error_code_name(e.code()) + ": " +
                     e.what());
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    fail(size, std::string(op) + " threw a non-gradzip exception: " + e.what());
  } catch (...) {
    fail(size, std::string(op) + " threw something that is not a std::exception");
  }
}

bool same(const WireHeader& a, const WireHeader& b) {
  return a.codec == b.codec && a.flags == b.flags && a.small_param == b.small_param &&
         a.count == b.count && a.payload_bytes == b.payload_bytes && a.large_param == b.large_param;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace c = gradzip::compressors;
  // An exact-size heap copy, so reads outside the message are reported.
  std::unique_ptr<std::byte[]> copy(new std::byte[size == 0 ? 1 : size]);
  if (size != 0) std::memcpy(copy.get(), data, size);
  const std::span<const std::byte> in(copy.get(), size);

  const auto header = parse(size, "read_header", [&] { return c::read_header(in, "fuzz"); });
  // The device path copies min(size, 32) bytes; shorter copies of longer messages are an
  // internal error by contract and are not exercised here.
  const auto from_copy = parse(size, "read_header_copy", [&] {
    return c::read_header_copy(in.first(size < c::kWireHeaderBytes ? size : c::kWireHeaderBytes),
                               size, "fuzz");
  });
  if (header.has_value() != from_copy.has_value() || (header && !same(*header, *from_copy))) {
    fail(size, "read_header_copy disagrees with read_header");
  }

  if (header) {
    if (size < c::kWireHeaderBytes || header->payload_bytes != size - c::kWireHeaderBytes) {
      fail(size, "read_header accepted payload_bytes " + std::to_string(header->payload_bytes));
    }
    const auto id = static_cast<unsigned>(header->codec);
    if (c::wire_codec_name(header->codec) == "unknown" || c::find_wire_descriptor(id) == nullptr) {
      fail(size, "read_header accepted codec id " + std::to_string(id));
    }
    std::byte rewritten[c::kWireHeaderBytes];
    c::write_header(*header, rewritten);
    if (std::memcmp(rewritten, copy.get(), c::kWireHeaderBytes) != 0) {
      fail(size, "write_header(read_header(m)) differs from m's first 32 bytes");
    }
  }

  // read_header_for == read_header + codec check + count check, for every codec id.
  const std::uint64_t header_count = header ? header->count : 0;
  for (const c::CodecDescriptor& row : c::codec_descriptors()) {
    if (!row.wire) continue;
    const WireCodec expected = *row.wire;
    const auto id = static_cast<unsigned>(expected);
    for (const std::uint64_t count : {header_count, header_count + 1}) {
      const auto got = parse(size, "read_header_for", [&] {
        return c::read_header_for(in, expected, static_cast<std::size_t>(count), "fuzz");
      });
      const bool should_accept = header && header->codec == expected && header->count == count;
      if (got.has_value() != should_accept) {
        fail(size, std::string("read_header_for(codec ") + std::to_string(id) + ", count " +
                       std::to_string(count) + ") " + (got ? "accepted" : "refused") +
                       " the message");
      }
      if (got && !same(*got, *header)) fail(size, "read_header_for returned another header");
    }
  }
  return 0;
}
