// Codecs on CUDA tensors: the host codec's message layout (compressors/<codec>.cpp documents
// each) written by the kernels of kernels/cuda/. Headers are built and checked on the host
// with compressors/wire_format.h, as the host codecs do, and travel to / from the device in
// one small copy; payloads are written and validated on the device.
//
// Every call runs on the legacy default stream of the tensor's device (or on the calling
// thread's work stream when a Reducer lane set one) and synchronises before it returns (the
// contract in gradzip/codec.h), except inside a stream-ordered call of the collectives
// (kernels/cuda/stream_ordered_call.h): there a call only queues its work, and a decode checks
// the received header on the device against the one its spec and size give (the codecs whose
// messages have a fixed size: fixed_header below) and leaves its payload checks in the call's
// status words. Nothing is read back and nothing waits. Scratch comes from the thread's block cache of
// kernels/cuda/device_runtime.h (no allocation once it is warm). Inputs in f16 / bf16 are widened into f32 scratch first (the host codecs load them
// as f32 too); f16 / bf16 decode outputs are decoded into f32 scratch and rounded to nearest
// even, except a cast message decoded into its own format, which is copied (as on the host).
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
#include "kernels/cuda/ef_cuda.h"
#include "kernels/cuda/runtime_support.h"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/cuda/sparse_cuda.h"
#include "kernels/cuda/topk_cuda.h"

