// write_small_bytes and compare_small_bytes (kernels/cuda/small_bytes_cuda.h): one thread per
// byte, the bytes passed by value in the kernel's parameter space; write_rank_flags: one block.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/small_bytes_cuda.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/emulated/kernel_twins.h"

namespace gradzip::kernels::cuda {
namespace {

struct SmallBytes {
  unsigned char bytes[kSmallBytesMax];
};

__global__ void write_small_bytes_kernel(unsigned char* out, SmallBytes value, unsigned count) {
  if (threadIdx.x < count) out[threadIdx.x] = value.bytes[threadIdx.x];
}

__global__ void compare_small_bytes_kernel(const unsigned char* bytes, SmallBytes expected,
                                           unsigned count, int mismatch, int* status) {
  const bool differs = threadIdx.x < count && bytes[threadIdx.x] != expected.bytes[threadIdx.x];
  const int any = __syncthreads_or(differs ? 1 : 0);
  if (threadIdx.x == 0) *status = any != 0 ? mismatch : 0;
}

constexpr unsigned kFlagThreads = 256;

struct FlagGroups {
  const int* words[kMaxFlagGroups];
  std::size_t counts[kMaxFlagGroups];
  unsigned groups;
};

__global__ void rank_flags_kernel(FlagGroups g, float* flags, std::size_t total, std::size_t first) {
  for (std::size_t i = threadIdx.x; i < total; i += kFlagThreads)
    if (i < first || i >= first + g.groups) flags[i] = 0.0f;
  for (unsigned k = 0; k < g.groups; ++k) {
    int nonzero = 0;
    for (std::size_t i = threadIdx.x; i < g.counts[k]; i += kFlagThreads)
      nonzero |= g.words[k][i] != 0 ? 1 : 0;
    const int any = __syncthreads_or(nonzero);
    if (threadIdx.x == 0) flags[first + k] = any != 0 ? 1.0f : 0.0f;
  }
}

__global__ void words_from_flags_kernel(const float* flags, std::size_t count, int* words) {
  for (std::size_t i = threadIdx.x; i < count; i += kFlagThreads) words[i] = flags[i] != 0.0f ? 1 : 0;
}

}  // namespace

void write_small_bytes(std::byte* d_out, const std::byte* host, std::size_t count, void* stream) {
  if (emulated::active()) return emulated::write_small_bytes(d_out, host, count, stream);
  constexpr const char* kOp = "cuda.write_small_bytes";
  if (count == 0) return;
  GZ_REQUIRE(count <= kSmallBytesMax, ErrorCode::invalid_argument, kOp, ": ", count,
             " bytes (at most ", kSmallBytesMax, ")");
  GZ_REQUIRE(d_out != nullptr && host != nullptr, ErrorCode::invalid_argument, kOp,
             ": null pointer for ", count, " bytes");
  SmallBytes value{};
  for (std::size_t i = 0; i < count; ++i) value.bytes[i] = static_cast<unsigned char>(host[i]);
  write_small_bytes_kernel<<<1, static_cast<unsigned>(kSmallBytesMax), 0,
                             static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<unsigned char*>(d_out), value, static_cast<unsigned>(count));
  detail::check_launch(kOp, count, "bytes");
}

void compare_small_bytes(const std::byte* d_bytes, const std::byte* expected, std::size_t count,
                         int mismatch, int* d_status, void* stream) {
  if (emulated::active())
    return emulated::compare_small_bytes(d_bytes, expected, count, mismatch, d_status, stream);
  constexpr const char* kOp = "cuda.compare_small_bytes";
  GZ_REQUIRE(count <= kSmallBytesMax, ErrorCode::invalid_argument, kOp, ": ", count,
             " bytes (at most ", kSmallBytesMax, ")");
  GZ_REQUIRE(d_status != nullptr && mismatch != 0 &&
                 (count == 0 || (d_bytes != nullptr && expected != nullptr)),
             ErrorCode::invalid_argument, kOp, ": null pointer or zero mismatch code for ", count,
             " bytes");
  SmallBytes value{};
  for (std::size_t i = 0; i < count; ++i) value.bytes[i] = static_cast<unsigned char>(expected[i]);
  compare_small_bytes_kernel<<<1, static_cast<unsigned>(kSmallBytesMax), 0,
                               static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const unsigned char*>(d_bytes), value, static_cast<unsigned>(count),
      mismatch, d_status);
  detail::check_launch(kOp, count, "bytes");
}

void write_rank_flags(const FlagWords* groups, std::size_t group_count, float* d_flags,
                      std::size_t total, std::size_t first, void* stream) {
  if (emulated::active())
    return emulated::write_rank_flags(groups, group_count, d_flags, total, first, stream);
  constexpr const char* kOp = "cuda.write_rank_flags";
  GZ_REQUIRE(group_count <= kMaxFlagGroups && first <= total && group_count <= total - first,
             ErrorCode::invalid_argument, kOp, ": ", group_count, " flags at ", first, " of ",
             total, " (at most ", kMaxFlagGroups, ", inside the array)");
  GZ_REQUIRE(d_flags != nullptr && (group_count == 0 || groups != nullptr),
             ErrorCode::invalid_argument, kOp, ": null pointer");
  FlagGroups g{};
  g.groups = static_cast<unsigned>(group_count);
  for (std::size_t k = 0; k < group_count; ++k) {
    GZ_REQUIRE(groups[k].count == 0 || groups[k].words != nullptr, ErrorCode::invalid_argument,
               kOp, ": null pointer for ", groups[k].count, " words");
    g.words[k] = groups[k].words;
    g.counts[k] = groups[k].count;
  }
  if (total == 0) return;
  rank_flags_kernel<<<1, kFlagThreads, 0, static_cast<cudaStream_t>(stream)>>>(g, d_flags, total,
                                                                              first);
  detail::check_launch(kOp, total, "flags");
}

void words_from_flags(const float* d_flags, std::size_t count, int* d_words, void* stream) {
  if (emulated::active()) return emulated::words_from_flags(d_flags, count, d_words, stream);
  constexpr const char* kOp = "cuda.words_from_flags";
  if (count == 0) return;
  GZ_REQUIRE(d_flags != nullptr && d_words != nullptr, ErrorCode::invalid_argument, kOp,
             ": null pointer for ", count, " flags");
  words_from_flags_kernel<<<1, kFlagThreads, 0, static_cast<cudaStream_t>(stream)>>>(d_flags, count,
                                                                                    d_words);
  detail::check_launch(kOp, count, "flags");
}

}  // namespace gradzip::kernels::cuda
