// How the codecs make_codec() returns route tensors by device: host views take the host code
// (the TensorView form of decode_add equals the pointer form bit for bit), and CUDA views go
// to the device codecs, which in a build or on a machine without CUDA refuse with a clear
// error instead of touching the pointer. (Device results are checked against the host codecs
// in tests/gpu/test_device_codec.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "compressors/device_codec.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#ifdef GRADZIP_HAVE_CUDA
#include "kernels/cuda/cast_cuda.h"
#endif

namespace gradzip {
namespace {

// True when this process can run CUDA work (a CUDA build with a device).
bool cuda_device_present() {
#ifdef GRADZIP_HAVE_CUDA
  return kernels::cuda::device_count(nullptr) > 0;
#else
  return false;
#endif
}

std::vector<float> ramp(std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return values;
}

TEST(CodecDevices, TensorViewDecodeAddOnTheHostEqualsThePointerForm) {
  const std::size_t count = 1000;
  for (const char* spec : {"none", "fp16", "qsgd:bits=4", "sign", "topk:ratio=0.1", "randk:ratio=0.1"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec);
    const std::vector<float> values = ramp(count);
    std::vector<std::byte> message(codec->max_encoded_bytes(count));
    message.resize(codec->encode(host_view(values.data(), count), message, EncodeContext{7, 1, 2, 0}));
    std::vector<float> by_pointer(count, 1.5f);
    std::vector<float> by_view(count, 1.5f);
    codec->decode_add(message, by_pointer.data(), count);
    codec->decode_add(message, host_view(by_view.data(), count));
    EXPECT_EQ(std::memcmp(by_pointer.data(), by_view.data(), count * sizeof(float)), 0);
    EXPECT_NE(by_view, std::vector<float>(count, 1.5f));  // something was added
  }
}

TEST(CodecDevices, TensorViewDecodeAddNeedsAnF32Accumulator) {
  const auto codec = make_codec("none");
  const std::vector<float> values = ramp(4);
  std::vector<std::byte> message(codec->max_encoded_bytes(4));
  message.resize(codec->encode(host_view(values.data(), 4), message, {}));
  std::vector<std::uint16_t> half(4);
  try {
    codec->decode_add(message, TensorView{half.data(), 4, DType::f16, Device{}});
    FAIL() << "an f16 accumulator was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(error.what()).find("must be f32"), std::string::npos) << error.what();
  }
}

TEST(CodecDevices, CudaTensorsWithoutCudaAreRefusedNamingTheDevice) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: tests/gpu/ covers this path";
  const auto codec = make_codec("fp16");
  // A pointer that must never be dereferenced: the refusal comes before any access.
  auto* const fake = reinterpret_cast<float*>(std::uintptr_t{0x1000});
  std::vector<std::byte> out(codec->max_encoded_bytes(16));
  const Device device{DeviceKind::cuda, 3};
  try {
    codec->encode(ConstTensorView(fake, 16, DType::f32, device), out, {});
    FAIL() << "a CUDA tensor was encoded without CUDA";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::unsupported) << error.what();
    const std::string what = error.what();
    EXPECT_NE(what.find("fp16.encode"), std::string::npos) << what;
    if (!compressors::device_codecs_built()) {
      EXPECT_NE(what.find("built without CUDA"), std::string::npos) << what;
    }
  }
  EXPECT_THROW(codec->decode(out, TensorView{fake, 16, DType::f32, device}), Error);
  EXPECT_THROW(codec->decode_add(out, TensorView{fake, 16, DType::f32, device}), Error);
}

}  // namespace
}  // namespace gradzip
