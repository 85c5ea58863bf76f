// The top-k codec: exact selection equals an independent brute-force reference (indices and
// value bits), approx returns the exact top-m for a documented m, every ISA writes the same
// bytes, and every malformed message is refused before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>

#include "compressors/wire_format.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"
#include "kernels/cpu/cpu_features.h"
#include "compressors/topk/topk_cpu.h"
#include "compressors/topk/topk_math.h"
#include "kernels/host_device.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using compressors::kWireHeaderBytes;
using compressors::read_header;
using compressors::WireCodec;
using compressors::WireHeader;
using compressors::write_header;
using kernels::cpu::Isa;
using kernels::cpu::TopkPath;




// What a message holds, read by this test's own parser of the documented layout.
struct Entries {
  WireHeader header;
  std::vector<std::uint64_t> indices;
  std::vector<std::uint32_t> value_bits;  // f32 bits, or f16 bits when header.flags & 2
};

Entries parse(std::span<const std::byte> message) {
  Entries entries;
  entries.header = read_header(message, "test");
  const std::size_t m = entries.header.large_param;
  entries.indices.reserve(m);
  entries.value_bits.reserve(m);
  const std::size_t index_width = (entries.header.flags & 1) ? 8 : 4;
  const std::size_t value_width = (entries.header.flags & 2) ? 2 : 4;
  EXPECT_EQ(entries.header.payload_bytes, m * (index_width + value_width));
  const std::byte* payload = message.data() + kWireHeaderBytes;
  for (std::size_t j = 0; j < m; ++j) {
    std::uint64_t index = 0;
    std::memcpy(&index, payload + j * index_width, index_width);
    std::uint32_t value = 0;
    std::memcpy(&value, payload + m * index_width + j * value_width, value_width);
    entries.indices.push_back(index);
    entries.value_bits.push_back(value);
  }
  return entries;
}

// Brute-force reference: all indices ordered by (|x| descending, index ascending). A NaN ranks
// above every number (then by index: the tests give all NaNs of one input the same payload).
std::vector<std::uint64_t> reference_order(const std::vector<float>& x) {
  std::vector<std::uint64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
    const bool nan_a = std::isnan(x[a]), nan_b = std::isnan(x[b]);
    if (nan_a != nan_b) return nan_a;
    return !nan_a && std::fabs(x[a]) > std::fabs(x[b]);
  });
  return order;
}

// The first m of the order, by increasing index.
std::vector<std::uint64_t> top_indices(const std::vector<std::uint64_t>& order, std::size_t m) {
  std::vector<std::uint8_t> kept(order.size(), 0);
  for (std::size_t j = 0; j < m; ++j) kept[order[j]] = 1;
  std::vector<std::uint64_t> top;
  top.reserve(m);
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (kept[i]) top.push_back(i);
  }
  return top;
}

// The first of `count` elements of `width` bytes where a and b differ bitwise, or count.
std::size_t first_difference(const void* a, const void* b, std::size_t count, std::size_t width) {
  if (count == 0 || std::memcmp(a, b, count * width) == 0) return count;
  for (std::size_t i = 0;; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * width, static_cast<const char*>(b) + i * width,
                    width) != 0)
      return i;
  }
}

std::vector<std::byte> encode_with_isa(const Codec& codec, ConstTensorView in, Isa isa,
                                       const EncodeContext& ctx = {}) {
  kernels::cpu::set_isa_override(isa);
  auto message = testing::encode_message(codec, in, ctx);
  kernels::cpu::clear_isa_override();
  return message;
}

// Encodes under every ISA, expects identical bytes, returns them.
std::vector<std::byte> encode_all_isas(const Codec& codec, ConstTensorView in,
                                       const EncodeContext& ctx = {}) {
  const auto reference = encode_with_isa(codec, in, Isa::scalar, ctx);
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    EXPECT_TRUE(encode_with_isa(codec, in, isa, ctx) == reference)
        << codec.name() << ": " << kernels::cpu::isa_name(isa) << " bytes differ from scalar";
  }
  return reference;
}

// Which steps of compressors/topk/topk_cpu.h the selection of `codec` on `input` takes.
TopkPath path_of(const Codec& codec, ConstTensorView input, const EncodeContext& ctx = {}) {
  const std::size_t k = codec.spec().k_for(input.count);
  std::vector<std::uint32_t> indices(k);
  std::vector<float> values(k);
  const kernels::cpu::TopkOptions options{codec.spec().approx, ctx.seed, ctx.step, ctx.tensor_id};
  return kernels::cpu::topk_select<std::uint32_t>(input, k, options, indices.data(), values.data()).path;
}

