// The fp16/bf16 casts: the host conversion kernels on every ISA against an independent
// reference (exhaustive where the domain is 16 bits, boundary values and a sweep of f32 bit
// patterns otherwise), and the `fp16` / `bf16` codecs built on them (round trips, decode_add,
// layout, determinism, rejection of malformed messages).
//
// The reference here shares no code with kernels/cast_math.h: it rounds in double arithmetic
// (floor / ldexp on exact values) and builds the bits from the rounded value's exponent and
// fraction, so an error in cast_math.h's bit tricks cannot hide in both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cpu/cast_cpu_simd.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/host_device.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using compressors::WireCodec;
using compressors::WireHeader;
using kernels::cpu::Isa;

// ---- bits plumbing ---------------------------------------------------------------------------



std::uint16_t load16(const std::byte* bytes, std::size_t i) {
  std::uint16_t bits;
  std::memcpy(&bits, bytes + 2 * i, sizeof bits);
  return bits;
}

void store16(std::byte* bytes, std::size_t i, std::uint16_t bits) {
  std::memcpy(bytes + 2 * i, &bits, sizeof bits);
}

// ---- the independent reference ---------------------------------------------------------------

// A binary floating-point format with `fraction_bits` stored fraction bits and exponent bias
// `bias` (binary16: 10, 15; bfloat16: 7, 127), stored in 16 bits with the sign on top.
struct Format16 {
  int fraction_bits;
  int bias;
  const char* name;
};
constexpr Format16 kBinary16{10, 15, "f16"};
constexpr Format16 kBfloat16{7, 127, "bf16"};

// The format's bits for the f32 `value`, round to nearest, ties to even. NaN: the format's
// quiet NaN of the same sign whose fraction is the f32 fraction's top bits (F16C's rule).
// saturate (message payloads): a finite value that rounds beyond the range gives the largest
// finite value; otherwise (tensor stores) it gives Inf, as IEEE 754 says.
std::uint16_t reference_round(const Format16& format, float value, bool saturate = true) {
  const std::uint32_t f32 = kernels::float_bits(value);
  const auto sign = static_cast<std::uint16_t>((f32 >> 16) & 0x8000u);
  const int exponent_bits = 15 - format.fraction_bits;
  const std::uint16_t all_ones_exponent =
      static_cast<std::uint16_t>(((1u << exponent_bits) - 1u) << format.fraction_bits);
  if (std::isnan(value)) {
    const std::uint16_t quiet_bit = static_cast<std::uint16_t>(1u << (format.fraction_bits - 1));
    const auto top_fraction =
        static_cast<std::uint16_t>((f32 & 0x7FFFFFu) >> (23 - format.fraction_bits));
    return static_cast<std::uint16_t>(sign | all_ones_exponent | quiet_bit | top_fraction);
  }
  if (std::isinf(value)) return static_cast<std::uint16_t>(sign | all_ones_exponent);
  const int min_normal_exponent = 1 - format.bias;
  const int max_exponent = format.bias;
  const double magnitude = std::fabs(static_cast<double>(value));  // exact
  // Spacing of the format's values around `magnitude`; below the normal range it is fixed.
  int exponent = magnitude == 0.0 ? min_normal_exponent : std::ilogb(magnitude);
  if (exponent < min_normal_exponent) exponent = min_normal_exponent;
  const double quantum = std::ldexp(1.0, exponent - format.fraction_bits);
  const double scaled = magnitude / quantum;  // exact: a power-of-two scaling inside double
  double whole = std::floor(scaled);
  const double fraction = scaled - whole;                                   // exact
  const bool whole_is_odd = (static_cast<std::uint64_t>(whole) & 1u) != 0;  // whole < 2^12
  if (fraction > 0.5 || (fraction == 0.5 && whole_is_odd)) whole += 1.0;
  const double rounded = whole * quantum;  // exact
  if (rounded >= std::ldexp(1.0, max_exponent + 1)) {
    // Saturation (cast_math.h): a finite value that rounds beyond the format's range
    // becomes its largest finite value, all ones below the all-ones exponent; IEEE: Inf.
    return static_cast<std::uint16_t>(sign | (saturate ? all_ones_exponent - 1u : all_ones_exponent));
  }
  if (rounded < std::ldexp(1.0, min_normal_exponent)) {  // subnormal (or zero)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(whole));
  }
  const int rounded_exponent = std::ilogb(rounded);
  const double significand = std::ldexp(rounded, -rounded_exponent);  // [1, 2), exact
  const auto stored_fraction =
      static_cast<std::uint16_t>((significand - 1.0) * std::ldexp(1.0, format.fraction_bits));
  return static_cast<std::uint16_t>(
      sign | ((rounded_exponent + format.bias) << format.fraction_bits) | stored_fraction);
}

// The f32 value of the format's `bits`, exact. NaN: binary16 NaNs come out quiet (the quiet
// bit set, fraction in the top bits, as vcvtph2ps does); bfloat16 NaNs keep every bit (bf16 is
// the top half of an f32).
float reference_widen(const Format16& format, std::uint16_t bits) {
  const bool negative = (bits & 0x8000u) != 0;
  const int exponent_bits = 15 - format.fraction_bits;
  const std::uint32_t exponent_field =
      (bits >> format.fraction_bits) & ((1u << exponent_bits) - 1u);
  const std::uint32_t fraction_field = bits & ((1u << format.fraction_bits) - 1u);
  if (exponent_field == (1u << exponent_bits) - 1u) {
    if (fraction_field == 0) {
      return negative ? -std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::infinity();
    }
    const std::uint32_t sign = negative ? 0x80000000u : 0u;
    const std::uint32_t fraction = fraction_field << (23 - format.fraction_bits);
    if (format.fraction_bits == 10) return kernels::bits_float(sign | 0x7FC00000u | fraction);
    return kernels::bits_float(sign | 0x7F800000u | fraction);
  }
  const int scale = static_cast<int>(exponent_field) == 0
                        ? 1 - format.bias - format.fraction_bits
                        : static_cast<int>(exponent_field) - format.bias - format.fraction_bits;
  const double significand =
      exponent_field == 0 ? static_cast<double>(fraction_field)
                          : static_cast<double>(fraction_field + (1u << format.fraction_bits));
  const double magnitude = std::ldexp(significand, scale);
  return static_cast<float>(negative ? -magnitude : magnitude);  // exact in f32
}

const Format16& format_of(DType dtype) { return dtype == DType::f16 ? kBinary16 : kBfloat16; }

// ---- ISA plumbing -----------------------------------------------------------------------------

// The ISAs this CPU can run, scalar first.
std::vector<Isa> runnable_isas() {
  std::vector<Isa> isas = {Isa::scalar};
  if (kernels::cpu::detected_isa() >= Isa::avx2) isas.push_back(Isa::avx2);
  if (kernels::cpu::detected_isa() >= Isa::avx512) isas.push_back(Isa::avx512);
  return isas;
}

