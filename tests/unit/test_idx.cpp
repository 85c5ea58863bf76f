// The IDX loader of the Fashion-MNIST example: the real files (skipped with a message when
// Debian's dataset-fashion-mnist is absent) against an independent decoding, exact round trips of
// small files written here raw and gzip-compressed, and the error code and message of every
// refusal: a missing or unreadable file, a wrong magic, a truncated file or gzip stream, trailing
// bytes, zero and absurd dimensions, a label above 9, disagreeing image and label counts.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "examples/fashion_mnist/idx.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

namespace fs = std::filesystem;
using examples::ImageSet;
using examples::load_fashion_mnist;
using examples::read_idx_images;
using examples::read_idx_labels;
using testing::error_code_of;

constexpr std::uint32_t kImageMagic = 0x00000803;
constexpr std::uint32_t kLabelMagic = 0x00000801;

void append_big_endian(std::vector<std::uint8_t>& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(value >> shift));
}

std::vector<std::uint8_t> idx_file(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                   const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> bytes;
  append_big_endian(bytes, magic);
  for (std::uint32_t d : dims) append_big_endian(bytes, d);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::uint32_t big_endian_at(const std::vector<std::uint8_t>& bytes, std::size_t offset) {
  return (std::uint32_t{bytes[offset]} << 24) | (std::uint32_t{bytes[offset + 1]} << 16) |
         (std::uint32_t{bytes[offset + 2]} << 8) | std::uint32_t{bytes[offset + 3]};
}

void write_raw(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  const int written = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  const int closed = gzclose(file);
  ASSERT_EQ(written, static_cast<int>(bytes.size())) << path;
  ASSERT_EQ(closed, Z_OK) << path;
}

std::vector<std::uint8_t> read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The test's own decompression of a whole gzip file, independent of the loader's.
std::vector<std::uint8_t> gunzip_file(const fs::path& path) {
  std::vector<std::uint8_t> bytes;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return bytes;
  std::array<std::uint8_t, 1 << 16> chunk;
  int got;
  while ((got = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()))) > 0) {
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + got);
  }
  gzclose(file);
  return bytes;
}

// Three images of 2 x 4 pixels whose bytes cover 0 and 255, and their labels.
const std::vector<std::uint8_t> kSmallPixels = {0,   255, 1,   2,   127, 128, 254, 3,   10,  20,  30,  40,
                                                50,  60,  70,  80,  200, 201, 202, 203, 204, 205, 206, 9};
const std::vector<std::uint8_t> kSmallLabels = {9, 0, 4};

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "gradzip_test_idx_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // The code of the error reading `path` as images (or labels) throws; its message must name the path.
  ErrorCode images_error(const fs::path& path, std::string* message = nullptr) {
    std::string text;
    const ErrorCode code = error_code_of([&] {
      std::size_t count, rows, cols;
      read_idx_images(path.string(), count, rows, cols);
    }, &text);
    EXPECT_NE(text.find(path.string()), std::string::npos) << text;
    if (message != nullptr) *message = text;
    return code;
  }
  ErrorCode labels_error(const fs::path& path, std::string* message = nullptr) {
    std::string text;
    const ErrorCode code = error_code_of([&] { read_idx_labels(path.string()); }, &text);
    EXPECT_NE(text.find(path.string()), std::string::npos) << text;
    if (message != nullptr) *message = text;
    return code;
  }

  fs::path dir_;
};

TEST_F(IdxFiles, ReadsSmallImageFileRawAndGzipExactly) {
  const std::vector<std::uint8_t> bytes = idx_file(kImageMagic, {3, 2, 4}, kSmallPixels);
  write_raw(dir_ / "images", bytes);
  write_gzip(dir_ / "images.gz", bytes);
  ASSERT_EQ(read_whole(dir_ / "images.gz")[0], 0x1f);  // really compressed
  for (const char* name : {"images", "images.gz"}) {
    SCOPED_TRACE(name);
    std::size_t count = 0, rows = 0, cols = 0;
    const std::vector<float> pixels = read_idx_images((dir_ / name).string(), count, rows, cols);
    EXPECT_EQ(count, 3u);
    EXPECT_EQ(rows, 2u);
    EXPECT_EQ(cols, 4u);
    ASSERT_EQ(pixels.size(), kSmallPixels.size());
    for (std::size_t i = 0; i < pixels.size(); ++i) {
      EXPECT_EQ(pixels[i], static_cast<float>(kSmallPixels[i]) / 255.0f) << "pixel " << i;
    }
    EXPECT_EQ(pixels[0], 0.0f);
    EXPECT_EQ(pixels[1], 1.0f);
  }
}