// Checks that `message` holds exactly the entries `expected` (sorted indices) of `input`,
// values f32 or rounded to f16, and that decode / decode_add reproduce them.
void expect_message_holds(const Codec& codec, std::span<const std::byte> message,
                          const testing::HostTensor& input,
                          const std::vector<std::uint64_t>& expected) {
  const std::size_t n = input.count();
  const bool half = codec.spec().values == DType::f16;
  const Entries entries = parse(message);
  EXPECT_EQ(entries.header.codec, WireCodec::topk);
  EXPECT_EQ(entries.header.flags, half ? 2 : 0);
  EXPECT_EQ(entries.header.small_param, codec.spec().approx ? 1 : 0);
  EXPECT_EQ(entries.header.count, n);
  ASSERT_EQ(entries.indices, expected) << codec.name() << " n=" << n;

  // The value each entry must carry, and the f32 tensor decode must give.
  std::vector<std::uint32_t> want_bits(expected.size());
  std::vector<float> dense(n, 0.0f);
  for (std::size_t j = 0; j < expected.size(); ++j) {
    const float original = input.at(expected[j]);
    if (half) {
      const std::uint16_t rounded = kernels::f32_to_f16_bits(original);
      want_bits[j] = rounded;
      dense[expected[j]] = kernels::f16_bits_to_f32(rounded);
    } else {
      want_bits[j] = kernels::float_bits(original);
      dense[expected[j]] = original;
    }
  }
  ASSERT_EQ(first_difference(entries.value_bits.data(), want_bits.data(), want_bits.size(), 4),
            want_bits.size())
      << "first entry whose value bits differ";

  const auto decoded = testing::decode_to_f32(codec, message, n);
  ASSERT_EQ(first_difference(decoded.data(), dense.data(), n, 4), n)
      << "first element decode got wrong";

  // Decoding into the input's dtype rounds the f32 result (nearest even).
  testing::HostTensor typed(input.dtype(), n);
  codec.decode(message, typed.view());
  testing::HostTensor typed_expected(input.dtype(), dense);
  ASSERT_EQ(first_difference(typed.view().data, typed_expected.view().data, n,
                             dtype_size(input.dtype())),
            n)
      << "first element decode into " << dtype_name(input.dtype()) << " got wrong";

  std::vector<float> acc(n, 0.25f), acc_expected(n);
  codec.decode_add(message, acc.data(), n);
  for (std::size_t i = 0; i < n; ++i) acc_expected[i] = 0.25f + dense[i];
  ASSERT_EQ(first_difference(acc.data(), acc_expected.data(), n, 4), n)
      << "first element decode_add got wrong";
}

// ---- the main sweep: counts x dtypes x k x value precision x exact/approx --------------------

class TopkCodecTest : public ::testing::TestWithParam<std::tuple<std::size_t, DType>> {};

TEST_P(TopkCodecTest, ExactEqualsReferenceAndApproxIsTheExactTopM) {
  const auto [n, dtype] = GetParam();
  const testing::HostTensor input(dtype, testing::gaussian(n, 31));
  const std::vector<std::uint64_t> order = reference_order(input.to_f32());
  for (const std::string k_option : {"ratio=0.01", "ratio=0.5", "ratio=1", "k=1"}) {
    for (const std::string values : {"fp32", "fp16"}) {
      for (const std::string approx : {"off", "on"}) {
        const auto codec =
            make_codec("topk:" + k_option + ",values=" + values + ",approx=" + approx);
        SCOPED_TRACE(codec->name());
        EXPECT_FALSE(codec->additive());
        EXPECT_TRUE(codec->sparse());
        const std::size_t k = codec->spec().k_for(n);
        const auto message = encode_all_isas(*codec, input.view(), EncodeContext{5, 2, 9, 0});
        const std::size_t m = parse(message).header.large_param;
        if (approx == "off" || n <= kernels::kTopkSampleAllCount) {
          // Exact, and approx whose sample is the whole tensor: exactly k entries.
          EXPECT_EQ(m, k);
          EXPECT_EQ(message.size(), codec->max_encoded_bytes(n));
        } else {
          // The approx guarantee: ceil(k/2) <= m <= k and the entries are the exact top-m.
          EXPECT_GE(m, (k + 1) / 2);
          EXPECT_LE(m, k);
          EXPECT_LE(message.size(), codec->max_encoded_bytes(n));
        }
        expect_message_holds(*codec, message, input, top_indices(order, m));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CountsAndDTypes, TopkCodecTest,
                         ::testing::Combine(::testing::ValuesIn(testing::kTestCounts),
                                            ::testing::ValuesIn(testing::kTestDTypes)));

TEST(TopkCodec, EmptyTensorIsAHeaderOnlyMessage) {
  for (const char* spec : {"topk", "topk:approx=on,values=fp16"}) {
    const auto codec = make_codec(spec);
    const auto message = testing::encode_message(*codec, host_view(static_cast<const float*>(nullptr), 0));
    ASSERT_EQ(message.size(), kWireHeaderBytes);
    EXPECT_EQ(parse(message).header.large_param, 0u);
    EXPECT_TRUE(testing::decode_to_f32(*codec, message, 0).empty());
    codec->decode_add(message, nullptr, 0);
  }
}

// ---- ties, zeros, NaN and Inf ---------------------------------------------------------------

// All-equal magnitudes (mixed signs): the lowest indices win, 0..k-1, signs kept.
TEST(TopkTies, AllEqualMagnitudesKeepTheLowestIndices) {
  for (std::size_t n : {std::size_t{1000}, (std::size_t{1} << 20) + 3}) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? -0.5f : 0.5f;
    const testing::HostTensor input(DType::f32, x);
    for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.01,approx=on", "topk:k=1"}) {
      const auto codec = make_codec(spec);
      const std::size_t k = codec->spec().k_for(n);
      std::vector<std::uint64_t> expected(k);
      std::iota(expected.begin(), expected.end(), 0);
      if (n > kernels::kTopkSampleAllCount) {
        EXPECT_EQ(path_of(*codec, input.view()), TopkPath::tie_class) << spec;
      }
      expect_message_holds(*codec, encode_all_isas(*codec, input.view()), input, expected);
    }
  }
}

// All zeros, +0 and -0 mixed: indices 0..k-1 with their zero's sign bit.
TEST(TopkTies, AllZerosKeepTheLowestIndices) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<float> x(n, 0.0f);
  for (std::size_t i = 0; i < n; i += 2) x[i] = -0.0f;
  const testing::HostTensor input(DType::f32, x);
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.01,approx=on"}) {
    const auto codec = make_codec(spec);
    const std::size_t k = codec->spec().k_for(n);
    std::vector<std::uint64_t> expected(k);
    std::iota(expected.begin(), expected.end(), 0);
    const auto message = encode_all_isas(*codec, input.view());
    const Entries entries = parse(message);
    ASSERT_EQ(entries.indices, expected);
    for (std::size_t j = 0; j < k; ++j)
      ASSERT_EQ(entries.value_bits[j], j % 2 == 0 ? 0x80000000u : 0u) << "entry " << j;
  }
}

