#include "collectives/call_check.h"

#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <vector>

#include "kernels/fnv1a.h"

namespace gradzip::collectives {
namespace {

// The record's fields, in the order they travel.
enum Field : std::size_t {
  kName,
  kCount,
  kDType,
  kOp,
  kKind,
  kSpec,
  kStep,
  kMemory,  // CallDescription::memory: host, or CUDA and its path
  kError,   // 0: arguments valid; else ErrorCode + 1
  kNonfiniteCount,  // from here on: reported, not compared
  kNonfiniteFirst,
  kBeyondWireRange,
  kFieldCount,
};
constexpr std::size_t kComparedFields = kNonfiniteCount;
using Record = std::array<std::uint64_t, kFieldCount>;

// The texts behind the fingerprints and the error code, gathered only when the check fails.
struct RankTexts {
  std::string name;
  std::string spec;
  std::string error;
};

std::vector<RankTexts> gather_texts(Transport& transport, const CallDescription& call) {
  const std::string error = call.local_error != nullptr ? call.local_error->what() : "";
  const std::size_t ranks = static_cast<std::size_t>(transport.size());
  const std::array<std::uint64_t, 3> my_sizes = {call.name.size(), call.spec.size(), error.size()};
  std::vector<std::uint64_t> sizes(3 * ranks);
  transport.allgather_u64(my_sizes, sizes);

  std::vector<std::size_t> counts(ranks);
  std::size_t total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    counts[r] = static_cast<std::size_t>(sizes[3 * r] + sizes[3 * r + 1] + sizes[3 * r + 2]);
    total += counts[r];
  }
  std::string mine;
  mine.append(call.name).append(call.spec).append(error);
  std::vector<std::byte> all(total);
  transport.allgatherv(std::as_bytes(std::span(mine)), all, counts);

  std::vector<RankTexts> texts(ranks);
  const char* at = reinterpret_cast<const char*>(all.data());
  for (std::size_t r = 0; r < ranks; ++r) {
    texts[r].name.assign(at, sizes[3 * r]);
    at += sizes[3 * r];
    texts[r].spec.assign(at, sizes[3 * r + 1]);
    at += sizes[3 * r + 1];
    texts[r].error.assign(at, sizes[3 * r + 2]);
    at += sizes[3 * r + 2];
  }
  return texts;
}

std::string_view field_name(Field field) {
  switch (field) {
    case kName: return "name";
    case kCount: return "count";
    case kDType: return "dtype";
    case kOp: return "reduce op";
    case kKind: return "collective";
    case kSpec: return "spec";
    case kStep: return "call number (step) of this name";
    case kMemory: return "memory";
    default: return "?";
  }
}

std::string value_text(Field field, std::uint64_t value, const RankTexts& texts) {
  switch (field) {
    case kName: return "'" + texts.name + "'";
    case kDType:
      return value <= static_cast<std::uint64_t>(DType::bf16)
                 ? std::string(dtype_name(static_cast<DType>(value)))
                 : detail::concat("dtype ", value);
    case kOp: return value == static_cast<std::uint64_t>(ReduceOp::average) ? "average" : "sum";
    case kKind:
      return value <= static_cast<std::uint64_t>(CollectiveKind::allgather)
                 ? std::string(collective_kind_name(static_cast<CollectiveKind>(value)))
                 : detail::concat("kind ", value);
    case kSpec: return "'" + texts.spec + "'";
    case kMemory:
      switch (value) {
        case 0: return "host memory";
        case 1 + static_cast<std::uint64_t>(CudaPath::automatic): return "CUDA (cuda_path automatic)";
        case 1 + static_cast<std::uint64_t>(CudaPath::nccl): return "CUDA (cuda_path nccl)";
        case 1 + static_cast<std::uint64_t>(CudaPath::staged): return "CUDA (cuda_path staged)";
        default: return detail::concat("memory ", value);
      }
    default: return std::to_string(value);
  }
}

// "rank 0,2,3: 4097; rank 1: 4096": the ranks grouped by the value they hold, groups in the
// order of their lowest rank.
std::string describe_disagreement(Field field, const std::vector<Record>& records,
                                  const std::vector<RankTexts>& texts) {
  std::vector<std::string> values(records.size());
  for (std::size_t r = 0; r < records.size(); ++r) values[r] = value_text(field, records[r][field], texts[r]);
  std::vector<bool> listed(records.size(), false);
  std::string out;
  for (std::size_t first = 0; first < records.size(); ++first) {
    if (listed[first]) continue;
    if (!out.empty()) out += "; ";
    out += "rank ";
    bool first_in_group = true;
    for (std::size_t r = first; r < records.size(); ++r) {
      if (records[r][field] != records[first][field] || values[r] != values[first]) continue;
      listed[r] = true;
      if (!first_in_group) out += ",";
      out += std::to_string(r);
      first_in_group = false;
    }
    out += ": " + values[first];
  }
  return out;
}

}  // namespace

