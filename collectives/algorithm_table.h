// The all-reduce paths the library runs, one row each (algorithm_table.cpp): the flat
// algorithms, random-k's shared-index path and the hierarchical composition, keyed by
// AlgorithmId (collectives/algorithm_id.h). A row says the path's name (what
// CollectiveStats::algorithm reports and the model prints; for a row with an algo= value, taken
// from gradzip/algorithm_list.h through algorithm_name), the algo= value that selects it, the function that runs it on a ReduceJob, its cost estimate, whether
// it can run on device memory and whether the sharded collectives run it. Its message tags are
// in collectives/message_tags.h. Adding an algorithm adds its file, its estimate
// (collectives/cost_model.cpp), its line in gradzip/algorithm_list.h (when algo= selects it),
// its AlgorithmId and a row here.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "collectives/cost_model.h"
#include "gradzip/compression_spec.h"

namespace gradzip::collectives {

struct ReduceJob;

struct AlgorithmRow {
  AlgorithmId path = AlgorithmId::ring;
  std::string_view name;
  // The algo= value that selects it; none for random-k's shared-index path, which algo=auto
  // runs for random-k (collectives/codec_table.h).
  std::optional<Algorithm> spec_value;
  // Runs it on the job (the caller records `name` in the stats); null for hier, which needs its
  // node and cross-node transports (hierarchical_allreduce).
  void (*run_flat)(ReduceJob& job) = nullptr;
  // The cost model's estimate of one call on two or more ranks (collectives/cost_model.h).
  CostEstimate (*estimate)(const EstimateInputs& in) = nullptr;
  // Why a CUDA tensor's call on this path is staged through host memory, or empty when the
  // path runs on device memory (over NCCL or a CUDA-aware MPI).
  std::string_view host_only_reason;
  // Runs its reduce-scatter on the job (each rank's shard reduced in place; FSDP's sharded
  // gradients), or null: reduce_scatter runs the ring instead, with a note
  // (choose_reduce_scatter).
  void (*run_reduce_scatter)(ReduceJob& job) = nullptr;
};

const AlgorithmRow& algorithm_row(AlgorithmId path) noexcept;
// Every row, in AlgorithmId's order.
std::span<const AlgorithmRow> algorithm_rows() noexcept;

// What CollectiveStats::algorithm reports for a call that went through the transport's own
// uncompressed sum instead of a path of the table (warm-up, algo=auto under min_bytes, the
// non-finite fallback): "mpi" over every transport, as logs and benchmark files have it.
inline constexpr std::string_view kTransportSumName = "mpi";

// What CollectiveStats::algorithm reports when the sparse all-reduce found the gathered
// messages denser than the tensor and ran the uncompressed ring instead (its row's path).
inline constexpr std::string_view kSparseDenseSwitchName = "sparse->ring";

// The row whose name CollectiveStats::algorithm reports (kSparseDenseSwitchName: the sparse
// all-reduce's row), or null for anything else (kTransportSumName, "hier/<inner>").
const AlgorithmRow* find_algorithm_row(std::string_view name) noexcept;

// The row of an algo= value (not auto_select: gradzip::Error internal).
const AlgorithmRow& algorithm_row(Algorithm spec_value);

}  // namespace gradzip::collectives