// Gaussian data where 5000 elements are set to +-(the k-th magnitude): the tie class straddles
// the cut, so part of it is kept (the lowest indices) and part is not.
TEST(TopkTies, TiesStraddlingTheKthMagnitude) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<float> x = testing::gaussian(n, 77);
  const auto codec = make_codec("topk:ratio=0.01");
  const std::size_t k = codec->spec().k_for(n);
  const float kth = std::fabs(x[reference_order(x)[k - 1]]);
  for (std::size_t i = 13; i < n; i += 209) x[i] = (i % 2 == 0) ? kth : -kth;
  const std::vector<std::uint64_t> order = reference_order(x);
  // The cut falls strictly inside the tie class.
  ASSERT_EQ(std::fabs(x[order[k - 1]]), kth);
  ASSERT_EQ(std::fabs(x[order[k]]), kth);
  const testing::HostTensor input(DType::f32, x);
  expect_message_holds(*codec, encode_all_isas(*codec, input.view()), input, top_indices(order, k));
  const auto approx = make_codec("topk:ratio=0.01,approx=on");
  const auto message = encode_all_isas(*approx, input.view());
  const std::size_t m = parse(message).header.large_param;
  EXPECT_GE(m, (k + 1) / 2);
  expect_message_holds(*approx, message, input, top_indices(order, m));
}

// Small-integer data (x = 7i mod 9 - 4: magnitudes 0..4, 2/9 of the elements at each non-zero
// magnitude). ratio 0.01: the sampled threshold lands on the class |x| = 4 (233018 elements),
// the candidate buffer (30344 entries) overflows, nothing is above 4, so K = key(4) (step 4).
// ratio 0.3: the threshold is |x| = 3 and the 4/9 n candidates fit; the tie class |x| = 3 is
// cut inside the candidates (step 3).
TEST(TopkTies, HeavyTiesAreResolvedByIndexOnEveryPath) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<int>((7 * i) % 9) - 4);
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  const std::pair<const char*, TopkPath> cases[] = {{"topk:ratio=0.01", TopkPath::tie_class},
                                                    {"topk:ratio=0.01,approx=on", TopkPath::tie_class},
                                                    {"topk:ratio=0.3", TopkPath::candidates}};
  for (const auto& [spec, path] : cases) {
    const auto codec = make_codec(spec);
    EXPECT_EQ(path_of(*codec, input.view()), path) << spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view()), input,
                         top_indices(order, codec->spec().k_for(n)));
  }
}

// 99.5% zeros: the k-th magnitude is 0, the sampled threshold is 0, and the result is every
// non-zero plus the lowest-index zeros (step 4: the non-zeros are the collected key > 0).
TEST(TopkTies, MostlyZerosKeepEveryNonZeroThenTheLowestZeros) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<float> x(n, 0.0f);
  const std::vector<float> noise = testing::gaussian(n, 5);
  for (std::size_t i = 7; i < n; i += 200) x[i] = noise[i];
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.01,approx=on"}) {
    const auto codec = make_codec(spec);
    const std::size_t k = codec->spec().k_for(n);
    ASSERT_EQ(x[order[k - 1]], 0.0f);
    EXPECT_EQ(path_of(*codec, input.view()), TopkPath::tie_class) << spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view()), input, top_indices(order, k));
  }
}

// NaN ranks above Inf, Inf above every finite number; NaNs among themselves by payload; equal
// keys (+Inf, -Inf) by index. Value bits, NaN payloads included, are carried unchanged.
TEST(TopkSpecialValues, NanAndInfOrderAndSurviveTheRoundTrip) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, kernels::bits_float(0x7FC00000u), -inf, 3.0f,
                                inf,  kernels::bits_float(0xFFC00001u), 0.0f, -5.0f};
  const testing::HostTensor input(DType::f32, x);
  // Keys: [5] 0x7FC00001 > [1] 0x7FC00000 > [2] = [4] 0x7F800000 > [7] 5 > [3] 3 > [0] 1 > [6] 0.
  const std::vector<std::pair<std::size_t, std::vector<std::uint64_t>>> cases = {
      {1, {5}}, {2, {1, 5}}, {3, {1, 2, 5}}, {4, {1, 2, 4, 5}}, {5, {1, 2, 4, 5, 7}}};
  for (const auto& [k, expected] : cases) {
    const auto codec = make_codec("topk:k=" + std::to_string(k));
    const auto message = encode_all_isas(*codec, input.view());
    const Entries entries = parse(message);
    ASSERT_EQ(entries.indices, expected) << "k=" << k;
    for (std::size_t j = 0; j < k; ++j) EXPECT_EQ(entries.value_bits[j], kernels::float_bits(x[expected[j]]));
    const auto decoded = testing::decode_to_f32(*codec, message, x.size());
    for (std::size_t j = 0; j < k; ++j)
      EXPECT_EQ(kernels::float_bits(decoded[expected[j]]), kernels::float_bits(x[expected[j]]));
    std::vector<float> acc(x.size(), 1.0f);
    codec->decode_add(message, acc.data(), acc.size());
    if (k >= 2) {
      EXPECT_TRUE(std::isnan(acc[1]));
    }
  }
  // f16 values: NaN stays NaN (quiet), Inf stays Inf.
  const auto half = make_codec("topk:k=4,values=fp16");
  const Entries entries = parse(encode_all_isas(*half, input.view()));
  EXPECT_EQ(entries.value_bits, (std::vector<std::uint32_t>{0x7E00u, 0xFC00u, 0x7C00u, 0xFE00u}));
}

