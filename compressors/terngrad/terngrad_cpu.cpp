// Host loops of the `terngrad` codec (compressors/terngrad/terngrad_cpu.h): qsgd's 2-bit codes, repacked
// five to a byte through a per-thread qsgd payload.
#include "compressors/terngrad/terngrad_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "compressors/qsgd/qsgd_cpu.h"
#include "compressors/qsgd/qsgd_math.h"
#include "compressors/terngrad/terngrad_math.h"

namespace gradzip::kernels::cpu {

static_assert(kTerngradMaxCount == kQsgdMaxCount,
              "terngrad's codes are qsgd's: its count limit is qsgd's");

namespace {

// Ten code bits (five 2-bit codes) -> trit byte, and trit byte -> ten code bits.
struct TerngradTables {
  std::array<std::uint8_t, 1024> pack{};
  std::array<std::uint16_t, kTerngradBytesValid> unpack{};
};

const TerngradTables& tables() {
  static const TerngradTables built = [] {
    TerngradTables t;
    for (std::uint32_t codes10 = 0; codes10 < t.pack.size(); ++codes10) {
      t.pack[codes10] = static_cast<std::uint8_t>(terngrad_pack_codes(codes10));
    }
    for (std::uint32_t byte = 0; byte < t.unpack.size(); ++byte) {
      t.unpack[byte] = static_cast<std::uint16_t>(terngrad_unpack_codes(byte));
    }
    return t;
  }();
  return built;
}

// Four trit bytes hold 20 elements, whose 2-bit codes are 40 bits: five whole code bytes. The
// loops below move such groups as one 64-bit word (no read-modify-write of shared bytes) and
// finish the last partial group byte by byte.
constexpr std::size_t kGroupTritBytes = 4;
constexpr std::size_t kGroupCodeBytes = 5;
constexpr std::size_t kGroupElements = 20;

// The calling thread's qsgd payload for `bytes` bytes (grown, never shrunk).
std::byte* qsgd_scratch(std::size_t bytes) {
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch.data();
}

// The qsgd payload holding the codes of a checked terngrad payload.
const std::byte* to_qsgd_payload(const std::byte* payload, std::size_t count, std::size_t bucket) {
  const TerngradLayout layout = terngrad_layout(count, bucket);
  const QsgdLayout qsgd = *qsgd_layout(count, kTerngradCodeBits, bucket);
  std::byte* const scratch = qsgd_scratch(qsgd.payload_bytes());
  std::memcpy(scratch, payload, layout.scale_bytes);
  auto* const stream = reinterpret_cast<std::uint8_t*>(scratch + qsgd.scale_bytes);
  const auto* const trits = reinterpret_cast<const std::uint8_t*>(payload + layout.scale_bytes);
  const TerngradTables& t = tables();
  const std::size_t groups = count / kGroupElements;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::uint8_t* in = trits + g * kGroupTritBytes;
    const std::uint64_t word = std::uint64_t{t.unpack[in[0]]} | std::uint64_t{t.unpack[in[1]]} << 10 |
                               std::uint64_t{t.unpack[in[2]]} << 20 | std::uint64_t{t.unpack[in[3]]} << 30;
    std::memcpy(stream + g * kGroupCodeBytes, &word, kGroupCodeBytes);  // little-endian
  }
  std::memset(stream + groups * kGroupCodeBytes, 0, qsgd.code_bytes - groups * kGroupCodeBytes);
  for (std::size_t j = groups * kGroupTritBytes; j < layout.trit_bytes; ++j) {
    // Element 5j's codes start at stream bit 10j: bit 0, 2, 4 or 6 of byte 10j / 8, so the
    // ten bits span at most two bytes.
    const std::uint32_t shifted = static_cast<std::uint32_t>(t.unpack[trits[j]]) << (10 * j % 8);
    const std::size_t first = 10 * j / 8;
    stream[first] |= static_cast<std::uint8_t>(shifted);
    if ((shifted >> 8) != 0u) stream[first + 1] |= static_cast<std::uint8_t>(shifted >> 8);
  }
  return scratch;
}

}  // namespace

