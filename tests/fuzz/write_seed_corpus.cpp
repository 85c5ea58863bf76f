// Writes the seed corpora of the fuzz targets: valid messages of every spec in
// tests/fuzz/fuzz_specs.h, encoded from fixed-seed random tensors.
//
//   write_seed_corpus OUT_DIR      writes OUT_DIR/decode/* and OUT_DIR/wire_header/*
//
// decode/: the fuzz_decode input layout (spec index, u16 count, isa, message) for counts
//          0, 1, 7, 37 (with NaN, +-Inf, -0 and a subnormal among the values), 300 and 1000,
//          the forced ISA cycling through scalar, avx2, avx512.
// wire_header/: the bare messages of counts 0 and 7.
// The checked-in corpus is tests/fuzz/corpus/ (rerun after changing the spec list):
//   build-fuzz/tests/fuzz/write_seed_corpus tests/fuzz/corpus
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gradzip/codec.h"
#include "tests/fuzz/fuzz_specs.h"

namespace {

void write_file(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "write_seed_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string file_stem(std::size_t index, const char* spec, std::size_t count) {
  std::string name = "s" + std::to_string(index / 10) + std::to_string(index % 10) + "_";
  for (const char* p = spec; *p != '\0'; ++p) {
    const char ch = *p;
    name += (ch == ':' || ch == ',' || ch == '=' || ch == '.') ? '-' : ch;
  }
  return name + "_n" + std::to_string(count);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradzip::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  std::filesystem::create_directories(root / "decode");
  std::filesystem::create_directories(root / "wire_header");

  std::mt19937_64 rng(20240508);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t counts[] = {0, 1, 7, 37, 300, 1000};
  std::size_t files = 0, bytes = 0, isa = 0;
  for (std::size_t s = 0; s < kFuzzSpecCount; ++s) {
    const auto codec = gradzip::make_codec(kFuzzSpecs[s]);
    for (const std::size_t count : counts) {
      std::vector<float> values(count);
      for (float& v : values) v = normal(rng);
      if (count == 37) {
        values[3] = std::numeric_limits<float>::quiet_NaN();
        values[10] = std::numeric_limits<float>::infinity();
        values[11] = -std::numeric_limits<float>::infinity();
        values[20] = -0.0f;
        values[30] = 1e-40f;
      }
      gradzip::EncodeContext ctx;
      ctx.seed = rng();
      ctx.step = static_cast<std::uint32_t>(rng() % 1000);
      ctx.tensor_id = static_cast<std::uint32_t>(rng() % 16);
      ctx.element_offset = (count % 2 == 1) ? 4096 : 0;
      std::vector<std::byte> message(codec->max_encoded_bytes(count));
      message.resize(codec->encode(gradzip::host_view(values.data(), count), message, ctx));

      std::vector<std::byte> input = {
          static_cast<std::byte>(s), static_cast<std::byte>(count & 0xFF),
          static_cast<std::byte>(count >> 8), static_cast<std::byte>(isa++ % 3)};
      input.insert(input.end(), message.begin(), message.end());
      const std::string stem = file_stem(s, kFuzzSpecs[s], count);
      write_file(root / "decode" / stem, input);
      ++files;
      bytes += input.size();
      if (count == 0 || count == 7) {
        write_file(root / "wire_header" / stem, message);
        ++files;
        bytes += message.size();
      }
    }
  }
  std::printf("write_seed_corpus: %zu files, %zu bytes under %s\n", files, bytes, root.c_str());
  return 0;
}
