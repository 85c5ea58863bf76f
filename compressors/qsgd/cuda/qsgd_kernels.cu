// qsgd kernels: thin loops around compressors/qsgd/qsgd_math.h, so every code and every decoded value
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
// That is the reference variant (KernelVariant::reference). The fast variant (the default):
// Encode, one kernel (plus, for some bucket sizes, a tiny one): block s takes segment s, the
// largest number of whole buckets that fits 4096 elements (a multiple of 16 elements where
// possible), or one bucket when it is longer; thread t takes run first + t of 16 consecutive
// elements (four float4 loads when the input is 16-byte aligned). The run's |x| bits fold into
// per-bucket maxima (shared-memory atomics for the buckets a run leaves, a segmented warp
// shuffle reduction for the one it ends in); after a barrier one thread per bucket writes the
// scale and the bucket's encoder constants (one division per bucket) to shared memory; after
// another each thread encodes its run from the values still in its registers, with the four
// Philox blocks it computed at the start (element_offset % 4 != 0: the first words of the next
// block come from the right neighbour's shared-memory copy), and packs the 16 codes into
// 2 * bits bytes, stored with the widest aligned stores (bytewise where the address or the
// segment's edge demands). A bucket longer than 4096 elements is swept twice by its block
// (maxima, then codes; the second sweep re-reads through L2). A code byte shared by two
// segments (segment * bits not a multiple of 8, e.g. bucket 1001) is left by both and written
// by fast_boundary_bytes_kernel, one thread per segment boundary, from the scales in the
// payload. Decode: a validation kernel reads every scale and, only in segments with a valid
// non-finite bucket, the codes; the decode kernel (which writes nothing unless the status is
// still ok) puts each segment's decoder constants in shared memory, then each thread decodes a
// run from its 2 * bits code bytes (word loads where aligned) with float4 stores. No division
// in the per-element loops: a run's buckets are walked with a counter. Every per-thread step
// after the reductions is a function of compressors/qsgd/qsgd_fast_layout.h, which
// compressors/qsgd/tests/test_qsgd_fast_layout.cpp runs for every simulated thread on the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "compressors/qsgd/cuda/qsgd_kernels.h"
#include "compressors/qsgd/qsgd_fast_layout.h"
#include "compressors/qsgd/qsgd_math.h"
#include "gradzip/error.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/emulated/emulated_device.h"
#include "kernels/nonfinite_math.h"
#include "kernels/run_fast_layout.h"

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

// ---- fast variant (KernelVariant::fast): compressors/qsgd/qsgd_fast_layout.h ---------------------------

static_assert(kFastThreads == kThreads, "the fast kernels run blocks of kThreads");
constexpr unsigned kFullWarp = 0xFFFFFFFFu;
constexpr unsigned kWarpSize = 32;

// What every fast kernel of a launch needs.
struct FastArgs {
  const float* in;            // encode: the values
  // Fused error feedback (qsgd_encode_with_feedback), else null: the encoded values are
  // c = in + residual, and each run's residual becomes finite_or_zero(c - D(message)).
  float* residual;
  float* out;                 // decode: the output
  std::byte* payload;         // encode: written; decode: read
  unsigned char* stream;      // payload + 4 * num_buckets
  std::uint64_t count;
  std::uint64_t bucket;
  std::uint64_t code_bytes;
  QsgdFastPlan plan;
  QsgdFastKey key;
  bool vector_values;         // in / out is 16-byte aligned: float4 loads and stores
  bool aligned_scales;        // the payload is 4-byte aligned: word loads and stores of scales
};

// Scale b of the payload (launch.cuh's word or bytewise access, by a.aligned_scales).
__device__ __forceinline__ float load_scale(const FastArgs& a, std::uint64_t b) {
  return load_f32_at(a.payload, b, a.aligned_scales);
}
__device__ __forceinline__ void store_scale(const FastArgs& a, std::uint64_t b, float scale) {
  store_f32_at(a.payload, b, scale, a.aligned_scales);
}

