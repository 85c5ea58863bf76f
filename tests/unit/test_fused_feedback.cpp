// Error feedback fused into sign's, qsgd's, top-k's and the casts' encodes (compressors/fused_feedback.h)
// against the general path it replaces, on every ISA: the same message bytes as encode(g + e) and, bit for bit, the
// same residual finite_or_zero(g + e - D(message)), for bucket sizes that cut blocks anywhere,
// counts that end mid-bucket and mid-byte, and inputs whose bucket sums overflow (the rescue),
// hold an inf or a NaN. Also through ErrorFeedbackCodec, whose in-place path takes the fused
// encode and whose decoded-output path does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compressors/fused_feedback.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "kernels/cpu/cpu_features.h"
#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/topk_math.h"
#include "kernels/nonfinite_math.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using kernels::cpu::Isa;


bool same_bits(std::span<const float> a, std::span<const float> b) {
  // (empty spans may have null data, which memcmp must not get)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// g and e of `count` elements; `special` adds elements near FLT_MAX (bucket sums that overflow:
// the rescue), an inf and a NaN.
struct Inputs {
  std::vector<float> g, e;
};
Inputs make_inputs(std::size_t count, std::uint64_t seed, bool special) {
  Inputs in{testing::gaussian(count, seed), testing::gaussian(count, seed + 1, 0.1f)};
  if (special && count > 40) {
    for (std::size_t i = 5; i < 12; ++i) in.g[i] = 3.0e38f;  // their sum overflows f32
    in.g[count / 2] = std::numeric_limits<float>::infinity();
    in.e[count - 3] = std::numeric_limits<float>::quiet_NaN();
  }
  return in;
}

// The general path: message = encode(g + e), residual = finite_or_zero(g + e - D(message)).
struct Reference {
  std::vector<std::byte> message;
  std::vector<float> residual;
};
Reference general_path(const Codec& codec, const Inputs& in, const EncodeContext& ctx) {
  const std::size_t count = in.g.size();
  std::vector<float> corrected(count);
  for (std::size_t i = 0; i < count; ++i) corrected[i] = in.g[i] + in.e[i];
  Reference ref;
  ref.message = testing::encode_message(
      codec, ConstTensorView{corrected.data(), count, DType::f32, Device{}}, ctx);
  const std::vector<float> decoded = testing::decode_to_f32(codec, ref.message, count);
  ref.residual.resize(count);
  for (std::size_t i = 0; i < count; ++i)
    ref.residual[i] = kernels::finite_or_zero(corrected[i] - decoded[i]);
  return ref;
}

// The fused encode of `spec` on `isa`, for each count, plain and special inputs, against
// general_path: the same message bytes and, bit for bit, the same residual.
void expect_fused_is_general(Isa isa, const std::string& spec, std::initializer_list<std::size_t> counts,
                             const EncodeContext& ctx = {}) {
  {
    testing::ScopedIsa forced(isa);
    const std::unique_ptr<Codec> codec = make_codec(spec);
    const auto* fused = dynamic_cast<const compressors::FusedFeedbackEncoder*>(codec.get());
    ASSERT_NE(fused, nullptr) << spec;
    for (const std::size_t count : counts) {
      for (const bool special : {false, true}) {
        SCOPED_TRACE(::testing::Message() << kernels::cpu::isa_name(isa) << " " << spec
                                          << " count " << count << " special " << special);
        Inputs in = make_inputs(count, 100 + count + spec.size(), special);
        const Reference ref = general_path(*codec, in, ctx);
        std::vector<std::byte> message(codec->max_encoded_bytes(count));
        const std::optional<std::size_t> bytes =
            fused->encode_with_feedback(in.g.data(), in.e.data(), count, message, ctx);
        ASSERT_TRUE(bytes.has_value());
        ASSERT_EQ(*bytes, ref.message.size());
        EXPECT_TRUE(std::memcmp(message.data(), ref.message.data(), *bytes) == 0)
            << "message bytes differ";
        EXPECT_TRUE(same_bits(in.e, ref.residual)) << "residual differs";
      }
    }
  }
}

class FusedFeedbackOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(FusedFeedbackOnEachIsa);

TEST_P(FusedFeedbackOnEachIsa, SignGivesTheGeneralPathsMessageAndResidualOnEveryIsa) {
  // Buckets that cut the 4096-element blocks anywhere (3, 4095: blocks of lcm(bucket, 8)),
  // counts that end mid-bucket and mid-byte; the special inputs overflow bucket sums (the
  // rescue) and hold an inf and a NaN.
  for (const std::size_t bucket : {1u, 3u, 8u, 64u, 512u, 4095u, 4096u, 5000u})
    expect_fused_is_general(GetParam(), "sign:bucket=" + std::to_string(bucket),
                            {0, 1, 7, 100, 4096, 4097, 12345, 40001});
}

TEST_P(FusedFeedbackOnEachIsa, CastsGiveTheGeneralPathsMessageAndResidualOnEveryIsa) {
  // Near FLT_MAX fp16 overflows to inf: the residual's finite_or_zero guard is exercised.
  for (const char* spec : {"fp16", "bf16"}) expect_fused_is_general(GetParam(), spec, {0, 1, 7, 4096, 4097, 40001});
}

// qsgd draws its stochastic rounding from (seed, step, tensor id, element index): an element
// offset that is not a multiple of 4 starts the chunk inside a Philox block.
TEST_P(FusedFeedbackOnEachIsa, QsgdGivesTheGeneralPathsMessageAndResidualOnEveryIsa) {
  for (const char* spec : {"qsgd:bits=4", "qsgd:bits=8,bucket=64", "qsgd:bits=2,bucket=7",
                           "qsgd:bits=3,bucket=5000", "qsgd:bits=1,bucket=100"}) {
    expect_fused_is_general(GetParam(), spec, {0, 1, 7, 4096, 4097, 40001}, EncodeContext{77, 3, 9, 4101});
  }
}

// Top-k fuses from kTopkSampleAllCount + 1 elements on (smaller tensors form g + e first):
// counts on both sides, exact and approx, f16 values (whose residual keeps g' - f16(g')), k = 1
// and k = n. (64-bit indices need more than 2^32 elements: not here.)
TEST_P(FusedFeedbackOnEachIsa, TopkGivesTheGeneralPathsMessageAndResidualOnEveryIsa) {
  static_assert(kernels::kTopkSampleAllCount == 65536);
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.001,approx=on",
                           "topk:ratio=0.05,values=fp16", "topk:k=1", "topk:ratio=1"}) {
    expect_fused_is_general(GetParam(), spec, {0, 1, 7, 65536, 65537, 100003, 300001},
                            EncodeContext{77, 3, 9, 0});
  }
}