// A large tensor with NaNs and Infs sprinkled over Gaussian data: the sampled and the fallback
// paths rank them like the reference (all NaNs here share one payload, so they tie by index).
TEST(TopkSpecialValues, SprinkledNanAndInfMatchTheReference) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  std::vector<float> x = testing::gaussian(n, 8);
  for (std::size_t i = 3; i < n; i += 1009) x[i] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 5; i < n; i += 997) x[i] = (i % 2) ? std::numeric_limits<float>::infinity()
                                                          : -std::numeric_limits<float>::infinity();
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  for (const char* spec : {"topk:ratio=0.01", "topk:k=1000", "topk:ratio=0.01,values=fp16"}) {
    const auto codec = make_codec(spec);
    expect_message_holds(*codec, encode_all_isas(*codec, input.view()), input,
                         top_indices(order, codec->spec().k_for(n)));
  }
}

// ---- values=fp16 rounding -------------------------------------------------------------------

TEST(TopkValues, Fp16ValuesRoundToNearestEven) {
  // f16 has 10 fraction bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (-> even: 1);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9 (-> even: 1 + 2^-9); 65519 is
  // below the halfway point 65520 to the next binade (-> 65504, the largest f16); 70000
  // saturates to 65504 (narrowing never turns a finite value into Inf); 2^-25 is halfway between 0 and the smallest subnormal 2^-24 (-> 0).
  const std::vector<float> x = {1.0f + 0x1p-11f, -(1.0f + 3 * 0x1p-11f), 65519.0f, 70000.0f,
                                0x1p-25f};
  const std::vector<float> expected = {1.0f, -(1.0f + 0x1p-9f), 65504.0f, 65504.0f, 0.0f};
  const auto codec = make_codec("topk:ratio=1,values=fp16");
  const auto message = encode_all_isas(*codec, host_view(x.data(), x.size()));
  EXPECT_EQ(message.size(), kWireHeaderBytes + 5 * (4 + 2));
  EXPECT_EQ(testing::decode_to_f32(*codec, message, x.size()), expected);
}

// ---- approx ---------------------------------------------------------------------------------

// Gaussian data, n = 2^20 + 3: the approx threshold is the sample's ceil(k s / n)-th key; the
// number of sample elements at or above the true k-th key is about Binomial(65536, k / n), sd
// <= sqrt(e) ~ 25.6 for ratio 0.01 (e = 656). Candidates below k mean that sample count fell
// short of e by d, giving m ~ k (1 - d / e); m < 0.8 k would need d > 131, a 5-sd event.
// So the recall m / k is >= 0.8; the exact values are checked against the reference.
TEST(TopkApprox, RecallOnGaussianDataIsAtLeastFourFifths) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const std::vector<float> x = testing::gaussian(n, 1234);
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  for (const char* ratio : {"0.001", "0.01", "0.1"}) {
    const auto codec = make_codec(std::string("topk:approx=on,ratio=") + ratio);
    const std::size_t k = codec->spec().k_for(n);
    for (std::uint64_t seed : {0ull, 1ull, 99ull}) {
      const auto message = encode_all_isas(*codec, input.view(), EncodeContext{seed, 3, 4, 0});
      const std::size_t m = parse(message).header.large_param;
      EXPECT_GE(m * 5, k * 4) << "ratio " << ratio << " seed " << seed << ": m = " << m;
      EXPECT_LE(m, k);
      expect_message_holds(*codec, message, input, top_indices(order, m));
    }
  }
}

// Approx depends on the context only through the sample; the same context gives the same bytes.
TEST(TopkApprox, SameContextGivesTheSameBytes) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const testing::HostTensor input(DType::bf16, testing::gaussian(n, 4321));
  const auto codec = make_codec("topk:approx=on,ratio=0.01");
  const EncodeContext ctx{42, 7, 3, 0};
  EXPECT_EQ(testing::encode_message(*codec, input.view(), ctx),
            testing::encode_message(*codec, input.view(), ctx));
}

// An input whose sampled runs (compressors/topk/topk_math.h) hold 2.0 and all other elements are below
// 1: the sample says "2.0 is the k-th magnitude" but only the 65536 sampled elements reach it.
std::vector<float> sample_aliased_input(std::size_t n, const EncodeContext& ctx) {
  std::vector<float> x = testing::gaussian(n, 17, 0.1f);
  for (float& value : x) value = std::max(-0.9f, std::min(0.9f, value));
  for (std::uint64_t segment = 0; segment < kernels::kTopkSampleGroups; ++segment) {
    const std::uint64_t start =
        kernels::topk_sample_run_start(n, segment, ctx.seed, ctx.step, ctx.tensor_id);
    for (std::uint64_t i = 0; i < kernels::kTopkSampleRun; ++i) x[start + i] = 2.0f;
  }
  return x;
}