namespace gradzip::compressors {
namespace {

namespace cuda = kernels::cuda;

using namespace device;  // compressors/cuda/device_support.h

// fp16 / bf16 payload from f32 values; through aligned scratch when the payload is not 2-byte
// aligned (the kernel stores 16-bit words).
void write_half_payload(const float* d_in, std::size_t count, bool bf16, std::byte* d_payload,
                        const std::string& op) {
  const std::size_t bytes = checked_product(count, 2, op);
  DeviceScratch staging(aligned(d_payload, 2) ? 0 : bytes, op);
  auto* target = aligned(d_payload, 2) ? reinterpret_cast<std::uint16_t*>(d_payload)
                                       : staging.as<std::uint16_t>();
  if (bf16) cuda::f32_to_bf16(d_in, target, count, work_stream());
  else cuda::f32_to_f16(d_in, target, count, work_stream());
  if (!aligned(d_payload, 2)) copy_on_device(d_payload, target, bytes, op);
}

// f32 values of an fp16 / bf16 payload, into d_out (4-byte aligned f32).
void widen_half_payload(const std::byte* d_payload, std::size_t count, bool bf16, float* d_out,
                        const std::string& op) {
  const std::size_t bytes = checked_product(count, 2, op);
  DeviceScratch staging(aligned(d_payload, 2) ? 0 : bytes, op);
  const std::uint16_t* source = reinterpret_cast<const std::uint16_t*>(d_payload);
  if (!aligned(d_payload, 2)) {
    copy_on_device(staging.as<std::uint16_t>(), d_payload, bytes, op);
    source = staging.as<std::uint16_t>();
  }
  if (bf16) cuda::bf16_to_f32(source, d_out, count, work_stream());
  else cuda::f16_to_f32(source, d_out, count, work_stream());
}


// ---- encode ------------------------------------------------------------------------------------

WireHeader encode_none(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  const std::size_t bytes = checked_product(n, sizeof(float), op);
  copy_on_device(d_payload, d_in, bytes, op);
  return WireHeader{WireCodec::none, 0, 0, n, bytes, 0};
}

WireHeader encode_half(const float* d_in, std::size_t n, bool bf16, std::byte* d_payload,
                       const std::string& op) {
  write_half_payload(d_in, n, bf16, d_payload, op);
  return WireHeader{bf16 ? WireCodec::bf16 : WireCodec::fp16, 0, 0, n, n * 2, 0};
}
WireHeader encode_fp16(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  return encode_half(d_in, n, false, d_payload, op);
}
WireHeader encode_bf16(const CompressionSpec& /*spec*/, const float* d_in, std::size_t n,
                       const EncodeContext& /*ctx*/, std::byte* d_payload, const std::string& op) {
  return encode_half(d_in, n, true, d_payload, op);
}

std::string describe_topk_entries(int /*status*/) {
  return "the device selected another number of entries than k (exact top-k selects k)";
}

// Top-k's device scratch: a 256-byte slot (the selected entry count, and the non-finite flag of
// the in-place error feedback) in front of the selection workspace. The slot keeps the pool's
// 256-byte alignment for the workspace (topk_select needs it), and the scratch is never empty.
constexpr std::size_t kTopkSlotBytes = 256;

std::size_t topk_scratch_bytes(const CompressionSpec& spec, std::size_t n, const EncodeContext& ctx) {
  const cuda::TopkCudaOptions options{spec.approx, spec.values == DType::f16, ctx.seed, ctx.step,
                                      ctx.tensor_id};
  return kTopkSlotBytes + cuda::topk_workspace_bytes(n, spec.k_for(n), options);
}

// The non-finite flag in top-k's scratch slot (after the 8-byte entry count).
int* topk_flag_slot(const DeviceScratch& scratch) {
  return reinterpret_cast<int*>(scratch.as<std::byte>() + sizeof(std::uint64_t));
}

// encode_topk with its scratch (topk_scratch_bytes) allocated by the caller.
WireHeader encode_topk_into(const CompressionSpec& spec, const float* d_in, std::size_t n,
                            const EncodeContext& ctx, std::byte* d_payload,
                            const DeviceScratch& scratch, const std::string& op) {
  const std::size_t k = spec.k_for(n);
  const bool wide = n > kTopkMaxNarrowCount;
  const bool half = spec.values == DType::f16;
  const cuda::TopkCudaOptions options{spec.approx, half, ctx.seed, ctx.step, ctx.tensor_id};
  std::size_t workspace_bytes = cuda::topk_workspace_bytes(n, k, options);
  auto* const d_entries = scratch.as<std::uint64_t>();
  cuda::topk_select(d_in, n, k, options, d_payload, d_entries,
                    scratch.as<std::byte>() + kTopkSlotBytes, &workspace_bytes, work_stream());
  std::uint64_t entries = 0;
  if (!spec.approx && cuda::stream_ordered()) {
    // Exact top-k selects k entries: the header says k, and the device checks that it did
    // (at the call's completion) instead of the host reading the count back.
    entries = k;
    StatusWords<1> selected(op, {describe_topk_entries});
    std::array<std::byte, sizeof entries> expected{};
    std::memcpy(expected.data(), &entries, sizeof entries);
    cuda::compare_small_bytes(reinterpret_cast<const std::byte*>(d_entries), expected.data(),
                              expected.size(), 1, selected.word(0), work_stream());
  } else {
    check_runtime(cudaMemcpyAsync(&entries, d_entries, sizeof entries, cudaMemcpyDeviceToHost,
                                  static_cast<cudaStream_t>(work_stream())),
                  op, "reading the entry count");
    synchronize(op);
    GZ_REQUIRE(entries <= k, ErrorCode::internal, op, ": the device selected ", entries,
               " entries for k = ", k);
  }
  std::uint8_t flags = wide ? kTopkWideIndices : 0;
  if (half) flags |= kTopkHalfValues;
  const std::size_t entry_bytes = (wide ? 8 : 4) + (half ? 2 : 4);
  return WireHeader{WireCodec::topk, flags, static_cast<std::uint8_t>(spec.approx ? 1 : 0), n,
                    entries * entry_bytes, entries};
}

WireHeader encode_topk(const CompressionSpec& spec, const float* d_in, std::size_t n,
                       const EncodeContext& ctx, std::byte* d_payload, const std::string& op) {
  const DeviceScratch scratch(topk_scratch_bytes(spec, n, ctx), op);
  return encode_topk_into(spec, d_in, n, ctx, d_payload, scratch, op);
}

// ---- decode ------------------------------------------------------------------------------------

std::string describe_sparse_status(int status) {
  return (status & cuda::kSparseIndexOutOfRange) != 0
             ? "an index is outside the message's element count"
             : "the indices are not strictly increasing";
}

std::size_t expected_cast_payload(const WireHeader& header, std::size_t element_bytes,
                                  const std::string& op) {
  GZ_REQUIRE(header.flags == 0 && header.small_param == 0 && header.large_param == 0,
             ErrorCode::malformed_message, op, ": flags ", int{header.flags}, ", small_param ",
             int{header.small_param}, ", large_param ", header.large_param, " (expected all 0)");
  GZ_REQUIRE(header.count <= SIZE_MAX / element_bytes &&
                 header.payload_bytes == header.count * element_bytes,
             ErrorCode::malformed_message, op, ": payload of ", header.payload_bytes, " bytes for ",
             header.count, " elements (expected ", element_bytes, " per element)");
  return static_cast<std::size_t>(header.payload_bytes);
}

void decode_none(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  expected_cast_payload(header, sizeof(float), op);
  if (!target.accumulate) {
    copy_on_device(target.data, d_payload, n * sizeof(float), op);
    return finish(op);
  }
  DeviceScratch staging(aligned(d_payload, 4) ? 0 : n * sizeof(float), op);
  const float* values = reinterpret_cast<const float*>(d_payload);
  if (!aligned(d_payload, 4)) {
    copy_on_device(staging.as<float>(), d_payload, n * sizeof(float), op);
    values = staging.as<float>();
  }
  cuda::ef_compensate(target.data, values, target.data, n, work_stream());  // acc + value
  return finish(op);
}

void decode_half(const WireHeader& header, const std::byte* d_payload, const DecodeTarget& target,
                 bool bf16, const std::string& op) {
  const std::size_t n = target.count;
  expected_cast_payload(header, 2, op);
  if (!target.accumulate) {
    widen_half_payload(d_payload, n, bf16, target.data, op);
    return finish(op);
  }
  DeviceScratch widened(n * sizeof(float), op);
  widen_half_payload(d_payload, n, bf16, widened.as<float>(), op);
  cuda::ef_compensate(target.data, widened.as<float>(), target.data, n, work_stream());
  return finish(op);
}
void decode_fp16(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  decode_half(header, d_payload, target, false, op);
}
void decode_bf16(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  decode_half(header, d_payload, target, true, op);
}

void decode_topk(const WireHeader& header, std::span<const std::byte> /*prefix*/,
                 const std::byte* d_payload, const DecodeTarget& target, const std::string& op) {
  const std::size_t n = target.count;
  GZ_REQUIRE((header.flags & ~(kTopkWideIndices | kTopkHalfValues)) == 0,
             ErrorCode::malformed_message, op, ": flags 0x", std::hex, int{header.flags},
             " (only 0x1 and 0x2 are defined)");
  GZ_REQUIRE(header.small_param <= 1, ErrorCode::malformed_message, op, ": small_param ",
             int{header.small_param}, " is neither 0 (exact) nor 1 (approx)");
  const bool wide = has_wide_indices(header);
  const bool half = has_half_values(header);
  GZ_REQUIRE(wide || header.count <= kTopkMaxNarrowCount, ErrorCode::malformed_message, op,
             ": 32-bit indices for ", header.count,
             " elements (flags bit 0x1 must be set above 2^32)");
  GZ_REQUIRE(entry_count_of(header) <= header.count, ErrorCode::malformed_message, op, ": ",
             entry_count_of(header), " entries (large_param) for ", header.count, " elements");
  const std::size_t entry_bytes = (wide ? 8 : 4) + (half ? 2 : 4);
  GZ_REQUIRE(header.payload_bytes % entry_bytes == 0 &&
                 header.payload_bytes / entry_bytes == entry_count_of(header),
             ErrorCode::malformed_message, op, ": payload of ", header.payload_bytes,
             " bytes, expected ", entry_count_of(header), " entries of ", entry_bytes, " bytes");
  const StatusWords<1> status(op, {describe_sparse_status});
  if (target.accumulate) {
    const std::byte* payloads[1] = {d_payload};
    const std::uint64_t entries[1] = {entry_count_of(header)};
    cuda::sparse_decode_add(payloads, entries, 1, wide, half, n, target.data, status.word(0),
                            work_stream());
  } else {
    cuda::sparse_decode(d_payload, entry_count_of(header), wide, half, n, target.data,
                        status.word(0), work_stream());
  }
  status.check();  // synchronous calls: the one wait; stream-ordered: nothing
}

// ---- fixed headers -----------------------------------------------------------------------------

std::optional<WireHeader> fixed_none(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::none, 0, 0, n, n * sizeof(float), 0};
}
std::optional<WireHeader> fixed_fp16(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::fp16, 0, 0, n, n * 2, 0};
}
std::optional<WireHeader> fixed_bf16(const CompressionSpec&, std::size_t n) {
  return WireHeader{WireCodec::bf16, 0, 0, n, n * 2, 0};
}
// Exact top-k only: approximate top-k's entry count varies.
std::optional<WireHeader> fixed_topk(const CompressionSpec& spec, std::size_t n) {
  if (spec.approx) return std::nullopt;
  const std::size_t k = spec.k_for(n);
  const bool wide = n > kTopkMaxNarrowCount;
  const bool half = spec.values == DType::f16;
  std::uint8_t flags = wide ? kTopkWideIndices : 0;
  if (half) flags |= kTopkHalfValues;
  return WireHeader{WireCodec::topk, flags, 0, n, k * ((wide ? 8 : 4) + (half ? 2 : 4)), k};
}

