// Spec strings: every codec and key parses to the documented value, canonical strings
// round-trip, and each bad string gets an invalid_spec error that says what was wrong.
#include <gtest/gtest.h>

#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

TEST(CompressionSpec, DefaultsPerCodec) {
  const auto none = CompressionSpec::parse("none");
  EXPECT_EQ(none.codec, CodecKind::none);
  EXPECT_FALSE(none.error_feedback);
  EXPECT_EQ(CompressionSpec::parse("fp16").codec, CodecKind::fp16);
  EXPECT_EQ(CompressionSpec::parse("bf16").codec, CodecKind::bf16);
  const auto qsgd = CompressionSpec::parse("qsgd");
  EXPECT_EQ(qsgd.bits, 8);
  EXPECT_EQ(qsgd.bucket, 512u);
  EXPECT_FALSE(qsgd.error_feedback);
  const auto sign = CompressionSpec::parse("sign");
  EXPECT_EQ(sign.bucket, 512u);
  EXPECT_TRUE(sign.error_feedback);
  const auto topk = CompressionSpec::parse("topk");
  EXPECT_DOUBLE_EQ(topk.ratio, 0.01);
  EXPECT_EQ(topk.k, 0u);
  EXPECT_FALSE(topk.approx);
  EXPECT_EQ(topk.values, DType::f32);
  EXPECT_TRUE(topk.error_feedback);
  EXPECT_TRUE(CompressionSpec::parse("randk").error_feedback);
  EXPECT_EQ(CompressionSpec::parse("powersgd").rank, 4);
  EXPECT_EQ(none.algo, Algorithm::auto_select);
  EXPECT_EQ(none.warmup, 0u);
  EXPECT_EQ(none.min_bytes, 65536u);
  EXPECT_EQ(none.ranks_per_node, 0u);
  EXPECT_EQ(none.seed, 0u);
  EXPECT_EQ(none.ef_resize, ResizePolicy::error);
  EXPECT_EQ(none.nonfinite, NonfinitePolicy::propagate);
}

TEST(CompressionSpec, EveryKeyParses) {
  const auto qsgd = CompressionSpec::parse("qsgd:bits=4,bucket=128");
  EXPECT_EQ(qsgd.bits, 4);
  EXPECT_EQ(qsgd.bucket, 128u);
  EXPECT_EQ(CompressionSpec::parse("sign:bucket=64").bucket, 64u);
  const auto topk = CompressionSpec::parse("topk:ratio=0.25,approx=on,values=fp16,ef=off");
  EXPECT_DOUBLE_EQ(topk.ratio, 0.25);
  EXPECT_TRUE(topk.approx);
  EXPECT_EQ(topk.values, DType::f16);
  EXPECT_FALSE(topk.error_feedback);
  EXPECT_EQ(CompressionSpec::parse("topk:k=17").k, 17u);
  const auto randk = CompressionSpec::parse("randk:k=5,values=fp16");
  EXPECT_EQ(randk.k, 5u);
  EXPECT_EQ(randk.values, DType::f16);
  EXPECT_EQ(CompressionSpec::parse("powersgd:rank=2").rank, 2);
  const auto shared = CompressionSpec::parse(
      "fp16:ef=on,ef_resize=reset,algo=sra,warmup=100,min_bytes=4096,seed=18446744073709551615");
  EXPECT_TRUE(shared.error_feedback);
  EXPECT_EQ(shared.ef_resize, ResizePolicy::reset);
  EXPECT_EQ(shared.algo, Algorithm::sra);
  EXPECT_EQ(shared.warmup, 100u);
  EXPECT_EQ(shared.min_bytes, 4096u);
  EXPECT_EQ(shared.seed, 18446744073709551615ull);
  EXPECT_EQ(CompressionSpec::parse("sign:ranks_per_node=2").ranks_per_node, 2u);
  for (auto [text, algo] : {std::pair{"auto", Algorithm::auto_select}, {"ring", Algorithm::ring},
                            {"sra", Algorithm::sra}, {"sparse", Algorithm::sparse},
                            {"hier", Algorithm::hier}, {"rhd", Algorithm::rhd},
                            {"tree", Algorithm::tree}}) {
    EXPECT_EQ(CompressionSpec::parse(std::string("none:algo=") + text).algo, algo) << text;
  }
  // The sparse all-reduce's former name still parses, to the same spec, printed by its name.
  const CompressionSpec alias = CompressionSpec::parse("topk:ratio=0.5,algo=sparse");
  EXPECT_EQ(alias.algo, Algorithm::sparse);
  EXPECT_EQ(alias, CompressionSpec::parse("topk:ratio=0.5,algo=sparse"));
  EXPECT_NE(alias.to_string().find("algo=sparse"), std::string::npos) << alias.to_string();
  EXPECT_EQ(alias.to_string().find("allgather"), std::string::npos) << alias.to_string();
  EXPECT_EQ(CompressionSpec::parse("  topk : ratio = 0.5 , ef = off ").ratio, 0.5);
  // nonfinite is a shared key: every codec takes each value.
  for (const char* codec : {"none", "fp16", "bf16", "qsgd", "sign", "topk", "randk", "powersgd",
                            "terngrad"}) {
    for (auto [text, policy] : {std::pair{"propagate", NonfinitePolicy::propagate},
                                {"error", NonfinitePolicy::error}, {"skip", NonfinitePolicy::skip}}) {
      const auto spec = CompressionSpec::parse(std::string(codec) + ":nonfinite=" + text);
      EXPECT_EQ(spec.nonfinite, policy) << codec << " " << text;
      EXPECT_NE(spec.to_string().find(std::string(",nonfinite=") + text), std::string::npos)
          << spec.to_string();
    }
  }
}

