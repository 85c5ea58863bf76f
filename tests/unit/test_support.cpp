#include "tests/unit/test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "compressors/wire_format.h"
#include "kernels/cast_math.h"
#ifdef GRADZIP_HAVE_CUDA
#include "kernels/cuda/cast_cuda.h"
#endif

namespace gradzip::testing {

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> values(n);
  for (float& value : values) value = normal(engine);
  return values;
}

HostTensor::HostTensor(DType dtype, std::size_t count)
    : dtype_(dtype), count_(count), bytes_(count * dtype_size(dtype)) {}

HostTensor::HostTensor(DType dtype, std::span<const float> values)
    : HostTensor(dtype, values.size()) {
  for (std::size_t i = 0; i < count_; ++i) {
    if (dtype_ == DType::f32) {
      std::memcpy(bytes_.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t bits = dtype_ == DType::f16 ? kernels::f32_to_f16_bits(values[i])
                                                      : kernels::f32_to_bf16_bits(values[i]);
      std::memcpy(bytes_.data() + 2 * i, &bits, 2);
    }
  }
}

TensorView HostTensor::view() { return TensorView{bytes_.data(), count_, dtype_, Device{}}; }

ConstTensorView HostTensor::view() const {
  return ConstTensorView{bytes_.data(), count_, dtype_, Device{}};
}

float HostTensor::at(std::size_t i) const {
  if (dtype_ == DType::f32) {
    float value;
    std::memcpy(&value, bytes_.data() + 4 * i, 4);
    return value;
  }
  std::uint16_t bits;
  std::memcpy(&bits, bytes_.data() + 2 * i, 2);
  return dtype_ == DType::f16 ? kernels::f16_bits_to_f32(bits) : kernels::bf16_bits_to_f32(bits);
}

std::vector<float> HostTensor::to_f32() const {
  std::vector<float> values(count_);
  for (std::size_t i = 0; i < count_; ++i) values[i] = at(i);
  return values;
}

ErrorCode fake_cuda_view_error() {
#ifdef GRADZIP_HAVE_CUDA
  if (kernels::cuda::device_count(nullptr) > 0) return ErrorCode::invalid_argument;
#endif
  return ErrorCode::unsupported;
}

ErrorCode error_code_of(const std::function<void()>& call, std::string* message) {
  try {
    call();
  } catch (const Error& error) {
    if (message != nullptr) *message = error.what();
    return error.code();
  }
  ADD_FAILURE() << "expected a gradzip::Error";
  return ErrorCode::internal;
}

void expect_malformed(const Codec& codec, std::span<const std::byte> message, std::size_t count,
                      const std::string& field) {
  const std::string name(codec_kind_name(codec.spec().codec));
  std::vector<float> out(count, 7.0f), acc(count, 7.0f);
  std::string text;
  EXPECT_EQ(error_code_of([&] { codec.decode(message, host_view(out.data(), count)); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find(name + ".decode"), std::string::npos) << text;
  EXPECT_NE(text.find(field), std::string::npos) << text;
  EXPECT_EQ(error_code_of([&] { codec.decode_add(message, acc.data(), count); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find(name + ".decode_add"), std::string::npos) << text;
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], 7.0f) << "decode wrote element " << i;
    ASSERT_EQ(acc[i], 7.0f) << "decode_add wrote element " << i;
  }
}

std::vector<std::byte> with_byte(std::span<const std::byte> message, std::size_t offset,
                                 std::uint8_t value) {
  std::vector<std::byte> copy(message.begin(), message.end());
  copy.at(offset) = std::byte{value};
  return copy;
}

::testing::AssertionResult same_bits(std::span<const float> actual, std::span<const float> expected) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << actual.size() << " elements, expected "
                                         << expected.size();
  for (std::size_t i = 0; i < actual.size(); ++i)
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << " of " << actual.size() << ": "
                                           << actual[i] << ", expected " << expected[i];
  return ::testing::AssertionSuccess();
}

void EmulatedPayload::write(std::size_t at, std::uint32_t byte) {
  ASSERT_LT(at, bytes.size());
  bytes[at] = static_cast<std::byte>(byte & 0xFFu);
  ++writes[at];
}

void EmulatedPayload::write_scale(std::uint64_t b, float scale) {
  std::uint32_t word = 0;
  std::memcpy(&word, &scale, sizeof word);
  for (unsigned m = 0; m < 4; ++m) write(4 * b + m, word >> (8 * m));
}

::testing::AssertionResult matches_message_payload(const EmulatedPayload& emulated,
                                                   std::span<const std::byte> message,
                                                   std::size_t scale_bytes, const char* data_name) {
  constexpr std::size_t kHeader = compressors::kWireHeaderBytes;
  if (message.size() < kHeader || emulated.bytes.size() != message.size() - kHeader) {
    return ::testing::AssertionFailure() << "the emulated payload has " << emulated.bytes.size()
                                         << " bytes, the message's " << message.size() - std::min(message.size(), kHeader);
  }
  for (std::size_t i = 0; i < emulated.bytes.size(); ++i) {
    const int want = std::to_integer<int>(message[kHeader + i]);
    const int got = std::to_integer<int>(emulated.bytes[i]);
    if (emulated.writes[i] == 1 && got == want) continue;
    auto failure = ::testing::AssertionFailure() << "payload byte " << i;
    if (i < scale_bytes) failure << " (scale of bucket " << i / 4 << ")";
    else failure << " (" << data_name << " byte " << i - scale_bytes << ")";
    if (emulated.writes[i] != 1) return failure << " written " << emulated.writes[i] << " times";
    return failure << ": " << got << ", the CPU codec's " << want;
  }
  return ::testing::AssertionSuccess();
}

void PerIsaTest::SetUp() {
  if (GetParam() > kernels::cpu::detected_isa()) {
    GTEST_SKIP() << "this CPU lacks " << kernels::cpu::isa_name(GetParam())
                 << " (it has " << kernels::cpu::isa_name(kernels::cpu::detected_isa())
                 << "): not tested here";
  }
}

std::string isa_case_name(const ::testing::TestParamInfo<kernels::cpu::Isa>& info) {
  return std::string(kernels::cpu::isa_name(info.param));
}

std::vector<std::byte> encode_message(const Codec& codec, ConstTensorView in,
                                      const EncodeContext& ctx) {
  std::vector<std::byte> message(codec.max_encoded_bytes(in.count));
  message.resize(codec.encode(in, message, ctx));
  return message;
}

std::vector<float> decode_to_f32(const Codec& codec, std::span<const std::byte> message,
                                 std::size_t count) {
  std::vector<float> out(count);
  codec.decode(message, host_view(out.data(), count));
  return out;
}

std::uint64_t fnv1a64_reference(const unsigned char* data, std::size_t size) {
  std::uint64_t hash = 14695981039346656037ull;
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= data[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

void rehash_checkpoint(std::vector<unsigned char>& bytes) {
  put_le(bytes, bytes.size() - 8, fnv1a64_reference(bytes.data(), bytes.size() - 8));
}

void append_name(std::vector<unsigned char>& bytes, const std::string& name) {
  append_le<std::uint32_t>(bytes, static_cast<std::uint32_t>(name.size()));
  bytes.insert(bytes.end(), name.begin(), name.end());
}

std::vector<unsigned char> legacy_checkpoint_bytes(std::uint32_t version, std::uint32_t world_size,
                                                   std::uint32_t rank,
                                                   const LegacyCheckpointTensors& tensors,
                                                   const LegacyCheckpointCounters& counters) {
  EXPECT_TRUE(version == 2 || (version == 1 && counters.empty()))
      << "version " << version << " with " << counters.size() << " counters";
  std::vector<unsigned char> bytes = {'G', 'Z', 'E', 'F'};
  append_le<std::uint32_t>(bytes, version);
  append_le<std::uint32_t>(bytes, world_size);
  append_le<std::uint32_t>(bytes, rank);
  append_le<std::uint64_t>(bytes, tensors.size());
  for (const auto& [name, values] : tensors) {
    append_name(bytes, name);
    append_le<std::uint64_t>(bytes, values.size());
    for (const float value : values) append_le<float>(bytes, value);
  }
  if (version == 2) {
    append_le<std::uint64_t>(bytes, counters.size());
    for (const auto& [name, value] : counters) {
      append_name(bytes, name);
      append_le<std::uint64_t>(bytes, value);
    }
  }
  append_le<std::uint64_t>(bytes, fnv1a64_reference(bytes.data(), bytes.size()));
  return bytes;
}

void write_file_bytes(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

std::vector<unsigned char> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_legacy_checkpoint(const std::filesystem::path& path, std::uint32_t version,
                             std::uint32_t world_size, std::uint32_t rank,
                             const LegacyCheckpointTensors& tensors,
                             const LegacyCheckpointCounters& counters) {
  write_file_bytes(path, legacy_checkpoint_bytes(version, world_size, rank, tensors, counters));
}

}  // namespace gradzip::testing

// UBSan's options in the builds with -fsanitize=undefined (the sanitized unit and multi-rank
// tests): a report prints its stack. Compiled in rather than set per test, since ctest's
// per-case registration takes one environment variable (ASAN_OPTIONS). Unused elsewhere.
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1"; }
