// The fast qsgd CUDA kernels' per-thread work (compressors/qsgd/qsgd_fast_layout.h), run on the CPU for
// every simulated thread of a launch, in the kernels' order of phases, against the CPU codec:
//   encode: the payload equals the CPU codec's byte for byte, and every payload byte is
//           written exactly once (scales by their segment, code bytes by one run's thread or,
//           for a byte shared by two segments, by the boundary-byte pass);
//   decode: decode / decode-accumulate equal the CPU codec's, every element written once;
//   validation: the status the kernels would report for malformed payloads.
// What the kernels do with warp shuffles and shared-memory atomics (the per-bucket maxima, the
// merge of the runs' last buckets) is computed directly here; everything after it (the scales,
// the constants, the Philox words, the codes, the byte masks, the stores) goes through the
// functions the kernels call. Values a thread loads outside its span are replaced by junk, so
// that a function reading them fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/host_device.h"
#include "compressors/qsgd/qsgd_fast_layout.h"
#include "compressors/qsgd/qsgd_math.h"
#include "kernels/run_fast_layout.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using kernels::bits_float;
using kernels::FastPass;
using kernels::FastRunSpan;
using kernels::FastSegment;
using kernels::float_bits;
using kernels::kFastRun;
using kernels::kFastThreads;
using kernels::Philox4x32;
using kernels::QsgdFastKey;
using kernels::QsgdFastPlan;

constexpr std::uint64_t kBuckets[] = {1, 2, 3, 7, 16, 17, 100, 128, 255, 256, 257, 512, 1001, 4095, 4096, 4097, 10000};
constexpr int kStatusOk = 0, kStatusNonzeroCode = 1, kStatusBadScale = 2;  // qsgd_kernels.h's

std::unique_ptr<Codec> qsgd_codec(int bits, std::uint64_t bucket) {
  return make_codec("qsgd:bits=" + std::to_string(bits) + ",bucket=" + std::to_string(bucket));
}

EncodeContext context_of(const QsgdFastKey& key) {
  EncodeContext ctx;
  ctx.seed = key.seed;
  ctx.step = key.step;
  ctx.tensor_id = key.tensor_id;
  ctx.element_offset = key.element_offset;
  return ctx;
}

QsgdFastKey key_at(std::uint64_t element_offset) {
  return QsgdFastKey{0x5EED5EED12345678ull, 11, 42, element_offset};
}

// Calls f(std::integral_constant<int, bits>) (the kernels are templates on bits).
template <class F>
void with_bits(int bits, F&& f) {
  switch (bits) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    default: FAIL() << "bits " << bits;
  }
}

using testing::ceil_div;

