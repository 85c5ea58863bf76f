// The public Codec objects on CUDA tensors (compressors/device_codec.h behind make_codec()):
// for every codec, encoding a device tensor gives the bytes the host codec gives for the same
// values, spec and context, and decoding / decode_adding a device message gives the host
// decoder's bits. Malformed messages are refused with the output untouched; host buffers
// where device memory is required are refused naming what was wrong.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "collectives/cost_model.h"
#include "collectives/device_memory.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "kernels/cuda/device_runtime.h"
#include "kernels/cuda/stream_ordered_call.h"
#include "tests/fuzz/fuzz_specs.h"

namespace gradzip {
namespace {

using gpu_test::DeviceArray;
using gpu_test::DeviceTest;
using gpu_test::kNoDifference;

// Every spec of the codec conformance list (tests/fuzz/fuzz_specs.h, which covers every element
// codec of the registry: tests/unit/test_codec_conformance.cpp checks that), then defaults and
// cases of their own (a bucket longer than the largest count, top-k's and random-k's 1%).
const std::vector<std::string> kSpecs = [] {
  std::vector<std::string> specs(std::begin(fuzz::kFuzzSpecs), std::end(fuzz::kFuzzSpecs));
  for (const char* own : {"qsgd:bits=4,bucket=512", "qsgd:bits=1,bucket=7",
                          "qsgd:bits=8,bucket=100000", "sign", "topk:ratio=0.01",
                          "topk:ratio=0.01,approx=on", "randk:ratio=0.01", "terngrad"})
    specs.emplace_back(own);
  return specs;
}();
const std::vector<std::size_t> kCounts = {0, 1, 7, (std::size_t{1} << 20) + 3};

Device cuda0() { return Device{DeviceKind::cuda, 0}; }

EncodeContext context_for(std::size_t count) {
  return EncodeContext{0x1234'5678'9ABCull, 17, 0xC0FFEEu, count % 5};
}

// The message the host codec writes for `values`.
std::vector<std::byte> host_message(const Codec& codec, const std::vector<float>& values,
                                    const EncodeContext& ctx) {
  std::vector<std::byte> message(codec.max_encoded_bytes(values.size()));
  message.resize(codec.encode(host_view(values.data(), values.size()), message, ctx));
  return message;
}

class DeviceCodecTest : public DeviceTest {};

TEST_F(DeviceCodecTest, EncodeGivesTheHostCodecsBytes) {
  for (const std::string& spec : kSpecs) {
    const auto codec = make_codec(spec);
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(spec + ", count " + std::to_string(count));
      const std::vector<float> values = gpu_test::gaussian(count, count + 3);
      const EncodeContext ctx = context_for(count);
      const std::vector<std::byte> want = host_message(*codec, values, ctx);

      DeviceArray<float> d_values(values);
      DeviceArray<std::byte> d_message(codec->max_encoded_bytes(count));
      const std::size_t bytes = codec->encode(
          ConstTensorView(d_values.get(), count, DType::f32, cuda0()),
          std::span<std::byte>(d_message.get(), codec->max_encoded_bytes(count)), ctx);
      ASSERT_EQ(bytes, want.size());
      const auto got = gpu_test::from_device<std::byte>(d_message.get(), bytes);
      ASSERT_TRUE(gpu_test::same_bytes(want.data(), got));
    }
  }
}

TEST_F(DeviceCodecTest, HalfInputsEncodeLikeTheHostCodec) {
  const std::size_t count = 4099;
  const std::vector<float> values = gpu_test::gaussian(count, 5);
  for (DType dtype : {DType::f16, DType::bf16}) {
    std::vector<std::uint16_t> half(count);
    if (dtype == DType::f16) kernels::cpu::f32_to_f16(values.data(), half.data(), count);
    else kernels::cpu::f32_to_bf16(values.data(), half.data(), count);
    DeviceArray<std::uint16_t> d_half(half);
    for (const char* spec : {"none", "fp16", "qsgd:bits=4", "topk:ratio=0.05"}) {
      SCOPED_TRACE(std::string(spec) + " from " + std::string(dtype_name(dtype)));
      const auto codec = make_codec(spec);
      const EncodeContext ctx = context_for(count);
      std::vector<std::byte> want(codec->max_encoded_bytes(count));
      want.resize(codec->encode(ConstTensorView(half.data(), count, dtype), want, ctx));
      DeviceArray<std::byte> d_message(want.size());
      const std::size_t bytes =
          codec->encode(ConstTensorView(d_half.get(), count, dtype, cuda0()),
                        std::span<std::byte>(d_message.get(), codec->max_encoded_bytes(count)), ctx);
      ASSERT_EQ(bytes, want.size());
      ASSERT_TRUE(gpu_test::same_bytes(want.data(), gpu_test::from_device<std::byte>(d_message.get(), bytes)));
    }
  }
}

TEST_F(DeviceCodecTest, DecodeAndDecodeAddGiveTheHostDecodersBits) {
  for (const std::string& spec : kSpecs) {
    const auto codec = make_codec(spec);
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(spec + ", count " + std::to_string(count));
      const std::vector<std::byte> message =
          host_message(*codec, gpu_test::gaussian(count, count + 11), context_for(count));
      DeviceArray<std::byte> d_message(message);
      const std::span<const std::byte> device_message(d_message.get(), message.size());

      std::vector<float> want(count);
      codec->decode(message, host_view(want.data(), count));
      DeviceArray<float> d_out(count);
      codec->decode(device_message, TensorView{d_out.get(), count, DType::f32, cuda0()});
      const std::vector<float> got = gpu_test::from_device<float>(d_out.get(), count);
      const std::size_t diff = gpu_test::first_float_difference(got, want, count, false);
      ASSERT_EQ(diff, kNoDifference) << "decode differs at element " << diff;

      std::vector<float> want_acc = gpu_test::gaussian(count, 99);
      DeviceArray<float> d_acc(want_acc);
      codec->decode_add(message, want_acc.data(), count);
      codec->decode_add(device_message, TensorView{d_acc.get(), count, DType::f32, cuda0()});
      const std::vector<float> got_acc = gpu_test::from_device<float>(d_acc.get(), count);
      const std::size_t acc_diff = gpu_test::first_float_difference(got_acc, want_acc, count, true);
      ASSERT_EQ(acc_diff, kNoDifference) << "decode_add differs at element " << acc_diff;
    }
  }
}