void terngrad_encode_payload(ConstTensorView in, std::size_t bucket, const EncodeContext& ctx,
                             std::byte* payload) {
  const std::size_t count = in.count;
  if (count == 0) return;  // an empty payload
  const TerngradLayout layout = terngrad_layout(count, bucket);
  const QsgdLayout qsgd = *qsgd_layout(count, kTerngradCodeBits, bucket);
  std::byte* const scratch = qsgd_scratch(qsgd.payload_bytes());
  qsgd_encode_payload(in, kTerngradCodeBits, bucket, ctx, scratch);
  std::memcpy(payload, scratch, layout.scale_bytes);
  const auto* const stream = reinterpret_cast<const std::uint8_t*>(scratch + qsgd.scale_bytes);
  auto* const trits = reinterpret_cast<std::uint8_t*>(payload + layout.scale_bytes);
  const TerngradTables& t = tables();
  const std::size_t groups = count / kGroupElements;
  for (std::size_t g = 0; g < groups; ++g) {
    std::uint64_t word = 0;
    std::memcpy(&word, stream + g * kGroupCodeBytes, kGroupCodeBytes);  // little-endian
    std::uint8_t* out = trits + g * kGroupTritBytes;
    for (std::size_t i = 0; i < kGroupTritBytes; ++i) out[i] = t.pack[(word >> (10 * i)) & 0x3FFu];
  }
  for (std::size_t j = groups * kGroupTritBytes; j < layout.trit_bytes; ++j) {
    // The stream's unused high bits are 0, so the last byte's missing codes are 0 trits.
    trits[j] = t.pack[terngrad_read_codes10(stream, qsgd.code_bytes, 10 * std::uint64_t{j})];
  }
}

bool terngrad_check_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                            TerngradPayloadProblem& problem) {
  const TerngradLayout layout = terngrad_layout(count, bucket);
  const auto* const trits = reinterpret_cast<const std::uint8_t*>(payload + layout.scale_bytes);
  // Full bytes: the largest first (a loop the compiler vectorises), the offender only if needed.
  const std::size_t full_bytes = count / kTerngradTritsPerByte;
  std::uint8_t largest = 0;
  for (std::size_t j = 0; j < full_bytes; ++j) largest = std::max(largest, trits[j]);
  const std::size_t first_to_scan = largest < kTerngradBytesValid ? full_bytes : 0;
  for (std::size_t j = first_to_scan; j < layout.trit_bytes; ++j) {
    if (trits[j] > terngrad_byte_limit(count, j)) {
      problem = TerngradPayloadProblem{TerngradPayloadProblem::Kind::trit_byte, j, trits[j]};
      return false;
    }
  }
  for (std::size_t b = 0; b < layout.num_buckets; ++b) {
    float scale;
    std::memcpy(&scale, payload + b * sizeof(float), sizeof scale);
    if (!qsgd_scale_is_valid(scale)) {
      problem = TerngradPayloadProblem{TerngradPayloadProblem::Kind::scale, b, float_bits(scale)};
      return false;
    }
    if (qsgd_scale_is_finite(scale)) continue;
    const std::size_t end = b * bucket + std::min(bucket, count - b * bucket);
    for (std::size_t i = b * bucket; i < end; ++i) {
      std::uint32_t byte = trits[i / kTerngradTritsPerByte];
      for (std::size_t d = 0; d < i % kTerngradTritsPerByte; ++d) byte /= 3u;
      if (byte % 3u != 0u) {
        problem = TerngradPayloadProblem{TerngradPayloadProblem::Kind::nonzero_code, b,
                                         float_bits(scale)};
        return false;
      }
    }
  }
  return true;
}

void terngrad_decode_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                             TensorView out) {
  if (count == 0) return;
  qsgd_decode_payload(to_qsgd_payload(payload, count, bucket), count, kTerngradCodeBits, bucket,
                      out);
}

void terngrad_decode_add_payload(const std::byte* payload, std::size_t count, std::size_t bucket,
                                 float* acc) {
  if (count == 0) return;
  qsgd_decode_add_payload(to_qsgd_payload(payload, count, bucket), count, kTerngradCodeBits,
                          bucket, acc);
}

}  // namespace gradzip::kernels::cpu