// The kernel itself, on inputs that drive each step of the selection (compressors/topk/topk_cpu.h):
// e must end as g + e and the result (entries, path, threshold, candidate count) must be
// topk_select's of that sum. Which path each case takes is asserted too, so that the cases
// keep covering steps 2 to 5 if the sampling changes.
TEST_P(FusedFeedbackOnEachIsa, TopkKernelSelectsAsTopkSelectOfTheSumOnEveryPath) {
  using kernels::cpu::TopkPath;
  struct Case {
    const char* name;
    std::size_t k;
    bool approx;
    TopkPath expected_path;
    std::vector<float> g, e;
    bool overflows_while_collecting = false;  // step 2 collected (threshold > 0) and overflowed
  };
  const std::size_t n = 200003;
  std::vector<Case> cases;
  {
    Inputs in = make_inputs(n, 5, true);
    cases.push_back({"gaussian with inf and NaN", 2000, false, TopkPath::candidates, in.g, in.e});
  }
  {
    Inputs in = make_inputs(n, 6, false);
    cases.push_back({"gaussian, approx", 2000, true, TopkPath::approx_accepted, in.g, in.e});
  }
  {
    // Sums that are 0 except for 100 elements: the sampled threshold is 0, step 2 overflows
    // without collecting, step 4 finds fewer than k above 0 (K = 0, the tie class).
    std::vector<float> g(n, 0.0f), e(n, 0.0f);
    for (std::size_t i = 0; i < 100; ++i) g[i * 1999] = 1.0f + static_cast<float>(i);
    cases.push_back({"mostly zero", 1000, false, TopkPath::tie_class, g, e});
  }
  {
    // g = -e everywhere except 50 large sums: the sum, not g or e, must be selected. The sums
    // are 0 elsewhere: threshold 0, 50 < k above it, the rest of k from the tie class at 0.
    std::vector<float> g = testing::gaussian(n, 8), e(n);
    for (std::size_t i = 0; i < n; ++i) e[i] = -g[i];
    for (std::size_t i = 0; i < 50; ++i) e[i * 3001 + 17] += 0.5f + static_cast<float>(i);
    cases.push_back({"cancelling", 60, false, TopkPath::tie_class, g, e});
  }
  {
    // Equal magnitudes but for 10 larger sums and a NaN in the last 3 elements: the threshold
    // is that magnitude, so step 2 overflows while collecting and must still form the rest of
    // g' (the NaN included); step 4 finds the 10 and takes the tie class.
    std::vector<float> g(n), e(n);
    for (std::size_t i = 0; i < n; ++i) {
      g[i] = i % 2 == 0 ? 0.75f : -0.75f;
      e[i] = i % 2 == 0 ? 0.25f : -0.25f;
    }
    for (std::size_t i = 0; i < 10; ++i) g[i * 7919] = 5.0f;
    e[n - 2] = std::numeric_limits<float>::quiet_NaN();
    cases.push_back({"overflow while collecting", 1000, false, TopkPath::tie_class, g, e, true});
  }
  {
    // A ramp: the top k are the last k elements, one contiguous run at the end.
    std::vector<float> g(n), e(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i) * 1e-3f;
    cases.push_back({"ramp", 20000, false, TopkPath::candidates, g, e});
  }
  {
    // The sampled runs (compressors/topk/topk_math.h, same key as `options` below) hold 100 (split
    // between g and e), every other element 1: the threshold is 100, step 2 finds only the
    // 65536 sampled elements, fewer than k, and step 5's radix select runs over the sum. With
    // k = 100000 the candidate buffer holds all n and the top digit's bin is collected
    // (radix_bin); with k = 70000 it holds 192560 < n: every level runs over the tensor.
    std::vector<float> g(n, 1.0f), e(n, 0.0f);
    for (std::uint64_t segment = 0; segment < kernels::kTopkSampleGroups; ++segment) {
      const std::uint64_t start = kernels::topk_sample_run_start(n, segment, 11, 2, 3);
      for (std::uint64_t i = start; i < start + kernels::kTopkSampleRun; ++i) {
        g[i] = 60.0f;
        e[i] = 40.0f;
      }
    }
    cases.push_back({"sample above the rest", 100000, false, TopkPath::radix_bin, g, e});
    cases.push_back({"sample above the rest, smaller k", 70000, false, TopkPath::full_radix, g, e});
  }
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << kernels::cpu::isa_name(isa) << " " << c.name);
      std::vector<float> sum(n);
      for (std::size_t i = 0; i < n; ++i) sum[i] = c.g[i] + c.e[i];
      const kernels::cpu::TopkOptions options{c.approx, 11, 2, 3};
      std::vector<std::uint32_t> want_index(c.k), got_index(c.k);
      std::vector<float> want_value(c.k), got_value(c.k);
      const kernels::cpu::TopkResult want = kernels::cpu::topk_select<std::uint32_t>(
          ConstTensorView{sum.data(), n, DType::f32, Device{}}, c.k, options, want_index.data(),
          want_value.data());
      std::vector<float> e = c.e;
      bool any_non_finite = false;
      const kernels::cpu::TopkResult got = kernels::cpu::topk_select_with_feedback<std::uint32_t>(
          c.g.data(), e.data(), n, c.k, options, got_index.data(), got_value.data(),
          any_non_finite);
      EXPECT_EQ(want.path, c.expected_path);
      if (c.overflows_while_collecting) {
        EXPECT_GT(want.threshold, 0u);
        EXPECT_EQ(want.candidates, kernels::cpu::kTopkCollectOverflow);
      }
      EXPECT_EQ(got.path, want.path);
      EXPECT_EQ(got.count, want.count);
      EXPECT_EQ(got.threshold, want.threshold);
      EXPECT_EQ(got.candidates, want.candidates);
      EXPECT_EQ(got_index, want_index);
      EXPECT_TRUE(same_bits(got_value, want_value));
      EXPECT_TRUE(same_bits(e, sum)) << "e does not hold g + e";
      const bool sum_non_finite = std::any_of(sum.begin(), sum.end(), [](float v) {
        return kernels::f32_bits_nonfinite(kernels::float_bits(v));
      });
      EXPECT_EQ(any_non_finite, sum_non_finite);
    }
  }
}

