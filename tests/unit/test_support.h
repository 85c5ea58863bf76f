// Shared helpers of the unit tests: deterministic data and dtype plumbing.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>

#include <gtest/gtest.h>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "gradzip/tensor_view.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/fuzz/fuzz_specs.h"

namespace gradzip::testing {

// Every codec variant the edge-case and regression tests sweep: the codec conformance list
// (tests/fuzz/fuzz_specs.h; tests/unit/test_codec_conformance.cpp checks that it covers every
// element codec of the registry), so a new codec is swept here with no edit.
inline const auto& kAllCodecs = fuzz::kFuzzSpecs;

// The element counts every codec is tested over: empty, one, two, seven, a thousand, and one
// just above 2^20 (the vector loops' tails and the multi-bucket paths).
inline constexpr std::size_t kTestCounts[] = {0, 1, 2, 7, 1000, (std::size_t{1} << 20) + 3};
inline constexpr DType kTestDTypes[] = {DType::f32, DType::f16, DType::bf16};

// n samples of N(0, sigma^2) from a fixed-seed generator (same values on every run).
std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma = 1.0f);

// A tensor of `dtype` holding `values` (rounded to nearest even for f16/bf16), with accessors.
class HostTensor {
 public:
  HostTensor(DType dtype, std::size_t count);
  HostTensor(DType dtype, std::span<const float> values);

  TensorView view();
  ConstTensorView view() const;
  // Element i as f32 (exact for every dtype).
  float at(std::size_t i) const;
  std::vector<float> to_f32() const;
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  std::size_t count_;
  std::vector<std::byte> bytes_;
};

// Encodes `in` with `codec` into a message of exactly the returned size.
std::vector<std::byte> encode_message(const Codec& codec, ConstTensorView in,
                                      const EncodeContext& ctx = {});

// The code of the gradzip::Error that `call` throws (its text into *message when given);
// records a test failure and returns ErrorCode::internal when it throws none.
ErrorCode error_code_of(const std::function<void()>& call, std::string* message = nullptr);

// Decodes `message` with codec.decode and with codec.decode_add into host outputs of `count`
// elements holding 7.0f: both must throw ErrorCode::malformed_message naming the operation
// ("<codec>.decode", "<codec>.decode_add") and containing `field`, and leave every output
// element at 7.0f.
void expect_malformed(const Codec& codec, std::span<const std::byte> message, std::size_t count,
                      const std::string& field);

// A copy of `message` with the byte at `offset` set to `value`.
std::vector<std::byte> with_byte(std::span<const std::byte> message, std::size_t offset,
                                 std::uint8_t value);

// The code a codec or collective refuses a host pointer labelled as a CUDA tensor with:
// unsupported where this process cannot run CUDA work (no CUDA in the build, or no device), and
// invalid_argument ("not CUDA device memory") where it can.
ErrorCode fake_cuda_view_error();

// Bitwise equality of two f32 arrays (so -0 differs from +0 and NaNs compare by payload);
// a failure names the first element that differs.
::testing::AssertionResult same_bits(std::span<const float> actual, std::span<const float> expected);

// ceil(a / b) for b > 0.
inline std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// A payload written by a kernel launch emulated thread by thread (the fast-layout tests): each
// byte's value (0xA5 until written) and how many times it was written.
struct EmulatedPayload {
  std::vector<std::byte> bytes;
  std::vector<int> writes;

  explicit EmulatedPayload(std::size_t n) : bytes(n, std::byte{0xA5}), writes(n, 0) {}
  // bytes[at] = the low byte of `byte` (a failure when `at` is outside the payload).
  void write(std::size_t at, std::uint32_t byte);
  // The 4 little-endian bytes of f32 number b (a bucket's scale) at 4 b.
  void write_scale(std::uint64_t b, float scale);
};

// Every byte of `emulated` was written exactly once and equals the payload of `message` (what
// follows its 32-byte header); a failure names the first byte that is not, as the scale of a
// bucket (below `scale_bytes`) or as `data_name` byte j after the scales.
::testing::AssertionResult matches_message_payload(const EmulatedPayload& emulated,
                                                   std::span<const std::byte> message,
                                                   std::size_t scale_bytes, const char* data_name);

