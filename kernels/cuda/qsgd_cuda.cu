// qsgd kernels: thin loops around kernels/qsgd_math.h, so every code and every decoded value
// is computed by the same GZ_HOST_DEVICE functions as on the CPU (built with --fmad=false,
// IEEE division and no flush-to-zero, like the host build).
//
// Encode: (1) the scales: max |x| bits per bucket, an exact, order-free maximum (one thread per
// bucket for short buckets, one block per bucket for long ones), written to the payload;
// (2) the codes: one thread per byte of the code stream computes every element whose bits
// reach into its byte (an element that straddles two bytes is computed by both threads, with
// the same result), so no two threads write one byte and the unused bits of the last byte are
// 0. Stream order makes (2) see the scales (1) wrote.
// Decode: (1) a validation pass over every scale and every code byte that raises *d_status
// (atomicMax, so the result does not depend on the order of the offences); (2) one thread per
// element, which writes only when *d_status is still 0.
// The payload may sit at any alignment: scales are read and written bytewise.
#include <cuda_runtime.h>

#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/qsgd_cuda.h"
#include "kernels/qsgd_math.h"

namespace gradzip::kernels::cuda {
namespace {

using namespace detail;  // kernels/cuda/launch.cuh

// scales_per_block_kernel's tree reduction halves kThreads down to 1.
static_assert(kThreads == 256, "the block maximum is written for 256 threads");
// Buckets at least this long get a block each for their maximum; shorter ones a thread each.
constexpr std::size_t kBlockBucket = 256;

// Bits [index * bits, (index + 1) * bits) of the stream (bits <= 8: at most two bytes).
__device__ __forceinline__ std::uint32_t read_code(const unsigned char* stream, std::size_t index,
                                                   int bits) {
  const std::size_t first_bit = index * static_cast<std::size_t>(bits);
  const std::size_t byte = first_bit / 8;
  const unsigned shift = static_cast<unsigned>(first_bit % 8);
  std::uint32_t window = stream[byte];
  if (shift + static_cast<unsigned>(bits) > 8) window |= static_cast<std::uint32_t>(stream[byte + 1]) << 8;
  return (window >> shift) & ((1u << bits) - 1u);
}

// ---- encode ------------------------------------------------------------------------------------

// One thread per bucket (short buckets).
__global__ void scales_per_thread_kernel(const float* in, std::size_t count, std::size_t bucket,
                                         std::size_t num_buckets, std::byte* payload) {
  for (std::size_t b = global_thread(); b < num_buckets; b += grid_threads()) {
    const std::size_t begin = b * bucket;
    const std::size_t end = count - begin < bucket ? count : begin + bucket;
    std::uint32_t abs_max = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t a = qsgd_abs_bits(in[i]);
      abs_max = a > abs_max ? a : abs_max;
    }
    store_f32(payload + b * sizeof(float), qsgd_scale_from_abs_max_bits(abs_max));
  }
}

// One block per bucket (long buckets): a block-stride maximum, then a shared-memory tree.
__global__ void scales_per_block_kernel(const float* in, std::size_t count, std::size_t bucket,
                                        std::size_t num_buckets, std::byte* payload) {
  __shared__ std::uint32_t partial[kThreads];
  for (std::size_t b = blockIdx.x; b < num_buckets; b += gridDim.x) {
    const std::size_t begin = b * bucket;
    const std::size_t end = count - begin < bucket ? count : begin + bucket;
    std::uint32_t abs_max = 0;
    for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const std::uint32_t a = qsgd_abs_bits(in[i]);
      abs_max = a > abs_max ? a : abs_max;
    }
    partial[threadIdx.x] = abs_max;
    __syncthreads();
    for (unsigned width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) {
        const std::uint32_t other = partial[threadIdx.x + width];
        if (other > partial[threadIdx.x]) partial[threadIdx.x] = other;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      store_f32(payload + b * sizeof(float), qsgd_scale_from_abs_max_bits(partial[0]));
    }
    __syncthreads();  // partial[0] is read before the next bucket overwrites it
  }
}