// Exact with k > 65536: the sampled threshold (2.0) lets through only 65536 < k candidates, so
// the whole-tensor radix select runs (step 5; the top-digit bin of K is small). Approx with ceil(k/2) <= 65536 < k accepts the 65536;
// with 65536 < ceil(k/2) it falls back to exact.
TEST(TopkApprox, TooFewCandidatesAreAcceptedOrFallBackAsDocumented) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const EncodeContext ctx{11, 1, 2, 0};
  const std::vector<float> x = sample_aliased_input(n, ctx);
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  const kernels::cpu::TopkOptions options_exact{false, ctx.seed, ctx.step, ctx.tensor_id};
  const kernels::cpu::TopkOptions options_approx{true, ctx.seed, ctx.step, ctx.tensor_id};
  struct Case {
    const char* spec;
    kernels::cpu::TopkOptions options;
    TopkPath path;
    std::size_t entries;  // 0: k
  };
  const Case cases[] = {
      {"topk:ratio=0.1", options_exact, TopkPath::radix_bin, 0},             // k = 104858
      {"topk:ratio=0.1,approx=on", options_approx, TopkPath::approx_accepted, 65536},
      {"topk:ratio=0.2,approx=on", options_approx, TopkPath::radix_bin, 0},  // k = 209716
  };
  for (const Case& c : cases) {
    const auto codec = make_codec(c.spec);
    const std::size_t k = codec->spec().k_for(n);
    const std::size_t m = c.entries == 0 ? k : c.entries;
    std::vector<std::uint32_t> indices(k);
    std::vector<float> values(k);
    const auto result =
        kernels::cpu::topk_select<std::uint32_t>(input.view(), k, c.options, indices.data(), values.data());
    EXPECT_EQ(result.path, c.path) << c.spec;
    EXPECT_EQ(result.count, m) << c.spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view(), ctx), input,
                         top_indices(order, m));
  }
}

// Step 4 followed by step 3: every sampled element is 1.0, so the threshold is key(1.0) and
// the pass overflows on the n elements >= 1.0; every 50th element outside the sample is 2.0
// (about 20000: between k = 10486 and the capacity 30344), so the second pass (key > 1.0)
// finds at least k candidates and selects among them.
TEST(TopkFallbacks, OverflowThenEnoughCandidatesAboveTheThreshold) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const EncodeContext ctx{3, 4, 5, 0};
  std::vector<float> x(n, 1.0f);
  std::vector<bool> sampled(n, false);
  for (std::uint64_t segment = 0; segment < kernels::kTopkSampleGroups; ++segment) {
    const std::uint64_t start =
        kernels::topk_sample_run_start(n, segment, ctx.seed, ctx.step, ctx.tensor_id);
    for (std::uint64_t i = 0; i < kernels::kTopkSampleRun; ++i) sampled[start + i] = true;
  }
  for (std::size_t i = 0; i < n; i += 50) {
    if (!sampled[i]) x[i] = (i % 100 == 0) ? 2.0f : -2.0f;
  }
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.01,approx=on"}) {
    const auto codec = make_codec(spec);
    EXPECT_EQ(path_of(*codec, input.view(), ctx), TopkPath::candidates) << spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view(), ctx), input,
                         top_indices(order, codec->spec().k_for(n)));
  }
}

// The sampled runs (compressors/topk/topk_math.h) of an input set to 0.
void zero_the_sample(std::vector<float>& x, const EncodeContext& ctx) {
  for (std::uint64_t segment = 0; segment < kernels::kTopkSampleGroups; ++segment) {
    const std::uint64_t start =
        kernels::topk_sample_run_start(x.size(), segment, ctx.seed, ctx.step, ctx.tensor_id);
    for (std::uint64_t i = 0; i < kernels::kTopkSampleRun; ++i) x[start + i] = 0.0f;
  }
}

// Step 4 overflowing again, then step 5: the sampled elements are 0 (threshold 0, the pass is
// skipped as overflowed) and all others are non-zero, far more than the buffer holds. Gaussian
// data: the top-digit bin holding K is small, so its elements are collected (radix_bin).
TEST(TopkFallbacks, SecondOverflowFallsBackToTheRadixSelect) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const EncodeContext ctx{8, 0, 1, 0};
  std::vector<float> x = testing::gaussian(n, 12);
  zero_the_sample(x, ctx);
  const testing::HostTensor input(DType::bf16, x);
  const std::vector<std::uint64_t> order = reference_order(input.to_f32());
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.01,approx=on"}) {
    const auto codec = make_codec(spec);
    EXPECT_EQ(path_of(*codec, input.view(), ctx), TopkPath::radix_bin) << spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view(), ctx), input,
                         top_indices(order, codec->spec().k_for(n)));
  }
}

// As above, but every non-sampled element lies in [1, 1.125), one top-digit bin (2^20 - 1
// possible values for 2^20 elements, so also many ties): the bin is too large to collect and
// all three digits are refined over the tensor (full_radix).
TEST(TopkFallbacks, OneCrowdedTopDigitBinRefinesAllDigits) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const EncodeContext ctx{8, 0, 1, 0};
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = (i % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>((i * 2654435761u) % (1u << 20)) * 0x1p-23f);
  zero_the_sample(x, ctx);
  const testing::HostTensor input(DType::f32, x);
  const std::vector<std::uint64_t> order = reference_order(x);
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.2,approx=on", "topk:k=3"}) {
    const auto codec = make_codec(spec);
    EXPECT_EQ(path_of(*codec, input.view(), ctx), TopkPath::full_radix) << spec;
    expect_message_holds(*codec, encode_all_isas(*codec, input.view(), ctx), input,
                         top_indices(order, codec->spec().k_for(n)));
  }
}