// Forces an ISA for the lifetime of the object.
class IsaScope {
 public:
  explicit IsaScope(Isa isa) { kernels::cpu::set_isa_override(isa); }
  ~IsaScope() { kernels::cpu::clear_isa_override(); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

std::string isa_label(Isa isa) { return "isa " + std::string(kernels::cpu::isa_name(isa)); }

using NarrowKernel = void (*)(const float*, std::byte*, std::size_t) noexcept;
using WidenKernel = void (*)(const std::byte*, float*, std::size_t) noexcept;

NarrowKernel narrow_kernel(const Format16& format) {
  return &format == &kBinary16 ? kernels::cpu::f32_to_f16_bytes : kernels::cpu::f32_to_bf16_bytes;
}
WidenKernel widen_kernel(const Format16& format) {
  return &format == &kBinary16 ? kernels::cpu::f16_bytes_to_f32 : kernels::cpu::bf16_bytes_to_f32;
}
WidenKernel add_kernel(const Format16& format) {
  return &format == &kBinary16 ? kernels::cpu::add_f16_bytes_to_f32
                               : kernels::cpu::add_bf16_bytes_to_f32;
}

// Converts `values` with the typed convert.h entry point under the active ISA (the byte-level
// entry points it forwards to are tested at odd addresses below).
std::vector<std::uint16_t> narrow(const Format16& format, const std::vector<float>& values) {
  std::vector<std::uint16_t> out(values.size());
  if (&format == &kBinary16) {
    kernels::cpu::f32_to_f16(values.data(), out.data(), values.size());
  } else {
    kernels::cpu::f32_to_bf16(values.data(), out.data(), values.size());
  }
  return out;
}

// Index of the first element where the two differ, or npos.
template <typename T>
std::size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return i;
  }
  return std::string::npos;
}

std::vector<std::uint32_t> bit_patterns(const std::vector<float>& values) {
  std::vector<std::uint32_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = kernels::float_bits(values[i]);
  return bits;
}

// Every ISA's narrowing of `values` equals reference_round(), element by element.
void expect_narrowing_matches_reference(const Format16& format, const std::vector<float>& values) {
  std::vector<std::uint16_t> expected(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) expected[i] = reference_round(format, values[i]);
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    const auto actual = narrow(format, values);
    const std::size_t at = first_difference(actual, expected);
    EXPECT_EQ(at, std::string::npos)
        << format.name << ", " << isa_label(isa) << ": f32 0x" << std::hex << kernels::float_bits(values[at])
        << " gave 0x" << actual[at] << ", expected 0x" << expected[at];
  }
}

// Values that exercise every path of the conversions: both signs of zero, f32 denormals,
// binary16 subnormals and the edges of its range, bfloat16's overflow edge, infinities and
// NaNs with payloads (quiet and signalling).
std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,
          -0.0f,
          kernels::bits_float(0x00000001u),  // smallest f32 denormal
          kernels::bits_float(0x807FFFFFu),  // largest negative f32 denormal
          std::ldexp(1.0f, -24),
          std::ldexp(1.0f, -25),
          -std::ldexp(3.0f, -25),
          std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25),
          1.0f + std::ldexp(1.0f, -11),
          1.0f + std::ldexp(1.0f, -8),
          65504.0f,
          65519.99f,
          65520.0f,
          -65520.0f,
          65536.0f,
          -1.0e9f,
          kernels::bits_float(0x477FE001u),  // just above 65504
          kernels::bits_float(0x7F7F7FFFu),  // just below halfway: bf16 rounds down
          kernels::bits_float(0x7F7F8000u),  // halfway from bf16's largest finite to inf
          kernels::bits_float(0xFF7F8001u),
          std::numeric_limits<float>::max(),
          -std::numeric_limits<float>::max(),
          inf,
          -inf,
          kernels::bits_float(0x7FC00000u),
          kernels::bits_float(0xFFC00001u),
          kernels::bits_float(0x7F800001u),  // signalling, low payload
          kernels::bits_float(0x7FA00000u),  // signalling, high payload
          kernels::bits_float(0xFFFFFFFFu)};
}

// ---- the reference itself --------------------------------------------------------------------