// Gaussian values with zeros everywhere, and in a few places: runs of subnormal, tiny (whole
// buckets with a scale below 2^-64) and huge values; with `nonfinite`, scattered Inf and NaN
// (for short tensors, one of each). Most buckets of every tested size stay plain gaussian, so
// that their codes use all levels.
std::vector<float> make_values(std::size_t count, std::uint64_t seed, bool nonfinite) {
  std::vector<float> x = testing::gaussian(count, seed);
  const auto scale_run = [&](std::size_t begin, std::size_t n, float factor) {
    for (std::size_t i = begin; i < begin + n && i < count; ++i) x[i] *= factor;
  };
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = (i * 0x9E3779B97F4A7C15ull + seed) >> 40;
    if (h % 29 == 0) x[i] = 0.0f;
    if (nonfinite && h % 2003 == 3) x[i] = std::numeric_limits<float>::infinity() * (h % 2 ? 1.0f : -1.0f);
    if (nonfinite && h % 3001 == 4) x[i] = bits_float(0x7FC00000u | static_cast<std::uint32_t>(h & 0xFFu));
  }
  scale_run(count / 5, 64, 1e-42f);  // subnormal
  scale_run(count / 3, 40, 1e-30f);  // tiny
  scale_run(count / 2, 8, 1e37f);    // huge
  if (nonfinite && count > 2 && count < 1000) {
    x[count / 2] = std::numeric_limits<float>::infinity();
    x[count - 2] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

// A thread's 16 loads of run k: the input inside the span, junk elsewhere (on the device the
// values there are the neighbours' or 0; the functions must not look at them).
void load_run(const std::vector<float>& x, std::uint64_t k, const FastRunSpan& span, float (&run)[kFastRun]) {
  for (unsigned r = 0; r < kFastRun; ++r) {
    const std::uint64_t i = k * kFastRun + r;
    const bool inside = r >= span.first && r < span.end;
    run[r] = inside ? x[i] : (r % 2 == 0 ? bits_float(0x7FC0BEEFu) : -3.0e38f);
  }
}

using Payload = testing::EmulatedPayload;

// The fast encode launch, thread by thread.
Payload emulate_encode(const std::vector<float>& x, int bits, std::uint64_t bucket, const QsgdFastKey& key) {
  const std::uint64_t count = x.size();
  const std::uint64_t num_buckets = ceil_div(count, bucket);
  const std::uint64_t code_bytes = ceil_div(count * static_cast<std::uint64_t>(bits), 8);
  const std::size_t scale_bytes = 4 * num_buckets;
  Payload payload(scale_bytes + code_bytes);
  const QsgdFastPlan plan = kernels::qsgd_fast_plan(count, bits, bucket);
  const bool one_bucket = plan.segment_buckets == 1;
  const unsigned phase = kernels::qsgd_fast_phase(key);
  Philox4x32 junk;
  for (std::uint32_t& w : junk.v) w = 0xDEADBEEFu;

  with_bits(bits, [&](auto bits_constant) {
    constexpr int kBits = decltype(bits_constant)::value;
    for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
      const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
      const std::uint32_t buckets = kernels::qsgd_fast_segment_buckets(plan, segment, bucket);
      const std::uint64_t first_bucket = s * plan.segment_buckets;
      const std::uint64_t passes = kernels::fast_pass_count(segment);
      if (plan.resident) {
        ASSERT_EQ(passes, 1u) << "segment " << s;
      }
      ASSERT_LE(buckets, kernels::kQsgdFastMaxSegmentBuckets);
      // 1. Maxima (the kernel's atomics and warp merge, done directly).
      std::vector<std::uint32_t> maxima(buckets, 0);
      for (std::uint64_t p = 0; p < passes; ++p) {
        const FastPass pass = kernels::fast_pass(segment, p);
        for (unsigned t = 0; t < pass.runs; ++t) {
          const std::uint64_t k = pass.first + t;
          const FastRunSpan span = kernels::fast_run_span(k, segment, bucket, one_bucket);
          ASSERT_LT(span.first, span.end) << "run " << k << " of segment " << s << " is empty";
          float run[kFastRun];
          load_run(x, k, span, run);
          const auto merge = [&](std::uint32_t b, std::uint32_t m) {
            ASSERT_LT(b, buckets);
            maxima[b] = std::max(maxima[b], m);
          };
          const kernels::QsgdFastRunMax tail = kernels::qsgd_fast_run_maxima(run, span, merge);
          merge(tail.bucket, tail.abs_max);
        }
      }
      // 2. Scales and constants.
      std::vector<kernels::QsgdFastEncodeRecord> records(buckets);
      for (std::uint32_t b = 0; b < buckets; ++b) {
        const float scale = kernels::qsgd_scale_from_abs_max_bits(maxima[b]);
        payload.write_scale(first_bucket + b, scale);
        records[b] = kernels::qsgd_fast_encode_record(scale, kBits);
      }
      // 3. Codes, pass by pass: own blocks published, then the runs.
      for (std::uint64_t p = 0; p < passes; ++p) {
        const FastPass pass = kernels::fast_pass(segment, p);
        std::vector<Philox4x32> published(kFastThreads, junk);
        std::vector<std::array<Philox4x32, 4>> own(pass.runs);
        for (unsigned t = 0; t < pass.runs; ++t) {
          Philox4x32 blocks[4];
          kernels::qsgd_fast_own_blocks(key, pass.first + t, blocks);
          std::copy(std::begin(blocks), std::end(blocks), own[t].begin());
          published[t] = blocks[0];
        }
        for (unsigned t = 0; t < pass.runs; ++t) {
          const std::uint64_t k = pass.first + t;
          const FastRunSpan span = kernels::fast_run_span(k, segment, bucket, one_bucket);
          float run[kFastRun];
          load_run(x, k, span, run);
          Philox4x32 blocks[4];
          std::copy(own[t].begin(), own[t].end(), std::begin(blocks));
          const Philox4x32 next = kernels::qsgd_fast_needs_next(phase, span)
                                      ? kernels::qsgd_fast_next_block(published.data(), t, pass.runs, key, k)
                                      : junk;
          const kernels::QsgdFastRunBytes bytes = kernels::qsgd_fast_run_bytes_at<kBits>(
              phase, run, blocks, next, span, segment.end == count, records.data());
          for (unsigned m = 0; m < 2 * kBits; ++m) {
            if ((bytes.write_mask >> m & 1u) == 0) continue;
            const std::uint64_t byte = std::uint64_t{2 * kBits} * k + m;
            ASSERT_LT(byte, code_bytes) << "run " << k << " byte " << m;
            payload.write(scale_bytes + byte, bytes.word[m / 4] >> (8 * (m % 4)));
          }
        }
      }
    }
  });
  // 4. The bytes two segments share, after the scales are in the payload.
  if (plan.boundary_bytes) {
    for (std::uint64_t s = 1; s < plan.num_segments; ++s) {
      std::uint64_t byte = 0;
      if (!kernels::qsgd_fast_boundary_byte(plan, bits, s, &byte)) continue;
      const auto element = [&](std::uint64_t i) { return x.at(i); };
      const auto scale_of = [&](std::uint64_t b) {
        std::uint32_t scale_bits = 0;
        std::memcpy(&scale_bits, payload.bytes.data() + 4 * b, 4);
        return bits_float(scale_bits);
      };
      payload.write(scale_bytes + byte, kernels::qsgd_fast_code_byte(byte, count, bits, bucket, key, element, scale_of));
    }
  }
  return payload;
}

