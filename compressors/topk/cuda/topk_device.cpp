// The top-k codec's device path (compressors/cuda/device_codec_row.h): the selection of
// cuda/topk_kernels.h writes the payload on the work stream, the entries are decoded by the
// shared sparse kernels (kernels/cuda/sparse_cuda.h), the header is built and checked on the
// host as the host codec does. Exact top-k's messages have a fixed header (k entries);
// approximate top-k's entry count is read back from the device. Error feedback fuses into the
// encode (any shape).
#include "kernels/device_api.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>

#include "compressors/cuda/device_codec_row.h"
#include "compressors/cuda/device_support.h"
#include "compressors/topk/cuda/topk_kernels.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/cuda/sparse_cuda.h"

namespace gradzip::compressors {
namespace {

using namespace device;  // compressors/cuda/device_support.h

// The header of `spec`'s message of n elements with `entries` entries.
WireHeader topk_header(const CompressionSpec& spec, std::size_t n, std::uint64_t entries) {
  const bool wide = n > kTopkMaxNarrowCount;
  const bool half = spec.values == DType::f16;
  std::uint8_t flags = wide ? kTopkWideIndices : 0;
  if (half) flags |= kTopkHalfValues;
  const std::size_t entry_bytes = (wide ? 8 : 4) + (half ? 2 : 4);
  return WireHeader{WireCodec::topk, flags, static_cast<std::uint8_t>(spec.approx ? 1 : 0), n,
                    entries * entry_bytes, entries};
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
  const cuda::TopkCudaOptions options{spec.approx, spec.values == DType::f16, ctx.seed, ctx.step,
                                      ctx.tensor_id};
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
  return topk_header(spec, n, entries);
}

WireHeader encode_topk(const CompressionSpec& spec, const float* d_in, std::size_t n,
                       const EncodeContext& ctx, std::byte* d_payload, const std::string& op) {
  const DeviceScratch scratch(topk_scratch_bytes(spec, n, ctx), op);
  return encode_topk_into(spec, d_in, n, ctx, d_payload, scratch, op);
}

std::string describe_sparse_status(int status) {
  return (status & cuda::kSparseIndexOutOfRange) != 0
             ? "an index is outside the message's element count"
             : "the indices are not strictly increasing";
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

// Exact top-k only: approximate top-k's entry count varies.
std::optional<WireHeader> fixed_topk(const CompressionSpec& spec, std::size_t n) {
  if (spec.approx) return std::nullopt;
  return topk_header(spec, n, spec.k_for(n));
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

constexpr DeviceCodecRow kTopkDevice{encode_topk, decode_topk, std::nullopt, fixed_topk,
                                     topk_fuses_feedback, encode_topk_with_feedback};

}  // namespace

const DeviceCodecRow* const topk_device_row = &kTopkDevice;

}  // namespace gradzip::compressors