// Pins the reference to hand-derived bits so it cannot drift together with the kernels.
TEST(CastReference, AgreesWithHandDerivedBits) {
  EXPECT_EQ(reference_round(kBinary16, 1.0f), 0x3C00);
  EXPECT_EQ(reference_round(kBinary16, -2.0f), 0xC000);
  EXPECT_EQ(reference_round(kBinary16, 65504.0f), 0x7BFF);
  EXPECT_EQ(reference_round(kBinary16, 65520.0f), 0x7BFF);   // saturates (IEEE: 0x7C00)
  EXPECT_EQ(reference_round(kBinary16, -1.0e30f), 0xFBFF);
  EXPECT_EQ(reference_round(kBinary16, std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(reference_round(kBinary16, std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(reference_round(kBinary16, std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(reference_round(kBfloat16, 1.0f), 0x3F80);
  EXPECT_EQ(reference_round(kBfloat16, -3.0f), 0xC040);
  EXPECT_EQ(reference_round(kBfloat16, kernels::bits_float(0x00010000u)), 0x0001);
  EXPECT_EQ(reference_round(kBfloat16, std::numeric_limits<float>::max()), 0x7F7F);  // saturates
  EXPECT_EQ(reference_round(kBfloat16, -std::numeric_limits<float>::max()), 0xFF7F);
  EXPECT_EQ(reference_round(kBfloat16, -std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(kernels::float_bits(reference_widen(kBinary16, 0x3C00)), 0x3F800000u);
  EXPECT_EQ(kernels::float_bits(reference_widen(kBinary16, 0x0001)), kernels::float_bits(std::ldexp(1.0f, -24)));
  EXPECT_EQ(kernels::float_bits(reference_widen(kBinary16, 0x7BFF)), kernels::float_bits(65504.0f));
  EXPECT_EQ(kernels::float_bits(reference_widen(kBfloat16, 0xC040)), kernels::float_bits(-3.0f));
}

// ---- widening: all 65536 patterns ------------------------------------------------------------

void expect_widening_exhaustive(const Format16& format) {
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t bits = 0; bits < 65536; ++bits) all[bits] = static_cast<std::uint16_t>(bits);
  std::vector<std::uint32_t> expected(65536);
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    expected[bits] = kernels::float_bits(reference_widen(format, static_cast<std::uint16_t>(bits)));
  }
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    std::vector<float> out(65536);
    widen_kernel(format)(reinterpret_cast<const std::byte*>(all.data()), out.data(), all.size());
    const auto actual = bit_patterns(out);
    const std::size_t at = first_difference(actual, expected);
    EXPECT_EQ(at, std::string::npos)
        << format.name << ", " << isa_label(isa) << ": 0x" << std::hex << at << " gave 0x"
        << actual[at] << ", expected 0x" << expected[at];
    // The typed convert.h entry point runs the same kernels.
    std::vector<float> typed_out(65536);
    if (&format == &kBinary16) {
      kernels::cpu::f16_to_f32(all.data(), typed_out.data(), all.size());
    } else {
      kernels::cpu::bf16_to_f32(all.data(), typed_out.data(), all.size());
    }
    EXPECT_EQ(first_difference(bit_patterns(typed_out), expected), std::string::npos)
        << format.name << ", " << isa_label(isa) << ": convert.h entry point";
  }
}

TEST(CastKernels, F16ToF32IsExactForAll65536PatternsOnEveryIsa) {
  expect_widening_exhaustive(kBinary16);
}

TEST(CastKernels, Bf16ToF32IsExactForAll65536PatternsOnEveryIsa) {
  expect_widening_exhaustive(kBfloat16);
}

// Every non-NaN 16-bit value survives widen -> round unchanged; NaNs come back quiet.
TEST(CastKernels, WidenThenRoundIsTheIdentityExceptNanQuieting) {
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    std::vector<float> widened(65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      widened[bits] = reference_widen(*format, static_cast<std::uint16_t>(bits));
    }
    const std::uint16_t quiet_bit = static_cast<std::uint16_t>(1u << (format->fraction_bits - 1));
    for (Isa isa : runnable_isas()) {
      IsaScope scope(isa);
      const auto back = narrow(*format, widened);
      for (std::uint32_t bits = 0; bits < 65536; ++bits) {
        const auto expected =
            static_cast<std::uint16_t>(std::isnan(widened[bits]) ? bits | quiet_bit : bits);
        if (back[bits] != expected) {
          ADD_FAILURE() << format->name << ", " << isa_label(isa) << ": 0x" << std::hex << bits
                        << " came back as 0x" << back[bits];
          break;
        }
      }
    }
  }
}

// ---- narrowing: boundaries, ties, sweep --------------------------------------------------------

struct NarrowCase {
  float value;
  std::uint16_t bits;
  const char* why;
};

void expect_cases(const Format16& format, const std::vector<NarrowCase>& cases) {
  std::vector<float> values;
  for (const auto& c : cases) values.push_back(c.value);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(reference_round(format, cases[i].value), cases[i].bits)
        << "reference: " << cases[i].why;
  }
  for (Isa isa : runnable_isas()) {
    IsaScope scope(isa);
    // Each case alone (a tail), all together, and filling 2 x 64 + 1 elements (every lane of
    // the unrolled loop, the single-vector loop and the tail).
    const auto together = narrow(format, values);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const auto alone = narrow(format, {cases[i].value});
      EXPECT_EQ(alone[0], cases[i].bits) << isa_label(isa) << ": " << cases[i].why;
      EXPECT_EQ(together[i], cases[i].bits) << isa_label(isa) << ": " << cases[i].why;
      const auto filled = narrow(format, std::vector<float>(129, cases[i].value));
      EXPECT_EQ(filled, std::vector<std::uint16_t>(129, cases[i].bits))
          << isa_label(isa) << ": " << cases[i].why;
    }
  }
}

TEST(CastKernels, F32ToF16BoundaryValues) {
  const float inf = std::numeric_limits<float>::infinity();
  expect_cases(
      kBinary16,
      {
          {65504.0f, 0x7BFF, "max half"},
          {-65504.0f, 0xFBFF, "-max half"},
          {65519.99f, 0x7BFF, "just below the overflow threshold"},
          // Finite values that IEEE RNE would carry to Inf saturate (cast_math.h).
          {65520.0f, 0x7BFF, "65520 (IEEE: ties to even, inf) saturates"},
          {-65520.0f, 0xFBFF, "-65520 saturates to -max half"},
          {65536.0f, 0x7BFF, "2^16 saturates"},
          {1e30f, 0x7BFF, "far beyond range saturates"},
          {-std::numeric_limits<float>::max(), 0xFBFF, "-FLT_MAX saturates"},
          {std::ldexp(1.0f, -24), 0x0001, "smallest subnormal 2^-24"},
          {std::ldexp(1.0f, -25), 0x0000, "2^-25 ties to 0"},
          {-std::ldexp(1.0f, -25), 0x8000, "-2^-25 ties to -0"},
          {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001, "just above 2^-25"},
          {std::nextafter(std::ldexp(1.0f, -25), 0.0f), 0x0000, "just below 2^-25"},
          {std::ldexp(3.0f, -25), 0x0002, "1.5 x 2^-24 ties to even 2"},
          {std::ldexp(5.0f, -25), 0x0002, "2.5 x 2^-24 ties to even 2"},
          {std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 0x0400,
           "halfway between the largest subnormal and 2^-14: even is the normal"},
          {std::ldexp(1.0f, -14), 0x0400, "smallest normal"},
          {1.0f + std::ldexp(1.0f, -11), 0x3C00, "1 + half ulp ties to 1"},
          {1.0f + std::ldexp(3.0f, -11), 0x3C02, "1 + 1.5 ulp ties to even"},
          {std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f), 0x3C01, "just above a tie"},
          {kernels::bits_float(0x00000001u), 0x0000, "f32 denormal"},
          {kernels::bits_float(0x80000001u), 0x8000, "negative f32 denormal"},
          {0.0f, 0x0000, "+0"},
          {-0.0f, 0x8000, "-0"},
          {inf, 0x7C00, "+inf"},
          {-inf, 0xFC00, "-inf"},
          {kernels::bits_float(0x7FC00000u), 0x7E00, "quiet NaN"},
          {kernels::bits_float(0xFFC00000u), 0xFE00, "negative quiet NaN"},
          {kernels::bits_float(0x7F800001u), 0x7E00, "signalling NaN, payload below f16's bits: quiet"},
          {kernels::bits_float(0x7FA00000u), 0x7F00, "signalling NaN, payload kept, quiet bit set"},
          {kernels::bits_float(0xFFFFE000u), 0xFFFF, "NaN with every payload bit"},
      });
}

// Stores into f16 / bf16 tensors (store_from_f32: a collective's result, a decode's output)
// round as IEEE 754 does: beyond the range to +-Inf, like PyTorch's .half() and all-reduce, so
// that a loss scaler sees the overflow; every other value as the payload conversion does.
TEST(CastKernels, TensorStoresRoundBeyondTheRangeToInfinityOnEveryIsa) {
  std::vector<float> values = special_values();
  // Around both overflow edges, and a run long enough for every vector path and its tail.
  for (std::uint32_t bits = 0x477FE000u - 64; bits < 0x477FF000u + 64; bits += 7) {
    values.push_back(kernels::bits_float(bits));
    values.push_back(-kernels::bits_float(bits));
  }
  for (std::uint32_t bits = 0x7F7F7F00u; bits < 0x7F800000u; bits += 13) values.push_back(kernels::bits_float(bits));
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    const DType dtype = format == &kBinary16 ? DType::f16 : DType::bf16;
    std::vector<std::uint16_t> expected(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      expected[i] = reference_round(*format, values[i], /*saturate=*/false);
    for (Isa isa : runnable_isas()) {
      IsaScope scope(isa);
      // Odd offsets and lengths: the stores start inside the tensor.
      std::vector<std::uint16_t> out(values.size() + 3, 0xABCD);
      kernels::cpu::store_from_f32(values.data(), values.size(),
                                   TensorView{out.data(), out.size(), dtype, Device{}}, 3);
      const std::vector<std::uint16_t> stored(out.begin() + 3, out.end());
      const std::size_t at = first_difference(stored, expected);
      EXPECT_EQ(at, std::string::npos)
          << format->name << ", " << isa_label(isa) << ": f32 0x" << std::hex
          << kernels::float_bits(values[at]) << " gave 0x" << stored[at] << ", expected 0x" << expected[at];
      EXPECT_EQ(out[0], 0xABCD);
    }
  }
  // Hand-derived: the edges, against the payload conversion's saturation.
  EXPECT_EQ(kernels::f32_to_f16_bits_ieee(65519.99f), 0x7BFF);
  EXPECT_EQ(kernels::f32_to_f16_bits_ieee(65520.0f), 0x7C00);
  EXPECT_EQ(kernels::f32_to_f16_bits_ieee(-1.0e9f), 0xFC00);
  EXPECT_EQ(kernels::f32_to_f16_bits(65520.0f), 0x7BFF);
  EXPECT_EQ(kernels::f32_to_bf16_bits_ieee(kernels::bits_float(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(kernels::f32_to_bf16_bits_ieee(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(kernels::f32_to_bf16_bits_ieee(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(kernels::f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F7F);
  EXPECT_EQ(reference_round(kBinary16, 65520.0f, /*saturate=*/false), 0x7C00);
}

TEST(CastKernels, F32ToBf16BoundaryValues) {
  const float inf = std::numeric_limits<float>::infinity();
  expect_cases(
      kBfloat16,
      {
          {1.0f + std::ldexp(1.0f, -8), 0x3F80, "1 + half ulp ties to 1"},
          {1.0f + std::ldexp(3.0f, -8), 0x3F82, "1 + 1.5 ulp ties to even"},
          {std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f), 0x3F81, "just above a tie"},
          {kernels::bits_float(0x7F7F0000u), 0x7F7F, "largest finite bf16"},
          {kernels::bits_float(0x7F7F7FFFu), 0x7F7F, "just below the overflow tie"},
          // Finite values that IEEE RNE would carry to Inf saturate (cast_math.h).
          {kernels::bits_float(0x7F7F7FFFu), 0x7F7F, "just below the overflow tie: max bf16"},
          {kernels::bits_float(0x7F7F8000u), 0x7F7F, "overflow tie (IEEE: inf) saturates"},
          {std::numeric_limits<float>::max(), 0x7F7F, "FLT_MAX saturates"},
          {-std::numeric_limits<float>::max(), 0xFF7F, "-FLT_MAX saturates"},
          {kernels::bits_float(0x00000001u), 0x0000, "smallest f32 denormal"},
          {kernels::bits_float(0x00008000u), 0x0000, "denormal tie to 0 (even)"},
          {kernels::bits_float(0x00008001u), 0x0001, "denormal just above a tie"},
          {kernels::bits_float(0x00018000u), 0x0002, "denormal tie to even 2"},
          {kernels::bits_float(0x007FFFFFu), 0x0080, "largest denormal rounds up to the smallest normal"},
          {kernels::bits_float(0x80808000u), 0x8080, "negative normal tie to even"},
          {0.0f, 0x0000, "+0"},
          {-0.0f, 0x8000, "-0"},
          {inf, 0x7F80, "+inf"},
          {-inf, 0xFF80, "-inf"},
          {kernels::bits_float(0x7FC00000u), 0x7FC0, "quiet NaN"},
          {kernels::bits_float(0x7F800001u), 0x7FC0, "signalling NaN, low payload: quiet"},
          {kernels::bits_float(0x7F810000u), 0x7FC1, "signalling NaN, payload kept, quiet bit set"},
          {kernels::bits_float(0xFFFFFFFFu), 0xFFFF, "NaN with every payload bit (no carry into the sign)"},
      });
}

// For every pair of adjacent finite 16-bit values, the f32 midpoint rounds to the even one and
// its f32 neighbours round to the nearer one. Midpoints of binary16 (11 significant bits) and
// bfloat16 (8) values are exact in f32 (24).
TEST(CastKernels, EveryMidpointRoundsToEvenAndItsNeighboursToTheNearer) {
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    const std::uint16_t largest_finite = format == &kBinary16 ? 0x7BFF : 0x7F7F;
    std::vector<float> values;
    std::vector<std::uint16_t> expected;
    for (std::uint32_t low = 0; low <= largest_finite; ++low) {
      const auto high = static_cast<std::uint16_t>(low + 1);  // +inf after the largest finite
      const double low_value = reference_widen(*format, static_cast<std::uint16_t>(low));
      const double high_value = high == largest_finite + 1
                                    ? std::ldexp(1.0, format->bias + 1)  // where inf "starts"
                                    : static_cast<double>(reference_widen(*format, high));
      const auto midpoint = static_cast<float>((low_value + high_value) / 2);  // exact
      // Past the largest finite value the result saturates (cast_math.h): what IEEE rounds
      // to inf comes out as the largest finite value.
      const auto up = static_cast<std::uint16_t>(high == largest_finite + 1 ? largest_finite : high);
      const auto even = static_cast<std::uint16_t>((low & 1u) == 0 ? low : up);
      for (const std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
        const float signed_midpoint = sign ? -midpoint : midpoint;
        const float outward = std::nextafter(signed_midpoint, sign ? -INFINITY : INFINITY);
        const float inward = std::nextafter(signed_midpoint, 0.0f);
        values.insert(values.end(), {signed_midpoint, outward, inward});
        expected.insert(expected.end(), {static_cast<std::uint16_t>(sign | even),
                                         static_cast<std::uint16_t>(sign | up),
                                         static_cast<std::uint16_t>(sign | low)});
      }
    }
    for (Isa isa : runnable_isas()) {
      IsaScope scope(isa);
      const auto actual = narrow(*format, values);
      const std::size_t at = first_difference(actual, expected);
      EXPECT_EQ(at, std::string::npos)
          << format->name << ", " << isa_label(isa) << ": f32 0x" << std::hex << kernels::float_bits(values[at])
          << " gave 0x" << actual[at] << ", expected 0x" << expected[at];
    }
  }
}

// Every 1021st f32 bit pattern (4.2 million, every sign/exponent/fraction region including
// NaNs and denormals) against the reference, for both formats and every ISA.
TEST(CastKernels, SweepOfF32BitPatternsMatchesTheReference) {
  constexpr std::uint64_t kStride = 1021;
  std::vector<float> values;
  values.reserve((std::uint64_t{1} << 32) / kStride + 1);
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += kStride) {
    values.push_back(kernels::bits_float(static_cast<std::uint32_t>(bits)));
  }
  const auto specials = special_values();
  values.insert(values.end(), specials.begin(), specials.end());
  expect_narrowing_matches_reference(kBinary16, values);
  expect_narrowing_matches_reference(kBfloat16, values);
}

// ---- every ISA, every length, any alignment ---------------------------------------------------

// Data for the length test: specials first (so short lengths see them), then a mix of normal,
// binary16-subnormal and out-of-binary16-range values.
std::vector<float> mixed_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values = testing::gaussian(count, seed);
  const auto specials = special_values();
  for (std::size_t i = 0; i < count; ++i) {
    if (i < specials.size()) {
      values[i] = specials[i];
    } else if (i % 5 == 0) {
      values[i] = std::ldexp(values[i], -18);  // binary16 subnormal range
    } else if (i % 7 == 0) {
      values[i] = std::ldexp(values[i], 15);  // near or beyond binary16's largest value
    } else if (i % 11 == 0) {
      values[i] = specials[i % specials.size()];
    }
  }
  return values;
}

// Runs each kernel on a 16-bit side starting one byte past an even address (the vector paths
// use unaligned accesses; the scalar path must not form a misaligned pointer) and checks that
// every ISA writes the same bits and nothing past `count`.
TEST(CastKernels, EveryIsaGivesIdenticalBitsForOddLengthsAndMisalignedBuffers) {
  constexpr std::byte kGuard{0xA5};
  constexpr std::size_t kGuardElements = 24;  // more than one vector of slack
  const std::size_t lengths[] = {0, 1, 2, 7, 15, 16, 17, 31, 33, 63, 65, 1000, (1u << 20) + 3};
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    for (std::size_t count : lengths) {
      SCOPED_TRACE(std::string(format->name) + ", count " + std::to_string(count));
      const auto values = mixed_values(count, 17 + count);
      const auto start_acc = testing::gaussian(count, 99 + count);
      std::vector<std::uint16_t> expected_narrow(count);
      for (std::size_t i = 0; i < count; ++i)
        expected_narrow[i] = reference_round(*format, values[i]);
      std::vector<std::uint32_t> expected_widen(count);
      std::vector<std::uint32_t> expected_sum(count);
      for (std::size_t i = 0; i < count; ++i) {
        const float widened = reference_widen(*format, expected_narrow[i]);
        expected_widen[i] = kernels::float_bits(widened);
        expected_sum[i] = kernels::float_bits(start_acc[i] + widened);  // the one IEEE add decode_add does
      }
      for (Isa isa : runnable_isas()) {
        SCOPED_TRACE(isa_label(isa));
        IsaScope scope(isa);
        // Narrow into bytes [1, 1 + 2 count) of a guarded buffer.
        std::vector<std::byte> buffer(1 + 2 * (count + kGuardElements), kGuard);
        std::byte* out16 = buffer.data() + 1;
        narrow_kernel (*format)(values.data(), out16, count);
        std::vector<std::uint16_t> narrowed(count);
        for (std::size_t i = 0; i < count; ++i) narrowed[i] = load16(out16, i);
        const std::size_t at = first_difference(narrowed, expected_narrow);
        EXPECT_EQ(at, std::string::npos) << "narrow: element " << at;
        for (std::size_t b = 1 + 2 * count; b < buffer.size(); ++b) {
          ASSERT_EQ(buffer[b], kGuard) << "narrow wrote past the end, byte " << b - 1 - 2 * count;
        }
        ASSERT_EQ(buffer[0], kGuard) << "narrow wrote before the start";

        // Widen from the misaligned bytes into a guarded f32 buffer.
        std::vector<float> widened(count + kGuardElements, kernels::bits_float(0x7FBADBADu));
        widen_kernel (*format)(out16, widened.data(), count);
        auto widened_bits = bit_patterns(widened);
        for (std::size_t i = count; i < widened_bits.size(); ++i) {
          ASSERT_EQ(widened_bits[i], 0x7FBADBADu) << "widen wrote past the end, element " << i;
        }
        widened_bits.resize(count);
        EXPECT_EQ(first_difference(widened_bits, expected_widen), std::string::npos) << "widen";

        // Add into a guarded accumulator.
        std::vector<float> acc(start_acc);
        acc.resize(count + kGuardElements, kernels::bits_float(0x7FBADBADu));
        add_kernel (*format)(out16, acc.data(), count);
        auto acc_bits = bit_patterns(acc);
        for (std::size_t i = count; i < acc_bits.size(); ++i) {
          ASSERT_EQ(acc_bits[i], 0x7FBADBADu) << "add wrote past the end, element " << i;
        }
        acc_bits.resize(count);
        EXPECT_EQ(first_difference(acc_bits, expected_sum), std::string::npos) << "add";
      }
    }
  }
}

// Forces streaming (non-temporal) stores for every output large enough to hold an aligned
// block, for the lifetime of the object.
class StreamEverythingScope {
 public:
  StreamEverythingScope() { kernels::cpu::set_streaming_min_bytes(0); }
  ~StreamEverythingScope() { kernels::cpu::reset_streaming_min_bytes(); }
  StreamEverythingScope(const StreamEverythingScope&) = delete;
  StreamEverythingScope& operator=(const StreamEverythingScope&) = delete;
};

// Large outputs are written with streaming stores after a cached head that reaches a 64-byte
// boundary; with the threshold forced to 0, every split of head / streamed body / cached rest
// shows up across these counts and output offsets, and must give the reference bits.
TEST(CastKernels, StreamingStoresGiveTheSameBitsForEveryHeadAndTailSplit) {
  StreamEverythingScope stream_everything;
  constexpr std::byte kGuard{0x5A};
  const std::size_t counts[] = {63, 64, 65, 127, 200, 1003};
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    for (std::size_t count : counts) {
      const auto values = mixed_values(count, 23 + count);
      std::vector<std::uint16_t> expected_narrow(count);
      std::vector<std::uint32_t> expected_widen(count);
      for (std::size_t i = 0; i < count; ++i) {
        expected_narrow[i] = reference_round(*format, values[i]);
        expected_widen[i] = kernels::float_bits(reference_widen(*format, expected_narrow[i]));
      }
      for (Isa isa : runnable_isas()) {
        IsaScope scope(isa);
        // 16-bit outputs at every even offset within a line (odd offsets cannot be streamed).
        for (std::size_t offset = 0; offset < 64; offset += 2) {
          SCOPED_TRACE(std::string(format->name) + ", count " + std::to_string(count) + ", " +
                       isa_label(isa) + ", 16-bit offset " + std::to_string(offset));
          std::vector<std::byte> storage(2 * count + 192, kGuard);
          auto* line = reinterpret_cast<std::byte*>(
              (reinterpret_cast<std::uintptr_t>(storage.data()) + 63) / 64 * 64);
          std::byte* out16 = line + offset;
          narrow_kernel (*format)(values.data(), out16, count);
          std::vector<std::uint16_t> narrowed(count);
          for (std::size_t i = 0; i < count; ++i) narrowed[i] = load16(out16, i);
          EXPECT_EQ(first_difference(narrowed, expected_narrow), std::string::npos) << "narrow";
          for (std::byte* b = storage.data(); b < out16; ++b) ASSERT_EQ(*b, kGuard) << "before";
          for (std::byte* b = out16 + 2 * count; b < storage.data() + storage.size(); ++b) {
            ASSERT_EQ(*b, kGuard) << "after";
          }
          // Widen from there into f32 outputs at every float offset within a line.
          if (offset % 4 != 0) continue;
          std::vector<float> widened_storage(count + 48, kernels::bits_float(0x7FBADBADu));
          auto* widened = reinterpret_cast<float*>(
              (reinterpret_cast<std::uintptr_t>(widened_storage.data()) + 63) / 64 * 64 + offset);
          widen_kernel (*format)(out16, widened, count);
          std::vector<std::uint32_t> widened_bits(count);
          for (std::size_t i = 0; i < count; ++i) widened_bits[i] = kernels::float_bits(widened[i]);
          EXPECT_EQ(first_difference(widened_bits, expected_widen), std::string::npos) << "widen";
          for (const float* f = widened_storage.data(); f < widened; ++f) {
            ASSERT_EQ(kernels::float_bits(*f), 0x7FBADBADu) << "widen wrote before the start";
          }
          for (const float* f = widened + count;
               f < widened_storage.data() + widened_storage.size(); ++f) {
            ASSERT_EQ(kernels::float_bits(*f), 0x7FBADBADu) << "widen wrote past the end";
          }
        }
      }
    }
  }
}

// The conversions are integer math or F16C with an explicit rounding immediate: neither the
// MXCSR rounding mode nor flush-to-zero / denormals-are-zero may change a result.
TEST(CastKernels, ResultsDoNotDependOnMxcsrRoundingOrFlushModes) {
#if defined(__x86_64__) || defined(__i386__)
  const auto values = mixed_values(4099, 5);
  std::vector<std::uint16_t> halves(65536);
  for (std::uint32_t bits = 0; bits < 65536; ++bits)
    halves[bits] = static_cast<std::uint16_t>(bits);
  for (const Format16* format : {&kBinary16, &kBfloat16}) {
    std::vector<std::uint16_t> expected_narrow(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      expected_narrow[i] = reference_round(*format, values[i]);
    std::vector<std::uint32_t> expected_widen(65536);
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      expected_widen[bits] = kernels::float_bits(reference_widen(*format, static_cast<std::uint16_t>(bits)));
    }
    for (Isa isa : runnable_isas()) {
      IsaScope scope(isa);
      for (const unsigned mode : {_MM_ROUND_TOWARD_ZERO | _MM_FLUSH_ZERO_ON | 0x0040u /*DAZ*/,
                                  unsigned{_MM_ROUND_UP}, unsigned{_MM_ROUND_DOWN}}) {
        const unsigned saved = _mm_getcsr();
        _mm_setcsr((saved & ~0xE040u) | mode);
        const auto narrowed = narrow(*format, values);
        std::vector<float> widened(65536);
        widen_kernel (*format)(reinterpret_cast<const std::byte*>(halves.data()), widened.data(),
                               halves.size());
        _mm_setcsr(saved);
        const std::size_t at = first_difference(narrowed, expected_narrow);
        EXPECT_EQ(at, std::string::npos)
            << format->name << ", " << isa_label(isa) << ", MXCSR mode 0x" << std::hex << mode
            << ": narrow element " << std::dec << at;
        const std::size_t widen_at = first_difference(bit_patterns(widened), expected_widen);
        EXPECT_EQ(widen_at, std::string::npos)
            << format->name << ", " << isa_label(isa) << ", MXCSR mode 0x" << std::hex << mode
            << ": widen pattern 0x" << widen_at;
      }
    }
  }
#else
  GTEST_SKIP() << "MXCSR exists on x86 only";
#endif
}

// ---- the codecs --------------------------------------------------------------------------------

struct CodecUnderTest {
  const char* spec;
  DType format;
  WireCodec wire;
};
constexpr CodecUnderTest kCodecs[] = {{"fp16", DType::f16, WireCodec::fp16},
                                      {"bf16", DType::bf16, WireCodec::bf16}};

// The raw bytes of a tensor's elements.
std::vector<std::byte> raw_bytes(const testing::HostTensor& tensor) {
  const auto view = tensor.view();
  const auto* begin = static_cast<const std::byte*>(view.data);
  return std::vector<std::byte>(begin, begin + view.size_bytes());
}

// The bytes `dtype` holds for the f32 `value`: exact for f32, reference rounding otherwise
// (saturating for a payload, IEEE for a tensor: kernels/cast_math.h).
void put_reference(DType dtype, float value, std::byte* out, std::size_t i, bool saturate) {
  if (dtype == DType::f32) {
    std::memcpy(out + 4 * i, &value, 4);
  } else {
    store16(out, i, reference_round(format_of(dtype), value, saturate));
  }
}

// Entry b (dtype_size(to) bytes at b * dtype_size(to)): what `to` holds for the 16-bit pattern b
// of `from` widened exactly: a payload of `to` (`saturate`) or a tensor of `to`. The reference
// applied once per pattern instead of once per element, each table built once per process.
const std::vector<std::byte>& reference_table(const Format16& from, DType to, bool saturate) {
  static std::vector<std::byte> tables[2][3][2];
  auto& table = tables[&from == &kBinary16 ? 0 : 1][static_cast<int>(to)][saturate ? 1 : 0];
  if (table.empty()) {
    table.resize(65536 * dtype_size(to));
    for (std::uint32_t bits = 0; bits < 65536; ++bits) {
      put_reference(to, reference_widen(from, static_cast<std::uint16_t>(bits)), table.data(),
                    bits, saturate);
    }
  }
  return table;
}

// For every codec x count x input dtype x output dtype: the payload is the reference rounding of
// the input's exact f32 value, and decode writes the reference conversion of the payload's exact
// f32 value. Both are exact expectations (no tolerance): the casts are deterministic functions.
TEST(CastCodec, RoundTripMatchesTheReferenceForEveryCountInputAndOutputDtype) {
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    const Format16& format = format_of(tested.format);
    for (std::size_t count : testing::kTestCounts) {
      const auto values = mixed_values(count, 3 + count);
      for (DType in_dtype : testing::kTestDTypes) {
        SCOPED_TRACE(std::string(tested.spec) + ", count " + std::to_string(count) + ", input " +
                     std::string(dtype_name(in_dtype)));
        const testing::HostTensor input(in_dtype, values);
        const auto input_bytes = raw_bytes(input);
        const auto message = testing::encode_message(*codec, input.view());
        ASSERT_EQ(message.size(), kWireHeaderBytes + 2 * count);
        std::vector<std::uint16_t> expected_payload(count);
        if (in_dtype == DType::f32) {
          for (std::size_t i = 0; i < count; ++i)
            expected_payload[i] = reference_round(format, values[i]);
        } else {
          const auto& recast = reference_table(format_of(in_dtype), tested.format, /*saturate=*/true);
          for (std::size_t i = 0; i < count; ++i) {
            expected_payload[i] = load16(recast.data(), load16(input_bytes.data(), i));
          }
        }
        std::vector<std::uint16_t> payload(count);
        if (count > 0) std::memcpy(payload.data(), message.data() + kWireHeaderBytes, 2 * count);
        const std::size_t at = first_difference(payload, expected_payload);
        ASSERT_EQ(at, std::string::npos) << "payload element " << at << ": input " << input.at(at);

        for (DType out_dtype : testing::kTestDTypes) {
          testing::HostTensor output(out_dtype, count);
          codec->decode(message, output.view());
          // Decoding writes a tensor: IEEE rounding (a bf16 payload beyond f16's range: Inf).
          const auto& table = reference_table(format, out_dtype, /*saturate=*/false);
          const std::size_t size = dtype_size(out_dtype);
          std::vector<std::byte> expected(count * size);
          for (std::size_t i = 0; i < count; ++i) {
            std::memcpy(expected.data() + i * size, table.data() + payload[i] * size, size);
          }
          const auto actual = raw_bytes(output);
          EXPECT_TRUE(actual == expected)
              << "decode into " << dtype_name(out_dtype) << ": first byte "
              << first_difference(actual, expected) << " differs";
        }
      }
    }
  }
}

// acc[i] + decoded[i] is one IEEE f32 add; the expectation performs the same add.
TEST(CastCodec, DecodeAddAddsTheExactDecodedValues) {
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    const Format16& format = format_of(tested.format);
    for (std::size_t count : testing::kTestCounts) {
      SCOPED_TRACE(std::string(tested.spec) + ", count " + std::to_string(count));
      const auto values = mixed_values(count, 7 + count);
      const auto message = testing::encode_message(*codec, host_view(values.data(), count));
      std::vector<float> acc = testing::gaussian(count, 8 + count, 4.0f);
      std::vector<std::uint32_t> expected(count);
      for (std::size_t i = 0; i < count; ++i) {
        expected[i] = kernels::float_bits(acc[i] + reference_widen(format, reference_round(format, values[i])));
      }
      codec->decode_add(message, acc.data(), count);
      EXPECT_EQ(first_difference(bit_patterns(acc), expected), std::string::npos);
    }
  }
}