// ---- the kernels: candidate pass and index widths ------------------------------------------

class TopkKernelsOnEachIsa : public testing::PerIsaTest {};
GZ_ON_EACH_ISA(TopkKernelsOnEachIsa);

// Every ISA and both index widths collect exactly what a plain loop collects, in order, and
// report overflow exactly when more than `capacity` qualify; every tail length is covered.
TEST_P(TopkKernelsOnEachIsa, CandidatePassMatchesAPlainLoop) {
  const std::vector<float> data = testing::gaussian(300, 9);
  const std::uint32_t thresholds[] = {0, kernels::topk_key(0.5f), kernels::topk_key(1.0f),
                                      kernels::topk_key(2.5f), 0x7F800000u, 0x7FFFFFFFu,
                                      0x80000000u, 0xFFFFFFFFu};
  for (std::size_t count = 0; count <= data.size(); count += (count < 140 ? 1 : 37)) {
    for (std::uint32_t threshold : thresholds) {
      std::vector<std::uint64_t> want_index;
      std::vector<std::uint32_t> want_bits;
      for (std::size_t i = 0; i < count; ++i) {
        if ((kernels::float_bits(data[i]) & 0x7FFFFFFFu) >= threshold) {
          want_index.push_back(1000 + i);
          want_bits.push_back(kernels::float_bits(data[i]));
        }
      }
      const std::size_t want = want_index.size();
      for (std::size_t capacity : {want, want + 3, want > 0 ? want - 1 : std::size_t{0}}) {
        const bool overflow = capacity < want;
        {
          const Isa isa = GetParam();
          kernels::cpu::set_isa_override(isa);
          std::vector<std::uint32_t> index32(capacity + kernels::cpu::kTopkCollectSlack);
          std::vector<std::uint64_t> index64(capacity + kernels::cpu::kTopkCollectSlack);
          std::vector<std::uint32_t> bits32(capacity + kernels::cpu::kTopkCollectSlack);
          std::vector<std::uint32_t> bits64(capacity + kernels::cpu::kTopkCollectSlack);
          const std::size_t got32 = kernels::cpu::topk_collect(
              data.data(), count, threshold, std::uint32_t{1000}, index32.data(), bits32.data(), capacity);
          const std::size_t got64 = kernels::cpu::topk_collect(
              data.data(), count, threshold, std::uint64_t{1000}, index64.data(), bits64.data(), capacity);
          kernels::cpu::clear_isa_override();
          SCOPED_TRACE(::testing::Message() << kernels::cpu::isa_name(isa) << " count " << count
                                            << " threshold " << threshold << " capacity " << capacity);
          if (overflow) {
            EXPECT_EQ(got32, kernels::cpu::kTopkCollectOverflow);
            EXPECT_EQ(got64, kernels::cpu::kTopkCollectOverflow);
            continue;
          }
          ASSERT_EQ(got32, want);
          ASSERT_EQ(got64, want);
          for (std::size_t j = 0; j < want; ++j) {
            ASSERT_EQ(index32[j], want_index[j]);
            ASSERT_EQ(index64[j], want_index[j]);
            ASSERT_EQ(bits32[j], want_bits[j]);
            ASSERT_EQ(bits64[j], want_bits[j]);
          }
        }
      }
    }
  }
}

// 64-bit indices past 2^32 (the first_index offset stands in for a tensor of > 2^32 elements).
TEST_P(TopkKernelsOnEachIsa, CandidatePassWritesIndicesAbove4G) {
  const std::vector<float> data = testing::gaussian(100, 2);
  const std::uint64_t first = (std::uint64_t{1} << 32) - 10;
  {
    const Isa isa = GetParam();
    kernels::cpu::set_isa_override(isa);
    std::vector<std::uint64_t> index(100 + kernels::cpu::kTopkCollectSlack);
    std::vector<std::uint32_t> bits(100 + kernels::cpu::kTopkCollectSlack);
    const std::size_t got =
        kernels::cpu::topk_collect(data.data(), 100, 0, first, index.data(), bits.data(), 100);
    kernels::cpu::clear_isa_override();
    ASSERT_EQ(got, 100u);
    for (std::size_t i = 0; i < 100; ++i) ASSERT_EQ(index[i], first + i) << kernels::cpu::isa_name(isa);
  }
}

// The 64-bit-index selection (used above 2^32 elements) gives the 32-bit one's result on every
// path.
TEST(TopkKernels, SixtyFourBitSelectionEqualsThirtyTwoBit) {
  const std::size_t n = (std::size_t{1} << 20) + 3;
  const EncodeContext ctx{11, 1, 2, 0};
  const std::vector<std::vector<float>> inputs = {testing::gaussian(n, 3), sample_aliased_input(n, ctx)};
  for (const auto& x : inputs) {
    for (bool approx : {false, true}) {
      for (std::size_t k : {std::size_t{1}, n / 100, n / 5, n - 1, n}) {
        const kernels::cpu::TopkOptions options{approx, ctx.seed, ctx.step, ctx.tensor_id};
        std::vector<std::uint32_t> index32(k);
        std::vector<std::uint64_t> index64(k);
        std::vector<float> values32(k), values64(k);
        const auto r32 = kernels::cpu::topk_select<std::uint32_t>(host_view(x.data(), n), k, options,
                                                                  index32.data(), values32.data());
        const auto r64 = kernels::cpu::topk_select<std::uint64_t>(host_view(x.data(), n), k, options,
                                                                  index64.data(), values64.data());
        ASSERT_EQ(r32.count, r64.count);
        EXPECT_EQ(r32.path, r64.path);
        for (std::size_t j = 0; j < r32.count; ++j) {
          ASSERT_EQ(index32[j], index64[j]);
          ASSERT_EQ(kernels::float_bits(values32[j]), kernels::float_bits(values64[j]));
        }
      }
    }
  }
}