// Merges the warp's per-run maxima into maxima[] (shared): lanes hold consecutive runs, so
// equal buckets sit in adjacent lanes; a segmented shuffle reduction leaves each bucket's
// maximum in its first lane, which raises the shared entry. All 32 lanes must call it.
__device__ __forceinline__ void merge_warp_maxima(QsgdFastRunMax tail, std::uint32_t* maxima) {
  const unsigned lane = threadIdx.x % kWarpSize;
  std::uint32_t value = tail.abs_max;
  GZ_FAST_UNROLL
  for (unsigned offset = 1; offset < kWarpSize; offset *= 2) {
    const std::uint32_t other_bucket = __shfl_down_sync(kFullWarp, tail.bucket, offset);
    const std::uint32_t other = __shfl_down_sync(kFullWarp, value, offset);
    if (lane + offset < kWarpSize && other_bucket == tail.bucket && other > value) value = other;
  }
  const std::uint32_t previous_bucket = __shfl_up_sync(kFullWarp, tail.bucket, 1);
  if (tail.bucket != kQsgdFastNoBucket && value != 0u && (lane == 0 || previous_bucket != tail.bucket)) {
    atomicMax(maxima + tail.bucket, value);
  }
}

// The run's stream bytes (bytes [2 * kBits * k, + 2 * kBits) of the code stream) to global
// memory: the widest aligned stores when the thread writes them all, else byte by byte.
template <int kBits>
__device__ __forceinline__ void store_run_bytes(unsigned char* stream, std::uint64_t k,
                                                const QsgdFastRunBytes& bytes) {
  constexpr unsigned kBytes = 2 * kBits;
  constexpr std::uint32_t kAll = (1u << kBytes) - 1u;
  unsigned char* const at = stream + std::uint64_t{kBytes} * k;
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  if (bytes.write_mask == kAll) {
    if constexpr (kBytes == 16) {
      if (address % 16 == 0) {
        *reinterpret_cast<uint4*>(at) = make_uint4(bytes.word[0], bytes.word[1], bytes.word[2], bytes.word[3]);
        return;
      }
    }
    if constexpr (kBytes % 8 == 0) {
      if (address % 8 == 0) {
        GZ_FAST_UNROLL
        for (unsigned q = 0; q < kBytes / 8; ++q) {
          reinterpret_cast<uint2*>(at)[q] = make_uint2(bytes.word[2 * q], bytes.word[2 * q + 1]);
        }
        return;
      }
    }
    if constexpr (kBytes % 4 == 0) {
      if (address % 4 == 0) {
        GZ_FAST_UNROLL
        for (unsigned q = 0; q < kBytes / 4; ++q) reinterpret_cast<std::uint32_t*>(at)[q] = bytes.word[q];
        return;
      }
    }
    if (address % 2 == 0) {
      GZ_FAST_UNROLL
      for (unsigned q = 0; q < kBytes / 2; ++q) {
        reinterpret_cast<std::uint16_t*>(at)[q] =
            static_cast<std::uint16_t>(bytes.word[q / 2] >> (16 * (q % 2)));
      }
      return;
    }
  }
  GZ_FAST_UNROLL
  for (unsigned m = 0; m < kBytes; ++m) {
    if ((bytes.write_mask >> m & 1u) != 0u) at[m] = static_cast<unsigned char>(bytes.word[m / 4] >> (8 * (m % 4)));
  }
}

