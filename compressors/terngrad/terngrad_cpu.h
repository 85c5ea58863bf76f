// Host loops of the `terngrad` codec (element math: compressors/terngrad/terngrad_math.h). Internal to
// gradzip: compressors/terngrad/terngrad_codec.cpp writes and validates the message header and calls these.
//
// Payload (little-endian, no padding, any alignment):
//   compressors/terngrad/terngrad_math.h's TerngradLayout: the f32 scale of each bucket (max |x|), as qsgd
//   writes them, then the trit bytes, five elements each.
//
// The codes are qsgd's 2-bit codes for the same values, bucket and context, drawn by qsgd's
// loops (compressors/qsgd/qsgd_cpu.h: scalar, AVX2 or AVX-512, all giving the same bytes), and a
// payload decodes to the bits qsgd's decoder gives for those codes. The loops go through a
// qsgd payload in a per-thread scratch buffer (ceil(count / 4) + 4 * num_buckets bytes, kept
// for the thread's next call).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gradzip/codec.h"
#include "gradzip/tensor_view.h"

namespace gradzip::kernels::cpu {

// Writes the payload of `in` (host f32/f16/bf16) into
// payload[0, terngrad_layout(in.count, bucket).payload_bytes()).
// Preconditions: bucket >= 1, in.count <= 2^60.
void terngrad_encode_payload(ConstTensorView in, std::size_t bucket, const EncodeContext& ctx,
                             std::byte* payload);

// The first offence terngrad_check_payload() found.
struct TerngradPayloadProblem {
  enum class Kind : std::uint8_t {
    trit_byte,     // trit byte `index` holds `value`, above terngrad_byte_limit()
    scale,         // bucket `index`'s scale has the bits `value`, which encode never writes
    nonzero_code,  // bucket `index` has a non-finite scale (bits `value`) and a non-zero trit
  };
  Kind kind = Kind::trit_byte;
  std::size_t index = 0;
  std::uint32_t value = 0;
};

// Checks everything the header cannot: every trit byte is one encode writes (below 243, the
// digits after the last element 0), every scale is one encode writes (+0 .. +Inf or the quiet NaN
// 0x7FC00000) and every trit of a bucket with a non-finite scale is 0. Returns false with the
// first offence in `problem`. Preconditions: the payload holds terngrad_layout(count,
// bucket).payload_bytes() bytes.
bool terngrad_check_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                            TerngradPayloadProblem& problem);

// Decodes a checked payload into `out` (host f32/f16/bf16, `count` elements), or adds it to acc.
void terngrad_decode_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                             TensorView out);
void terngrad_decode_add_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                                 float* acc);

}  // namespace gradzip::kernels::cpu
