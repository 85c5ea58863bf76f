// sign kernels: thin loops around compressors/sign/sign_math.h (built with --fmad=false, IEEE division
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
// That is the reference variant (KernelVariant::reference). The fast variant (the default):
// Encode, one kernel: block s takes segment s, the largest number of whole buckets that fits
// 4096 elements, and stages it (plus the up to 7 elements its last sign byte needs) in shared
// memory with coalesced float4 loads; thread (bucket, lane) folds its canonical lane from
// shared memory (sign_fast_lane_fold, the reference's lane l in the reference's order); one
// thread per bucket combines the lanes with the reference's functions (overflow rescue
// included; buckets under 16 elements take sign_bucket_scale itself) and writes the scale;
// each warp builds the sign bytes of 32 elements at a time with a ballot and stores them as
// one word (bytewise at the segment's edges or an unaligned address). Each sign byte belongs to
// the segment holding its first element. A bucket longer than 4096 elements is staged chunk
// by chunk, 16 threads carrying its lane sums across the chunks, and its sign bytes re-read
// the input (through L2). Decode: one thread checks the unused bits (as in the reference); the
// decode kernel puts each segment's scales in shared memory, then each thread decodes a run of
// 16 elements from its two sign bytes with float4 stores, walking the run's buckets with a
// counter (no division per element). Every per-thread step after the ballot is a function of
// compressors/sign/sign_fast_layout.h, which compressors/sign/tests/test_sign_fast_layout.cpp runs on the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "compressors/sign/cuda/sign_kernels.h"
#include "compressors/sign/sign_fast_layout.h"
#include "compressors/sign/sign_math.h"
#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/nonfinite_math.h"
#include "kernels/run_fast_layout.h"

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

// ---- fast variant (KernelVariant::fast): compressors/sign/sign_fast_layout.h ---------------------------

static_assert(kFastThreads == kThreads, "the fast kernels run blocks of kThreads");
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr unsigned kWarps = kThreads / kWarp;

// What every fast kernel of a launch needs.
struct FastArgs {
  const float* in;        // encode: the values
  // Fused error feedback (sign_encode_with_feedback), else null: the encoded values are
  // c = in + residual, and the residual of each segment's elements becomes
  // finite_or_zero(c - D(message)).
  float* residual;
  float* out;             // decode: the output
  std::byte* scales;      // the payload (its first 4 * num_buckets bytes)
  unsigned char* bits;    // the sign bytes after them
  std::uint64_t count;
  std::uint64_t bucket;
  std::uint64_t bit_bytes;
  SignFastPlan plan;
  bool vector_values;     // in / out is 16-byte aligned: float4 loads and stores
  bool aligned_scales;    // the payload is 4-byte aligned: word loads and stores of scales
};

// Scale b of the payload (launch.cuh's word or bytewise access, by a.aligned_scales).
__device__ __forceinline__ float load_scale(const FastArgs& a, std::uint64_t b) {
  return load_f32_at(a.scales, b, a.aligned_scales);
}
__device__ __forceinline__ void store_scale(const FastArgs& a, std::uint64_t b, float scale) {
  store_f32_at(a.scales, b, scale, a.aligned_scales);
}

// in[first, end) -> staged[0, end - first) by the whole block, coalesced: float4 loads for the
// 16-byte-aligned middle when `vector` (then float4 shared stores too when `first` is a
// multiple of 4). The caller synchronises before reading.
// With `add` (fused error feedback; 16-byte aligned like `in` when `vector`), staged[i] is
// in[first + i] + add[first + i], the f32 add of error feedback's c = g + e.
__device__ __forceinline__ float staged_value(const float* in, const float* add, std::uint64_t i) {
  return add != nullptr ? in[i] + add[i] : in[i];
}
__device__ __forceinline__ float4 staged_quad(const float4* in, const float4* add, std::uint64_t j) {
  float4 quad = in[j];
  if (add != nullptr) {
    const float4 other = add[j];
    quad.x = quad.x + other.x;
    quad.y = quad.y + other.y;
    quad.z = quad.z + other.z;
    quad.w = quad.w + other.w;
  }
  return quad;
}