TEST(CastCodec, MessageLayoutIsTheDocumentedOne) {
  const float values[] = {1.0f, -2.0f, 65520.0f};
  // fp16: 1 -> 0x3C00, -2 -> 0xC000, 65520 -> 0x7BFF (saturated; IEEE would give inf);
  // bf16: 0x3F80, 0xC000, 0x4780.
  const unsigned char fp16_payload[] = {0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B};
  const unsigned char bf16_payload[] = {0x80, 0x3F, 0x00, 0xC0, 0x80, 0x47};
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    const auto message = testing::encode_message(*codec, host_view(values, 3));
    ASSERT_EQ(message.size(), kWireHeaderBytes + 6);
    const WireHeader header = compressors::read_header(message, "test");
    EXPECT_EQ(header.codec, tested.wire);
    EXPECT_EQ(header.flags, 0);
    EXPECT_EQ(header.small_param, 0);
    EXPECT_EQ(header.count, 3u);
    EXPECT_EQ(header.payload_bytes, 6u);
    EXPECT_EQ(header.large_param, 0u);
    const unsigned char* expected = tested.format == DType::f16 ? fp16_payload : bf16_payload;
    EXPECT_EQ(std::memcmp(message.data() + kWireHeaderBytes, expected, 6), 0) << tested.spec;
  }
}

