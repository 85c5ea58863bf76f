// sign kernels: thin loops around kernels/sign_math.h (built with --fmad=false, IEEE division
// and no flush-to-zero, like the host build), so the scales carry the CPU's f32 bits.
//
// Encode: (1) the scales, in the canonical order of sign_math.h:
//   - buckets shorter than the 16 lanes: one thread per bucket calls sign_bucket_scale(), the
//     scalar reference itself (overflow rescue included);
//   - longer buckets: 16 threads per bucket (half a warp), thread l summing lane l -- elements
//     l, l + 16, l + 32, ... of the bucket, in increasing order, from +0.0f, exactly the
//     reference's lane l -- then one thread combines the 16 lane sums with sign_combine_lanes()
//     and sign_scale_from_sum(), the reference's functions, on a copy of the lanes in shared
//     memory. So every f32 operation and its operands are those of the reference. A +inf
//     scale gets the reference's overflow rescue, sign_rescued_scale(), from that thread.
//   (2) the bits: one thread per byte.
// Decode: (1) one thread checks the unused bits of the last byte; (2) one thread per element,
// which writes only when *d_status is still 0.
// The payload may sit at any alignment: scales are read and written bytewise.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/sign_cuda.h"
#include "kernels/sign_math.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh
constexpr int kWarp = 32;
static_assert(kWarp % kSignLanes == 0 && kThreads % kWarp == 0,
              "a 16-lane group must sit inside one warp");

// ---- encode ------------------------------------------------------------------------------------

// Buckets of fewer than 16 elements: one thread per bucket, the scalar reference.
__global__ void short_scales_kernel(const float* in, std::size_t count, std::size_t bucket,
                                    std::size_t num_buckets, std::byte* scales) {
  for (std::size_t b = global_thread(); b < num_buckets; b += grid_threads()) {
    const std::size_t begin = b * bucket;
    const std::size_t len = count - begin < bucket ? count - begin : bucket;
    store_f32(scales + b * sizeof(float), sign_bucket_scale(in + begin, len));
  }
}

// Buckets of 16 or more elements: half a warp per bucket, thread l of the half summing lane l.
// Each warp handles buckets 2w and 2w + 1 per turn; the loop bound depends on the warp only, so
// both halves reach every __syncwarp() together.
__global__ void lane_scales_kernel(const float* in, std::size_t count, std::size_t bucket,
                                   std::size_t num_buckets, std::byte* scales) {
  __shared__ float lanes[kThreads];
  const std::size_t warp = global_thread() / kWarp;
  const std::size_t warps = grid_threads() / kWarp;
  const unsigned lane_in_warp = threadIdx.x % kWarp;
  const std::size_t half = lane_in_warp / kSignLanes;
  const std::size_t lane = lane_in_warp % kSignLanes;
  float* const group_lanes = lanes + (threadIdx.x - lane);
  for (std::size_t pair = warp; 2 * pair < num_buckets; pair += warps) {
    const std::size_t b = 2 * pair + half;
    const bool valid = b < num_buckets;
    std::size_t len = 0;
    float sum = 0.0f;
    if (valid) {
      const std::size_t begin = b * bucket;
      len = count - begin < bucket ? count - begin : bucket;
      const float* x = in + begin;
      for (std::size_t j = lane; j < len; j += kSignLanes) sum += sign_abs(x[j]);
    }
    lanes[threadIdx.x] = sum;
    __syncwarp();
    if (valid && lane == 0) {
      float scale = sign_scale_from_sum(sign_combine_lanes(group_lanes), len);
      // The overflow rescue (rare: finite elements near FLT_MAX, or an inf): this one thread
      // runs the reference's rescue over the whole bucket.
      if (sign_scale_overflowed(scale)) scale = sign_rescued_scale(in + b * bucket, len);
      store_f32(scales + b * sizeof(float), scale);
    }
    __syncwarp();  // the lanes are read before the next turn overwrites them
  }
}

// One thread per byte of the sign bits: bit k = sign_bit(x[8j + k]) for the elements below
// count, so the unused high bits of the last byte stay 0.
__global__ void bits_kernel(const float* in, std::size_t count, unsigned char* bits,
                            std::size_t bit_bytes) {
  for (std::size_t j = global_thread(); j < bit_bytes; j += grid_threads()) {
    const std::size_t first = 8 * j;
    const std::size_t n = count - first < 8 ? count - first : 8;
    std::uint32_t byte = 0;
    for (std::size_t k = 0; k < n; ++k) byte |= sign_bit(in[first + k]) << k;
    bits[j] = static_cast<unsigned char>(byte);
  }
}

