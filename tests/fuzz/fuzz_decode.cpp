// libFuzzer target: the host decoders of every codec on arbitrary bytes.
//
// Input layout: tests/fuzz/fuzz_specs.h (spec index, output count, forced ISA, then the message).
// For each input the target runs, on an exact-size heap copy of the message:
//   decode into an f32, an f16 and a bf16 host tensor of `count` elements,
//   decode_add into an f32 accumulator (the float* overload and the TensorView overload).
// Failures (the target prints what happened and calls abort(), which libFuzzer records as a
// crash; ASan/UBSan reports are crashes too):
//   - any exception other than gradzip::Error with code malformed_message or invalid_argument;
//   - a call that throws and changes its output (every buffer is filled with a sentinel first:
//     the codec contract is "validated first; a bad message leaves `out` untouched");
//   - the five calls disagreeing on whether the message is valid, or on the error code;
//   - for an accepted message: the f16 / bf16 outputs differing from the f32 output rounded to
//     nearest even (NaN for NaN), or decode_add not giving acc[i] + decoded[i] (one f32 add,
//     NaN for NaN).
#include <cmath>
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
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "gradzip/tensor_view.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/fuzz/fuzz_specs.h"

namespace {

using gradzip::Codec;
using gradzip::DType;
using gradzip::ErrorCode;
using gradzip::TensorView;

struct Case {
  const char* spec;
  std::size_t count;
  int isa;
};

[[noreturn]] void fail(const Case& c, const std::string& what) {
  std::fprintf(stderr, "fuzz_decode FAILURE: spec '%s', count %zu, isa %d: %s\n", c.spec, c.count,
               c.isa, what.c_str());
  std::abort();
}

const std::vector<std::unique_ptr<Codec>>& codecs() {
  static const std::vector<std::unique_ptr<Codec>> all = [] {
    std::vector<std::unique_ptr<Codec>> made;
    for (const char* spec : gradzip::fuzz::kFuzzSpecs) made.push_back(gradzip::make_codec(spec));
    return made;
  }();
  return all;
}

// Runs `call`; returns the code of the gradzip::Error it threw (nullopt when it returned).
// Anything else thrown, or an unexpected code, fails the case.
template <typename Call>
std::optional<ErrorCode> outcome(const Case& c, const char* op, Call&& call) {
  try {
    call();
    return std::nullopt;
  } catch (const gradzip::Error& e) {
    if (e.code() != ErrorCode::malformed_message && e.code() != ErrorCode::invalid_argument) {
      fail(c, std::string(op) + " threw gradzip::Error with code " +
                  gradzip::error_code_name(e.code()) + ": " + e.what());
    }
    return e.code();
  } catch (const std::exception& e) {
    fail(c, std::string(op) + " threw a non-gradzip exception: " + e.what());
  } catch (...) {
    fail(c, std::string(op) + " threw something that is not a std::exception");
  }
}

// A heap buffer of exactly `bytes` bytes (ASan sees any access past it) filled with a sentinel.
struct Buffer {
  explicit Buffer(std::size_t bytes, std::uint8_t seed)
      : data(new std::byte[bytes == 0 ? 1 : bytes]), size(bytes), sentinel(bytes) {
    for (std::size_t i = 0; i < bytes; ++i) {
      sentinel[i] = static_cast<std::byte>((i * 37u + seed) & 0xFFu);
    }
    if (bytes != 0) std::memcpy(data.get(), sentinel.data(), bytes);
  }
  bool untouched() const { return size == 0 || std::memcmp(data.get(), sentinel.data(), size) == 0; }
  std::unique_ptr<std::byte[]> data;
  std::size_t size;
  std::vector<std::byte> sentinel;
};

// A finite accumulator pattern with no -0 (so acc + 0 keeps its bits).
float acc_start(std::size_t i) { return static_cast<float>(static_cast<int>(i % 23) - 11) * 0.375f + 0.125f; }

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

void check_consistency(const Case& c, const float* out32, const std::uint16_t* out16,
                       const std::uint16_t* outbf, const float* acc, const float* acc_view) {
  namespace k = gradzip::kernels;
  for (std::size_t i = 0; i < c.count; ++i) {
    const float value = out32[i];
    const bool nan = std::isnan(value);
    // Decoding writes a tensor: IEEE rounding, beyond the range to +-Inf (kernels/cast_math.h).
    if (nan ? !std::isnan(k::f16_bits_to_f32(out16[i]))
            : out16[i] != k::f32_to_f16_bits_ieee(value)) {
      fail(c, "f16 output " + std::to_string(out16[i]) + " at " + std::to_string(i) +
                  " is not the f32 output " + std::to_string(value) + " rounded");
    }
    if (nan ? !std::isnan(k::bf16_bits_to_f32(outbf[i]))
            : outbf[i] != k::f32_to_bf16_bits_ieee(value)) {
      fail(c, "bf16 output " + std::to_string(outbf[i]) + " at " + std::to_string(i) +
                  " is not the f32 output " + std::to_string(value) + " rounded");
    }
    const float expected = acc_start(i) + value;
    for (const float* got : {acc, acc_view}) {
      const bool ok = std::isnan(expected) ? std::isnan(got[i]) : bits_of(got[i]) == bits_of(expected);
      if (!ok) {
        fail(c, "decode_add gave " + std::to_string(got[i]) + " at " + std::to_string(i) +
                    ", expected " + std::to_string(acc_start(i)) + " + " + std::to_string(value));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gradzip::fuzz;
  if (size < kFuzzDecodePrefixBytes) return 0;
  const std::size_t spec_index = data[0] % kFuzzSpecCount;
  const std::size_t count = (std::size_t{data[1]} | (std::size_t{data[2]} << 8)) % (kFuzzMaxCount + 1);
  const int isa = data[3] % 3;
  const Case c{kFuzzSpecs[spec_index], count, isa};
  gradzip::kernels::cpu::set_isa_override(static_cast<gradzip::kernels::cpu::Isa>(isa));

  // The message in a heap block of its exact size, so over- and under-reads are reported.
  const std::size_t message_bytes = size - kFuzzDecodePrefixBytes;
  std::unique_ptr<std::byte[]> message_copy(new std::byte[message_bytes == 0 ? 1 : message_bytes]);
  if (message_bytes != 0) std::memcpy(message_copy.get(), data + kFuzzDecodePrefixBytes, message_bytes);
  const std::span<const std::byte> message(message_copy.get(), message_bytes);

  const Codec& codec = *codecs()[spec_index];
  Buffer out32(count * 4, 1), out16(count * 2, 2), outbf(count * 2, 3);
  Buffer acc(count * 4, 0), acc_view(count * 4, 0);
  for (Buffer* a : {&acc, &acc_view}) {
    for (std::size_t i = 0; i < count; ++i) {
      const float start = acc_start(i);
      std::memcpy(a->sentinel.data() + 4 * i, &start, 4);
    }
    if (count != 0) std::memcpy(a->data.get(), a->sentinel.data(), count * 4);
  }

  struct Run {
    const char* op;
    Buffer* buffer;
    std::optional<ErrorCode> code;
  };
  Run runs[] = {
      {"decode(f32)", &out32, {}},   {"decode(f16)", &out16, {}},
      {"decode(bf16)", &outbf, {}},  {"decode_add(float*)", &acc, {}},
      {"decode_add(TensorView)", &acc_view, {}},
  };
  runs[0].code = outcome(c, runs[0].op, [&] {
    codec.decode(message, TensorView{out32.data.get(), count, DType::f32, {}});
  });
  runs[1].code = outcome(c, runs[1].op, [&] {
    codec.decode(message, TensorView{out16.data.get(), count, DType::f16, {}});
  });
  runs[2].code = outcome(c, runs[2].op, [&] {
    codec.decode(message, TensorView{outbf.data.get(), count, DType::bf16, {}});
  });
  runs[3].code = outcome(c, runs[3].op, [&] {
    codec.decode_add(message, reinterpret_cast<float*>(acc.data.get()), count);
  });
  runs[4].code = outcome(c, runs[4].op, [&] {
    codec.decode_add(message, TensorView{acc_view.data.get(), count, DType::f32, {}});
  });
  gradzip::kernels::cpu::clear_isa_override();

  for (const Run& run : runs) {
    if (run.code && !run.buffer->untouched()) {
      fail(c, std::string(run.op) + " threw " + gradzip::error_code_name(*run.code) +
                  " and changed its output");
    }
    if (run.code != runs[0].code) {
      const auto name = [](const std::optional<ErrorCode>& code) {
        return std::string(code ? gradzip::error_code_name(*code) : "success");
      };
      fail(c, std::string(run.op) + " gave " + name(run.code) + " where decode(f32) gave " +
                  name(runs[0].code));
    }
  }
  if (!runs[0].code) {
    check_consistency(c, reinterpret_cast<const float*>(out32.data.get()),
                      reinterpret_cast<const std::uint16_t*>(out16.data.get()),
                      reinterpret_cast<const std::uint16_t*>(outbf.data.get()),
                      reinterpret_cast<const float*>(acc.data.get()),
                      reinterpret_cast<const float*>(acc_view.data.get()));
  }
  return 0;
}
