#include "tests/multirank/multirank_support.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <system_error>

#include "compressors/codec_descriptor.h"

namespace gradzip::testing {

std::vector<std::vector<float>> gather_all(const std::vector<float>& mine) {
  const auto ranks = static_cast<std::size_t>(world_size());
  std::vector<float> flat(mine.size() * ranks);
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, flat.data(),
                static_cast<int>(mine.size()), MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<std::vector<float>> all(ranks);
  for (std::size_t r = 0; r < ranks; ++r)
    all[r].assign(flat.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                  flat.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size()));
  return all;
}

std::size_t first_difference_from_integer_sum(std::span<const float> data, int ranks,
                                              std::uint64_t seed) {
  const std::vector<double> exact = exact_sum(
      data.size(), ranks, seed,
      [](std::size_t c, int r, std::uint64_t s) { return integer_contribution(c, r, s); });
  for (std::size_t i = 0; i < data.size(); ++i)
    if (static_cast<double>(data[i]) != exact[i]) return i;
  return data.size();
}

ScratchDirectory::ScratchDirectory(const std::string& prefix)
    : path_(std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()))) {
  std::filesystem::create_directories(path_);
}

ScratchDirectory::~ScratchDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

bool identical_on_all_ranks(std::span<const std::byte> bytes) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a 64
  for (std::byte b : bytes) hash = (hash ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  const std::uint64_t mine[2] = {bytes.size(), hash};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(world_size()));
  MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD);
  for (std::size_t r = 0; r < all.size(); r += 2)
    if (all[r] != mine[0] || all[r + 1] != mine[1]) return false;
  return true;
}

bool identical_on_all_ranks(std::span<const float> values) {
  return identical_on_all_ranks(std::as_bytes(values));
}

std::vector<float> integer_contribution(std::size_t count, int rank, std::uint64_t seed, int range) {
  std::mt19937_64 engine(seed * 1000003u + static_cast<std::uint64_t>(rank));
  std::uniform_int_distribution<int> pick(-range, range);
  std::vector<float> values(count);
  for (float& value : values) value = static_cast<float>(pick(engine));
  return values;
}

std::vector<float> gaussian_contribution(std::size_t count, int rank, std::uint64_t seed) {
  std::mt19937_64 engine(seed * 1000003u + static_cast<std::uint64_t>(rank) + 17u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(engine);
  return values;
}

double smallest_cosine_estimate(const CompressionSpec& spec, std::size_t count, int ranks,
                                std::uint64_t seed,
                                std::vector<float> (*contribution)(std::size_t, int, std::uint64_t),
                                std::size_t begin, std::size_t end) {
  const auto estimate = compressors::codec_descriptor(spec.codec).cosine_estimate;
  double smallest = 1;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> values = contribution(count, r, seed);
    smallest = std::min(
        smallest, estimate(spec, std::span<const float>(values).subspan(begin, end - begin)));
  }
  return smallest;
}

std::vector<double> exact_sum(std::size_t count, int ranks, std::uint64_t seed,
                              std::vector<float> (*contribution)(std::size_t, int, std::uint64_t)) {
  std::vector<double> sum(count, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> values = contribution(count, r, seed);
    for (std::size_t i = 0; i < count; ++i) sum[i] += values[i];
  }
  return sum;
}

}  // namespace gradzip::testing