// Error feedback on the device against the host's, with the decoded message asked for (the
// general path) and without (the fused encodes of fp16, bf16, sign, qsgd and terngrad where
// their shapes allow; sign:bucket=100 and qsgd's bucket 1001 decline and run the general path).
TEST_F(DeviceCodecTest, ErrorFeedbackOnTheDeviceGivesTheHostBytesAndResiduals) {
  const std::size_t count = 50001;
  for (const char* spec : {"topk:ratio=0.01", "qsgd:bits=2,bucket=256", "sign", "fp16", "bf16",
                           "qsgd:bits=4", "qsgd:bits=3,bucket=1001", "terngrad", "sign:bucket=100",
                           "randk:ratio=0.01", "topk:ratio=0.3,values=fp16",
                           "topk:ratio=0.01,approx=on", "randk:ratio=0.5,values=fp16"}) {
   for (const bool with_decoded : {true, false}) {
    SCOPED_TRACE(std::string(spec) + (with_decoded ? ", decoded asked for" : ", fused where it can"));
    const std::shared_ptr<const Codec> codec = make_codec(spec);
    error_feedback::ResidualStore host_store(1, 0, ResizePolicy::error);
    error_feedback::ResidualStore device_store(1, 0, ResizePolicy::error);
    error_feedback::ErrorFeedbackCodec host_ef(codec, host_store);
    error_feedback::ErrorFeedbackCodec device_ef(codec, device_store);
    for (std::uint32_t step = 0; step < 3; ++step) {
      const std::vector<float> grad = gpu_test::gaussian(count, 40 + step);
      // Two chunks, as the collectives send them: offsets key the draws and the residual slice.
      for (const auto& [begin, end] : {std::pair<std::size_t, std::size_t>{0, 20000}, {20000, count}}) {
        const std::size_t n = end - begin;
        const EncodeContext ctx{11, step, 5, begin};
        std::vector<std::byte> want(codec->max_encoded_bytes(n));
        std::vector<float> want_decoded(with_decoded ? n : 0);
        want.resize(host_ef.encode_chunk("w", count, host_view(grad.data() + begin, n), want, ctx,
                                         want_decoded));
        DeviceArray<float> d_grad(std::vector<float>(grad.begin() + begin, grad.begin() + end));
        DeviceArray<std::byte> d_message(codec->max_encoded_bytes(n));
        DeviceArray<float> d_decoded(n);
        const std::size_t bytes = device_ef.encode_chunk(
            "w", count, ConstTensorView(d_grad.get(), n, DType::f32, cuda0()),
            std::span<std::byte>(d_message.get(), codec->max_encoded_bytes(n)), ctx,
            with_decoded ? std::span<float>(d_decoded.get(), n) : std::span<float>{});
        ASSERT_EQ(bytes, want.size());
        ASSERT_TRUE(gpu_test::same_bytes(want.data(), gpu_test::from_device<std::byte>(d_message.get(), bytes)));
        if (with_decoded) {
          ASSERT_EQ(gpu_test::first_float_difference(d_decoded.download(), want_decoded, n, false),
                    kNoDifference);
        }
      }
      // Read through the const overloads: the device residual stays where the encodes run.
      const std::span<const float> want_residual = std::as_const(host_store).residual("w");
      const std::span<const float> got_residual = std::as_const(device_store).residual("w");
      ASSERT_EQ(std::memcmp(want_residual.data(), got_residual.data(), count * sizeof(float)), 0)
          << "residuals differ after step " << step;
    }
   }
  }
}