TEST(CastCodec, DescribesItself) {
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    EXPECT_TRUE(codec->additive()) << tested.spec;
    EXPECT_FALSE(codec->sparse()) << tested.spec;
    EXPECT_EQ(codec->spec().codec, tested.format == DType::f16 ? CodecKind::fp16 : CodecKind::bf16);
    EXPECT_EQ(codec->max_encoded_bytes(0), kWireHeaderBytes);
    EXPECT_EQ(codec->max_encoded_bytes(1001), kWireHeaderBytes + 2002);
    EXPECT_EQ(testing::error_code_of([&] { codec->max_encoded_bytes(std::numeric_limits<std::size_t>::max()); }),
              ErrorCode::invalid_argument);
  }
}

// Same input twice, under every ISA, with cached or streaming stores: the same message bytes and
// the same decoded bytes.
TEST(CastCodec, EncodeAndDecodeAreByteIdenticalAcrossRunsAndIsas) {
  const std::size_t count = (std::size_t{1} << 20) + 3;
  const auto values = mixed_values(count, 11);
  for (const auto& tested : kCodecs) {
    SCOPED_TRACE(tested.spec);
    const auto codec = make_codec(tested.spec);
    const auto reference_message = testing::encode_message(*codec, host_view(values.data(), count));
    std::vector<float> reference_decoded(count);
    {
      IsaScope scope(Isa::scalar);
      codec->decode(reference_message, host_view(reference_decoded.data(), count));
    }
    for (Isa isa : runnable_isas()) {
      for (const bool stream_everything : {false, true}) {
        SCOPED_TRACE(isa_label(isa) + (stream_everything ? ", streaming stores" : ""));
        IsaScope scope(isa);
        std::optional<StreamEverythingScope> streaming;
        if (stream_everything) streaming.emplace();
        for (int run = 0; run < 2; ++run) {
          EXPECT_TRUE(testing::encode_message(*codec, host_view(values.data(), count)) ==
                      reference_message);
        }
        std::vector<float> decoded(count);
        codec->decode(reference_message, host_view(decoded.data(), count));
        EXPECT_EQ(first_difference(bit_patterns(decoded), bit_patterns(reference_decoded)),
                  std::string::npos);
      }
    }
  }
}

