// The `sign` kernels: the scalar loop bodies (the reference the vector paths must match bit
// for bit), the ISA dispatch, and the parts every ISA shares (unaligned heads, short tails,
// bucket bookkeeping), which run the scalar math of compressors/sign/sign_math.h.
#include "compressors/sign/sign_cpu.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "kernels/cpu/cpu_features.h"

namespace gradzip::kernels::cpu {

// One ISA's loop bodies (contracts in sign_cpu.h).
struct SignVectorBodies {
  void (*pack_bits_64)(const float* x, std::size_t count, std::uint8_t* bits) noexcept;
  void (*accumulate_16)(const float* x, std::size_t count, float* lanes) noexcept;
  void (*decode_16)(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept;
  void (*decode_add_16)(float scale, const std::uint8_t* bits, std::size_t count,
                        float* acc) noexcept;
  bool (*short_scales_16)(const float* x, std::size_t bucket, std::size_t buckets,
                          std::byte* scales) noexcept;
  void (*decode_short_16)(const std::byte* scales, std::size_t bucket, std::size_t first,
                          const std::uint8_t* bits, std::size_t count, float* out) noexcept;
  void (*decode_add_short_16)(const std::byte* scales, std::size_t bucket, std::size_t first,
                              const std::uint8_t* bits, std::size_t count, float* acc) noexcept;
};

namespace {

// Elements SignEncoder::add packs and then sums in two passes: small enough (16 KiB of f32)
// that the pack pass leaves them in L1 for the sum pass, and a multiple of 64 so every block
// but the last goes to the vector bodies whole.
constexpr std::size_t kEncodeBlock = 4096;

// The byte holding the bits of x[0, n), n <= 8; bits n..7 zero.
std::uint8_t pack_byte(const float* x, std::size_t n) noexcept {
  std::uint32_t byte = 0;
  for (std::size_t j = 0; j < n; ++j) byte |= sign_bit(x[j]) << j;
  return static_cast<std::uint8_t>(byte);
}

std::uint32_t bit_at(const std::uint8_t* bits, std::size_t i) noexcept {
  return (bits[i / 8] >> (i % 8)) & 1u;
}

float scale_at(const std::byte* scales, std::size_t bucket_index) noexcept {
  float scale;
  std::memcpy(&scale, scales + bucket_index * sizeof(float), sizeof scale);
  return scale;
}

void write_scale(std::byte* scales, std::size_t bucket_index, float scale) noexcept {
  std::memcpy(scales + bucket_index * sizeof(float), &scale, sizeof scale);
}

// out = value, or out += value for the decode_add paths.
template <bool kAdd>
void put(float& out, float value) noexcept {
  if constexpr (kAdd) {
    out += value;
  } else {
    out = value;
  }
}

namespace scalar {

void sign_pack_bits_64(const float* x, std::size_t count, std::uint8_t* bits) noexcept {
  for (std::size_t k = 0; k < count; k += 8) bits[k / 8] = pack_byte(x + k, 8);
}

void sign_accumulate_16(const float* x, std::size_t count, float* lanes) noexcept {
  for (std::size_t k = 0; k < count; ++k) lanes[k % kSignLanes] += sign_abs(x[k]);
}

template <bool kAdd>
void decode_16(float scale, const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  for (std::size_t k = 0; k < count; ++k) put<kAdd>(out[k], sign_decoded(scale, bit_at(bits, k)));
}

// The scalar reference's scales are rescued already (sign_bucket_scale): none is +inf but
// for a bucket holding an inf, which the rescue would leave as it is.
bool sign_short_scales_16(const float* x, std::size_t bucket, std::size_t buckets,
                          std::byte* scales) noexcept {
  for (std::size_t b = 0; b < buckets; ++b) {
    write_scale(scales, b, sign_bucket_scale(x + b * bucket, bucket));
  }
  return false;
}

template <bool kAdd>
void decode_short_16(const std::byte* scales, std::size_t bucket, std::size_t first,
                     const std::uint8_t* bits, std::size_t count, float* out) noexcept {
  std::size_t bucket_index = first / bucket;
  std::size_t position = first % bucket;
  float scale = scale_at(scales, bucket_index);
  for (std::size_t k = 0; k < count; ++k) {
    put<kAdd>(out[k], sign_decoded(scale, bit_at(bits, k)));
    if (++position == bucket && k + 1 < count) {
      position = 0;
      scale = scale_at(scales, ++bucket_index);
    }
  }
}

}  // namespace scalar

constexpr SignVectorBodies kScalarBodies{
    scalar::sign_pack_bits_64,    scalar::sign_accumulate_16,   scalar::decode_16<false>,
    scalar::decode_16<true>,      scalar::sign_short_scales_16, scalar::decode_short_16<false>,
    scalar::decode_short_16<true>};
constexpr SignVectorBodies kAvx2Bodies{avx2::sign_pack_bits_64,       avx2::sign_accumulate_16,
                                       avx2::sign_decode_16,          avx2::sign_decode_add_16,
                                       avx2::sign_short_scales_16,    avx2::sign_decode_short_16,
                                       avx2::sign_decode_add_short_16};
constexpr SignVectorBodies kAvx512Bodies{
    avx512::sign_pack_bits_64,       avx512::sign_accumulate_16,   avx512::sign_decode_16,
    avx512::sign_decode_add_16,      avx512::sign_short_scales_16, avx512::sign_decode_short_16,
    avx512::sign_decode_add_short_16};

const SignVectorBodies& bodies_for(Isa isa) noexcept {
  switch (isa) {
    case Isa::avx512:
      return kAvx512Bodies;
    case Isa::avx2:
      return kAvx2Bodies;
    case Isa::scalar:
      break;
  }
  return kScalarBodies;
}

// Bits of x[0, count) into bits[0, ceil(count / 8)), starting on a byte boundary.
void pack_bits(const SignVectorBodies& bodies, const float* x, std::size_t count,
               std::uint8_t* bits) noexcept {
  const std::size_t body = count / 64 * 64;
  bodies.pack_bits_64(x, body, bits);
  for (std::size_t k = body; k < count; k += 8) {
    bits[k / 8] = pack_byte(x + k, std::min<std::size_t>(8, count - k));
  }
}

// lanes[(first_lane + k) % 16] += |x[k]| for k < count, in increasing k.
void accumulate_lanes(const SignVectorBodies& bodies, const float* x, std::size_t count,
                      std::size_t first_lane, float* lanes) noexcept {
  std::size_t k = 0;
  for (std::size_t lane = first_lane; lane != 0 && k < count; lane = (lane + 1) % kSignLanes) {
    lanes[lane] += sign_abs(x[k++]);
  }
  const std::size_t body = (count - k) / kSignLanes * kSignLanes;
  bodies.accumulate_16(x + k, body, lanes);
  k += body;
  for (std::size_t lane = 0; k < count; ++lane) lanes[lane] += sign_abs(x[k++]);
}

// The decoded value of element i of the payload.
float value_at(const SignPayload& payload, std::size_t i) noexcept {
  return sign_decoded(scale_at(payload.scales, i / payload.bucket), bit_at(payload.bits, i));
}

// out[k] (+)= value of element begin + k, k < n, for buckets of >= 16 elements: bucket by
// bucket, each run handed to the 16-element bodies from its first byte-aligned element.
template <bool kAdd>
void decode_long_buckets(const SignVectorBodies& bodies, const SignPayload& payload,
                         std::size_t begin, std::size_t n, float* out) noexcept {
  std::size_t bucket_index = begin / payload.bucket;
  std::size_t position = begin % payload.bucket;
  for (std::size_t k = 0; k < n; ++bucket_index, position = 0) {
    const std::size_t run_end = k + std::min(payload.bucket - position, n - k);
    const float scale = scale_at(payload.scales, bucket_index);
    for (; k < run_end && (begin + k) % 8 != 0; ++k) {
      put<kAdd>(out[k], sign_decoded(scale, bit_at(payload.bits, begin + k)));
    }
    const std::size_t body = (run_end - k) / 16 * 16;
    const std::uint8_t* body_bits = payload.bits + (begin + k) / 8;
    if constexpr (kAdd) {
      bodies.decode_add_16(scale, body_bits, body, out + k);
    } else {
      bodies.decode_16(scale, body_bits, body, out + k);
    }
    for (k += body; k < run_end; ++k) {
      put<kAdd>(out[k], sign_decoded(scale, bit_at(payload.bits, begin + k)));
    }
  }
}

// The same for buckets of < 16 elements: the bodies span buckets.
template <bool kAdd>
void decode_short_buckets(const SignVectorBodies& bodies, const SignPayload& payload,
                          std::size_t begin, std::size_t n, float* out) noexcept {
  std::size_t k = 0;
  for (; k < n && (begin + k) % 8 != 0; ++k) put<kAdd>(out[k], value_at(payload, begin + k));
  const std::size_t body = (n - k) / 16 * 16;
  const std::uint8_t* body_bits = payload.bits + (begin + k) / 8;
  // Not called with nothing to do: the body may read the scale of element begin + k, which
  // is past the end when k == n.
  if (body > 0) {
    if constexpr (kAdd) {
      bodies.decode_add_short_16(payload.scales, payload.bucket, begin + k, body_bits, body,
                                 out + k);
    } else {
      bodies.decode_short_16(payload.scales, payload.bucket, begin + k, body_bits, body, out + k);
    }
  }
  for (k += body; k < n; ++k) put<kAdd>(out[k], value_at(payload, begin + k));
}

template <bool kAdd>
void decode_elements(const SignPayload& payload, std::size_t begin, std::size_t n,
                     float* out) noexcept {
  if (n == 0) return;
  const SignVectorBodies& bodies = bodies_for(active_isa());
  if (payload.bucket < kSignLanes) {
    decode_short_buckets<kAdd>(bodies, payload, begin, n, out);
  } else {
    decode_long_buckets<kAdd>(bodies, payload, begin, n, out);
  }
}

}  // namespace

SignEncoder::SignEncoder(std::size_t bucket, std::byte* scales, std::uint8_t* bits) noexcept
    : bodies_(&bodies_for(active_isa())), bucket_(bucket), scales_(scales), bits_(bits) {}

void SignEncoder::add(const float* x, std::size_t count) noexcept {
  for (std::size_t done = 0; done < count; done += kEncodeBlock) {
    const std::size_t n = std::min(kEncodeBlock, count - done);
    pack_bits(*bodies_, x + done, n, bits_ + (elements_added_ + done) / 8);
    add_to_buckets(x + done, n);
  }
  elements_added_ += count;
}

void SignEncoder::add_to_buckets(const float* x, std::size_t count) noexcept {
  for (std::size_t k = 0; k < count;) {
    if (position_in_bucket_ == 0 && bucket_ < kSignLanes) {
      // Whole buckets too short for the 16-lane bodies go 16 at a time to the across-bucket
      // body; the rest (fewer than 16 buckets, or a bucket cut by the block's end) below.
      const std::size_t buckets = (count - k) / bucket_ / 16 * 16;
      std::byte* const scales = scales_ + bucket_index_ * sizeof(float);
      any_scale_overflowed_ |= bodies_->short_scales_16(x + k, bucket_, buckets, scales);
      bucket_index_ += buckets;
      k += buckets * bucket_;
      if (k == count) break;
    }
    const std::size_t run = std::min(bucket_ - position_in_bucket_, count - k);
    accumulate_lanes(*bodies_, x + k, run, position_in_bucket_ % kSignLanes, lanes_);
    position_in_bucket_ += run;
    k += run;
    if (position_in_bucket_ == bucket_) finish_bucket();
  }
}

void SignEncoder::finish_bucket() noexcept {
  const float scale = sign_scale_from_sum(sign_combine_lanes(lanes_), position_in_bucket_);
  any_scale_overflowed_ |= sign_scale_overflowed(scale);
  write_scale(scales_, bucket_index_, scale);
  ++bucket_index_;
  position_in_bucket_ = 0;
  std::fill(std::begin(lanes_), std::end(lanes_), 0.0f);
}

void SignEncoder::finish() noexcept {
  if (position_in_bucket_ > 0) finish_bucket();
}

void sign_decode(const SignPayload& payload, std::size_t begin, std::size_t n,
                 float* out) noexcept {
  decode_elements<false>(payload, begin, n, out);
}

void sign_decode_add(const SignPayload& payload, float* acc) noexcept {
  decode_elements<true>(payload, 0, payload.count, acc);
}

}  // namespace gradzip::kernels::cpu