// Top-k and random-k update the device residual in place (the entries only, then a
// finite_or_zero sweep that runs only when some g + e was not finite). Inputs that make g + e
// overflow or carry Inf / NaN, and f16 values that overflow where g + e is finite, must still
// leave the host's residual: finite everywhere, zero exactly where the host's is.
TEST_F(DeviceCodecTest, SparseFeedbackInPlaceLeavesTheHostResidualForNonfiniteSums) {
  const std::size_t count = 30011;
  for (const char* spec : {"topk:ratio=0.01", "topk:ratio=0.3,values=fp16", "randk:ratio=0.01",
                           "randk:ratio=0.5,values=fp16"}) {
   for (const gpu_test::Data data : {gpu_test::Data::finite_specials, gpu_test::Data::nonfinite}) {
    SCOPED_TRACE(std::string(spec) + ", " + gpu_test::data_name(data));
    const std::shared_ptr<const Codec> codec = make_codec(spec);
    error_feedback::ResidualStore host_store(1, 0, ResizePolicy::error);
    error_feedback::ResidualStore device_store(1, 0, ResizePolicy::error);
    error_feedback::ErrorFeedbackCodec host_ef(codec, host_store);
    error_feedback::ErrorFeedbackCodec device_ef(codec, device_store);
    // Steps 0 and 1 get the same data: the huge values (FLT_MAX, 3e38 in finite_specials) that
    // step 0 did not send stay in the residual, and step 1's g + e overflows there; step 2
    // runs on plain data after it.
    for (std::uint32_t step = 0; step < 3; ++step) {
      std::vector<float> grad = step == 2 ? gpu_test::gaussian(count, 77)
                                          : gpu_test::make_data(count, data, 60);
      const EncodeContext ctx{5, step, 2, 0};
      std::vector<std::byte> want(codec->max_encoded_bytes(count));
      want.resize(host_ef.encode_chunk("w", count, host_view(grad.data(), count), want, ctx, {}));
      DeviceArray<float> d_grad(grad);
      DeviceArray<std::byte> d_message(codec->max_encoded_bytes(count));
      const std::size_t bytes = device_ef.encode_chunk(
          "w", count, ConstTensorView(d_grad.get(), count, DType::f32, cuda0()),
          std::span<std::byte>(d_message.get(), codec->max_encoded_bytes(count)), ctx, {});
      ASSERT_EQ(bytes, want.size());
      // NaN payload bits may differ on a GPU (kernels/cuda/ef_cuda.h); finite data compare bytes.
      if (data == gpu_test::Data::finite_specials || step == 2) {
        ASSERT_TRUE(gpu_test::same_bytes(want.data(), gpu_test::from_device<std::byte>(d_message.get(), bytes)));
      }
      const std::span<const float> want_residual = std::as_const(host_store).residual("w");
      const std::span<const float> got_residual = std::as_const(device_store).residual("w");
      std::size_t zeros = 0;
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_EQ(kernels::float_bits(got_residual[i]), kernels::float_bits(want_residual[i]))
            << "element " << i << " after step " << step << " (input " << grad[i] << ")";
        ASSERT_TRUE(std::isfinite(got_residual[i])) << "element " << i;
        zeros += got_residual[i] == 0.0f ? 1 : 0;
      }
      // Not vacuous: the residual holds the unsent values (most elements nonzero).
      EXPECT_LT(zeros, count / 2) << "after step " << step;
    }
   }
  }
}

