// Reading Fashion-MNIST (and any MNIST-style data) from IDX files, gzip-compressed or raw.
// The IDX format: a big-endian u32 magic (0x00000803 for u8 images of three dimensions,
// 0x00000801 for u8 labels of one), one big-endian u32 per dimension, then the u8 data.
//
//   ImageSet train = load_fashion_mnist(default_fashion_mnist_dir(), "train");
//   // train.count == 60000, train.rows == train.cols == 28
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gradzip::examples {

struct ImageSet {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<float> pixels;          // count * rows * cols, row-major per image, value / 255.0f
  std::vector<std::uint8_t> labels;   // count, each 0..9
};

// The directory of the four files: $GRADZIP_FASHION_MNIST_DIR when set and not empty, else
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
std::string default_fashion_mnist_dir();

// Reads one IDX image file, gzip-compressed (it starts with 1f 8b; read with zlib) or raw:
// magic 0x00000803, dimensions count, rows, cols, then count * rows * cols bytes, returned as
// byte / 255.0f in file order. Throws gradzip::Error: ErrorCode::io_error (naming the path and
// the errno text) when the file cannot be opened or read; ErrorCode::malformed_message (naming
// the path and the fault) for a wrong magic, fewer data bytes than the header promises (a
// truncated file or gzip stream), bytes after the data, a zero dimension, or more than 2^31
// pixels in all.
std::vector<float> read_idx_images(const std::string& path, std::size_t& count, std::size_t& rows,
                                   std::size_t& cols);

// Reads one IDX label file (magic 0x00000801, dimension count, then count bytes), gzip or raw.
// Errors as read_idx_images, and ErrorCode::malformed_message for a label above 9.
std::vector<std::uint8_t> read_idx_labels(const std::string& path);

// Both files of one split, `split` being "train" or "t10k": <directory>/<split>-images-idx3-ubyte.gz
// and <directory>/<split>-labels-idx1-ubyte.gz (each name without ".gz" is used instead when only
// the uncompressed file exists). Throws ErrorCode::invalid_argument for another split name,
// ErrorCode::malformed_message when the two files' counts differ, and the readers' errors.
ImageSet load_fashion_mnist(const std::string& directory, const std::string& split);

}  // namespace gradzip::examples