__device__ __forceinline__ void stage(const float* in, const float* add, std::uint64_t first,
                                      std::uint64_t end, bool vector, float* staged) {
  const std::uint64_t n = end - first;
  const unsigned t = threadIdx.x;
  if (!vector) {
    for (std::uint64_t i = t; i < n; i += kThreads) staged[i] = staged_value(in, add, first + i);
    return;
  }
  std::uint64_t head = (4 - first % 4) % 4;
  if (head > n) head = n;
  for (std::uint64_t i = t; i < head; i += kThreads) staged[i] = staged_value(in, add, first + i);
  const std::uint64_t quads = (n - head) / 4;
  const float4* source = reinterpret_cast<const float4*>(in + first + head);
  const float4* added = add != nullptr ? reinterpret_cast<const float4*>(add + first + head) : nullptr;
  if (head == 0) {
    float4* const target = reinterpret_cast<float4*>(staged);
    for (std::uint64_t j = t; j < quads; j += kThreads) target[j] = staged_quad(source, added, j);
  } else {
    for (std::uint64_t j = t; j < quads; j += kThreads) {
      const float4 quad = staged_quad(source, added, j);
      float* const at = staged + head + 4 * j;
      at[0] = quad.x;
      at[1] = quad.y;
      at[2] = quad.z;
      at[3] = quad.w;
    }
  }
  for (std::uint64_t i = head + 4 * quads + t; i < n; i += kThreads)
    staged[i] = staged_value(in, add, first + i);
}

// Group G's word (the warp's ballot) to sign bytes 4G .. 4G+3, those in `mask`: one word store
// when all four are and the address allows, else one byte per lane 0..3.
__device__ __forceinline__ void store_group(unsigned char* bits, std::uint64_t group, std::uint32_t word,
                                            std::uint32_t mask, unsigned lane) {
  unsigned char* const at = bits + 4 * group;
  if (mask == 0xFu && reinterpret_cast<std::uintptr_t>(at) % 4 == 0) {
    if (lane == 0) *reinterpret_cast<std::uint32_t*>(at) = word;
  } else if (lane < 4 && (mask >> lane & 1u) != 0u) {
    at[lane] = static_cast<unsigned char>(word >> (8 * lane));
  }
}

// The sign bytes a segment owns, one 32-element group per warp step; load(i) gives element i
// for i in [lo, hi). Every lane of the block must call it (ballots).
template <class Load>
__device__ __forceinline__ void write_sign_bytes(const FastArgs& a, const FastSegment& segment,
                                                 std::uint64_t lo, std::uint64_t hi, Load&& load) {
  const unsigned warp = threadIdx.x / kWarp;
  const unsigned lane = threadIdx.x % kWarp;
  const SignFastBytes bytes = sign_fast_owned_bytes(segment);
  const std::uint64_t end = sign_fast_end_group(bytes);
  for (std::uint64_t group = sign_fast_first_group(bytes) + warp; group < end; group += kWarps) {
    const std::uint32_t word = __ballot_sync(kFullWarp, sign_fast_lane_bit(group, lane, lo, hi, load) != 0u);
    store_group(a.bits, group, word, sign_fast_group_mask(group, bytes), lane);
  }
}

// Encode, resident segments (bucket <= kFastResidentAligned): stage the segment, fold the
// lanes, the scales, the sign bytes; the input is read once.
__global__ void __launch_bounds__(kThreads) fast_encode_resident_kernel(FastArgs a) {
  __shared__ __align__(16) float staged[kSignFastStaged];
  __shared__ float lanes[kSignFastMaxLaneBuckets * kSignLanes];
  const unsigned t = threadIdx.x;
  const bool lane_sums = a.bucket >= kSignLanes;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint64_t staged_end = sign_fast_staged_end(segment, a.count);
    const std::uint64_t buckets = sign_fast_segment_buckets(a.plan, segment, a.bucket);
    stage(a.in, a.residual, segment.begin, staged_end, a.vector_values, staged);
    __syncthreads();
    if (lane_sums) {
      for (std::uint64_t p = t; p < buckets * kSignLanes; p += kThreads) {
        const std::uint64_t b = p / kSignLanes;
        lanes[p] = sign_fast_lane_fold(0.0f, staged + b * a.bucket, sign_fast_bucket_length(segment, a.bucket, b),
                                       static_cast<unsigned>(p % kSignLanes));
      }
    }
    __syncthreads();
    for (std::uint64_t b = t; b < buckets; b += kThreads) {
      const float* const x = staged + b * a.bucket;
      const std::uint64_t len = sign_fast_bucket_length(segment, a.bucket, b);
      const float scale = lane_sums ? sign_fast_scale_from_lanes(lanes + b * kSignLanes, x, len)
                                    : sign_bucket_scale(x, len);
      store_scale(a, s * a.plan.segment_buckets + b, scale);
    }
    const std::uint64_t begin = segment.begin;
    write_sign_bytes(a, segment, begin, staged_end, [begin](std::uint64_t i) { return staged[i - begin]; });
    if (a.residual != nullptr) {
      // e = finite_or_zero(c - D): the segment's scales were written by this block (visible
      // after the barrier); c is staged. Only the segment's own elements: segments of fused
      // calls end on sign-byte boundaries, so nothing was staged from the next one.
      __syncthreads();
      const std::uint64_t first_bucket = s * a.plan.segment_buckets;
      for (std::uint64_t i = begin + t; i < segment.end; i += kThreads) {
        const float c = staged[i - begin];
        const float scale = load_scale(a, first_bucket + (i - begin) / a.bucket);
        a.residual[i] = finite_or_zero(c - sign_decoded(scale, sign_bit(c)));
      }
    }
    __syncthreads();  // `staged` and `lanes` are read before the next segment overwrites them
  }
}