std::vector<std::byte> cpu_message(const std::vector<float>& x, int bits, std::uint64_t bucket,
                                   const QsgdFastKey& key) {
  return testing::encode_message(*qsgd_codec(bits, bucket), host_view(x.data(), x.size()), context_of(key));
}

// The emulated payload equals the CPU codec's and every byte was written once.
void check_encode(const std::vector<float>& x, int bits, std::uint64_t bucket, const QsgdFastKey& key) {
  SCOPED_TRACE("count=" + std::to_string(x.size()) + " bits=" + std::to_string(bits) + " bucket=" +
               std::to_string(bucket) + " element_offset=" + std::to_string(key.element_offset));
  const std::vector<std::byte> message = cpu_message(x, bits, bucket, key);
  const Payload payload = emulate_encode(x, bits, bucket, key);
  if (::testing::Test::HasFatalFailure()) return;
  const std::size_t scale_bytes = 4 * ceil_div(x.size(), bucket);
  ASSERT_TRUE(testing::matches_message_payload(payload, message, scale_bytes, "code"));
}

// ---- decode ------------------------------------------------------------------------------------

// The fast decode launch, thread by thread: d_out = decode(payload), or += when accumulating.
void emulate_decode(const std::byte* payload, std::uint64_t count, int bits, std::uint64_t bucket,
                    bool accumulate, std::vector<float>& out) {
  const std::uint64_t num_buckets = ceil_div(count, bucket);
  const std::uint64_t code_bytes = ceil_div(count * static_cast<std::uint64_t>(bits), 8);
  const std::byte* stream = payload + 4 * num_buckets;
  const QsgdFastPlan plan = kernels::qsgd_fast_plan(count, bits, bucket);
  std::vector<int> writes(count, 0);
  with_bits(bits, [&](auto bits_constant) {
    constexpr int kBits = decltype(bits_constant)::value;
    for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
      const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
      const std::uint32_t buckets = kernels::qsgd_fast_segment_buckets(plan, segment, bucket);
      std::vector<kernels::QsgdFastDecodeRecord> records(buckets);
      for (std::uint32_t b = 0; b < buckets; ++b) {
        std::uint32_t scale_bits = 0;
        std::memcpy(&scale_bits, payload + 4 * (s * plan.segment_buckets + b), 4);
        records[b] = kernels::qsgd_fast_decode_record(bits_float(scale_bits), kBits);
      }
      for (std::uint64_t p = 0; p < kernels::fast_pass_count(segment); ++p) {
        const FastPass pass = kernels::fast_pass(segment, p);
        for (unsigned t = 0; t < pass.runs; ++t) {
          const std::uint64_t k = pass.first + t;
          const FastRunSpan span =
              kernels::fast_run_span(k, segment, bucket, plan.segment_buckets == 1);
          std::uint32_t word[4] = {0, 0, 0, 0};
          const unsigned present = kernels::qsgd_fast_run_stream_bytes<kBits>(k, code_bytes);
          for (unsigned m = 0; m < present; ++m) {
            word[m / 4] |= std::to_integer<std::uint32_t>(stream[2 * kBits * k + m]) << (8 * (m % 4));
          }
          float values[kFastRun];
          kernels::qsgd_fast_decode_run<kBits>(word, span, records.data(), values);
          for (unsigned r = span.first; r < span.end; ++r) {
            const std::uint64_t i = k * kFastRun + r;
            ASSERT_LT(i, count);
            out[i] = accumulate ? out[i] + values[r] : values[r];
            ++writes[i];
          }
        }
      }
    }
  });
  for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(writes[i], 1) << "element " << i;
}