TEST(FusedFeedback, SignAndQsgdDeclineBucketsTooLargeForABlockAndChangeNothing) {
  // lcm(70000, 8) = 70000 > 65536 elements: the general path runs instead.
  for (const char* spec : {"sign:bucket=70000", "qsgd:bits=4,bucket=70000"}) {
    SCOPED_TRACE(spec);
    const std::unique_ptr<Codec> codec = make_codec(spec);
    const auto* fused = dynamic_cast<const compressors::FusedFeedbackEncoder*>(codec.get());
    ASSERT_NE(fused, nullptr);
    Inputs in = make_inputs(1000, 7, false);
    const std::vector<float> e_before = in.e;
    std::vector<std::byte> message(codec->max_encoded_bytes(1000), std::byte{0x5A});
    EXPECT_FALSE(fused->encode_with_feedback(in.g.data(), in.e.data(), 1000, message, EncodeContext{}));
    EXPECT_TRUE(same_bits(in.e, e_before));
    for (const std::byte b : message) ASSERT_EQ(b, std::byte{0x5A});
  }
}

// Through the decorator: its in-place path (no decoded output asked) takes the fused encode,
// its decoded-output path the general one; both must give the same bytes and residual, every
// step (the residual carries over), for sign and for a bucket the fused path declines.
TEST_P(FusedFeedbackOnEachIsa, ErrorFeedbackCodecGivesTheSameBytesWithAndWithoutTheFusedPath) {
  {
    const Isa isa = GetParam();
    testing::ScopedIsa forced(isa);
    for (const char* spec : {"sign", "sign:bucket=7", "sign:bucket=70000", "fp16", "bf16",
                             "qsgd:bits=4", "qsgd:bits=3,bucket=77", "qsgd:bits=4,bucket=70000",
                             "topk:ratio=0.1", "topk:ratio=0.1,values=fp16"}) {
      SCOPED_TRACE(::testing::Message() << kernels::cpu::isa_name(isa) << " " << spec);
      const std::shared_ptr<const Codec> codec = make_codec(spec);
      error_feedback::ResidualStore fused_store(1, 0, ResizePolicy::error);
      error_feedback::ResidualStore general_store(1, 0, ResizePolicy::error);
      error_feedback::ErrorFeedbackCodec fused(codec, fused_store);
      error_feedback::ErrorFeedbackCodec general(codec, general_store);
      const std::size_t count = 70001;  // above kTopkSampleAllCount: top-k fuses
      for (std::uint64_t step = 0; step < 3; ++step) {
        const std::vector<float> g = testing::gaussian(count, 40 + step);
        const ConstTensorView view{g.data(), count, DType::f32, Device{}};
        std::vector<std::byte> a(codec->max_encoded_bytes(count)), b(a.size());
        std::vector<float> decoded(count);
        const std::size_t a_bytes = fused.encode_chunk("t", count, view, a, EncodeContext{});
        const std::size_t b_bytes =
            general.encode_chunk("t", count, view, b, EncodeContext{}, decoded);
        ASSERT_EQ(a_bytes, b_bytes);
        EXPECT_TRUE(std::memcmp(a.data(), b.data(), a_bytes) == 0) << "step " << step;
        EXPECT_TRUE(same_bits(fused_store.residual("t"), general_store.residual("t")))
            << "step " << step;
      }
      // The residual is not trivially zero (sign drops most of the signal, a cast the low bits).
      const std::span<const float> e = fused_store.residual("t");
      EXPECT_GT(std::count_if(e.begin(), e.end(), [](float v) { return v != 0.0f; }), 9000);
    }
  }
}

}  // namespace
}  // namespace gradzip