// Tests whose cases run once per instruction set: a suite `class XOnEachIsa : public
// testing::PerIsaTest {};`, `GZ_ON_EACH_ISA(XOnEachIsa);`, cases TEST_P(XOnEachIsa, Case),
// which ctest lists as Isa/XOnEachIsa.Case/scalar, /avx2 and /avx512. GetParam() is the case's
// ISA; the case forces it (ScopedIsa) where its kernels run, so references it computes before
// that run on the CPU's own ISA. A case whose ISA this CPU lacks is skipped, saying so: forcing
// it would silently run the next lower ISA, and the summary would claim a coverage it lacks.
class PerIsaTest : public ::testing::TestWithParam<kernels::cpu::Isa> {
 protected:
  void SetUp() override;
};
std::string isa_case_name(const ::testing::TestParamInfo<kernels::cpu::Isa>& info);
#define GZ_ON_EACH_ISA(Suite)                                                                \
  INSTANTIATE_TEST_SUITE_P(Isa, Suite,                                                       \
                           ::testing::Values(::gradzip::kernels::cpu::Isa::scalar,          \
                                             ::gradzip::kernels::cpu::Isa::avx2,            \
                                             ::gradzip::kernels::cpu::Isa::avx512),         \
                           ::gradzip::testing::isa_case_name)

// Forces an ISA for the lifetime of the object.
class ScopedIsa {
 public:
  explicit ScopedIsa(kernels::cpu::Isa isa) { kernels::cpu::set_isa_override(isa); }
  ~ScopedIsa() { kernels::cpu::clear_isa_override(); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
};

// Decodes `message` into a fresh f32 vector of `count` elements.
std::vector<float> decode_to_f32(const Codec& codec, std::span<const std::byte> message,
                                 std::size_t count);

// ---- checkpoint files byte by byte (error_feedback/checkpoint_file.h's formats) ---------------

// Sets the sizeof(T) bytes at `offset` to `value`, little-endian (f32 and f64 as their bits).
template <typename T>
void put_le(std::vector<unsigned char>& bytes, std::size_t offset, T value) {
  static_assert(std::is_arithmetic_v<T> && sizeof(T) <= 8);
  std::uint64_t bits = 0;
  if constexpr (std::is_same_v<T, double>) {
    bits = std::bit_cast<std::uint64_t>(value);
  } else if constexpr (std::is_same_v<T, float>) {
    bits = std::bit_cast<std::uint32_t>(value);
  } else {
    bits = static_cast<std::uint64_t>(value);
  }
  for (std::size_t i = 0; i < sizeof(T); ++i)
    bytes[offset + i] = static_cast<unsigned char>(bits >> (8 * i));
}

// Appends `value`, little-endian (f32 and f64 as their bits).
template <typename T>
void append_le(std::vector<unsigned char>& bytes, T value) {
  bytes.resize(bytes.size() + sizeof(T));
  put_le(bytes, bytes.size() - sizeof(T), value);
}

// FNV-1a 64, written again here from its definition so that tests check the documented format.
std::uint64_t fnv1a64_reference(const unsigned char* data, std::size_t size);

// Rewrites the trailing 8-byte checksum of a checkpoint after a deliberate edit, so that only
// the edit is wrong.
void rehash_checkpoint(std::vector<unsigned char>& bytes);

// Appends a name as the formats store it: u32 length, then its bytes.
void append_name(std::vector<unsigned char>& bytes, const std::string& name);

// A checkpoint file of format version 1 or 2 as earlier builds wrote it (the layout in
// error_feedback/checkpoint_file.h's header comment), built byte by byte, so that the reader of
// old files stays tested now that the writer writes version 3. A std::map's order is the files'
// name order. Version 1 has no counters section: `counters` must then be empty.
using LegacyCheckpointTensors = std::map<std::string, std::vector<float>>;
using LegacyCheckpointCounters = std::map<std::string, std::uint64_t>;
std::vector<unsigned char> legacy_checkpoint_bytes(std::uint32_t version, std::uint32_t world_size,
                                                   std::uint32_t rank,
                                                   const LegacyCheckpointTensors& tensors,
                                                   const LegacyCheckpointCounters& counters = {});

// Writes `bytes` to `path` (replacing it); a test failure when it cannot.
void write_file_bytes(const std::filesystem::path& path, const std::vector<unsigned char>& bytes);
std::vector<unsigned char> read_file_bytes(const std::filesystem::path& path);

// legacy_checkpoint_bytes(...) written to `path`.
void write_legacy_checkpoint(const std::filesystem::path& path, std::uint32_t version,
                             std::uint32_t world_size, std::uint32_t rank,
                             const LegacyCheckpointTensors& tensors,
                             const LegacyCheckpointCounters& counters = {});

}  // namespace gradzip::testing