// Messages sit at any byte offset of send and receive buffers.
TEST(CastCodec, EncodesAndDecodesAtAnyAlignment) {
  const std::size_t count = 1000;
  const auto values = mixed_values(count, 13);
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    const auto aligned = testing::encode_message(*codec, host_view(values.data(), count));
    const auto expected = testing::decode_to_f32(*codec, aligned, count);
    for (std::size_t offset : {1, 3}) {
      SCOPED_TRACE(std::string(tested.spec) + ", offset " + std::to_string(offset));
      std::vector<std::byte> buffer(offset + aligned.size());
      const std::span<std::byte> shifted(buffer.data() + offset, aligned.size());
      ASSERT_EQ(codec->encode(host_view(values.data(), count), shifted, {}), aligned.size());
      EXPECT_EQ(std::memcmp(shifted.data(), aligned.data(), aligned.size()), 0);
      const auto decoded = testing::decode_to_f32(*codec, shifted, count);
      EXPECT_EQ(first_difference(bit_patterns(decoded), bit_patterns(expected)), std::string::npos);
      std::vector<float> acc(count, 0.5f);
      codec->decode_add(shifted, acc.data(), count);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(kernels::float_bits(acc[i]), kernels::float_bits(0.5f + expected[i])) << "element " << i;
      }
    }
  }
}