// The run's stream bytes from global memory (those below code_bytes; the rest read as 0).
template <int kBits>
__device__ __forceinline__ void load_run_bytes(const unsigned char* stream, std::uint64_t k,
                                               std::uint64_t code_bytes, std::uint32_t (&word)[4]) {
  constexpr unsigned kBytes = 2 * kBits;
  const unsigned char* const at = stream + std::uint64_t{kBytes} * k;
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  const unsigned present = qsgd_fast_run_stream_bytes<kBits>(k, code_bytes);
  GZ_FAST_UNROLL
  for (unsigned w = 0; w < 4; ++w) word[w] = 0;
  if (present == kBytes) {
    if constexpr (kBytes == 16) {
      if (address % 16 == 0) {
        const uint4 v = *reinterpret_cast<const uint4*>(at);
        word[0] = v.x;
        word[1] = v.y;
        word[2] = v.z;
        word[3] = v.w;
        return;
      }
    }
    if constexpr (kBytes % 8 == 0) {
      if (address % 8 == 0) {
        GZ_FAST_UNROLL
        for (unsigned q = 0; q < kBytes / 8; ++q) {
          const uint2 v = reinterpret_cast<const uint2*>(at)[q];
          word[2 * q] = v.x;
          word[2 * q + 1] = v.y;
        }
        return;
      }
    }
    if constexpr (kBytes % 4 == 0) {
      if (address % 4 == 0) {
        GZ_FAST_UNROLL
        for (unsigned q = 0; q < kBytes / 4; ++q) word[q] = reinterpret_cast<const std::uint32_t*>(at)[q];
        return;
      }
    }
    if (address % 2 == 0) {
      GZ_FAST_UNROLL
      for (unsigned q = 0; q < kBytes / 2; ++q) {
        word[q / 2] |= std::uint32_t{reinterpret_cast<const std::uint16_t*>(at)[q]} << (16 * (q % 2));
      }
      return;
    }
  }
  GZ_FAST_UNROLL
  for (unsigned m = 0; m < kBytes; ++m) {
    if (m < present) word[m / 4] |= std::uint32_t{at[m]} << (8 * (m % 4));
  }
}

// Encode, resident segments (every bucket of at most kFastResidentAligned elements): one pass,
// thread t owns run first + t; its values and Philox blocks stay in registers from the maxima
// to the codes. Phases (qsgd_fast_layout.h): maxima -> scales and constants -> codes.
// kFused (a.residual set): the values loaded are g + e, and after the codes each thread
// decodes its run from the codes it packed and writes finite_or_zero(c - D) to the residual;
// launched only when segments hold whole runs and own whole code bytes (qsgd_fuses_feedback),
// so no thread reads or writes another thread's elements.
template <int kBits, bool kFused = false>
__global__ void __launch_bounds__(kThreads) fast_encode_resident_kernel(FastArgs a) {
  __shared__ std::uint32_t maxima[kQsgdFastMaxSegmentBuckets];
  __shared__ QsgdFastEncodeRecord records[kQsgdFastMaxSegmentBuckets];
  __shared__ QsgdFastDecodeRecord decode_records[kFused ? kQsgdFastMaxSegmentBuckets : 1];
  __shared__ Philox4x32 published[kThreads];
  const unsigned t = threadIdx.x;
  const unsigned phase = qsgd_fast_phase(a.key);
  const bool one_bucket = a.plan.segment_buckets == 1;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint32_t buckets = qsgd_fast_segment_buckets(a.plan, segment, a.bucket);
    const std::uint64_t first_bucket = s * a.plan.segment_buckets;
    for (std::uint32_t b = t; b < buckets; b += kThreads) maxima[b] = 0u;
    __syncthreads();

    // 1. Load, per-bucket maxima, own Philox blocks.
    const FastPass pass = fast_pass(segment, 0);
    const bool active = t < pass.runs;
    const std::uint64_t k = pass.first + t;
    float x[kFastRun];
    Philox4x32 own[4] = {};
    FastRunSpan span{};
    QsgdFastRunMax tail{kQsgdFastNoBucket, 0u};
    if (active) {
      fast_device::load_run(a.in, a.count, k, a.vector_values, x);
      if constexpr (kFused) {
        float e[kFastRun];
        fast_device::load_run(a.residual, a.count, k, a.vector_values, e);
        GZ_FAST_UNROLL
        for (unsigned r = 0; r < kFastRun; ++r) x[r] = x[r] + e[r];
      }
      span = fast_run_span(k, segment, a.bucket, one_bucket);
      tail = qsgd_fast_run_maxima(x, span, [](std::uint32_t b, std::uint32_t m) {
        if (m != 0u) atomicMax(maxima + b, m);
      });
      qsgd_fast_own_blocks(a.key, k, own);
      published[t] = own[0];
    }
    merge_warp_maxima(tail, maxima);
    __syncthreads();

    // 2. Scales, constants, the neighbour's Philox block.
    for (std::uint32_t b = t; b < buckets; b += kThreads) {
      const float scale = qsgd_scale_from_abs_max_bits(maxima[b]);
      store_scale(a, first_bucket + b, scale);
      records[b] = qsgd_fast_encode_record(scale, kBits);
      if constexpr (kFused) decode_records[b] = qsgd_fast_decode_record(scale, kBits);
    }
    Philox4x32 next = own[0];
    if (active && qsgd_fast_needs_next(phase, span)) next = qsgd_fast_next_block(published, t, pass.runs, a.key, k);
    __syncthreads();

    // 3. Codes (and, fused, the residual from the decoded codes).
    if (active) {
      const QsgdFastRunBytes bytes =
          qsgd_fast_run_bytes_at<kBits>(phase, x, own, next, span, segment.end == a.count, records);
      store_run_bytes<kBits>(a.stream, k, bytes);
      if constexpr (kFused) {
        float decoded[kFastRun];
        qsgd_fast_decode_run<kBits>(bytes.word, span, decode_records, decoded);
        GZ_FAST_UNROLL
        for (unsigned r = 0; r < kFastRun; ++r) decoded[r] = finite_or_zero(x[r] - decoded[r]);
        fast_device::store_run_values<false>(a.residual, k, span, decoded, a.vector_values);
      }
    }
    if constexpr (kFused) __syncthreads();  // decode_records are read before the next segment
  }
}