// ---- decode ------------------------------------------------------------------------------------

// Launched with one thread, only when count % 8 != 0.
__global__ void validate_kernel(const unsigned char* bits, std::size_t count, int* status) {
  if ((static_cast<unsigned>(bits[count / 8]) >> (count % 8)) != 0u) *status = kSignStatusUnusedBits;
}

template <bool kAccumulate>
__global__ void decode_kernel(const std::byte* scales, const unsigned char* bits, std::size_t count,
                              std::size_t bucket, float* out, const int* status) {
  if (*status != kSignStatusOk) return;
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const float scale = load_f32(scales + (i / bucket) * sizeof(float));
    const float value = sign_decoded(scale, (static_cast<std::uint32_t>(bits[i / 8]) >> (i % 8)) & 1u);
    if constexpr (kAccumulate) {
      out[i] += value;
    } else {
      out[i] = value;
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

std::size_t num_buckets_for(std::size_t count, std::size_t bucket) {
  return count == 0 ? 0 : (count - 1) / bucket + 1;
}

std::size_t bit_bytes_for(std::size_t count) { return count / 8 + (count % 8 != 0 ? 1 : 0); }

}  // namespace

std::size_t sign_payload_bytes(std::size_t count, std::size_t bucket) {
  GZ_REQUIRE(bucket >= 1, ErrorCode::invalid_argument,
             "cuda.sign_payload_bytes: bucket=0 (expected >= 1)");
  const std::size_t buckets = num_buckets_for(count, bucket);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  GZ_REQUIRE(buckets <= (kMax - bit_bytes_for(count)) / sizeof(float), ErrorCode::invalid_argument,
             "cuda.sign_payload_bytes: the payload of ", count, " elements in buckets of ", bucket,
             " does not fit a size_t");
  return buckets * sizeof(float) + bit_bytes_for(count);
}

void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream) {
  constexpr const char* kOp = "cuda.sign_encode";
  sign_payload_bytes(count, bucket);  // validates bucket and the size
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t num_buckets = num_buckets_for(count, bucket);
  if (bucket < static_cast<std::size_t>(kSignLanes)) {
    short_scales_kernel<<<grid_for(num_buckets), kThreads, 0, s>>>(d_in, count, bucket,
                                                                  num_buckets, d_payload);
  } else {
    // Two buckets per warp.
    const std::size_t threads = (num_buckets + 1) / 2 * kWarp;
    lane_scales_kernel<<<grid_for(threads), kThreads, 0, s>>>(d_in, count, bucket, num_buckets,
                                                             d_payload);
  }
  check_launch(kOp, count);
  const std::size_t bit_bytes = bit_bytes_for(count);
  bits_kernel<<<grid_for(bit_bytes), kThreads, 0, s>>>(
      d_in, count, reinterpret_cast<unsigned char*>(d_payload + num_buckets * sizeof(float)),
      bit_bytes);
  check_launch(kOp, count);
}

void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream) {
  constexpr const char* kOp = "cuda.sign_decode";
  sign_payload_bytes(count, bucket);  // validates bucket and the size
  GZ_REQUIRE(count == 0 || (d_payload != nullptr && d_out != nullptr), ErrorCode::invalid_argument,
             kOp, ": null payload or output for ", count, " elements");
  const auto s = static_cast<cudaStream_t>(stream);
  reset_decode_status(kOp, d_status, s);
  if (count == 0) return;
  const std::size_t num_buckets = num_buckets_for(count, bucket);
  const auto* bits = reinterpret_cast<const unsigned char*>(d_payload + num_buckets * sizeof(float));
  if (count % 8 != 0) {
    validate_kernel<<<1, 1, 0, s>>>(bits, count, d_status);
    check_launch(kOp, count);
  }
  if (accumulate) {
    decode_kernel<true><<<grid_for(count), kThreads, 0, s>>>(d_payload, bits, count, bucket, d_out,
                                                            d_status);
  } else {
    decode_kernel<false><<<grid_for(count), kThreads, 0, s>>>(d_payload, bits, count, bucket, d_out,
                                                             d_status);
  }
  check_launch(kOp, count);
}

}  // namespace gradzip::kernels::cuda
