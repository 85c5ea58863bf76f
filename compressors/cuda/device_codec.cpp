// Codecs on CUDA tensors, the generic part: each codec's device row (compressors/cuda/
// device_codec_row.h, defined in the codec's folder, compressors/<codec>/cuda/) writes and
// checks the host codec's message layout with its kernels; this file routes a call to the row,
// checks what every codec shares (pointers, sizes, the header, f16 / bf16 widening and rounding)
// and names no codec. Headers are built and checked on the host with compressors/wire_format.h,
// as the host codecs do, and travel to / from the device in one small copy; payloads are written
// and validated on the device.
//
// Every call runs on the legacy default stream of the tensor's device (or on the calling
// thread's work stream when a Reducer lane set one) and synchronises before it returns (the
// contract in gradzip/codec.h), except inside a stream-ordered call of the collectives
// (kernels/cuda/stream_ordered_call.h): there a call only queues its work, and a decode checks
// the received header on the device against the one its spec and size give (the codecs whose
// messages have a fixed size: the row's fixed_header) and leaves its payload checks in the
// call's status words. Nothing is read back and nothing waits. Scratch comes from the thread's
// block cache of kernels/cuda/device_runtime.h (no allocation once it is warm). Inputs in f16 /
// bf16 are widened into f32 scratch first (the host codecs load them as f32 too); f16 / bf16
// decode outputs are decoded into f32 scratch and rounded to nearest even, except a cast message
// decoded into its own format, which is copied (as on the host).
#include "compressors/device_codec.h"

#include "kernels/device_api.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "compressors/codec_descriptor.h"
#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/cuda/small_bytes_cuda.h"