// ---- encoder arguments ----------------------------------------------------------------------

TEST(TopkCodec, RefusesATooSmallOutputBuffer) {
  const auto codec = make_codec("topk:k=2");
  const std::vector<float> x = {1, 2, 3};
  std::vector<std::byte> small(codec->max_encoded_bytes(3) - 1);
  EXPECT_EQ(testing::error_code_of([&] { codec->encode(host_view(x.data(), 3), small, {}); }),
            ErrorCode::invalid_argument);
}

TEST(TopkCodec, DecodesFromAnUnalignedBuffer) {
  const auto codec = make_codec("topk:k=2,values=fp16");
  const std::vector<float> x = {1.0f, -4.0f, 0.5f, 3.0f, -0.25f};
  const auto message = testing::encode_message(*codec, host_view(x.data(), x.size()));
  std::vector<std::byte> shifted(message.size() + 3);
  std::memcpy(shifted.data() + 3, message.data(), message.size());
  const auto decoded = testing::decode_to_f32(
      *codec, std::span<const std::byte>(shifted).subspan(3), x.size());
  EXPECT_EQ(decoded, (std::vector<float>{0.0f, -4.0f, 0.0f, 3.0f, 0.0f}));
}

// ---- the decoder's validation ---------------------------------------------------------------

// A message with u32 or u64 indices and f32 values, written by hand.
std::vector<std::byte> handmade_message(std::uint64_t count, const std::vector<std::uint64_t>& indices,
                                        const std::vector<float>& values, bool wide) {
  const std::size_t m = indices.size();
  const std::size_t index_width = wide ? 8 : 4;
  std::vector<std::byte> message(kWireHeaderBytes + m * (index_width + 4));
  write_header(WireHeader{WireCodec::topk, static_cast<std::uint8_t>(wide ? 1 : 0), 0, count,
                          m * (index_width + 4), m},
               message);
  for (std::size_t j = 0; j < m; ++j) {
    std::memcpy(message.data() + kWireHeaderBytes + j * index_width, &indices[j], index_width);
    std::memcpy(message.data() + kWireHeaderBytes + m * index_width + j * 4, &values[j], 4);
  }
  return message;
}

// u64 indices are accepted at any count (the encoder only writes them above 2^32).
TEST(TopkDecoder, AcceptsSixtyFourBitIndicesAtAnyCount) {
  const auto codec = make_codec("topk");
  const auto message = handmade_message(6, {0, 2, 5}, {1.5f, -2.0f, 8.0f}, true);
  EXPECT_EQ(testing::decode_to_f32(*codec, message, 6),
            (std::vector<float>{1.5f, 0.0f, -2.0f, 0.0f, 0.0f, 8.0f}));
}

// Runs decode and decode_add on `message` for `count` elements; both must refuse it with
// malformed_message naming the op, and leave their outputs untouched.
void expect_refused(const std::vector<std::byte>& message, std::size_t count, const char* what) {
  SCOPED_TRACE(what);
  testing::expect_malformed(*make_codec("topk"), message, count, /*field=*/"");
}

TEST(TopkDecoder, RefusesEveryMalformedMessage) {
  constexpr std::size_t n = 10;
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  for (bool wide : {false, true}) {
    const auto valid = handmade_message(n, {1, 4, 9}, values, wide);
    const std::size_t index_width = wide ? 8 : 4;
    const auto codec = make_codec("topk");
    ASSERT_EQ(testing::decode_to_f32(*codec, valid, n)[9], 3.0f);  // the unmutated message is fine

    expect_refused(handmade_message(n, {1, 4, 10}, values, wide), n, "index == count");
    expect_refused(handmade_message(n, {1, 4, 0xFFFFFFFFu}, values, wide), n, "index 2^32-1");
    expect_refused(handmade_message(n, {4, 1, 9}, values, wide), n, "decreasing indices");
    expect_refused(handmade_message(n, {1, 4, 4}, values, wide), n, "duplicate index");
    expect_refused(handmade_message(3, {0, 1, 2, 2}, {1, 2, 3, 4}, wide), 3, "duplicate at the end");
    expect_refused(handmade_message(3, {0, 1, 2, 3}, {1, 2, 3, 4}, wide), 3, "m > count");
    for (std::uint8_t bad_flags : {0x04, 0x08, 0x80, 0xFF}) {
      auto message = valid;
      message[6] = std::byte{static_cast<std::uint8_t>(bad_flags | (wide ? 1 : 0))};
      expect_refused(message, n, "bad flags");
    }
    {  // f16 flag without f16-sized values: the payload size no longer matches
      auto message = valid;
      message[6] = std::byte{static_cast<std::uint8_t>(2 | (wide ? 1 : 0))};
      expect_refused(message, n, "payload size for f16 values");
    }
    {  // large_param disagreeing with the payload
      auto message = valid;
      const std::uint64_t m = 2;
      std::memcpy(message.data() + 24, &m, 8);
      expect_refused(message, n, "m below the payload");
      const std::uint64_t huge = (~std::uint64_t{0}) / 4;
      std::memcpy(message.data() + 24, &huge, 8);
      expect_refused(message, n, "m near 2^62");
    }
    {  // payload one entry short, header consistent with the message size
      auto message = handmade_message(n, {1, 4, 9}, values, wide);
      message.resize(message.size() - (index_width + 4));
      const std::uint64_t payload = 2 * (index_width + 4);
      std::memcpy(message.data() + 16, &payload, 8);
      expect_refused(message, n, "payload of 2 entries for m = 3");
    }
    {
      auto message = valid;
      message[7] = std::byte{2};
      expect_refused(message, n, "small_param 2");
    }
    {
      auto message = valid;
      message[5] = std::byte{static_cast<std::uint8_t>(WireCodec::randk)};
      expect_refused(message, n, "wrong codec");
    }
    expect_refused(valid, n + 1, "count mismatch (more)");
    expect_refused(valid, n - 1, "count mismatch (fewer)");
    {
      auto message = valid;
      message.pop_back();
      expect_refused(message, n, "truncated by one byte");
      message.resize(kWireHeaderBytes - 1);
      expect_refused(message, n, "truncated header");
      message.clear();
      expect_refused(message, n, "empty");
    }
  }
}