// One thread per byte j of the code stream: the codes of elements
// [floor(8j / bits), floor((8j + 7) / bits)] (those below count), each shifted to its place.
__global__ void codes_kernel(const float* in, std::size_t count, int bits, std::size_t bucket,
                             QsgdEncodeParams params, const std::byte* scales,
                             unsigned char* stream, std::size_t code_bytes) {
  const std::size_t width = static_cast<std::size_t>(bits);
  for (std::size_t j = global_thread(); j < code_bytes; j += grid_threads()) {
    const std::size_t first_bit = 8 * j;
    const std::size_t first = first_bit / width;
    std::size_t last = (first_bit + 7) / width;  // inclusive
    if (last >= count) last = count - 1;
    std::size_t bucket_index = first / bucket;
    std::size_t bucket_end = (bucket_index + 1) * bucket;
    QsgdEncodeBucket constants = qsgd_encode_bucket(load_f32(scales + bucket_index * sizeof(float)), bits);
    std::uint64_t block = ~std::uint64_t{0};
    Philox4x32 words{};
    std::uint32_t byte = 0;
    for (std::size_t e = first; e <= last; ++e) {
      if (e >= bucket_end) {
        while (e >= bucket_end) {
          ++bucket_index;
          bucket_end += bucket;
        }
        constants = qsgd_encode_bucket(load_f32(scales + bucket_index * sizeof(float)), bits);
      }
      const std::uint64_t element = params.element_offset + e;
      if ((element >> 2) != block) {
        block = element >> 2;
        words = philox_block(params.seed, params.step, params.tensor_id, block);
      }
      // A select instead of words.v[element & 3]: a dynamic index would put words on the stack.
      const unsigned word_index = static_cast<unsigned>(element & 3);
      const std::uint32_t word = word_index == 0   ? words.v[0]
                                 : word_index == 1 ? words.v[1]
                                 : word_index == 2 ? words.v[2]
                                                   : words.v[3];
      const std::uint32_t code = qsgd_encode_code(in[e], word, constants);
      const std::size_t code_bit = e * width;  // may start in the previous byte
      byte |= code_bit >= first_bit ? code << (code_bit - first_bit) : code >> (first_bit - code_bit);
    }
    stream[j] = static_cast<unsigned char>(byte & 0xFFu);
  }
}

// ---- decode ------------------------------------------------------------------------------------

// t < num_buckets: scale t must be one encode writes. t < code_bytes: the bits of byte t that
// belong to elements of a (validly) non-finite bucket must be 0.
__global__ void validate_kernel(const std::byte* payload, std::size_t count, int bits,
                                std::size_t bucket, std::size_t num_buckets,
                                std::size_t code_bytes, int* status) {
  const std::size_t width = static_cast<std::size_t>(bits);
  const auto* stream = reinterpret_cast<const unsigned char*>(payload + num_buckets * sizeof(float));
  const std::size_t tasks = num_buckets > code_bytes ? num_buckets : code_bytes;
  for (std::size_t t = global_thread(); t < tasks; t += grid_threads()) {
    if (t < num_buckets && !qsgd_scale_is_valid(load_f32(payload + t * sizeof(float)))) {
      atomicMax(status, kQsgdStatusBadScale);
    }
    if (t >= code_bytes) continue;
    const std::uint32_t byte = stream[t];
    if (byte == 0) continue;
    const std::size_t first_bit = 8 * t;
    const std::size_t first = first_bit / width;
    std::size_t last = (first_bit + 7) / width;
    if (last >= count) last = count - 1;
    for (std::size_t e = first; e <= last; ++e) {
      const float scale = load_f32(payload + (e / bucket) * sizeof(float));
      if (!qsgd_scale_is_valid(scale) || qsgd_scale_is_finite(scale)) continue;
      // The element's bits inside this byte: [lo, hi) of the byte.
      const std::size_t begin_bit = e * width;
      const std::size_t end_bit = begin_bit + width;
      const unsigned lo = begin_bit > first_bit ? static_cast<unsigned>(begin_bit - first_bit) : 0u;
      const unsigned hi = end_bit < first_bit + 8 ? static_cast<unsigned>(end_bit - first_bit) : 8u;
      const std::uint32_t mask = ((1u << hi) - 1u) & ~((1u << lo) - 1u);
      if ((byte & mask) != 0u) atomicMax(status, kQsgdStatusNonzeroCode);
    }
  }
}

