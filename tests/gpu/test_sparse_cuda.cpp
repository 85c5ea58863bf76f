// The CUDA sparse decode: sparse_decode_add of several CPU-encoded top-k messages gives, bit for
// bit, the CPU's decode_add over the same messages in the same order (u32 indices as the
// encoder writes them and the same messages rewritten with u64 indices; f32 and f16 values;
// aligned and unaligned payloads), sparse_decode gives the CPU decode, and a malformed payload
// anywhere in the batch sets *d_status and leaves the output untouched. Host-side refusals are
// checked without a device; the device tests skip, saying why, when no device is present.
#include <gtest/gtest.h>
#include "kernels/device_api.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cuda/cast_cuda.h"
#include "kernels/cuda/sparse_cuda.h"
#include "gpu_test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using compressors::WireHeader;
namespace cuda = kernels::cuda;
using namespace gpu_test;

constexpr std::size_t kCounts[] = {0, 1, 7, (std::size_t{1} << 20) + 3, std::size_t{1} << 26};

void expect_error(ErrorCode code, const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
  }
}

// ---- host-side checks (no device needed) ---------------------------------------------------

// What the header tells the host is refused before anything is launched (the fake device
// pointers are never touched).
TEST(SparseCudaHost, RefusesWhatTheHeaderRulesOut) {
  const auto* fake = reinterpret_cast<const std::byte*>(std::uintptr_t{4096});
  float* acc = reinterpret_cast<float*>(std::uintptr_t{8192});
  int* status = reinterpret_cast<int*>(std::uintptr_t{16384});
  const std::byte* payloads[] = {fake, fake, fake};
  const std::uint64_t too_many[] = {3, 11, 2};
  expect_error(ErrorCode::malformed_message, [&] {
    cuda::sparse_decode_add(payloads, too_many, 3, false, false, 10, acc, status, nullptr);
  });
  const std::uint64_t fine[] = {3, 1, 2};
  expect_error(ErrorCode::malformed_message, [&] {
    cuda::sparse_decode_add(payloads, fine, 3, false, true, (std::size_t{1} << 32) + 1, acc,
                            status, nullptr);
  });
  expect_error(ErrorCode::invalid_argument, [&] {
    cuda::sparse_decode_add(payloads, fine, 3, true, false, 10, acc, nullptr, nullptr);
  });
  const std::byte* with_null[] = {fake, nullptr, fake};
  expect_error(ErrorCode::invalid_argument, [&] {
    cuda::sparse_decode_add(with_null, fine, 3, true, false, 10, acc, status, nullptr);
  });
  expect_error(ErrorCode::invalid_argument, [&] {
    cuda::sparse_decode_add(payloads, fine, 3, true, false, 10, nullptr, status, nullptr);
  });
  expect_error(ErrorCode::malformed_message, [&] {
    cuda::sparse_decode(fake, 11, false, false, 10, acc, status, nullptr);
  });
  EXPECT_EQ(cuda::sparse_payload_bytes(5, false, false), 40u);
  EXPECT_EQ(cuda::sparse_payload_bytes(5, true, true), 50u);
}

// ---- device tests --------------------------------------------------------------------------

class CudaSparse : public DeviceTest {};

// Uniform in [-1, 1) scaled by 2^-4 .. 2^4, deterministic.
float test_value(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t r = mix(seed * 0x100000001B3ull + i);
  const float unit = static_cast<float>(static_cast<std::int64_t>(r >> 40) - (std::int64_t{1} << 23)) /
                     static_cast<float>(std::int64_t{1} << 23);
  return std::ldexp(unit, static_cast<int>((r >> 8) % 9) - 4);
}

// Rank r's gradient: a shared part plus a rank's own smaller part, so the ranks' top-k sets
// overlap a lot and many elements receive several ranks' values (the order of the f32 sums
// matters).
std::vector<float> rank_gradient(std::size_t n, std::uint64_t r) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = test_value(1, i) + 0.25f * test_value(100 + r, i);
  return g;
}

// The same message with u64 indices (the decoder accepts them for any count).
std::vector<std::byte> widened(const std::vector<std::byte>& message) {
  const WireHeader header = compressors::read_header(message, "test");
  const std::size_t m = header.large_param;
  const bool half = (header.flags & compressors::kTopkHalfValues) != 0;
  const std::size_t value_width = half ? 2 : 4;
  WireHeader wide = header;
  wide.flags = static_cast<std::uint8_t>(header.flags | compressors::kTopkWideIndices);
  wide.payload_bytes = cuda::sparse_payload_bytes(m, true, half);
  std::vector<std::byte> out(kWireHeaderBytes + wide.payload_bytes);
  compressors::write_header(wide, out);
  const std::byte* indices = message.data() + kWireHeaderBytes;
  std::byte* wide_indices = out.data() + kWireHeaderBytes;
  for (std::size_t j = 0; j < m; ++j) {
    std::uint32_t narrow;
    std::memcpy(&narrow, indices + 4 * j, 4);
    const std::uint64_t index = narrow;
    std::memcpy(wide_indices + 8 * j, &index, 8);
  }
  if (m > 0) std::memcpy(wide_indices + 8 * m, indices + 4 * m, m * value_width);
  return out;
}

