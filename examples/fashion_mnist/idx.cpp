#include "examples/fashion_mnist/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "gradzip/error.h"

namespace gradzip::examples {
namespace {

constexpr std::uint32_t kImageMagic = 0x00000803;  // u8 data, 3 dimensions
constexpr std::uint32_t kLabelMagic = 0x00000801;  // u8 data, 1 dimension
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 31;
constexpr std::size_t kReadChunk = std::size_t{1} << 20;

struct FileCloser {
  void operator()(std::FILE* file) const noexcept { std::fclose(file); }
};
struct GzCloser {
  void operator()(gzFile_s* file) const noexcept { gzclose(file); }
};

[[noreturn]] void throw_io_error(const std::string& path, const char* action, int error_number) {
  GZ_THROW(ErrorCode::io_error, "IDX file '", path, "': cannot ", action, ": ", std::strerror(error_number));
}

std::vector<std::uint8_t> read_raw(std::FILE* file, const std::string& path) {
  std::vector<std::uint8_t> bytes;
  for (;;) {
    const std::size_t old_size = bytes.size();
    bytes.resize(old_size + kReadChunk);
    const std::size_t got = std::fread(bytes.data() + old_size, 1, kReadChunk, file);
    bytes.resize(old_size + got);
    if (got < kReadChunk) {
      if (std::ferror(file)) throw_io_error(path, "read", errno);
      return bytes;
    }
  }
}

std::vector<std::uint8_t> read_gzip(const std::string& path) {
  errno = 0;
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw_io_error(path, "open", errno != 0 ? errno : ENOMEM);
  std::vector<std::uint8_t> bytes;
  for (;;) {
    const std::size_t old_size = bytes.size();
    bytes.resize(old_size + kReadChunk);
    const int got = gzread(file.get(), bytes.data() + old_size, static_cast<unsigned>(kReadChunk));
    bytes.resize(old_size + static_cast<std::size_t>(got > 0 ? got : 0));
    int status = Z_OK;
    const char* message = gzerror(file.get(), &status);
    if (got < 0 || status != Z_OK) {
      if (status == Z_ERRNO) throw_io_error(path, "read", errno);
      // Z_BUF_ERROR ("unexpected end of file") for a cut stream, Z_DATA_ERROR for corrupt data.
      GZ_THROW(ErrorCode::malformed_message, "IDX file '", path, "': truncated or corrupt gzip stream after ",
               bytes.size(), " decompressed bytes: ", message);
    }
    if (got == 0) return bytes;
  }
}

// The whole file, decompressed when it starts with the gzip magic 1f 8b.
std::vector<std::uint8_t> read_file(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw_io_error(path, "open", errno);
  std::uint8_t magic[2] = {0, 0};
  const std::size_t got = std::fread(magic, 1, 2, file.get());
  if (std::ferror(file.get())) throw_io_error(path, "read", errno);
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    file.reset();
    return read_gzip(path);
  }
  std::rewind(file.get());
  return read_raw(file.get(), path);
}

std::uint32_t big_endian_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

std::string hex32(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(value));
  return text;
}