template <bool kAccumulate>
__global__ void decode_kernel(const std::byte* payload, std::size_t count, int bits,
                              std::size_t bucket, std::size_t num_buckets, float* out,
                              const int* status) {
  if (*status != kQsgdStatusOk) return;
  const auto* stream = reinterpret_cast<const unsigned char*>(payload + num_buckets * sizeof(float));
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const QsgdDecodeBucket constants =
        qsgd_decode_bucket(load_f32(payload + (i / bucket) * sizeof(float)), bits);
    const float value = qsgd_decode_code(read_code(stream, i, bits), constants, bits);
    if constexpr (kAccumulate) {
      out[i] += value;
    } else {
      out[i] = value;
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

void check_shape(const char* op, std::size_t count, int bits, std::size_t bucket) {
  GZ_REQUIRE(bits >= kQsgdMinBits && bits <= kQsgdMaxBits, ErrorCode::invalid_argument, op,
             ": bits=", bits, " is outside 1..8");
  GZ_REQUIRE(bucket >= 1, ErrorCode::invalid_argument, op, ": bucket=0 (expected >= 1)");
  GZ_REQUIRE(count <= kQsgdCudaMaxCount, ErrorCode::invalid_argument, op, ": ", count,
             " elements exceed the ", kQsgdCudaMaxCount, " a qsgd message can hold");
}

std::size_t num_buckets_for(std::size_t count, std::size_t bucket) {
  return count / bucket + (count % bucket != 0 ? 1 : 0);
}

std::size_t code_bytes_for(std::size_t count, int bits) {
  return (count * static_cast<std::size_t>(bits) + 7) / 8;
}

}  // namespace

std::size_t qsgd_payload_bytes(std::size_t count, int bits, std::size_t bucket) {
  check_shape("cuda.qsgd_payload_bytes", count, bits, bucket);
  return num_buckets_for(count, bucket) * sizeof(float) + code_bytes_for(count, bits);
}

void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream) {
  constexpr const char* kOp = "cuda.qsgd_encode";
  check_shape(kOp, count, bits, bucket);
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t num_buckets = num_buckets_for(count, bucket);
  if (bucket >= kBlockBucket) {
    scales_per_block_kernel<<<clamp_blocks(num_buckets), kThreads, 0, s>>>(d_in, count, bucket,
                                                                             num_buckets, d_payload);
  } else {
    scales_per_thread_kernel<<<grid_for(num_buckets), kThreads, 0, s>>>(d_in, count, bucket,
                                                                       num_buckets, d_payload);
  }
  check_launch(kOp, count);
  const std::size_t code_bytes = code_bytes_for(count, bits);
  codes_kernel<<<grid_for(code_bytes), kThreads, 0, s>>>(
      d_in, count, bits, bucket, params, d_payload,
      reinterpret_cast<unsigned char*>(d_payload + num_buckets * sizeof(float)), code_bytes);
  check_launch(kOp, count);
}

void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream) {
  constexpr const char* kOp = "cuda.qsgd_decode";
  check_shape(kOp, count, bits, bucket);
  GZ_REQUIRE(count == 0 || (d_payload != nullptr && d_out != nullptr), ErrorCode::invalid_argument,
             kOp, ": null payload or output for ", count, " elements");
  const auto s = static_cast<cudaStream_t>(stream);
  reset_decode_status(kOp, d_status, s);
  if (count == 0) return;
  const std::size_t num_buckets = num_buckets_for(count, bucket);
  const std::size_t code_bytes = code_bytes_for(count, bits);
  const std::size_t tasks = num_buckets > code_bytes ? num_buckets : code_bytes;
  validate_kernel<<<grid_for(tasks), kThreads, 0, s>>>(d_payload, count, bits, bucket, num_buckets,
                                                      code_bytes, d_status);
  check_launch(kOp, count);
  if (accumulate) {
    decode_kernel<true><<<grid_for(count), kThreads, 0, s>>>(d_payload, count, bits, bucket,
                                                            num_buckets, d_out, d_status);
  } else {
    decode_kernel<false><<<grid_for(count), kThreads, 0, s>>>(d_payload, count, bits, bucket,
                                                             num_buckets, d_out, d_status);
  }
  check_launch(kOp, count);
}

}  // namespace gradzip::kernels::cuda