// The documented special-value rules, through the codec.
TEST(CastCodec, SpecialValuesFollowTheDocumentedRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float values[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -0.0f, 1e6f, -1e6f};
  for (const auto& tested : kCodecs) {
    SCOPED_TRACE(tested.spec);
    const auto codec = make_codec(tested.spec);
    const auto message = testing::encode_message(*codec, host_view(values, 6));
    const auto decoded = testing::decode_to_f32(*codec, message, 6);
    EXPECT_EQ(decoded[0], inf);
    EXPECT_EQ(decoded[1], -inf);
    EXPECT_TRUE(std::isnan(decoded[2]));
    EXPECT_EQ(kernels::float_bits(decoded[3]), 0x80000000u);
    if (tested.format == DType::f16) {  // beyond binary16's range: saturated, finite
      EXPECT_EQ(decoded[4], 65504.0f);
      EXPECT_EQ(decoded[5], -65504.0f);
    } else {  // 1e6 = 0x49742400 -> bf16 0x4974 (the dropped half 0x2400 < 0x8000)
      EXPECT_EQ(kernels::float_bits(decoded[4]), 0x49740000u);
      EXPECT_EQ(kernels::float_bits(decoded[5]), 0xC9740000u);
    }
  }
}

// Bit-for-bit copies where input or output already is the codec's format, signalling NaNs
// included (the documented exception to "decode = RNE of the decoded f32").
TEST(CastCodec, SameFormatInputAndOutputAreCopiedBitForBit) {
  for (const auto& tested : kCodecs) {
    SCOPED_TRACE(tested.spec);
    const auto codec = make_codec(tested.spec);
    const std::uint16_t signalling_nan = tested.format == DType::f16 ? 0x7C01 : 0x7F81;
    const std::vector<std::uint16_t> input = {0x0001, 0x8000, signalling_nan, 0x1234, 0xFBFF};
    const ConstTensorView view(input.data(), input.size(), tested.format);
    const auto message = testing::encode_message(*codec, view);
    EXPECT_EQ(std::memcmp(message.data() + kWireHeaderBytes, input.data(), 2 * input.size()), 0);
    std::vector<std::uint16_t> output(input.size());
    codec->decode(message, TensorView{output.data(), output.size(), tested.format, {}});
    EXPECT_EQ(output, input);
  }
}