// Checks the header of `bytes` (magic, `rank` non-zero dimensions, at most 2^31 elements) and
// that exactly the promised data follows; returns the dimensions. The data starts at 4 + 4 * rank.
std::vector<std::size_t> parse_header(const std::string& path, const std::vector<std::uint8_t>& bytes,
                                      std::uint32_t magic, std::size_t rank, const char* kind) {
  const std::size_t header_bytes = 4 + 4 * rank;
  // The magic first, so that a file of the other kind is named as such rather than as short.
  GZ_REQUIRE(bytes.size() >= 4, ErrorCode::malformed_message, "IDX file '", path, "': truncated: ",
             bytes.size(), " bytes, fewer than the 4-byte magic");
  const std::uint32_t found = big_endian_u32(bytes.data());
  GZ_REQUIRE(found == magic, ErrorCode::malformed_message, "IDX file '", path, "': magic ", hex32(found),
             ", expected ", hex32(magic), " (", kind, ")");
  GZ_REQUIRE(bytes.size() >= header_bytes, ErrorCode::malformed_message, "IDX file '", path, "': truncated: ",
             bytes.size(), " bytes, fewer than the ", header_bytes, "-byte header of ", kind);
  std::vector<std::size_t> dims(rank);
  std::uint64_t elements = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const std::uint32_t size = big_endian_u32(bytes.data() + 4 + 4 * d);
    GZ_REQUIRE(size != 0, ErrorCode::malformed_message, "IDX file '", path, "': dimension ", d, " is 0");
    elements *= size;  // < 2^31 * 2^32: no overflow
    GZ_REQUIRE(elements <= kMaxElements, ErrorCode::malformed_message, "IDX file '", path,
               "': dimensions promise more than 2^31 elements (dimension ", d, " is ", size, ")");
    dims[d] = size;
  }
  const std::size_t data_bytes = bytes.size() - header_bytes;
  GZ_REQUIRE(data_bytes >= elements, ErrorCode::malformed_message, "IDX file '", path, "': truncated: ",
             data_bytes, " data bytes, the header promises ", elements);
  GZ_REQUIRE(data_bytes == elements, ErrorCode::malformed_message, "IDX file '", path, "': ",
             data_bytes - elements, " trailing bytes after the ", elements, " data bytes the header promises");
  return dims;
}

// <directory>/<name>.gz, or <directory>/<name> when only that exists.
std::string split_file(const std::string& directory, const std::string& name) {
  const std::filesystem::path compressed = std::filesystem::path(directory) / (name + ".gz");
  const std::filesystem::path raw = std::filesystem::path(directory) / name;
  std::error_code ignored;
  if (!std::filesystem::exists(compressed, ignored) && std::filesystem::exists(raw, ignored)) return raw.string();
  return compressed.string();
}

}  // namespace

std::string default_fashion_mnist_dir() {
  const char* from_environment = std::getenv("GRADZIP_FASHION_MNIST_DIR");
  if (from_environment != nullptr && from_environment[0] != '\0') return from_environment;
  return "/usr/share/datasets/fashion-mnist";
}

std::vector<float> read_idx_images(const std::string& path, std::size_t& count, std::size_t& rows,
                                   std::size_t& cols) {
  const std::vector<std::uint8_t> bytes = read_file(path);
  const std::vector<std::size_t> dims = parse_header(path, bytes, kImageMagic, 3, "u8 images of 3 dimensions");
  const std::uint8_t* data = bytes.data() + 16;
  std::vector<float> pixels(bytes.size() - 16);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(data[i]) / 255.0f;
  count = dims[0];
  rows = dims[1];
  cols = dims[2];
  return pixels;
}

std::vector<std::uint8_t> read_idx_labels(const std::string& path) {
  const std::vector<std::uint8_t> bytes = read_file(path);
  parse_header(path, bytes, kLabelMagic, 1, "u8 labels of 1 dimension");
  std::vector<std::uint8_t> labels(bytes.begin() + 8, bytes.end());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    GZ_REQUIRE(labels[i] <= 9, ErrorCode::malformed_message, "IDX file '", path, "': label ", i, " is ",
               static_cast<unsigned>(labels[i]), ", outside 0..9");
  }
  return labels;
}

ImageSet load_fashion_mnist(const std::string& directory, const std::string& split) {
  GZ_REQUIRE(split == "train" || split == "t10k", ErrorCode::invalid_argument, "load_fashion_mnist: split '",
             split, "', expected 'train' or 't10k'");
  const std::string images_path = split_file(directory, split + "-images-idx3-ubyte");
  const std::string labels_path = split_file(directory, split + "-labels-idx1-ubyte");
  ImageSet set;
  set.pixels = read_idx_images(images_path, set.count, set.rows, set.cols);
  set.labels = read_idx_labels(labels_path);
  GZ_REQUIRE(set.labels.size() == set.count, ErrorCode::malformed_message, "load_fashion_mnist: '",
             images_path, "' holds ", set.count, " images but '", labels_path, "' ", set.labels.size(), " labels");
  return set;
}

}  // namespace gradzip::examples