// ---- error feedback fused into the encode (DeviceCodecRow::encode_with_feedback) ----------------

// The casts (kernels/cuda/ef_cuda.h, ef_cast_fused): the kernel stores 16-bit words.
bool cast_fuses_feedback(const CompressionSpec&, std::size_t, const std::byte* d_payload) {
  return aligned(d_payload, 2);
}
WireHeader encode_cast_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                     float* d_residual, std::size_t n,
                                     const EncodeContext& /*ctx*/, std::byte* d_payload,
                                     const std::string& op) {
  const bool bf16 = spec.codec == CodecKind::bf16;
  const WireHeader header =
      required_fixed_header(bf16 ? fixed_bf16(spec, n) : fixed_fp16(spec, n), spec, op);
  cuda::ef_cast_fused(d_grad, d_residual, reinterpret_cast<std::uint16_t*>(d_payload), bf16, n,
                      work_stream());
  return header;
}

// Top-k in place (device_support.h, begin/end_sparse_feedback): encode from e, then subtract the
// message's entries. Everything that can fail for want of memory is allocated before the
// residual changes. Any shape.
bool topk_fuses_feedback(const CompressionSpec&, std::size_t, const std::byte*) { return true; }
WireHeader encode_topk_with_feedback(const CompressionSpec& spec, const float* d_grad,
                                     float* d_residual, std::size_t n, const EncodeContext& ctx,
                                     std::byte* d_payload, const std::string& op) {
  const DeviceScratch scratch(topk_scratch_bytes(spec, n, ctx), op);
  int* const d_flag = topk_flag_slot(scratch);
  begin_sparse_feedback(d_grad, d_residual, n, d_flag, op);
  const WireHeader header = encode_topk_into(spec, d_residual, n, ctx, d_payload, scratch, op);
  cuda::sparse_subtract_own(d_payload, entry_count_of(header), has_wide_indices(header),
                            has_half_values(header), n, d_residual, work_stream());
  end_sparse_feedback(d_residual, n, d_flag);
  return header;
}

// ---- rows ----------------------------------------------------------------------------------------

constexpr DeviceCodecRow kNoneDevice{encode_none, decode_none, std::nullopt, fixed_none};
constexpr DeviceCodecRow kFp16Device{encode_fp16, decode_fp16, DType::f16, fixed_fp16,
                                     cast_fuses_feedback, encode_cast_with_feedback};
constexpr DeviceCodecRow kBf16Device{encode_bf16, decode_bf16, DType::bf16, fixed_bf16,
                                     cast_fuses_feedback, encode_cast_with_feedback};
constexpr DeviceCodecRow kTopkDevice{encode_topk, decode_topk, std::nullopt, fixed_topk,
                                     topk_fuses_feedback, encode_topk_with_feedback};

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

// The rows of the codecs without a folder of their own (compressors/cuda/device_codec_row.h).
const DeviceCodecRow* const none_device_row = &kNoneDevice;
const DeviceCodecRow* const fp16_device_row = &kFp16Device;
const DeviceCodecRow* const bf16_device_row = &kBf16Device;
const DeviceCodecRow* const topk_device_row = &kTopkDevice;
const DeviceCodecRow* const powersgd_device_row = nullptr;  // the Reducer's matrices only

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
    expected_cast_payload(header, 2, op);
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