// 32-bit indices cannot address more than 2^32 elements. The count agrees with the output's, so
// only the index-width check stands between the message and a (huge) write: the output below
// is a 4-element buffer, and ASan would catch a write through it.
TEST(TopkDecoder, RefusesThirtyTwoBitIndicesAbove4G) {
  const std::uint64_t count = (std::uint64_t{1} << 32) + 1;
  std::vector<std::byte> message(kWireHeaderBytes + 8);
  write_header(WireHeader{WireCodec::topk, 0, 0, count, 8, 1}, message);
  const std::uint32_t index = 1;
  const float value = 1.0f;
  std::memcpy(message.data() + kWireHeaderBytes, &index, 4);
  std::memcpy(message.data() + kWireHeaderBytes + 4, &value, 4);
  const auto codec = make_codec("topk");
  std::vector<float> acc(4, 0.0f);
  std::string text;
  EXPECT_EQ(testing::error_code_of([&] { codec->decode_add(message, acc.data(), count); }, &text),
            ErrorCode::malformed_message);
  EXPECT_NE(text.find("32-bit indices"), std::string::npos) << text;
  EXPECT_EQ(acc, std::vector<float>(4, 0.0f));
}

// ---- the shared math ------------------------------------------------------------------------

TEST(TopkMath, KeysOrderByMagnitudeWithNanOnTop) {
  EXPECT_EQ(kernels::topk_key(-0.0f), kernels::topk_key(0.0f));
  EXPECT_EQ(kernels::topk_key(-2.0f), kernels::topk_key(2.0f));
  EXPECT_LT(kernels::topk_key(1.0f), kernels::topk_key(-1.5f));
  EXPECT_LT(kernels::topk_key(std::numeric_limits<float>::max()),
            kernels::topk_key(-std::numeric_limits<float>::infinity()));
  EXPECT_LT(kernels::topk_key(std::numeric_limits<float>::infinity()),
            kernels::topk_key(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_LT(kernels::topk_key(std::numeric_limits<float>::denorm_min()), kernels::topk_key(0x1p-126f));
  EXPECT_TRUE(kernels::topk_ranks_before(5, 9, 4, 0));
  EXPECT_TRUE(kernels::topk_ranks_before(5, 3, 5, 4));
  EXPECT_FALSE(kernels::topk_ranks_before(5, 4, 5, 4));
}

TEST(TopkMath, SampleRankAndRunsStayInRange) {
  // Whole-tensor samples use the exact rank k.
  EXPECT_EQ(kernels::topk_sample_rank(10, 1000, false), 10u);
  EXPECT_EQ(kernels::topk_sample_rank(10, 1000, true), 10u);
  // n = 2^24, k = 167773: e = ceil(167773 * 65536 / 2^24) = ceil(655.36...) = 656;
  // exact adds 4 * floor(sqrt(656)) + 16 = 4 * 25 + 16.
  EXPECT_EQ(kernels::topk_sample_rank(167773, std::uint64_t{1} << 24, true), 656u);
  EXPECT_EQ(kernels::topk_sample_rank(167773, std::uint64_t{1} << 24, false), 656u + 116u);
  EXPECT_EQ(kernels::topk_isqrt(0), 0u);
  EXPECT_EQ(kernels::topk_isqrt(655), 25u);
  EXPECT_EQ(kernels::topk_isqrt(676), 26u);
  EXPECT_EQ(kernels::topk_isqrt(65536), 256u);
  // Runs lie inside their segment for sizes just above the whole-sample limit and huge ones.
  for (std::uint64_t n : {kernels::kTopkSampleAllCount + 1, std::uint64_t{1} << 40,
                          (std::uint64_t{1} << 50) + 12345}) {
    const std::uint64_t length = n / kernels::kTopkSampleGroups;
    for (std::uint64_t segment : {std::uint64_t{0}, std::uint64_t{1}, kernels::kTopkSampleGroups - 1}) {
      for (std::uint64_t seed : {0ull, 5ull, ~0ull}) {
        const std::uint64_t start = kernels::topk_sample_run_start(n, segment, seed, 1, 2);
        EXPECT_GE(start, segment * length);
        EXPECT_LE(start + kernels::kTopkSampleRun, (segment + 1) * length);
      }
    }
  }
}

}  // namespace
}  // namespace gradzip