// The cost model's γ of device calls (gradzip-bench model --device cuda) is measured on device
// memory: the sample goes up once, each timed run (3 phases x repeats) is waited for by the
// measurement, and the device codec does the work (its own waits appear under its name).
TEST_F(DeviceCodecTest, DeviceGammaIsMeasuredOnDeviceMemory) {
  constexpr std::size_t kSample = std::size_t{1} << 14;
  constexpr int kRepeats = 2;
  const std::unique_ptr<Codec> codec = make_codec("sign:ef=on");
  collectives::set_wait_site_counting(true);
  const auto sites_before = collectives::device_wait_sites();
  const collectives::DeviceRuntimeCounts before = collectives::device_runtime_counts();
  const collectives::CodecCost cost =
      collectives::measure_codec_cost(*codec, kSample, kRepeats, cuda0());
  const collectives::DeviceRuntimeCounts after = collectives::device_runtime_counts();
  const auto grown = collectives::wait_sites_between(sites_before, collectives::device_wait_sites());
  collectives::set_wait_site_counting(false);
  EXPECT_GT(cost.encode_s, 0);
  EXPECT_GT(cost.decode_add_s, 0);
  EXPECT_GT(cost.add_s, 0);
  // The sample's upload and, per run, at most the headers and status words that synchronous
  // device decodes read back: not the data (a staged path would copy 64 KiB per run).
  const std::uint64_t copied = after.host_device_bytes - before.host_device_bytes;
  EXPECT_GE(copied, kSample * sizeof(float));
  EXPECT_LT(copied, kSample * sizeof(float) + 1024);
  std::uint64_t measurement_waits = 0, codec_waits = 0;
  for (const auto& [site, count] : grown) {
    if (site == "measure_codec_cost (cuda:0)") measurement_waits += count;
    if (site.rfind("sign.", 0) == 0 || site.rfind("ef.encode", 0) == 0) codec_waits += count;
  }
  // Each timed run (encode, decode_add, add, kRepeats each) ends in the measurement's wait,
  // besides its set-up copies.
  EXPECT_GE(measurement_waits, 3u * kRepeats);
  EXPECT_GT(codec_waits, 0u);
}

TEST_F(DeviceCodecTest, HalfOutputsDecodeLikeTheHostCodec) {
  const std::size_t count = 1031;
  for (const char* spec : {"none", "fp16", "bf16", "sign"}) {
    const auto codec = make_codec(spec);
    const std::vector<std::byte> message =
        host_message(*codec, gpu_test::gaussian(count, 8), context_for(count));
    DeviceArray<std::byte> d_message(message);
    for (DType dtype : {DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(spec) + " into " + std::string(dtype_name(dtype)));
      std::vector<std::uint16_t> want(count);
      codec->decode(message, TensorView{want.data(), count, dtype, Device{}});
      DeviceArray<std::uint16_t> d_out(count);
      codec->decode(std::span<const std::byte>(d_message.get(), message.size()),
                    TensorView{d_out.get(), count, dtype, cuda0()});
      EXPECT_EQ(d_out.download(), want);
    }
  }
}