// Encode, one long bucket per segment: staged chunk by chunk, threads 0..15 carrying their
// lane sums across the chunks; the sign bytes read the input again (mostly from L2).
__global__ void __launch_bounds__(kThreads) fast_encode_streaming_kernel(FastArgs a) {
  __shared__ __align__(16) float staged[kFastResidentAligned];
  __shared__ float lanes[kSignLanes];
  const unsigned t = threadIdx.x;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    float sum = 0.0f;
    for (std::uint64_t first = segment.begin; first < segment.end; first += kFastResidentAligned) {
      const std::uint64_t end =
          segment.end - first < kFastResidentAligned ? segment.end : first + kFastResidentAligned;
      stage(a.in, nullptr, first, end, a.vector_values, staged);
      __syncthreads();
      // The chunk starts a multiple of 16 elements into the bucket: its lane l is the bucket's.
      if (t < kSignLanes) sum = sign_fast_lane_fold(sum, staged, end - first, t);
      __syncthreads();
    }
    if (t < kSignLanes) lanes[t] = sum;
    __syncthreads();
    if (t == 0) {
      store_scale(a, s, sign_fast_scale_from_lanes(lanes, a.in + segment.begin, segment.end - segment.begin));
    }
    const float* const in = a.in;
    write_sign_bytes(a, segment, segment.begin, sign_fast_staged_end(segment, a.count),
                     [in](std::uint64_t i) { return in[i]; });
    __syncthreads();  // `lanes` is read before the next segment overwrites it
  }
}

// Decode: per segment, the scales into shared memory; then each thread decodes its runs.
// Writes nothing unless *status is still ok (the validation ran before: stream order).
template <bool kAccumulate>
__global__ void __launch_bounds__(kThreads) fast_decode_kernel(FastArgs a, const int* status) {
  if (*status != kSignStatusOk) return;
  __shared__ float scales[kFastResidentAligned];
  const unsigned t = threadIdx.x;
  const bool one_bucket = a.plan.segment_buckets == 1;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint64_t buckets = sign_fast_segment_buckets(a.plan, segment, a.bucket);
    for (std::uint64_t b = t; b < buckets; b += kThreads) {
      scales[b] = load_scale(a, s * a.plan.segment_buckets + b);
    }
    __syncthreads();
    const std::uint64_t passes = fast_pass_count(segment);
    for (std::uint64_t p = 0; p < passes; ++p) {
      const FastPass pass = fast_pass(segment, p);
      if (t >= pass.runs) continue;
      const std::uint64_t k = pass.first + t;
      const unsigned char* const at = a.bits + 2 * k;
      std::uint32_t bits = 0;
      if (a.bit_bytes - 2 * k >= 2 && reinterpret_cast<std::uintptr_t>(at) % 2 == 0) {
        bits = *reinterpret_cast<const std::uint16_t*>(at);
      } else {
        bits = at[0];
        if (a.bit_bytes - 2 * k >= 2) bits |= std::uint32_t{at[1]} << 8;
      }
      const FastRunSpan span = fast_run_span(k, segment, a.bucket, one_bucket);
      float values[kFastRun];
      sign_fast_decode_run(bits, span, scales, values);
      fast_device::store_run_values<kAccumulate>(a.out, k, span, values, a.vector_values);
    }
    __syncthreads();  // `scales` are read before the next segment overwrites them
  }
}

// ---- host side ---------------------------------------------------------------------------------