namespace gradzip::compressors {
namespace {

namespace cuda = kernels::cuda;

using namespace device;  // compressors/cuda/device_support.h

// ---- routing -------------------------------------------------------------------------------------

// Each codec's row, in CodecKind order (null: no device path), built once from the list.
const DeviceCodecRow* device_row_of(CodecKind kind) {
#define GRADZIP_DEVICE_ROW_ENTRY(name, wire_id) name##_device_row,
  static const std::array rows{GRADZIP_CODECS(GRADZIP_DEVICE_ROW_ENTRY)};
#undef GRADZIP_DEVICE_ROW_ENTRY
  const auto index = static_cast<std::size_t>(kind);
  return index < rows.size() ? rows[index] : nullptr;
}

const DeviceCodecRow& device_row(const CompressionSpec& spec, const std::string& op) {
  const DeviceCodecRow* row = device_row_of(spec.codec);
  GZ_REQUIRE(row != nullptr, ErrorCode::unsupported, op, ": spec '", spec.to_string(),
             "' has no device codec");
  return *row;
}

// The row's fixed header of `spec`'s messages of n elements, or nullopt.
std::optional<WireHeader> fixed_header(const DeviceCodecRow& row, const CompressionSpec& spec,
                                       std::size_t n) {
  return row.fixed_header != nullptr ? row.fixed_header(spec, n) : std::nullopt;
}

std::array<std::byte, kWireHeaderBytes> header_bytes_of(const WireHeader& header) {
  std::array<std::byte, kWireHeaderBytes> bytes{};
  write_header(header, bytes);
  return bytes;
}


std::string describe_header_mismatch(int /*status*/) {
  return "the message header is not the one the call's spec writes for this chunk (its codec, "
         "parameters, element count or payload size differ)";
}

}  // namespace

bool device_codecs_built() noexcept { return true; }

std::size_t device_encode(const Codec& codec, ConstTensorView in, std::span<std::byte> out,
                          const EncodeContext& ctx) {
  const CompressionSpec& spec = codec.spec();
  const std::string op = std::string(codec_kind_name(spec.codec)) + ".encode";
  GZ_REQUIRE(in.data != nullptr || in.count == 0, ErrorCode::invalid_argument, op,
             ": null data pointer for ", in.count, " elements");
  const std::size_t capacity = codec.max_encoded_bytes(in.count);
  GZ_REQUIRE(out.size() >= capacity, ErrorCode::invalid_argument, op, ": output buffer holds ",
             out.size(), " bytes, ", capacity, " needed (max_encoded_bytes)");
  GZ_REQUIRE(aligned(in.data, dtype_size(in.dtype)), ErrorCode::invalid_argument, op,
             ": the input tensor is not aligned to its ", dtype_size(in.dtype), "-byte elements");
  const DeviceScope scope(in.device.index, op);
  cuda::require_device_pointer(out.data(), in.device.index, op, "the output message buffer");
  if (in.count > 0) cuda::require_device_pointer(in.data, in.device.index, op, "the input tensor");

  const DeviceCodecRow& row = device_row(spec, op);
  const F32Input values(in, op);
  const WireHeader header =
      row.encode(spec, values.data(), in.count, ctx, out.data() + kWireHeaderBytes, op);
  // fixed_header gives a stream-ordered decode this header (tests/gpu/test_device_codec.cpp
  // and the multi-rank device tests decode every codec's messages against it).
  const std::array<std::byte, kWireHeaderBytes> header_bytes = header_bytes_of(header);
  // As a kernel argument, not a copy from pageable memory (which would wait for the stream).
  cuda::write_small_bytes(out.data(), header_bytes.data(), header_bytes.size(), work_stream());
  finish(op);
  return kWireHeaderBytes + static_cast<std::size_t>(header.payload_bytes);
}

std::optional<std::size_t> device_encode_with_feedback(const Codec& codec, ConstTensorView g,
                                                       float* d_residual, std::span<std::byte> out,
                                                       const EncodeContext& ctx) {
  const CompressionSpec& spec = codec.spec();
  const DeviceCodecRow* const row = device_row_of(spec.codec);
  // (A buffer too small for the header fails the capacity check below.)
  std::byte* const d_payload =
      out.size() >= kWireHeaderBytes ? out.data() + kWireHeaderBytes : out.data();
  if (row == nullptr || row->fuses_feedback == nullptr || g.dtype != DType::f32 ||
      !aligned(g.data, sizeof(float)) || !row->fuses_feedback(spec, g.count, d_payload))
    return std::nullopt;
  const std::string op = std::string(codec_kind_name(spec.codec)) + ".encode (fused error feedback)";
  const std::size_t n = g.count;
  const std::size_t capacity = codec.max_encoded_bytes(n);
  GZ_REQUIRE(out.size() >= capacity, ErrorCode::invalid_argument, op, ": output buffer holds ",
             out.size(), " bytes, ", capacity, " needed (max_encoded_bytes)");
  const DeviceScope scope(g.device.index, op);
  cuda::require_device_pointer(out.data(), g.device.index, op, "the output message buffer");
  const WireHeader header = row->encode_with_feedback(spec, static_cast<const float*>(g.data),
                                                      d_residual, n, ctx, d_payload, op);
  const std::array<std::byte, kWireHeaderBytes> header_bytes = header_bytes_of(header);
  cuda::write_small_bytes(out.data(), header_bytes.data(), header_bytes.size(), work_stream());
  finish(op);
  return kWireHeaderBytes + static_cast<std::size_t>(header.payload_bytes);
}

void device_decode(const Codec& codec, std::span<const std::byte> in, TensorView out,
                   bool accumulate) {
  const CompressionSpec& spec = codec.spec();
  const std::string op =
      std::string(codec_kind_name(spec.codec)) + (accumulate ? ".decode_add" : ".decode");
  GZ_REQUIRE(out.data != nullptr || out.count == 0, ErrorCode::invalid_argument, op,
             ": null output pointer for ", out.count, " elements");
  GZ_REQUIRE(!accumulate || out.dtype == DType::f32, ErrorCode::invalid_argument, op,
             ": the accumulator is ", dtype_name(out.dtype), "; it must be f32");
  GZ_REQUIRE(out.dtype == DType::f32 || out.dtype == DType::f16 || out.dtype == DType::bf16,
             ErrorCode::invalid_argument, op, ": output dtype ", dtype_name(out.dtype),
             " (expected f32, f16 or bf16)");
  GZ_REQUIRE(aligned(out.data, dtype_size(out.dtype)), ErrorCode::invalid_argument, op,
             ": the output tensor is not aligned to its ", dtype_size(out.dtype), "-byte elements");
  const DeviceScope scope(out.device.index, op);
  if (!in.empty()) cuda::require_device_pointer(in.data(), out.device.index, op, "the message");
  if (out.count > 0) cuda::require_device_pointer(out.data, out.device.index, op, "the output tensor");

  const DeviceCodecRow& row = device_row(spec, op);
  std::array<std::byte, kWireHeaderBytes + kMaxDevicePrefixBytes> prefix{};
  WireHeader header;
  const std::optional<WireHeader> fixed =
      cuda::stream_ordered() ? fixed_header(row, spec, out.count) : std::nullopt;
  if (fixed) {
    // Stream-ordered: the header this spec writes for out.count elements, compared with the
    // received one on the device (the size, the host knows).
    const std::uint64_t expected_bytes = kWireHeaderBytes + fixed->payload_bytes;
    GZ_REQUIRE(in.size() == expected_bytes, ErrorCode::malformed_message, op, ": message of ",
               in.size(), " bytes for ", out.count, " elements (expected ", expected_bytes, ")");
    header = *fixed;
    write_header(header, std::span<std::byte>(prefix).first(kWireHeaderBytes));
    const StatusWords<1> header_check(op, {describe_header_mismatch});
    cuda::compare_small_bytes(in.data(), prefix.data(), kWireHeaderBytes, 1, header_check.word(0),
                              work_stream());
    header_check.check();
  } else {
    // The header (and the row's prefix bytes) on the host, checked like the host decoders
    // check it.
    const std::size_t prefix_bytes = std::min(in.size(), kWireHeaderBytes + row.prefix_bytes);
    if (prefix_bytes > 0) {
      check_runtime(cudaMemcpyAsync(prefix.data(), in.data(), prefix_bytes, cudaMemcpyDeviceToHost,
                                    static_cast<cudaStream_t>(work_stream())),
                    op, "reading the message header");
      synchronize(op);
    }
    header = check_header_for(
        read_header_copy(std::span<const std::byte>(prefix).first(prefix_bytes), in.size(), op),
        *codec_descriptor(spec.codec).wire, out.count, op);
  }
  const std::byte* d_payload = in.data() + kWireHeaderBytes;

  // A cast message decoded into its own format is its payload (as on the host).
  if (!accumulate && row.copied_payload_dtype == out.dtype) {
    expected_element_payload(header, 2, op);
    copy_on_device(out.data, d_payload, out.count * 2, op);
    return finish(op);
  }
  if (out.dtype == DType::f32) {  // row.decode returns with the stream synchronised (or queued)
    return row.decode(header, prefix, d_payload,
                      DecodeTarget{static_cast<float*>(out.data), out.count, accumulate}, op);
  }
  // f16 / bf16 output: decode into f32 scratch, then round (only once the payload passed), as
  // every store into a tensor: IEEE, beyond the range to +-Inf (kernels/cpu/convert.h).
  DeviceScratch decoded(checked_product(out.count, sizeof(float), op), op);
  row.decode(header, prefix, d_payload, DecodeTarget{decoded.as<float>(), out.count, false}, op);
  auto* const half = static_cast<std::uint16_t*>(out.data);
  if (out.dtype == DType::f16) cuda::f32_to_f16_ieee(decoded.as<float>(), half, out.count, work_stream());
  else cuda::f32_to_bf16_ieee(decoded.as<float>(), half, out.count, work_stream());
  finish(op);
}

void device_decode_own(const Codec& codec, std::span<const std::byte> in, TensorView out,
                         const EncodeContext& ctx) {
  const CompressionSpec& spec = codec.spec();
  const DeviceCodecRow* const row = device_row_of(spec.codec);
  if (!cuda::stream_ordered() || row == nullptr || row->decode_own == nullptr ||
      out.dtype != DType::f32)
    return device_decode(codec, in, out, false);
  const std::string op = std::string(codec_kind_name(spec.codec)) + ".decode";
  GZ_REQUIRE(out.data != nullptr || out.count == 0, ErrorCode::invalid_argument, op,
             ": null output pointer for ", out.count, " elements");
  const DeviceScope scope(out.device.index, op);
  if (!in.empty()) cuda::require_device_pointer(in.data(), out.device.index, op, "the message");
  if (out.count > 0) cuda::require_device_pointer(out.data, out.device.index, op, "the output tensor");
  row->decode_own(spec, in, static_cast<float*>(out.data), out.count, ctx, op);
  finish(op);
}

void require_device_tensor(ConstTensorView view, std::string_view op) {
  const std::string name(op);
  const DeviceScope scope(view.device.index, name);
  if (view.count > 0) cuda::require_device_pointer(view.data, view.device.index, name, "the tensor");
}

}  // namespace gradzip::compressors