TEST(CompressionSpec, CanonicalStringRoundTrips) {
  for (const char* text : {"none", "fp16", "bf16:ef=on", "qsgd:bits=2,bucket=64", "sign:ef=off",
                           "topk:ratio=0.001", "topk:k=3,approx=on,values=fp16", "randk:ratio=0.5",
                           "topk:ratio=0.01,ramp=50", "randk:ramp=7", "sign:nonfinite=skip",
                           "qsgd:nonfinite=error",
                           "powersgd:rank=8,warmup=10", "none:algo=hier,min_bytes=1,seed=9"}) {
    const auto spec = CompressionSpec::parse(text);
    EXPECT_EQ(CompressionSpec::parse(spec.to_string()), spec) << text << " -> " << spec.to_string();
  }
  EXPECT_EQ(CompressionSpec::parse("qsgd:bits=4").to_string(),
            "qsgd:bits=4,bucket=512,ef=off,ef_resize=error,algo=auto,warmup=0,min_bytes=65536,"
            "seed=0,ranks_per_node=0,nonfinite=propagate");
  // Specs differing only in the policy have different canonical strings, so the call check
  // (which compares them) refuses ranks that disagree on it.
  EXPECT_NE(CompressionSpec::parse("fp16:nonfinite=skip").to_string(),
            CompressionSpec::parse("fp16").to_string());
}

// fallback=dense is written only when on: every spec without it keeps the canonical string it
// had before the key existed (call-check fingerprints and checkpoints compare those strings).
TEST(CompressionSpec, FallbackIsWrittenOnlyWhenDense) {
  for (const char* codec : {"none", "fp16", "bf16", "qsgd", "sign", "topk", "randk", "terngrad"}) {
    const auto off = CompressionSpec::parse(codec);
    EXPECT_EQ(off.fallback, FallbackPolicy::off) << codec;
    EXPECT_EQ(off.to_string().find("fallback"), std::string::npos) << off.to_string();
    EXPECT_EQ(CompressionSpec::parse(std::string(codec) + ":fallback=off"), off) << codec;
    const auto dense = CompressionSpec::parse(std::string(codec) + ":fallback=dense");
    EXPECT_EQ(dense.fallback, FallbackPolicy::dense) << codec;
    EXPECT_NE(dense, off) << codec;
    EXPECT_EQ(CompressionSpec::parse(dense.to_string()), dense) << dense.to_string();
  }
  EXPECT_EQ(CompressionSpec::parse("sign:fallback=dense").to_string(),
            "sign:bucket=512,ef=on,ef_resize=error,algo=auto,warmup=0,min_bytes=65536,seed=0,"
            "ranks_per_node=0,nonfinite=propagate,fallback=dense");
  EXPECT_EQ(fallback_policy_name(FallbackPolicy::off), "off");
  EXPECT_EQ(fallback_policy_name(FallbackPolicy::dense), "dense");
}

TEST(CompressionSpec, SegmentIsWrittenOnlyWhenNotTheDefault) {
  for (const char* codec : {"none", "fp16", "qsgd", "sign", "topk", "terngrad"}) {
    const auto plain = CompressionSpec::parse(codec);
    EXPECT_EQ(plain.segment_bytes, 65536u) << codec;
    EXPECT_EQ(plain.to_string().find("segment"), std::string::npos) << plain.to_string();
    EXPECT_EQ(CompressionSpec::parse(std::string(codec) + ":segment=65536"), plain) << codec;
    for (const char* value : {"0", "1", "4096", "18446744073709551615"}) {
      const auto spec = CompressionSpec::parse(std::string(codec) + ":segment=" + value);
      EXPECT_EQ(spec.segment_bytes, std::stoull(value)) << codec;
      EXPECT_NE(spec, plain) << codec;
      EXPECT_EQ(CompressionSpec::parse(spec.to_string()), spec) << spec.to_string();
    }
  }
  EXPECT_EQ(CompressionSpec::parse("sign:segment=0,fallback=dense").to_string(),
            "sign:bucket=512,ef=on,ef_resize=error,algo=auto,warmup=0,min_bytes=65536,seed=0,"
            "ranks_per_node=0,nonfinite=propagate,fallback=dense,segment=0");
  for (const char* bad : {"sign:segment=-1", "sign:segment=64k", "sign:segment=",
                          "sign:segment=18446744073709551616", "sign:segment=1,segment=2"}) {
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { CompressionSpec::parse(bad); }, &message),
              ErrorCode::invalid_spec)
        << bad;
    EXPECT_NE(message.find("segment"), std::string::npos) << bad << ": " << message;
  }
}