FastArgs fast_args(const float* in, float* out, std::byte* payload, std::size_t count,
                   std::size_t bucket, float* residual = nullptr) {
  FastArgs a{};
  a.in = in;
  a.residual = residual;
  a.out = out;
  a.scales = payload;
  a.bits = reinterpret_cast<unsigned char*>(payload + sign_buckets(count, bucket) * sizeof(float));
  a.count = count;
  a.bucket = bucket;
  a.bit_bytes = sign_bit_bytes(count);
  a.plan = sign_fast_plan(count, bucket);
  a.vector_values = aligned_to(in != nullptr ? static_cast<const void*>(in) : out, 16) &&
                    (residual == nullptr || aligned_to(residual, 16));
  a.aligned_scales = aligned_to(payload, 4);
  return a;
}

}  // namespace

void sign_encode(const float* d_in, std::size_t count, std::size_t bucket, std::byte* d_payload,
                 void* d_workspace, std::size_t* workspace_bytes, void* stream,
                 KernelVariant variant) {
  if (emulated::active())
    return emulated::sign_encode(d_in, count, bucket, d_payload, d_workspace, workspace_bytes,
                                 stream, variant);
  constexpr const char* kOp = "cuda.sign_encode";
  sign_payload_bytes(count, bucket);  // validates bucket and the size
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (variant == KernelVariant::fast) {
    const FastArgs a = fast_args(d_in, nullptr, d_payload, count, bucket);
    const unsigned blocks = clamp_blocks(a.plan.num_segments);
    if (a.plan.resident) {
      fast_encode_resident_kernel<<<blocks, kThreads, 0, s>>>(a);
    } else {
      fast_encode_streaming_kernel<<<blocks, kThreads, 0, s>>>(a);
    }
    check_launch(kOp, count);
    return;
  }
  const std::size_t num_buckets = sign_buckets(count, bucket);
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
  const std::size_t bit_bytes = sign_bit_bytes(count);
  bits_kernel<<<grid_for(bit_bytes), kThreads, 0, s>>>(
      d_in, count, reinterpret_cast<unsigned char*>(d_payload + num_buckets * sizeof(float)),
      bit_bytes);
  check_launch(kOp, count);
}

bool sign_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count,
                               std::size_t bucket, std::byte* d_payload, void* stream) {
  if (emulated::active())
    return emulated::sign_encode_with_feedback(d_grad, d_residual, count, bucket, d_payload, stream);
  constexpr const char* kOp = "cuda.sign_encode_with_feedback";
  sign_payload_bytes(count, bucket);  // validates bucket and the size
  if (!sign_fuses_feedback(count, bucket)) return false;
  require_feedback_buffers(kOp, d_grad, d_residual, d_payload, count);
  const FastArgs a = fast_args(d_grad, nullptr, d_payload, count, bucket, d_residual);
  fast_encode_resident_kernel<<<clamp_blocks(a.plan.num_segments), kThreads, 0,
                                static_cast<cudaStream_t>(stream)>>>(a);
  check_launch(kOp, count);
  return true;
}

void sign_decode(const std::byte* d_payload, std::size_t count, std::size_t bucket, float* d_out,
                 bool accumulate, int* d_status, void* stream, KernelVariant variant) {
  if (emulated::active())
    return emulated::sign_decode(d_payload, count, bucket, d_out, accumulate, d_status, stream,
                                 variant);
  constexpr const char* kOp = "cuda.sign_decode";
  sign_payload_bytes(count, bucket);  // validates bucket and the size
  require_decode_buffers(kOp, d_payload, d_out, count);
  const auto s = static_cast<cudaStream_t>(stream);
  reset_decode_status(kOp, d_status, s);
  if (count == 0) return;
  const std::size_t num_buckets = sign_buckets(count, bucket);
  const auto* bits = reinterpret_cast<const unsigned char*>(d_payload + num_buckets * sizeof(float));
  if (count % 8 != 0) {
    validate_kernel<<<1, 1, 0, s>>>(bits, count, d_status);
    check_launch(kOp, count);
  }
  if (variant == KernelVariant::fast) {
    // The decoder only reads the payload: fast_args' pointer is not const for the encoder's sake.
    const FastArgs a = fast_args(nullptr, d_out, const_cast<std::byte*>(d_payload), count, bucket);
    const unsigned blocks = clamp_blocks(a.plan.num_segments);
    if (accumulate) {
      fast_decode_kernel<true><<<blocks, kThreads, 0, s>>>(a, d_status);
    } else {
      fast_decode_kernel<false><<<blocks, kThreads, 0, s>>>(a, d_status);
    }
    check_launch(kOp, count);
    return;
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
