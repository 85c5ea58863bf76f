// The all-reduce paths (collectives/algorithm_table.h).
#include "collectives/algorithm_table.h"

#include <array>

#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

using A = AlgorithmId;

// In AlgorithmId's order (checked below). A row that an algo= value selects takes that value's
// name (gradzip/algorithm_list.h).
constexpr std::array<AlgorithmRow, 7> kRows{{
    {A::ring, algorithm_name(Algorithm::ring), Algorithm::ring, &ring_allreduce, &estimate_ring, {},
     &ring_reduce_scatter},
    {A::sra, algorithm_name(Algorithm::sra), Algorithm::sra, &sra_allreduce, &estimate_sra, {},
     &sra_reduce_scatter},
    {A::sparse, algorithm_name(Algorithm::sparse), Algorithm::sparse, &sparse_allreduce,
     &estimate_sparse, {}},
    {A::randk, "randk", std::nullopt, &randk_allreduce, &estimate_randk, {}},
    // Halving/doubling parses the concatenated messages it forwards by their headers, and the
    // tree is meant for small tensors: both run on host memory.
    {A::rhd, algorithm_name(Algorithm::rhd), Algorithm::rhd, &halving_doubling_allreduce,
     &estimate_rhd, "the rhd all-reduce runs on host memory"},
    {A::tree, algorithm_name(Algorithm::tree), Algorithm::tree, &tree_allreduce, &estimate_tree,
     "the tree all-reduce runs on host memory"},
    {A::hier, algorithm_name(Algorithm::hier), Algorithm::hier, nullptr, &estimate_hier,
     "the hierarchical all-reduce runs on host memory"},
}};

// Row i describes AlgorithmId i, so an id indexes its row, and no two rows share a name.
constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < kRows.size(); ++i) {
    if (static_cast<std::size_t>(kRows[i].path) != i) return false;
    for (std::size_t j = 0; j < i; ++j)
      if (kRows[j].name == kRows[i].name) return false;
  }
  return true;
}
static_assert(rows_in_order(), "kRows: row i must describe AlgorithmId i, with a name of its own");

}  // namespace

const AlgorithmRow& algorithm_row(AlgorithmId path) noexcept {
  const auto index = static_cast<std::size_t>(path);
  return kRows[index < kRows.size() ? index : 0];
}

std::span<const AlgorithmRow> algorithm_rows() noexcept { return kRows; }

const AlgorithmRow* find_algorithm_row(std::string_view name) noexcept {
  if (name == kSparseDenseSwitchName) return &algorithm_row(AlgorithmId::sparse);
  for (const AlgorithmRow& row : kRows)
    if (row.name == name) return &row;
  return nullptr;
}

const char* algorithm_id_name(AlgorithmId algorithm) noexcept {
  return algorithm_row(algorithm).name.data();  // the table's names are string literals
}

const AlgorithmRow& algorithm_row(Algorithm spec_value) {
  for (const AlgorithmRow& row : kRows) {
    if (row.spec_value == spec_value) return row;
  }
  GZ_THROW(ErrorCode::internal, "algorithm_row: algo=", algorithm_name(spec_value),
           " names no single path (auto is chosen per call)");
}

}  // namespace gradzip::collectives