std::string_view collective_kind_name(CollectiveKind kind) noexcept {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather: return "allgather";
  }
  return "unknown collective";
}

std::uint64_t fingerprint64(std::string_view text) noexcept { return fnv1a64(text); }

std::vector<NonfiniteInput> check_call(Transport& transport, const CallDescription& call,
                                       std::uint64_t* beyond_wire_range) {
  if (transport.size() == 1) {  // nobody to disagree with or to tell
    if (call.local_error != nullptr) throw *call.local_error;
    if (beyond_wire_range != nullptr) *beyond_wire_range = call.beyond_wire_range;
    if (call.nonfinite_count == 0) return {};
    return {NonfiniteInput{0, call.nonfinite_count, call.nonfinite_first}};
  }
  const Record mine = {
      fingerprint64(call.name),
      call.count,
      static_cast<std::uint64_t>(call.dtype),
      static_cast<std::uint64_t>(call.op),
      static_cast<std::uint64_t>(call.kind),
      fingerprint64(call.spec),
      call.step,
      call.memory,
      call.local_error != nullptr ? static_cast<std::uint64_t>(call.local_error->code()) + 1 : 0,
      call.nonfinite_count,
      call.nonfinite_first,
      call.beyond_wire_range,
  };
  const std::size_t ranks = static_cast<std::size_t>(transport.size());
  std::vector<std::uint64_t> gathered(kFieldCount * ranks);
  transport.allgather_u64(mine, gathered);

  std::vector<Record> records(ranks);
  bool all_agree = true;
  bool any_error = false;
  for (std::size_t r = 0; r < ranks; ++r) {
    for (std::size_t f = 0; f < kFieldCount; ++f) records[r][f] = gathered[r * kFieldCount + f];
    all_agree = all_agree && std::equal(records[r].begin(), records[r].begin() + kComparedFields,
                                        mine.begin());
    any_error = any_error || records[r][kError] != 0;
  }
  if (all_agree && !any_error) {
    if (beyond_wire_range != nullptr) {
      *beyond_wire_range = 0;
      for (std::size_t r = 0; r < ranks; ++r) *beyond_wire_range += records[r][kBeyondWireRange];
    }
    std::vector<NonfiniteInput> nonfinite;
    for (std::size_t r = 0; r < ranks; ++r) {
      if (records[r][kNonfiniteCount] == 0) continue;
      nonfinite.push_back(NonfiniteInput{static_cast<int>(r), records[r][kNonfiniteCount],
                                         records[r][kNonfiniteFirst]});
    }
    return nonfinite;
  }

  // Every rank reaches this point together: the decision above used the same records.
  const std::vector<RankTexts> texts = gather_texts(transport, call);
  if (call.local_error != nullptr) throw *call.local_error;

  const std::string where = detail::concat(collective_kind_name(call.kind), " of '", call.name,
                                           "' on rank ", transport.rank());
  if (any_error) {
    std::string rejected;
    ErrorCode code = ErrorCode::invalid_argument;
    for (std::size_t r = 0; r < ranks; ++r) {
      if (records[r][kError] == 0) continue;
      if (rejected.empty()) code = static_cast<ErrorCode>(records[r][kError] - 1);
      rejected += detail::concat(rejected.empty() ? "" : "; ", "rank ", r,
                                 " rejected its arguments: ", texts[r].error);
    }
    GZ_THROW(code, where, ": ", rejected);
  }

  const auto differs = [&](Field field) {
    for (std::size_t r = 1; r < ranks; ++r)
      if (records[r][field] != records[0][field]) return true;
    return false;
  };
  std::string disagreements;
  for (Field field : {kName, kKind, kCount, kDType, kOp, kSpec, kStep, kMemory}) {
    // The step counts calls per name: across different names it compares nothing.
    if (!differs(field) || (field == kStep && differs(kName))) continue;
    disagreements += detail::concat(disagreements.empty() ? "ranks disagree on " : "; and on ",
                                    field_name(field), ": ",
                                    describe_disagreement(field, records, texts));
  }
  GZ_THROW(ErrorCode::size_mismatch, where, ": ", disagreements,
           " (every rank must make the same collective calls in the same order with the same "
           "name, count, dtype, op and spec)");
}

}  // namespace gradzip::collectives