TEST_F(IdxFiles, ReadsSmallLabelFileRawAndGzipExactly) {
  const std::vector<std::uint8_t> bytes = idx_file(kLabelMagic, {3}, kSmallLabels);
  write_raw(dir_ / "labels", bytes);
  write_gzip(dir_ / "labels.gz", bytes);
  EXPECT_EQ(read_idx_labels((dir_ / "labels").string()), kSmallLabels);
  EXPECT_EQ(read_idx_labels((dir_ / "labels.gz").string()), kSmallLabels);
}

TEST_F(IdxFiles, RejectsMissingAndUnreadableFilesAsIoError) {
  std::string message;
  EXPECT_EQ(images_error(dir_ / "absent.gz", &message), ErrorCode::io_error);
  EXPECT_NE(message.find(std::strerror(ENOENT)), std::string::npos) << message;
  EXPECT_EQ(labels_error(dir_ / "absent", &message), ErrorCode::io_error);
  EXPECT_NE(message.find(std::strerror(ENOENT)), std::string::npos) << message;
  // A directory opens but cannot be read.
  fs::create_directory(dir_ / "a_directory");
  EXPECT_EQ(images_error(dir_ / "a_directory", &message), ErrorCode::io_error);
  EXPECT_NE(message.find(std::strerror(EISDIR)), std::string::npos) << message;
}