TEST_F(DeviceCodecTest, MalformedMessagesAreRefusedAndTheOutputIsUntouched) {
  const std::size_t count = 4096;
  struct Case {
    const char* spec;
    std::size_t offset;  // byte to corrupt
    std::byte value;
  };
  // Header fields (checked on the host) and payload contents (checked on the device).
  const std::vector<Case> cases = {
      {"fp16", 0, std::byte{0x00}},                       // magic
      {"qsgd:bits=4,bucket=512", 7, std::byte{9}},        // bits
      {"qsgd:bits=4,bucket=512", 32 + 3, std::byte{0xFF}},  // scale 0: sign bit set -> negative
      {"sign", 6, std::byte{1}},                          // flags
      {"topk:ratio=0.01", 32 + 4 * 3 + 3, std::byte{0xFF}},  // index 3 >= 2^24: out of range
      {"randk:ratio=0.01", 24, std::byte{0}},             // k = 0 for 4096 elements
      // 8 buckets of 512 (32 scale bytes), then 820 trit bytes, the last holding 1 element.
      {"terngrad", 32 + 32, std::byte{243}},              // trit byte 0: 243 is not 5 trits
      {"terngrad", 32 + 32 + 819, std::byte{3}},          // last byte: a digit after element 4095
      {"terngrad", 32 + 3, std::byte{0xFF}},              // scale 0: negative
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + ", byte " + std::to_string(c.offset));
    const auto codec = make_codec(c.spec);
    std::vector<std::byte> message =
        host_message(*codec, gpu_test::gaussian(count, 4), context_for(count));
    message[c.offset] = c.value;
    // The host decoder refuses it too.
    std::vector<float> host_out(count, 0.5f);
    EXPECT_THROW(codec->decode(message, host_view(host_out.data(), count)), Error);

    DeviceArray<std::byte> d_message(message);
    const std::vector<float> before(count, 0.25f);
    DeviceArray<float> d_out(before);
    try {
      codec->decode_add(std::span<const std::byte>(d_message.get(), message.size()),
                        TensorView{d_out.get(), count, DType::f32, cuda0()});
      ADD_FAILURE() << "the malformed message was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::malformed_message) << error.what();
    }
    EXPECT_EQ(d_out.download(), before);
  }
}