// A valid message of `count` elements for `wire`, payload bytes 0x3C (a finite value in both).
std::vector<std::byte> message_for(WireCodec wire, std::size_t count, std::size_t payload_bytes) {
  std::vector<std::byte> message(kWireHeaderBytes + payload_bytes, std::byte{0x3C});
  compressors::write_header(WireHeader{wire, 0, 0, count, payload_bytes, 0}, message);
  return message;
}

// Every decode entry rejects `message` for `count` elements with malformed_message naming the
// op, and leaves the output untouched.
void expect_rejected(const Codec& codec, const std::vector<std::byte>& message, std::size_t count,
                     const std::string& what) {
  SCOPED_TRACE(codec.name() + ": " + what);
  const std::string codec_name = codec.spec().codec == CodecKind::fp16 ? "fp16" : "bf16";
  for (DType out_dtype : testing::kTestDTypes) {
    testing::HostTensor output(out_dtype, std::vector<float>(count, 7.0f));
    const auto before = raw_bytes(output);
    std::string text;
    EXPECT_EQ(testing::error_code_of([&] { codec.decode(message, output.view()); }, &text),
              ErrorCode::malformed_message);
    EXPECT_NE(text.find(codec_name + ".decode"), std::string::npos) << text;
    EXPECT_TRUE(raw_bytes(output) == before) << "decode wrote into a rejected output";
  }
  std::vector<float> acc(count, 7.0f);
  std::string text;
  EXPECT_EQ(testing::error_code_of([&] { codec.decode_add(message, acc.data(), count); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find(codec_name + ".decode_add"), std::string::npos) << text;
  EXPECT_EQ(acc, std::vector<float>(count, 7.0f)) << "decode_add wrote into a rejected acc";
}

TEST(CastCodec, RejectsAMessageOfTheOtherCodec) {
  const auto fp16 = make_codec("fp16");
  const auto bf16 = make_codec("bf16");
  const auto values = mixed_values(9, 1);
  expect_rejected(*fp16, testing::encode_message(*bf16, host_view(values.data(), 9)), 9,
                  "bf16 message");
  expect_rejected(*bf16, testing::encode_message(*fp16, host_view(values.data(), 9)), 9,
                  "fp16 message");
  expect_rejected(*fp16, message_for(WireCodec::none, 9, 18), 9, "none codec id");
}

TEST(CastCodec, RejectsMalformedHeadersAndPayloadSizes) {
  for (const auto& tested : kCodecs) {
    const auto codec = make_codec(tested.spec);
    const std::size_t count = 9;
    const auto good = message_for(tested.wire, count, 2 * count);
    // The good message decodes: the rejections below are caused by the one broken field.
    EXPECT_EQ(testing::decode_to_f32(*codec, good, count).size(), count);

    expect_rejected(*codec, good, count + 1, "count mismatch (output larger)");
    expect_rejected(*codec, good, count - 1, "count mismatch (output smaller)");
    expect_rejected(*codec, message_for(tested.wire, count, 2 * count + 2), count,
                    "payload_bytes 2n + 2, message size consistent with it");
    expect_rejected(*codec, message_for(tested.wire, count, 2 * count - 2), count,
                    "payload_bytes 2n - 2, message size consistent with it");
    expect_rejected(*codec, message_for(tested.wire, count, 2 * count + 1), count,
                    "odd payload_bytes");
    expect_rejected(*codec, message_for(tested.wire, 0, 2), 0, "payload for a count of 0");

    auto truncated = good;
    truncated.pop_back();
    expect_rejected(*codec, truncated, count, "truncated by one byte");
    auto trailing = good;
    trailing.push_back(std::byte{0});
    expect_rejected(*codec, trailing, count, "one trailing byte");
    const std::vector<std::byte> header_cut(good.begin(), good.begin() + kWireHeaderBytes - 1);
    expect_rejected(*codec, header_cut, count, "shorter than the header");
    expect_rejected(*codec, {}, count, "empty message");

    for (std::size_t offset : {6u, 7u, 24u, 31u}) {  // flags, small_param, large_param bytes
      auto bad_field = good;
      bad_field[offset] = std::byte{1};
      expect_rejected(*codec, bad_field, count,
                      "nonzero byte at header offset " + std::to_string(offset));
    }
  }
}

TEST(CastCodec, RejectsBadEncodeArguments) {
  for (const auto& tested : kCodecs) {
    SCOPED_TRACE(tested.spec);
    const auto codec = make_codec(tested.spec);
    const auto values = mixed_values(10, 2);
    std::vector<std::byte> small(codec->max_encoded_bytes(10) - 1, std::byte{0x5A});
    EXPECT_EQ(testing::error_code_of([&] { codec->encode(host_view(values.data(), 10), small, {}); }),
              ErrorCode::invalid_argument);
    EXPECT_TRUE(small == std::vector<std::byte>(small.size(), std::byte{0x5A}))
        << "encode wrote into a buffer it refused";
    std::vector<std::byte> out(codec->max_encoded_bytes(10));
    EXPECT_EQ(testing::error_code_of([&] { codec->encode(ConstTensorView(nullptr, 10, DType::f32), out, {}); }),
              ErrorCode::invalid_argument);
    const ConstTensorView on_gpu(values.data(), 10, DType::f32, Device{DeviceKind::cuda, 0});
    EXPECT_EQ(testing::error_code_of([&] { codec->encode(on_gpu, out, {}); }), testing::fake_cuda_view_error());
    const auto message = testing::encode_message(*codec, host_view(values.data(), 10));
    std::vector<float> decoded(10);
    const TensorView gpu_out{decoded.data(), 10, DType::f32, Device{DeviceKind::cuda, 0}};
    EXPECT_EQ(testing::error_code_of([&] { codec->decode(message, gpu_out); }), testing::fake_cuda_view_error());
    EXPECT_EQ(testing::error_code_of([&] { codec->decode_add(message, nullptr, 10); }),
              ErrorCode::invalid_argument);
  }
}

}  // namespace
}  // namespace gradzip