TEST_F(IdxFiles, RejectsWrongMagic) {
  write_gzip(dir_ / "labels.gz", idx_file(kLabelMagic, {3}, kSmallLabels));
  write_raw(dir_ / "images", idx_file(kImageMagic, {3, 2, 4}, kSmallPixels));
  std::vector<std::uint8_t> float_images = idx_file(0x00000D03, {3, 2, 4}, kSmallPixels);  // f32 type code
  write_raw(dir_ / "float_images", float_images);
  std::string message;
  EXPECT_EQ(images_error(dir_ / "labels.gz", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("magic 0x00000801"), std::string::npos) << message;
  EXPECT_EQ(labels_error(dir_ / "images", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("magic 0x00000803"), std::string::npos) << message;
  EXPECT_EQ(images_error(dir_ / "float_images", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("magic 0x00000d03"), std::string::npos) << message;
}

TEST_F(IdxFiles, RejectsTruncatedFilesRawAndGzip) {
  std::vector<std::uint8_t> images = idx_file(kImageMagic, {3, 2, 4}, kSmallPixels);
  images.pop_back();  // one data byte short
  write_raw(dir_ / "images", images);
  write_gzip(dir_ / "images.gz", images);
  std::vector<std::uint8_t> labels = idx_file(kLabelMagic, {3}, kSmallLabels);
  labels.pop_back();
  write_raw(dir_ / "labels", labels);
  write_gzip(dir_ / "labels.gz", labels);
  write_raw(dir_ / "header_only", std::vector<std::uint8_t>(images.begin(), images.begin() + 10));
  write_raw(dir_ / "empty", {});
  for (const char* name : {"images", "images.gz", "header_only", "empty"}) {
    std::string message;
    EXPECT_EQ(images_error(dir_ / name, &message), ErrorCode::malformed_message) << name;
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  }
  for (const char* name : {"labels", "labels.gz"}) {
    std::string message;
    EXPECT_EQ(labels_error(dir_ / name, &message), ErrorCode::malformed_message) << name;
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  }
}

TEST_F(IdxFiles, RejectsCutGzipStream) {
  // A complete file whose compressed stream is cut short: enough data to decode part of it.
  std::vector<std::uint8_t> data(5 * 28 * 28);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>((i * 7919) >> 3);
  write_gzip(dir_ / "whole.gz", idx_file(kImageMagic, {5, 28, 28}, data));
  const std::vector<std::uint8_t> compressed = read_whole(dir_ / "whole.gz");
  ASSERT_GT(compressed.size(), 40u);
  write_raw(dir_ / "cut.gz", std::vector<std::uint8_t>(compressed.begin(), compressed.end() - 20));
  std::size_t count, rows, cols;
  EXPECT_EQ(read_idx_images((dir_ / "whole.gz").string(), count, rows, cols).size(), data.size());
  std::string message;
  EXPECT_EQ(images_error(dir_ / "cut.gz", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  // Garbage after the gzip magic: corrupt, not an I/O failure.
  write_raw(dir_ / "corrupt.gz", {0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x03, 0x99, 0x98, 0x97});
  EXPECT_EQ(images_error(dir_ / "corrupt.gz"), ErrorCode::malformed_message);
}

TEST_F(IdxFiles, RejectsTrailingBytesZeroAndAbsurdDimensions) {
  std::vector<std::uint8_t> trailing = idx_file(kImageMagic, {3, 2, 4}, kSmallPixels);
  trailing.push_back(0);
  write_gzip(dir_ / "trailing.gz", trailing);
  write_raw(dir_ / "zero_rows", idx_file(kImageMagic, {3, 0, 4}, {}));
  write_raw(dir_ / "zero_labels", idx_file(kLabelMagic, {0}, {}));
  // 65536 * 65536 * 1 = 2^32 pixels: refused from the header, before the missing data.
  write_raw(dir_ / "absurd", idx_file(kImageMagic, {65536, 65536, 1}, kSmallPixels));
  // 2^31 pixels exactly passes the size check and is then truncated.
  write_raw(dir_ / "largest", idx_file(kImageMagic, {32768, 256, 256}, kSmallPixels));
  std::string message;
  EXPECT_EQ(images_error(dir_ / "trailing.gz", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("1 trailing bytes"), std::string::npos) << message;
  EXPECT_EQ(images_error(dir_ / "zero_rows", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("dimension 1 is 0"), std::string::npos) << message;
  EXPECT_EQ(labels_error(dir_ / "zero_labels", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("dimension 0 is 0"), std::string::npos) << message;
  EXPECT_EQ(images_error(dir_ / "absurd", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("2^31"), std::string::npos) << message;
  EXPECT_EQ(images_error(dir_ / "largest", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(IdxFiles, RejectsLabelAboveNine) {
  write_gzip(dir_ / "labels.gz", idx_file(kLabelMagic, {4}, {0, 9, 10, 1}));
  std::string message;
  EXPECT_EQ(labels_error(dir_ / "labels.gz", &message), ErrorCode::malformed_message);
  EXPECT_NE(message.find("label 2 is 10"), std::string::npos) << message;
}

TEST_F(IdxFiles, LoadsSplitAndChecksCounts) {
  write_gzip(dir_ / "train-images-idx3-ubyte.gz", idx_file(kImageMagic, {3, 2, 4}, kSmallPixels));
  write_gzip(dir_ / "train-labels-idx1-ubyte.gz", idx_file(kLabelMagic, {3}, kSmallLabels));
  // t10k uncompressed only, and with one label too many.
  write_raw(dir_ / "t10k-images-idx3-ubyte", idx_file(kImageMagic, {3, 2, 4}, kSmallPixels));
  write_raw(dir_ / "t10k-labels-idx1-ubyte", idx_file(kLabelMagic, {4}, {1, 2, 3, 4}));

  const ImageSet train = load_fashion_mnist(dir_.string(), "train");
  EXPECT_EQ(train.count, 3u);
  EXPECT_EQ(train.rows, 2u);
  EXPECT_EQ(train.cols, 4u);
  ASSERT_EQ(train.pixels.size(), kSmallPixels.size());
  EXPECT_EQ(train.pixels[1], 1.0f);
  EXPECT_EQ(train.pixels[23], 9.0f / 255.0f);
  EXPECT_EQ(train.labels, kSmallLabels);

  std::string message;
  EXPECT_EQ(error_code_of([&] { load_fashion_mnist(dir_.string(), "t10k"); }, &message),
            ErrorCode::malformed_message);
  EXPECT_NE(message.find("3 images"), std::string::npos) << message;
  EXPECT_NE(message.find("4 labels"), std::string::npos) << message;
  EXPECT_NE(message.find("t10k-labels-idx1-ubyte'"), std::string::npos) << message;  // the raw file

  EXPECT_EQ(error_code_of([&] { load_fashion_mnist(dir_.string(), "test"); }), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_of([&] { load_fashion_mnist((dir_ / "nowhere").string(), "train"); }, &message),
            ErrorCode::io_error);
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz"), std::string::npos) << message;
}

TEST(IdxDefaultDirectory, EnvironmentOverridesTheDebianPath) {
  const char* previous = std::getenv("GRADZIP_FASHION_MNIST_DIR");
  const std::optional<std::string> saved = previous ? std::optional<std::string>(previous) : std::nullopt;
  unsetenv("GRADZIP_FASHION_MNIST_DIR");
  EXPECT_EQ(examples::default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  setenv("GRADZIP_FASHION_MNIST_DIR", "", 1);
  EXPECT_EQ(examples::default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
  setenv("GRADZIP_FASHION_MNIST_DIR", "/data/fmnist", 1);
  EXPECT_EQ(examples::default_fashion_mnist_dir(), "/data/fmnist");
  if (saved) {
    setenv("GRADZIP_FASHION_MNIST_DIR", saved->c_str(), 1);
  } else {
    unsetenv("GRADZIP_FASHION_MNIST_DIR");
  }
}

// The real data set: headers checked by the test's own decoding, every pixel and label equal to
// it, and the class balance Fashion-MNIST is built with (6000 / 1000 images of each class).
TEST(IdxRealFiles, FashionMnistTrainAndTestSplits) {
  const fs::path dir = examples::default_fashion_mnist_dir();
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not found in " << dir
                 << " (install Debian's dataset-fashion-mnist or set GRADZIP_FASHION_MNIST_DIR)";
  }
  struct Split {
    const char* name;
    std::uint32_t count;
  };
  for (const Split split : {Split{"train", 60000}, Split{"t10k", 10000}}) {
    SCOPED_TRACE(split.name);
    const std::vector<std::uint8_t> images = gunzip_file(dir / (std::string(split.name) + "-images-idx3-ubyte.gz"));
    const std::vector<std::uint8_t> labels = gunzip_file(dir / (std::string(split.name) + "-labels-idx1-ubyte.gz"));
    ASSERT_EQ(images.size(), 16u + std::size_t{split.count} * 28 * 28);
    ASSERT_EQ(labels.size(), 8u + split.count);
    EXPECT_EQ(big_endian_at(images, 0), kImageMagic);
    EXPECT_EQ(big_endian_at(images, 4), split.count);
    EXPECT_EQ(big_endian_at(images, 8), 28u);
    EXPECT_EQ(big_endian_at(images, 12), 28u);
    EXPECT_EQ(big_endian_at(labels, 0), kLabelMagic);
    EXPECT_EQ(big_endian_at(labels, 4), split.count);

    const ImageSet set = load_fashion_mnist(dir.string(), split.name);
    EXPECT_EQ(set.count, split.count);
    EXPECT_EQ(set.rows, 28u);
    EXPECT_EQ(set.cols, 28u);
    ASSERT_EQ(set.pixels.size(), std::size_t{split.count} * 28 * 28);
    ASSERT_EQ(set.labels.size(), split.count);
    std::size_t pixel_mismatches = 0;
    for (std::size_t i = 0; i < set.pixels.size(); ++i) {
      pixel_mismatches += set.pixels[i] != static_cast<float>(images[16 + i]) / 255.0f;
    }
    EXPECT_EQ(pixel_mismatches, 0u);
    std::array<std::size_t, 10> per_class{};
    for (std::size_t i = 0; i < set.labels.size(); ++i) {
      ASSERT_LE(set.labels[i], 9u) << "label " << i;
      EXPECT_EQ(set.labels[i], labels[8 + i]) << "label " << i;
      ++per_class[set.labels[i]];
    }
    for (std::size_t c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], split.count / 10) << "class " << c;
  }
}

}  // namespace
}  // namespace gradzip