// Inside a stream-ordered call (kernels/cuda/stream_ordered_call.h, what the collectives open
// over NCCL), encode and decode only queue their work: no host wait, nothing read back. A
// received header is compared on the device with the one the spec writes for the element
// count, payload checks land in the call's status words, and the call's completion throws
// naming the failed check. A clean message decodes to the host decoder's bits.
TEST_F(DeviceCodecTest, InAStreamOrderedCallChecksWaitForTheCompletion) {
  const std::size_t count = 4096;
  struct Case {
    const char* spec;
    std::optional<std::size_t> offset;  // byte to corrupt; nullopt: a clean message
    std::byte value;
    const char* expected_text;  // in the completion's error
  };
  const std::vector<Case> cases = {
      {"fp16", std::nullopt, std::byte{0}, nullptr},
      {"fp16", 0, std::byte{0x00}, "message header is not the one"},
      {"qsgd:bits=4,bucket=512", std::nullopt, std::byte{0}, nullptr},
      {"qsgd:bits=4,bucket=512", 7, std::byte{9}, "message header is not the one"},
      {"qsgd:bits=4,bucket=512", 32 + 3, std::byte{0xFF}, "bucket scale"},
      {"sign", 6, std::byte{1}, "message header is not the one"},
      {"topk:ratio=0.01", std::nullopt, std::byte{0}, nullptr},
      {"topk:ratio=0.01", 32 + 4 * 3 + 3, std::byte{0xFF}, "index is outside"},
      {"terngrad", std::nullopt, std::byte{0}, nullptr},
      {"terngrad", 32 + 32, std::byte{243}, "trit byte"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + (c.offset ? ", byte " + std::to_string(*c.offset) : ", clean"));
    const auto codec = make_codec(c.spec);
    const std::vector<float> values = gpu_test::gaussian(count, 4);
    std::vector<std::byte> message = host_message(*codec, values, context_for(count));
    if (c.offset) message[*c.offset] = c.value;
    std::vector<float> host_out(count, 0.25f);
    if (!c.offset) codec->decode_add(message, host_view(host_out.data(), count));

    DeviceArray<std::byte> d_message(message);
    DeviceArray<float> d_out(std::vector<float>(count, 0.25f));
    DeviceArray<std::byte> d_encoded(codec->max_encoded_bytes(count));
    DeviceArray<float> d_values(values);
    {
      // Warm-up: a scratch size's first block is allocated and waited for once (the thread's
      // cache serves it afterwards), as in a training loop's first step.
      DeviceArray<float> d_scratch_out(count);
      kernels::cuda::StreamOrderedCall warm("warm-up");
      codec->encode(ConstTensorView(d_values.get(), count, DType::f32, cuda0()),
                    std::span<std::byte>(d_encoded.get(), codec->max_encoded_bytes(count)),
                    context_for(count));
      codec->decode_add(std::span<const std::byte>(d_encoded.get(), message.size()),
                        TensorView{d_scratch_out.get(), count, DType::f32, cuda0()});
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      warm.complete_and_check(0);
    }
    kernels::cuda::StreamOrderedCall call("test");
    const kernels::cuda::DeviceRuntimeCounters before = kernels::cuda::device_runtime_counters();
    const std::size_t encoded = codec->encode(
        ConstTensorView(d_values.get(), count, DType::f32, cuda0()),
        std::span<std::byte>(d_encoded.get(), codec->max_encoded_bytes(count)), context_for(count));
    codec->decode_add(std::span<const std::byte>(d_message.get(), message.size()),
                      TensorView{d_out.get(), count, DType::f32, cuda0()});
    const kernels::cuda::DeviceRuntimeCounters after = kernels::cuda::device_runtime_counters();
    EXPECT_EQ(after.synchronizations, before.synchronizations) << "a host wait inside the call";
    EXPECT_EQ(after.host_device_bytes, before.host_device_bytes) << "a copy to or from the host";
    EXPECT_EQ(encoded, message.size());
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);  // the caller's completion wait
    if (!c.offset) {
      EXPECT_NO_THROW(call.complete_and_check(0));
      EXPECT_EQ(d_out.download(), host_out);
      continue;
    }
    try {
      call.complete_and_check(0);
      ADD_FAILURE() << "the malformed message passed the call's checks";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::malformed_message) << error.what();
      EXPECT_NE(std::string(error.what()).find(c.expected_text), std::string::npos) << error.what();
    }
  }
}

TEST_F(DeviceCodecTest, HostBuffersWhereDeviceMemoryIsNeededAreRefused) {
  const std::size_t count = 64;
  const auto codec = make_codec("fp16");
  DeviceArray<float> d_values(gpu_test::gaussian(count, 1));
  std::vector<std::byte> host_buffer(codec->max_encoded_bytes(count));
  try {
    codec->encode(ConstTensorView(d_values.get(), count, DType::f32, cuda0()), host_buffer, {});
    ADD_FAILURE() << "a host message buffer was accepted for a device tensor";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("not CUDA device memory"), std::string::npos)
        << error.what();
  }
  // A device tensor whose pointer is host memory.
  std::vector<float> host_values(count, 1.0f);
  DeviceArray<std::byte> d_message(codec->max_encoded_bytes(count));
  EXPECT_THROW(codec->encode(ConstTensorView(host_values.data(), count, DType::f32, cuda0()),
                             std::span<std::byte>(d_message.get(), codec->max_encoded_bytes(count)), {}),
               Error);
  // Too small an output buffer.
  EXPECT_THROW(codec->encode(ConstTensorView(d_values.get(), count, DType::f32, cuda0()),
                             std::span<std::byte>(d_message.get(), 8), {}),
               Error);
}

}  // namespace
}  // namespace gradzip