// The fast validation launch: the status the kernels would leave.
int emulate_validate(const std::byte* payload, std::uint64_t count, int bits, std::uint64_t bucket) {
  const std::uint64_t num_buckets = ceil_div(count, bucket);
  const std::uint64_t code_bytes = ceil_div(count * static_cast<std::uint64_t>(bits), 8);
  const std::byte* stream = payload + 4 * num_buckets;
  const QsgdFastPlan plan = kernels::qsgd_fast_plan(count, bits, bucket);
  int status = kStatusOk;
  with_bits(bits, [&](auto bits_constant) {
    constexpr int kBits = decltype(bits_constant)::value;
    for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
      const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
      const std::uint32_t buckets = kernels::qsgd_fast_segment_buckets(plan, segment, bucket);
      std::vector<std::uint32_t> flagged(buckets, 0);
      bool any_flagged = false;
      for (std::uint32_t b = 0; b < buckets; ++b) {
        std::uint32_t scale_bits = 0;
        std::memcpy(&scale_bits, payload + 4 * (s * plan.segment_buckets + b), 4);
        if (!kernels::qsgd_fast_check_scale(bits_float(scale_bits), &flagged[b])) {
          status = std::max(status, kStatusBadScale);
        }
        any_flagged |= flagged[b] != 0;
      }
      if (!any_flagged) continue;
      for (std::uint64_t p = 0; p < kernels::fast_pass_count(segment); ++p) {
        const FastPass pass = kernels::fast_pass(segment, p);
        for (unsigned t = 0; t < pass.runs; ++t) {
          const std::uint64_t k = pass.first + t;
          const FastRunSpan span =
              kernels::fast_run_span(k, segment, bucket, plan.segment_buckets == 1);
          std::uint32_t word[4] = {0, 0, 0, 0};
          const unsigned present = kernels::qsgd_fast_run_stream_bytes<kBits>(k, code_bytes);
          for (unsigned m = 0; m < present; ++m) {
            word[m / 4] |= std::to_integer<std::uint32_t>(stream[2 * kBits * k + m]) << (8 * (m % 4));
          }
          if (kernels::qsgd_fast_run_has_flagged_code<kBits>(word, span, flagged.data())) {
            status = std::max(status, kStatusNonzeroCode);
          }
        }
      }
    }
  });
  return status;
}