// Encode, one long bucket per segment: the block sweeps the bucket twice, pass by pass (the
// maxima, then the codes; the second sweep's loads mostly hit L2).
template <int kBits>
__global__ void __launch_bounds__(kThreads) fast_encode_streaming_kernel(FastArgs a) {
  __shared__ std::uint32_t maximum;
  __shared__ QsgdFastEncodeRecord record;
  __shared__ Philox4x32 published[kThreads];
  const unsigned t = threadIdx.x;
  const unsigned phase = qsgd_fast_phase(a.key);
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint64_t passes = fast_pass_count(segment);
    if (t == 0) maximum = 0u;
    __syncthreads();

    std::uint32_t abs_max = 0u;
    for (std::uint64_t p = 0; p < passes; ++p) {
      const FastPass pass = fast_pass(segment, p);
      if (t >= pass.runs) continue;
      const std::uint64_t k = pass.first + t;
      float x[kFastRun];
      fast_device::load_run(a.in, a.count, k, a.vector_values, x);
      const FastRunSpan span = fast_run_span(k, segment, a.bucket, true);
      const QsgdFastRunMax tail = qsgd_fast_run_maxima(x, span, [](std::uint32_t, std::uint32_t) {});
      abs_max = tail.abs_max > abs_max ? tail.abs_max : abs_max;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    abs_max = __reduce_max_sync(kFullWarp, abs_max);
#else  // __reduce_max_sync needs sm_80: a butterfly of shuffles gives the same maximum
    for (int lane_mask = kWarpSize / 2; lane_mask > 0; lane_mask /= 2) {
      const std::uint32_t other = __shfl_xor_sync(kFullWarp, abs_max, lane_mask);
      abs_max = other > abs_max ? other : abs_max;
    }
#endif
    if (t % kWarpSize == 0 && abs_max != 0u) atomicMax(&maximum, abs_max);
    __syncthreads();
    if (t == 0) {
      const float scale = qsgd_scale_from_abs_max_bits(maximum);
      store_scale(a, s, scale);
      record = qsgd_fast_encode_record(scale, kBits);
    }
    __syncthreads();

    for (std::uint64_t p = 0; p < passes; ++p) {
      const FastPass pass = fast_pass(segment, p);
      const bool active = t < pass.runs;
      const std::uint64_t k = pass.first + t;
      float x[kFastRun];
      Philox4x32 own[4] = {};
      FastRunSpan span{};
      if (active) {
        fast_device::load_run(a.in, a.count, k, a.vector_values, x);
        span = fast_run_span(k, segment, a.bucket, true);
        qsgd_fast_own_blocks(a.key, k, own);
        published[t] = own[0];
      }
      __syncthreads();
      if (active) {
        Philox4x32 next = own[0];
        if (qsgd_fast_needs_next(phase, span)) next = qsgd_fast_next_block(published, t, pass.runs, a.key, k);
        const QsgdFastRunBytes bytes =
            qsgd_fast_run_bytes_at<kBits>(phase, x, own, next, span, segment.end == a.count, &record);
        store_run_bytes<kBits>(a.stream, k, bytes);
      }
      __syncthreads();  // `published` is read before the next pass overwrites it
    }
  }
}

