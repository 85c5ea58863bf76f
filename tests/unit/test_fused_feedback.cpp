// Error feedback fused into sign's, qsgd's and the casts' encodes (compressors/fused_feedback.h)
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
#include "kernels/nonfinite_math.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using kernels::cpu::Isa;

constexpr Isa kIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512};

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

// The fused encode of `spec` on every ISA, for each count, plain and special inputs, against
// general_path: the same message bytes and, bit for bit, the same residual.
void expect_fused_is_general(const std::string& spec, std::initializer_list<std::size_t> counts,
                             const EncodeContext& ctx = {}) {
  for (const Isa isa : kIsas) {
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

TEST(FusedFeedback, SignGivesTheGeneralPathsMessageAndResidualOnEveryIsa) {
  // Buckets that cut the 4096-element blocks anywhere (3, 4095: blocks of lcm(bucket, 8)),
  // counts that end mid-bucket and mid-byte; the special inputs overflow bucket sums (the
  // rescue) and hold an inf and a NaN.
  for (const std::size_t bucket : {1u, 3u, 8u, 64u, 512u, 4095u, 4096u, 5000u})
    expect_fused_is_general("sign:bucket=" + std::to_string(bucket),
                            {0, 1, 7, 100, 4096, 4097, 12345, 40001});
}

TEST(FusedFeedback, CastsGiveTheGeneralPathsMessageAndResidualOnEveryIsa) {
  // Near FLT_MAX fp16 overflows to inf: the residual's finite_or_zero guard is exercised.
  for (const char* spec : {"fp16", "bf16"}) expect_fused_is_general(spec, {0, 1, 7, 4096, 4097, 40001});
}

// qsgd draws its stochastic rounding from (seed, step, tensor id, element index): an element
// offset that is not a multiple of 4 starts the chunk inside a Philox block.
TEST(FusedFeedback, QsgdGivesTheGeneralPathsMessageAndResidualOnEveryIsa) {
  for (const char* spec : {"qsgd:bits=4", "qsgd:bits=8,bucket=64", "qsgd:bits=2,bucket=7",
                           "qsgd:bits=3,bucket=5000", "qsgd:bits=1,bucket=100"}) {
    expect_fused_is_general(spec, {0, 1, 7, 4096, 4097, 40001}, EncodeContext{77, 3, 9, 4101});
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
TEST(FusedFeedback, ErrorFeedbackCodecGivesTheSameBytesWithAndWithoutTheFusedPath) {
  for (const Isa isa : kIsas) {
    testing::ScopedIsa forced(isa);
    for (const char* spec : {"sign", "sign:bucket=7", "sign:bucket=70000", "fp16", "bf16",
                             "qsgd:bits=4", "qsgd:bits=3,bucket=77", "qsgd:bits=4,bucket=70000"}) {
      SCOPED_TRACE(::testing::Message() << kernels::cpu::isa_name(isa) << " " << spec);
      const std::shared_ptr<const Codec> codec = make_codec(spec);
      error_feedback::ResidualStore fused_store(1, 0, ResizePolicy::error);
      error_feedback::ResidualStore general_store(1, 0, ResizePolicy::error);
      error_feedback::ErrorFeedbackCodec fused(codec, fused_store);
      error_feedback::ErrorFeedbackCodec general(codec, general_store);
      const std::size_t count = 10007;
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