void check_decode(const std::vector<std::byte>& message, std::uint64_t count, int bits, std::uint64_t bucket) {
  SCOPED_TRACE("decode count=" + std::to_string(count) + " bits=" + std::to_string(bits) +
               " bucket=" + std::to_string(bucket));
  const auto codec = qsgd_codec(bits, bucket);
  const std::byte* payload = message.data() + kWireHeaderBytes;
  EXPECT_EQ(emulate_validate(payload, count, bits, bucket), kStatusOk);
  std::vector<float> want(count), got(count, bits_float(0xEEEEEEEEu));
  codec->decode(message, host_view(want.data(), count));
  emulate_decode(payload, count, bits, bucket, false, got);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(testing::same_bits(got, want));

  std::vector<float> want_acc = testing::gaussian(count, 99), got_acc = want_acc;
  codec->decode_add(message, want_acc.data(), count);
  emulate_decode(payload, count, bits, bucket, true, got_acc);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(testing::same_bits(got_acc, want_acc));
}

// ---- tests -------------------------------------------------------------------------------------

TEST(QsgdFastLayout, PlanCutsWholeBucketsIntoResidentSegments) {
  for (std::uint64_t bucket : kBuckets) {
    for (int bits = 1; bits <= 8; ++bits) {
      const QsgdFastPlan plan = kernels::qsgd_fast_plan(100000, bits, bucket);
      SCOPED_TRACE("bucket=" + std::to_string(bucket) + " bits=" + std::to_string(bits));
      EXPECT_GE(plan.segment_buckets, 1u);
      EXPECT_LE(plan.segment_buckets, kernels::kQsgdFastMaxSegmentBuckets);
      EXPECT_EQ(plan.segment_elements, plan.segment_buckets * bucket);
      EXPECT_EQ(plan.num_segments, ceil_div(100000, plan.segment_elements));
      EXPECT_EQ(plan.resident, bucket <= 4096 && !(bucket == 4095)) << "4095 fits no resident segment";
      if (plan.resident) {
        // At most one run per thread, wherever the segment starts.
        const std::uint64_t worst_runs = plan.segment_elements % kFastRun == 0
                                             ? plan.segment_elements / kFastRun
                                             : ceil_div(plan.segment_elements + kFastRun - 1, kFastRun);
        EXPECT_LE(worst_runs, kFastThreads);
      } else {
        EXPECT_EQ(plan.segment_buckets, 1u);
      }
      EXPECT_EQ(plan.boundary_bytes, (plan.segment_elements * bits) % 8 != 0);
    }
  }
  // The benchmark's shape: 8 buckets of 512 per block, no shared bytes.
  const QsgdFastPlan plan = kernels::qsgd_fast_plan(std::uint64_t{1} << 28, 4, 512);
  EXPECT_EQ(plan.segment_elements, 4096u);
  EXPECT_TRUE(plan.resident);
  EXPECT_FALSE(plan.boundary_bytes);
  EXPECT_EQ(kernels::qsgd_fast_plan(0, 4, 512).num_segments, 0u);
}