// The code bytes two segments share (plan.boundary_bytes), after the encode kernel wrote every
// scale: one thread per segment boundary.
__global__ void fast_boundary_bytes_kernel(FastArgs a, int bits) {
  for (std::uint64_t s = 1 + global_thread(); s < a.plan.num_segments; s += grid_threads()) {
    std::uint64_t byte = 0;
    if (!qsgd_fast_boundary_byte(a.plan, bits, s, &byte)) continue;
    const auto element = [&a](std::uint64_t i) { return a.in[i]; };
    const auto scale_of = [&a](std::uint64_t b) { return load_scale(a, b); };
    a.stream[byte] = static_cast<unsigned char>(
        qsgd_fast_code_byte(byte, a.count, bits, a.bucket, a.key, element, scale_of));
  }
}

// Validation: per segment, every scale; the codes of the runs only when the segment holds a
// valid non-finite bucket.
template <int kBits>
__global__ void __launch_bounds__(kThreads) fast_validate_kernel(FastArgs a, int* status) {
  __shared__ std::uint32_t flagged[kQsgdFastMaxSegmentBuckets];
  __shared__ int any_flagged;
  const unsigned t = threadIdx.x;
  const bool one_bucket = a.plan.segment_buckets == 1;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint32_t buckets = qsgd_fast_segment_buckets(a.plan, segment, a.bucket);
    const std::uint64_t first_bucket = s * a.plan.segment_buckets;
    if (t == 0) any_flagged = 0;
    __syncthreads();
    for (std::uint32_t b = t; b < buckets; b += kThreads) {
      if (!qsgd_fast_check_scale(load_scale(a, first_bucket + b), flagged + b)) {
        atomicMax(status, kQsgdStatusBadScale);
      }
      if (flagged[b] != 0u) any_flagged = 1;
    }
    __syncthreads();
    if (any_flagged != 0) {
      const std::uint64_t passes = fast_pass_count(segment);
      for (std::uint64_t p = 0; p < passes; ++p) {
        const FastPass pass = fast_pass(segment, p);
        if (t >= pass.runs) continue;
        const std::uint64_t k = pass.first + t;
        std::uint32_t word[4];
        load_run_bytes<kBits>(a.stream, k, a.code_bytes, word);
        if (qsgd_fast_run_has_flagged_code<kBits>(word, fast_run_span(k, segment, a.bucket, one_bucket), flagged)) {
          atomicMax(status, kQsgdStatusNonzeroCode);
        }
      }
    }
    __syncthreads();  // `flagged` and `any_flagged` are read before the next segment resets them
  }
}