TEST(CompressionSpec, KForClampsToOneAndN) {
  auto spec = CompressionSpec::parse("topk:ratio=0.01");
  EXPECT_EQ(spec.k_for(0), 0u);
  EXPECT_EQ(spec.k_for(1), 1u);
  EXPECT_EQ(spec.k_for(7), 1u);
  EXPECT_EQ(spec.k_for(1000), 10u);
  EXPECT_EQ(spec.k_for(1001), 11u);  // ceil
  spec = CompressionSpec::parse("topk:k=50");
  EXPECT_EQ(spec.k_for(10), 10u);
  EXPECT_EQ(spec.k_for(1000), 50u);
  EXPECT_EQ(CompressionSpec::parse("topk:ratio=1").k_for(33), 33u);
}

struct BadSpec {
  const char* text;
  const char* message_part;  // what the error must mention
};

class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, IsRefusedWithAnExplainingError) {
  const BadSpec& bad = GetParam();
  try {
    CompressionSpec::parse(bad.text);
    FAIL() << "'" << bad.text << "' was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_spec) << error.what();
    EXPECT_NE(std::string(error.what()).find(bad.message_part), std::string::npos)
        << "error for '" << bad.text << "' was: " << error.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadSpecTest,
    ::testing::Values(
        BadSpec{"", "empty"}, BadSpec{"   ", "empty"},
        BadSpec{"zip", "accepted codecs: none, fp16, bf16, qsgd, sign, topk, randk, powersgd, terngrad"},
        BadSpec{"TopK", "unknown codec 'TopK'"},
        BadSpec{"topk:", "nothing after ':'"},
        BadSpec{"topk:ratio", "not key=value"},
        BadSpec{"topk:=0.1", "not key=value"},
        BadSpec{"topk:ratio=0.1,", "not key=value"},
        BadSpec{"topk:bits=4", "unknown key 'bits' for codec 'topk'; accepted keys: ratio, k, "
                               "approx, values, ramp, ef, ef_resize, algo, warmup, min_bytes, seed, "
                               "ranks_per_node, nonfinite, fallback"},
        BadSpec{"fp16:ratio=0.1", "unknown key 'ratio' for codec 'fp16'"},
        BadSpec{"qsgd:bits=0", "integer in [1, 8]"}, BadSpec{"qsgd:bits=9", "integer in [1, 8]"},
        BadSpec{"qsgd:bits=4.5", "bad value '4.5'"}, BadSpec{"qsgd:bits=-1", "bad value '-1'"},
        BadSpec{"qsgd:bucket=0", "bucket"}, BadSpec{"sign:bucket=x", "bad value 'x'"},
        BadSpec{"topk:ratio=0", "(0, 1]"}, BadSpec{"topk:ratio=1.5", "(0, 1]"},
        BadSpec{"topk:ratio=nan", "(0, 1]"}, BadSpec{"topk:ratio=-0.1", "(0, 1]"},
        BadSpec{"topk:k=0", "k"}, BadSpec{"topk:ratio=0.1,k=5", "ratio or k, not both"},
        BadSpec{"topk:approx=yes", "one of: on, off"},
        BadSpec{"topk:values=bf16", "one of: fp32, fp16"},
        BadSpec{"powersgd:rank=0", "rank"}, BadSpec{"sign:ef=true", "one of: on, off"},
        BadSpec{"none:algo=butterfly", "one of: auto, ring, sra, sparse, hier, rhd, tree"},
        BadSpec{"none:ef_resize=grow", "one of: error, reset"},
        BadSpec{"none:warmup=-3", "warmup"}, BadSpec{"none:warmup=4294967296", "warmup"},
        BadSpec{"none:seed=18446744073709551616", "seed"},
        BadSpec{"none:ranks_per_node=-1", "ranks_per_node"},
        BadSpec{"fp16:nonfinite=ignore", "one of: propagate, error, skip"},
        BadSpec{"sign:nonfinite=skip,nonfinite=error", "given twice"},
        BadSpec{"topk:ratio=0.1,ratio=0.2", "given twice"},
        BadSpec{"qsgd:bits=1,ef=on", "use 'sign' for 1-bit with error feedback"},
        BadSpec{"sign:fallback=mpi", "one of: off, dense"},
        BadSpec{"sign:fallback=dense,algo=sra", "fallback=dense needs algo=auto"},
        BadSpec{"topk:algo=sparse,fallback=dense", "algo=sparse always runs that algorithm"},
        BadSpec{"powersgd:fallback=dense", "powersgd runs in the Reducer"},
        BadSpec{"fp16:fallback=dense,fallback=off", "given twice"}));

TEST(MakeCodec, RefusesPowerSgdAsAnElementCodec) {
  try {
    make_codec("powersgd:rank=2");
    FAIL() << "powersgd made an element codec";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(error.what()).find("Reducer"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gradzip