TEST(QsgdFastLayout, RunSpansCoverEverySegmentElementOnceWithItsBucket) {
  for (std::uint64_t bucket : kBuckets) {
    for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{9}, std::uint64_t{12289}}) {
      const QsgdFastPlan plan = kernels::qsgd_fast_plan(count, 3, bucket);
      std::vector<int> seen(count, 0);
      for (std::uint64_t s = 0; s < plan.num_segments; ++s) {
        const FastSegment segment = kernels::fast_segment(s, plan.segment_elements, count);
        for (std::uint64_t p = 0; p < kernels::fast_pass_count(segment); ++p) {
          const FastPass pass = kernels::fast_pass(segment, p);
          ASSERT_GE(pass.runs, 1u);
          ASSERT_LE(pass.runs, kFastThreads);
          for (unsigned t = 0; t < pass.runs; ++t) {
            const std::uint64_t k = pass.first + t;
            const FastRunSpan span = kernels::fast_run_span(k, segment, bucket, plan.segment_buckets == 1);
            kernels::FastBucketWalk walk(span);
            for (unsigned r = span.first; r < span.end; ++r) {
              const std::uint64_t i = k * kFastRun + r;
              ASSERT_GE(i, segment.begin);
              ASSERT_LT(i, segment.end);
              ++seen[i];
              ASSERT_EQ(s * plan.segment_buckets + walk.next(), i / bucket)
                  << "bucket " << bucket << " element " << i;
            }
          }
        }
      }
      for (std::uint64_t i = 0; i < count; ++i) ASSERT_EQ(seen[i], 1) << "bucket " << bucket << " element " << i;
    }
  }
}