// Decode: per segment, the buckets' constants; then each thread decodes its runs. Writes
// nothing unless *status is still ok (all validation is done by then: stream order).
template <int kBits, bool kAccumulate>
__global__ void __launch_bounds__(kThreads) fast_decode_kernel(FastArgs a, const int* status) {
  if (*status != kQsgdStatusOk) return;
  __shared__ QsgdFastDecodeRecord records[kQsgdFastMaxSegmentBuckets];
  const unsigned t = threadIdx.x;
  const bool one_bucket = a.plan.segment_buckets == 1;
  for (std::uint64_t s = blockIdx.x; s < a.plan.num_segments; s += gridDim.x) {
    const FastSegment segment = fast_segment(s, a.plan.segment_elements, a.count);
    const std::uint32_t buckets = qsgd_fast_segment_buckets(a.plan, segment, a.bucket);
    const std::uint64_t first_bucket = s * a.plan.segment_buckets;
    for (std::uint32_t b = t; b < buckets; b += kThreads) {
      records[b] = qsgd_fast_decode_record(load_scale(a, first_bucket + b), kBits);
    }
    __syncthreads();
    const std::uint64_t passes = fast_pass_count(segment);
    for (std::uint64_t p = 0; p < passes; ++p) {
      const FastPass pass = fast_pass(segment, p);
      if (t >= pass.runs) continue;
      const std::uint64_t k = pass.first + t;
      std::uint32_t word[4];
      load_run_bytes<kBits>(a.stream, k, a.code_bytes, word);
      const FastRunSpan span = fast_run_span(k, segment, a.bucket, one_bucket);
      float values[kFastRun];
      qsgd_fast_decode_run<kBits>(word, span, records, values);
      fast_device::store_run_values<kAccumulate>(a.out, k, span, values, a.vector_values);
    }
    __syncthreads();  // `records` are read before the next segment overwrites them
  }
}

template <int kBits>
void launch_fast_encode(const FastArgs& a, cudaStream_t stream) {
  const unsigned blocks = clamp_blocks(a.plan.num_segments);
  if (a.plan.resident) {
    fast_encode_resident_kernel<kBits><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    fast_encode_streaming_kernel<kBits><<<blocks, kThreads, 0, stream>>>(a);
  }
}

template <int kBits>
void launch_fast_decode(const FastArgs& a, bool accumulate, int* status, cudaStream_t stream) {
  const unsigned blocks = clamp_blocks(a.plan.num_segments);
  fast_validate_kernel<kBits><<<blocks, kThreads, 0, stream>>>(a, status);
  if (accumulate) {
    fast_decode_kernel<kBits, true><<<blocks, kThreads, 0, stream>>>(a, status);
  } else {
    fast_decode_kernel<kBits, false><<<blocks, kThreads, 0, stream>>>(a, status);
  }
}

// Calls launch(std::integral_constant<int, bits>{}) (bits in 1..8, checked before).
template <class Launch>
void with_bits(int bits, Launch&& launch) {
  switch (bits) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    case 5: launch(std::integral_constant<int, 5>{}); break;
    case 6: launch(std::integral_constant<int, 6>{}); break;
    case 7: launch(std::integral_constant<int, 7>{}); break;
    default: launch(std::integral_constant<int, 8>{}); break;
  }
}

// ---- host side ---------------------------------------------------------------------------------

FastArgs fast_args(const float* in, float* out, std::byte* payload, std::size_t count, int bits,
                   std::size_t bucket, const QsgdFastKey& key, float* residual = nullptr) {
  FastArgs a{};
  a.in = in;
  a.residual = residual;
  a.out = out;
  a.payload = payload;
  a.stream = reinterpret_cast<unsigned char*>(payload + qsgd_buckets(count, bucket) * sizeof(float));
  a.count = count;
  a.bucket = bucket;
  a.code_bytes = qsgd_code_bytes(count, bits);
  a.plan = qsgd_fast_plan(count, bits, bucket);
  a.key = key;
  a.vector_values = aligned_to(in != nullptr ? static_cast<const void*>(in) : out, 16) &&
                    (residual == nullptr || aligned_to(residual, 16));
  a.aligned_scales = aligned_to(payload, 4);
  return a;
}

}  // namespace

