// Uses only the installed public headers: round-trips a gradient through fp16 (values chosen
// to be exact in fp16) and checks that a bad spec is refused with gradzip::Error.
#include <cstdio>
#include <vector>

#include <gradzip/gradzip.h>

int main() {
  const std::vector<float> gradient = {1.0f, -2.5f, 0.125f, 1024.0f, 0.0f};
  auto codec = gradzip::make_codec("fp16");
  std::vector<std::byte> message(codec->max_encoded_bytes(gradient.size()));
  const std::size_t bytes = codec->encode(gradzip::host_view(gradient.data(), gradient.size()),
                                          message, gradzip::EncodeContext{});
  std::vector<float> decoded(gradient.size());
  codec->decode(std::span<const std::byte>(message.data(), bytes),
                gradzip::host_view(decoded.data(), decoded.size()));
  if (decoded != gradient) {
    std::fprintf(stderr, "consumer: fp16 round trip changed exactly representable values\n");
    return 1;
  }
  try {
    gradzip::make_codec("zip:ratio=2");
    std::fprintf(stderr, "consumer: an unknown codec was accepted\n");
    return 1;
  } catch (const gradzip::Error& error) {
    if (error.code() != gradzip::ErrorCode::invalid_spec) return 1;
  }
  std::printf("consumer: gradzip %s found and working (%zu-byte fp16 message)\n",
              gradzip::version(), bytes);
  return 0;
}
