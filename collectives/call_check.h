// Mismatch detection: before any algorithm runs, every rank learns what every other rank is
// calling, so ranks that disagree all get a clear error instead of a hang or garbage (the
// lesson from Horovod: a rank that submits another tensor must be named, not waited for).
//
// Protocol, every collective call, on every rank:
//   1. all-gather a fixed record of 12 u64 (Transport::allgather_u64): fingerprint of the tensor
//      name, element count, dtype, reduce op, collective kind, fingerprint of the canonical spec
//      string, the name's call number (step), where the tensor lives (host or CUDA memory: the
//      paths differ, CUDA tensors may run over NCCL), this rank's argument error code
//      (0 = none), and, outside the comparison, this rank's count of non-finite input elements
//      and the index of its first one (the nonfinite= policy of compression_spec.h) and of
//      finite elements beyond what the spec's 16-bit wire type holds (the overflow fallback);
//   2. if every compared field is equal and no rank reported an argument error: return which
//      ranks reported non-finite input (the same list on every rank);
//   3. otherwise (all ranks see the same records, so all take this branch together) all-gather
//      the name, spec and error texts (sizes first), and throw on every rank:
//        - a rank whose own arguments were invalid rethrows its own error;
//        - if some rank's arguments were invalid, the others throw that rank's error code with
//          "<kind> of '<name>' on rank R: rank 2 rejected its arguments: <its message>";
//        - else ErrorCode::size_mismatch listing each field that differs and which ranks hold
//          which value, e.g. "allreduce of 'layer1.weight' on rank 0: ranks disagree on count:
//          rank 0,2,3: 4097; rank 1: 4096".
//
// With one rank there is nobody to disagree with: the check only rethrows a local error.
// Cost: one all-gather of 96 bytes per rank per call (a few microseconds on shared memory, one
// latency-bound collective across nodes), paid on every call so that a rank that skips or
// reorders calls is caught on the very call where it happens. The texts travel only when the
// check fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "collectives/transport/transport.h"
#include "gradzip/communicator.h"
#include "gradzip/dtype.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

enum class CollectiveKind : std::uint8_t { allreduce, reduce_scatter, allgather };

std::string_view collective_kind_name(CollectiveKind kind) noexcept;

// FNV-1a 64 of `text`: stable across runs, hosts and builds (it keys the mismatch check and,
// folded to 32 bits, the tensor id of the random streams).
std::uint64_t fingerprint64(std::string_view text) noexcept;

// What this rank is about to run.
struct CallDescription {
  CollectiveKind kind = CollectiveKind::allreduce;
  std::string_view name;
  std::size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;  // ReduceOp::sum for all-gather, which has none
  // The canonical spec string (or the text as given when it did not parse).
  std::string_view spec;
  std::uint32_t step = 0;  // how many calls with this name this rank has completed the check for
  // Where the tensor lives and how it will travel: 0 for host memory; for CUDA memory
  // 1 + CudaPath (automatic, nccl, staged), since ranks with different paths would not meet.
  std::uint64_t memory = 0;
  // This rank's argument error, or null: it is rethrown here, after the exchange, so that the
  // other ranks learn about it instead of waiting for this rank forever.
  const Error* local_error = nullptr;
  // Non-finite elements (NaN, +-Inf) in this rank's input (for all-gather: its own shard) and
  // the index of the first one in the tensor; not compared between ranks.
  std::uint64_t nonfinite_count = 0;
  std::uint64_t nonfinite_first = 0;
  // Finite elements of this rank's input that the spec's 16-bit wire type could not carry
  // through the reduction (collectives/nonfinite_policy.h, wire_range_limit); not compared.
  std::uint64_t beyond_wire_range = 0;
};

// A rank whose input holds non-finite elements, as its record reported it.
struct NonfiniteInput {
  int rank = 0;
  std::uint64_t count = 0;
  std::uint64_t first = 0;  // index in the tensor
};

// Runs the protocol above over `transport` (a collective: every rank must call it). Returns
// the ranks with non-finite input, in rank order (empty when none): every rank gets the same
// list. With one rank: this rank's own count. `beyond_wire_range`, when given, receives the
// sum over ranks of CallDescription::beyond_wire_range (the same on every rank).
std::vector<NonfiniteInput> check_call(Transport& transport, const CallDescription& call,
                                       std::uint64_t* beyond_wire_range = nullptr);

}  // namespace gradzip::collectives
