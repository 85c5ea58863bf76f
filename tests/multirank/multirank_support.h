// Helpers of the multi-rank tests (run under mpirun; MPI is initialised by mpi_test_main.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace gradzip::testing {

int world_rank();
int world_size();

// True when `bytes` is byte-identical on every rank of MPI_COMM_WORLD (sizes and a 64-bit hash
// are all-gathered and compared). Collective: every rank must call it.
bool identical_on_all_ranks(std::span<const std::byte> bytes);
bool identical_on_all_ranks(std::span<const float> values);

// Rank r's contribution: small integers in [-range, range] stored as floats, so any sum over up
// to 2^24 / range ranks is exact in f32 and equals the f64 sum. Deterministic in (seed, rank).
std::vector<float> integer_contribution(std::size_t count, int rank, std::uint64_t seed,
                                        int range = 1000);
// Rank r's contribution drawn from N(0, 1), deterministic in (seed, rank).
std::vector<float> gaussian_contribution(std::size_t count, int rank, std::uint64_t seed);

// The exact (f64) element-wise sum over ranks 0 .. ranks-1 of `contribution(count, r, seed)`,
// computed locally on every rank.
std::vector<double> exact_sum(std::size_t count, int ranks, std::uint64_t seed,
                              std::vector<float> (*contribution)(std::size_t, int, std::uint64_t));

}  // namespace gradzip::testing