void qsgd_encode(const float* d_in, std::size_t count, int bits, std::size_t bucket,
                 const QsgdEncodeParams& params, std::byte* d_payload, void* d_workspace,
                 std::size_t* workspace_bytes, void* stream, KernelVariant variant) {
  if (emulated::active())
    return emulated::qsgd_encode(d_in, count, bits, bucket, params, d_payload, d_workspace,
                                 workspace_bytes, stream, variant);
  constexpr const char* kOp = "cuda.qsgd_encode";
  check_qsgd_shape(kOp, count, bits, bucket);
  if (answered_workspace_query(d_workspace, workspace_bytes)) return;
  if (!require_encode_buffers(kOp, d_in, d_payload, count)) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t num_buckets = qsgd_buckets(count, bucket);
  if (variant == KernelVariant::fast) {
    const QsgdFastKey key{params.seed, params.step, params.tensor_id, params.element_offset};
    const FastArgs a = fast_args(d_in, nullptr, d_payload, count, bits, bucket, key);
    with_bits(bits, [&](auto width) { launch_fast_encode<decltype(width)::value>(a, s); });
    check_launch(kOp, count);
    if (a.plan.boundary_bytes) {
      fast_boundary_bytes_kernel<<<grid_for(a.plan.num_segments - 1), kThreads, 0, s>>>(a, bits);
      check_launch(kOp, count);
    }
    return;
  }
  if (bucket >= kBlockBucket) {
    scales_per_block_kernel<<<clamp_blocks(num_buckets), kThreads, 0, s>>>(d_in, count, bucket,
                                                                             num_buckets, d_payload);
  } else {
    scales_per_thread_kernel<<<grid_for(num_buckets), kThreads, 0, s>>>(d_in, count, bucket,
                                                                       num_buckets, d_payload);
  }
  check_launch(kOp, count);
  const std::size_t code_bytes = qsgd_code_bytes(count, bits);
  codes_kernel<<<grid_for(code_bytes), kThreads, 0, s>>>(
      d_in, count, bits, bucket, params, d_payload,
      reinterpret_cast<unsigned char*>(d_payload + num_buckets * sizeof(float)), code_bytes);
  check_launch(kOp, count);
}

bool qsgd_encode_with_feedback(const float* d_grad, float* d_residual, std::size_t count, int bits,
                               std::size_t bucket, const QsgdEncodeParams& params,
                               std::byte* d_payload, void* stream) {
  if (emulated::active())
    return emulated::qsgd_encode_with_feedback(d_grad, d_residual, count, bits, bucket, params,
                                               d_payload, stream);
  constexpr const char* kOp = "cuda.qsgd_encode_with_feedback";
  check_qsgd_shape(kOp, count, bits, bucket);
  if (!qsgd_fuses_feedback(count, bits, bucket)) return false;
  require_feedback_buffers(kOp, d_grad, d_residual, d_payload, count);
  const QsgdFastKey key{params.seed, params.step, params.tensor_id, params.element_offset};
  const FastArgs a = fast_args(d_grad, nullptr, d_payload, count, bits, bucket, key, d_residual);
  const auto s = static_cast<cudaStream_t>(stream);
  with_bits(bits, [&](auto width) {
    fast_encode_resident_kernel<decltype(width)::value, true>
        <<<clamp_blocks(a.plan.num_segments), kThreads, 0, s>>>(a);
  });
  check_launch(kOp, count);
  return true;
}

void qsgd_decode(const std::byte* d_payload, std::size_t count, int bits, std::size_t bucket,
                 float* d_out, bool accumulate, int* d_status, void* stream, KernelVariant variant) {
  if (emulated::active())
    return emulated::qsgd_decode(d_payload, count, bits, bucket, d_out, accumulate, d_status,
                                 stream, variant);
  constexpr const char* kOp = "cuda.qsgd_decode";
  check_qsgd_shape(kOp, count, bits, bucket);
  require_decode_buffers(kOp, d_payload, d_out, count);
  const auto s = static_cast<cudaStream_t>(stream);
  reset_decode_status(kOp, d_status, s);
  if (count == 0) return;
  if (variant == KernelVariant::fast) {
    // The decoders only read the payload: fast_args' pointer is not const for the encoder's sake.
    const FastArgs a = fast_args(nullptr, d_out, const_cast<std::byte*>(d_payload), count, bits,
                                 bucket, QsgdFastKey{});
    with_bits(bits, [&](auto width) {
      launch_fast_decode<decltype(width)::value>(a, accumulate, d_status, s);
    });
    check_launch(kOp, count);
    return;
  }
  const std::size_t num_buckets = qsgd_buckets(count, bucket);
  const std::size_t code_bytes = qsgd_code_bytes(count, bits);
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