// Sizes 0, 1, 7, 8, 9 and a few around a run, every bucket, every bit width, element offsets
// in all four positions of a Philox block.
TEST(QsgdFastLayout, SmallCountsEncodeAndDecodeLikeTheCpuCodec) {
  for (std::size_t count : {0, 1, 7, 8, 9, 15, 16, 17, 33}) {
    const std::vector<float> x = make_values(count, count + 1, count % 2 == 1);
    for (std::uint64_t bucket : kBuckets) {
      for (int bits = 1; bits <= 8; ++bits) {
        for (std::uint64_t offset : {0, 1, 2, 3}) {
          check_encode(x, bits, bucket, key_at(offset));
          if (HasFatalFailure()) return;
        }
        check_decode(cpu_message(x, bits, bucket, key_at(0)), count, bits, bucket);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Counts that span several segments (launch blocks) and leave partial buckets, runs and bytes.
TEST(QsgdFastLayout, CountsOverSeveralBlocksEncodeAndDecodeLikeTheCpuCodec) {
  for (std::size_t count : {4099, 12289, 70001}) {
    const std::vector<float> x = make_values(count, count, true);
    for (std::uint64_t bucket : kBuckets) {
      for (int bits = 1; bits <= 8; ++bits) {
        check_encode(x, bits, bucket, key_at(count == 12289 ? 2 : 0));
        if (HasFatalFailure()) return;
        check_decode(cpu_message(x, bits, bucket, key_at(1)), count, bits, bucket);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Chunks at element offsets that are not multiples of 4 (a run's words come from five Philox
// blocks, the fifth from the neighbour thread or computed by the pass's last thread), far
// offsets, and a Philox block counter that crosses 2^32.
TEST(QsgdFastLayout, ElementOffsetsEncodeLikeTheCpuCodec) {
  const std::vector<float> x = make_values(20011, 5, true);
  for (std::uint64_t offset : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{5},
                               std::uint64_t{512 * 37}, (std::uint64_t{1} << 34) + 7,
                               std::uint64_t{0xFFFFFFFFull * 4 - 2}}) {
    for (std::uint64_t bucket : {std::uint64_t{3}, std::uint64_t{7}, std::uint64_t{512},
                                 std::uint64_t{1001}, std::uint64_t{4097}, std::uint64_t{10000}}) {
      for (int bits : {1, 3, 4, 8}) {
        check_encode(x, bits, bucket, key_at(offset));
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Another key: the high seed word, the step and the tensor id reach the words.
TEST(QsgdFastLayout, OtherKeysEncodeLikeTheCpuCodec) {
  const std::vector<float> x = make_values(5003, 8, false);
  const QsgdFastKey key{0xFEDCBA9876543210ull, 0xFFFFFFF0u, 0x80000001u, 6};
  for (int bits = 1; bits <= 8; ++bits) {
    check_encode(x, bits, 64, key);
    if (HasFatalFailure()) return;
  }
}

void set_scale(std::vector<std::byte>& message, std::size_t b, std::uint32_t bits) {
  std::memcpy(message.data() + kWireHeaderBytes + 4 * b, &bits, 4);
}

void set_stream_bit(std::vector<std::byte>& message, std::size_t scale_bytes, std::size_t bit) {
  message[kWireHeaderBytes + scale_bytes + bit / 8] |= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
}

// The status of each malformed payload is the largest offence, as the CPU codec refuses it.
TEST(QsgdFastLayout, ValidationFindsEveryOffence) {
  for (std::uint64_t bucket : {std::uint64_t{7}, std::uint64_t{512}, std::uint64_t{1001}, std::uint64_t{5000}}) {
    const std::size_t count = 30003;  // at least 6 buckets of each size
    const std::size_t num_buckets = ceil_div(count, bucket);
    const std::size_t scale_bytes = 4 * num_buckets;
    std::vector<float> x = testing::gaussian(count, 5);
    const std::size_t nan_bucket = 2;  // and the last, short bucket holds an Inf
    x[nan_bucket * bucket + bucket / 2] = std::numeric_limits<float>::quiet_NaN();
    x[count - 1] = std::numeric_limits<float>::infinity();
    for (int bits = 1; bits <= 8; ++bits) {
      SCOPED_TRACE("bucket=" + std::to_string(bucket) + " bits=" + std::to_string(bits));
      const auto codec = qsgd_codec(bits, bucket);
      const std::vector<std::byte> valid = cpu_message(x, bits, bucket, key_at(0));
      EXPECT_EQ(emulate_validate(valid.data() + kWireHeaderBytes, count, bits, bucket), kStatusOk);
      const auto w = static_cast<std::size_t>(bits);
      struct Case {
        const char* name;
        std::vector<std::byte> message;
        int status;
      };
      std::vector<Case> cases;
      const auto with = [&](const char* name, int status, auto edit) {
        std::vector<std::byte> message = valid;
        edit(message);
        cases.push_back(Case{name, std::move(message), status});
      };
      with("negative scale", kStatusBadScale, [&](auto& m) { set_scale(m, 1, 0xBF800000u); });
      with("-0 scale", kStatusBadScale, [&](auto& m) { set_scale(m, 0, 0x80000000u); });
      with("other NaN of the last bucket", kStatusBadScale, [&](auto& m) { set_scale(m, num_buckets - 1, 0x7FC00001u); });
      with("first code bit of the NaN bucket", kStatusNonzeroCode,
           [&](auto& m) { set_stream_bit(m, scale_bytes, nan_bucket * bucket * w); });
      with("last code bit of the NaN bucket", kStatusNonzeroCode,
           [&](auto& m) { set_stream_bit(m, scale_bytes, (nan_bucket + 1) * bucket * w - 1); });
      with("last element of the Inf bucket", kStatusNonzeroCode,
           [&](auto& m) { set_stream_bit(m, scale_bytes, (count - 1) * w + w - 1); });
      with("a bucket made Inf with codes", kStatusNonzeroCode, [&](auto& m) {
        set_scale(m, 3, 0x7F800000u);
        set_stream_bit(m, scale_bytes, 3 * bucket * w + w);
      });
      with("both offences", kStatusBadScale, [&](auto& m) {
        set_stream_bit(m, scale_bytes, nan_bucket * bucket * w);
        set_scale(m, 4, 0xC0000000u);
      });
      for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        EXPECT_EQ(testing::error_code_of([&] {
                    std::vector<float> out(count);
                    codec->decode(c.message, host_view(out.data(), count));
                  }),
                  ErrorCode::malformed_message);
        EXPECT_EQ(emulate_validate(c.message.data() + kWireHeaderBytes, count, bits, bucket), c.status);
      }
      // The bits of the next bucket, right after the NaN bucket's last bit, may be set.
      std::vector<std::byte> neighbour = valid;
      set_stream_bit(neighbour, scale_bytes, (nan_bucket + 1) * bucket * w);
      EXPECT_EQ(emulate_validate(neighbour.data() + kWireHeaderBytes, count, bits, bucket), kStatusOk);
    }
  }
}

}  // namespace
}  // namespace gradzip