// Copies the payloads (headers stripped) into one device buffer; payload r starts at an
// 8-byte boundary plus r % 2 bytes, so odd ranks take the unaligned loads.
struct DevicePayloads {
  std::unique_ptr<DeviceBytes> buffer;
  std::vector<const std::byte*> pointers;
  std::vector<std::uint64_t> entries;
};

DevicePayloads upload(const std::vector<std::vector<std::byte>>& messages) {
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (std::size_t r = 0; r < messages.size(); ++r) {
    total = (total + 7) / 8 * 8 + r % 2;
    offsets.push_back(total);
    total += messages[r].size() - kWireHeaderBytes;
  }
  DevicePayloads result;
  result.buffer = std::make_unique<DeviceBytes>(total);
  for (std::size_t r = 0; r < messages.size(); ++r) {
    to_device(result.buffer->get() + offsets[r], messages[r].data() + kWireHeaderBytes,
              messages[r].size() - kWireHeaderBytes);
    result.pointers.push_back(result.buffer->get() + offsets[r]);
    result.entries.push_back(compressors::read_header(messages[r], "test").large_param);
  }
  return result;
}

// sparse_decode_add of 3..5 ranks' CPU messages == the CPU decode_add loop over the ranks, in
// rank order, bit for bit; sparse_decode of rank 0's message == the CPU decode.
TEST_F(CudaSparse, DecodeAddMatchesTheCpuInRankOrder) {
  for (std::size_t c = 0; c < std::size(kCounts); ++c) {
    const std::size_t n = kCounts[c];
    const std::size_t ranks = 3 + c % 3;
    std::vector<std::vector<float>> gradients;
    for (std::size_t r = 0; r < ranks; ++r) gradients.push_back(rank_gradient(n, r));
    std::vector<float> acc0(n);
    for (std::size_t i = 0; i < n; ++i) acc0[i] = test_value(7, i);
    DeviceBytes d_acc(n * sizeof(float));
    DeviceBytes d_status(sizeof(int));
    for (const char* spec : {"topk:ratio=0.3", "topk:ratio=0.01,values=fp16", "topk:ratio=0.01"}) {
      if (n > (std::size_t{1} << 21) && std::string(spec) == "topk:ratio=0.3") continue;
      const auto codec = make_codec(spec);
      std::vector<std::vector<std::byte>> narrow;
      for (std::size_t r = 0; r < ranks; ++r) {
        const EncodeContext ctx{5, 1, 2, 0};
        std::vector<std::byte> message(codec->max_encoded_bytes(n));
        message.resize(codec->encode(host_view(gradients[r].data(), n), message, ctx));
        narrow.push_back(std::move(message));
      }
      std::vector<std::vector<std::byte>> wide;
      for (const auto& message : narrow) wide.push_back(widened(message));
      const bool half = codec->spec().values == DType::f16;
      for (const bool wide_indices : {false, true}) {
        SCOPED_TRACE(std::string(spec) + (wide_indices ? ", u64 indices" : ", u32 indices") +
                     ", n = " + std::to_string(n) + ", ranks = " + std::to_string(ranks));
        const auto& messages = wide_indices ? wide : narrow;
        std::vector<float> want = acc0;
        for (const auto& message : messages) codec->decode_add(message, want.data(), n);

        const DevicePayloads payloads = upload(messages);
        to_device(d_acc.get(), acc0.data(), n * sizeof(float));
        cuda::sparse_decode_add(payloads.pointers.data(), payloads.entries.data(), ranks,
                                wide_indices, half, n, d_acc.as<float>(), d_status.as<int>(),
                                nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(status_of(d_status.as<int>()), 0);
        ASSERT_TRUE(same_bits(want, from_device<float>(d_acc.get(), n)));

        // Rank 1's payload sits at an odd address: decode both an aligned and an unaligned one.
        for (std::size_t r = 0; r < 2 && r < ranks; ++r) {
          std::vector<float> decoded(n, -1.0f);
          codec->decode(messages[r], host_view(decoded.data(), n));
          ASSERT_EQ(cudaMemset(d_acc.get(), 0xFF, n * sizeof(float)), cudaSuccess);
          cuda::sparse_decode(payloads.pointers[r], payloads.entries[r], wide_indices, half, n,
                              d_acc.as<float>(), d_status.as<int>(), nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(status_of(d_status.as<int>()), 0);
          ASSERT_TRUE(same_bits(decoded, from_device<float>(d_acc.get(), n))) << "rank " << r;
        }
      }
    }
  }
}

// Index j of a message's payload, rewritten.
void set_index(std::vector<std::byte>& message, std::size_t j, std::uint64_t index, bool wide) {
  std::byte* at = message.data() + kWireHeaderBytes + j * (wide ? 8 : 4);
  if (wide) {
    std::memcpy(at, &index, 8);
  } else {
    const auto narrow = static_cast<std::uint32_t>(index);
    std::memcpy(at, &narrow, 4);
  }
}

std::uint64_t get_index(const std::vector<std::byte>& message, std::size_t j, bool wide) {
  const std::byte* at = message.data() + kWireHeaderBytes + j * (wide ? 8 : 4);
  if (wide) {
    std::uint64_t index;
    std::memcpy(&index, at, 8);
    return index;
  }
  std::uint32_t index;
  std::memcpy(&index, at, 4);
  return index;
}

// A bad index in the last payload (out of range, repeated, decreasing) sets its status bit, and
// neither it nor the valid payloads before it change the accumulator; the CPU refuses the same
// message. sparse_decode of the bad payload leaves its output untouched too.
TEST_F(CudaSparse, MalformedPayloadsLeaveTheOutputUntouched) {
  constexpr std::size_t n = 10007;
  constexpr std::size_t ranks = 4;
  const auto codec = make_codec("topk:ratio=0.05");
  std::vector<float> acc0(n);
  for (std::size_t i = 0; i < n; ++i) acc0[i] = test_value(9, i);
  DeviceBytes d_acc(n * sizeof(float));
  DeviceBytes d_status(sizeof(int));
  struct Corruption {
    const char* what;
    int status;
    bool wide;
    std::function<void(std::vector<std::byte>&, bool)> apply;
  };
  const Corruption corruptions[] = {
      {"last index == n", cuda::kSparseIndexOutOfRange, false,
       [](std::vector<std::byte>& m, bool w) {
         set_index(m, compressors::read_header(m, "test").large_param - 1, n, w);
       }},
      {"u64 index 2^40", cuda::kSparseIndexOutOfRange | cuda::kSparseIndexNotIncreasing, true,
       [](std::vector<std::byte>& m, bool w) { set_index(m, 3, std::uint64_t{1} << 40, w); }},
      {"repeated index", cuda::kSparseIndexNotIncreasing, false,
       [](std::vector<std::byte>& m, bool w) { set_index(m, 7, get_index(m, 6, w), w); }},
      {"decreasing index", cuda::kSparseIndexNotIncreasing, true,
       [](std::vector<std::byte>& m, bool w) { set_index(m, 0, get_index(m, 1, w) + 1, w); }},
  };
  for (const Corruption& corruption : corruptions) {
    SCOPED_TRACE(corruption.what);
    std::vector<std::vector<std::byte>> messages;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::vector<float> g = rank_gradient(n, r);
      std::vector<std::byte> message(codec->max_encoded_bytes(n));
      message.resize(codec->encode(host_view(g.data(), n), message, EncodeContext{}));
      messages.push_back(corruption.wide ? widened(message) : std::move(message));
    }
    corruption.apply(messages.back(), corruption.wide);
    std::vector<float> cpu = acc0;
    expect_error(ErrorCode::malformed_message,
                 [&] { codec->decode_add(messages.back(), cpu.data(), n); });

    const DevicePayloads payloads = upload(messages);
    to_device(d_acc.get(), acc0.data(), n * sizeof(float));
    cuda::sparse_decode_add(payloads.pointers.data(), payloads.entries.data(), ranks,
                            corruption.wide, false, n, d_acc.as<float>(), d_status.as<int>(),
                            nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(status_of(d_status.as<int>()), corruption.status);
    ASSERT_TRUE(same_bits(acc0, from_device<float>(d_acc.get(), n)));

    cuda::sparse_decode(payloads.pointers.back(), payloads.entries.back(), corruption.wide, false,
                        n, d_acc.as<float>(), d_status.as<int>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(status_of(d_status.as<int>()), corruption.status);
    ASSERT_TRUE(same_bits(acc0, from_device<float>(d_acc.get(), n)));

    // The status is reset by the next call: the valid payloads alone apply cleanly.
    cuda::sparse_decode_add(payloads.pointers.data(), payloads.entries.data(), ranks - 1,
                            corruption.wide, false, n, d_acc.as<float>(), d_status.as<int>(),
                            nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(status_of(d_status.as<int>()), 0);
    for (std::size_t r = 0; r + 1 < ranks; ++r) codec->decode_add(messages[r], cpu.data(), n);
    ASSERT_TRUE(same_bits(cpu, from_device<float>(d_acc.get(), n)));
  }
}

}  // namespace
}  // namespace gradzip
