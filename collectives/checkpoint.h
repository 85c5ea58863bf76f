// The checkpoint: what a rank saves to continue a run exactly, as types, and how those types
// are laid into the checkpoint file. This is the only place that knows the layout; the file
// itself (header, records, counters, checksum, atomic replace) is error_feedback/residual_store.h's
// version-2 format, which stores f32 tensors by name and named u64 counters.
//
// What goes where in the file:
//   Communicator::save_residuals   tensors: the residuals under their keys (job_encoder.h);
//                                  counters: each name's call number under the name itself,
//                                  and algo=auto's model inputs under kAutoModelPrefix.
//   Reducer::save_state            tensors: lane l's residual `key` as "lane<l>|<key>";
//                                  counters: "step" (the Reducer's step) and the model inputs.
//   model inputs                   "gradzip.auto/link/<term>", "gradzip.auto/hier/<L>/intra/<term>",
//                                  "gradzip.auto/hier/<L>/across/<term>",
//                                  "gradzip.auto/hier/0/ranks_per_node" (the detected size of
//                                  nodes of ranks that share memory) and
//                                  "gradzip.auto/gamma/<spec>/<term>"; each a double stored as its
//                                  64 bits. Link terms: latency_s, bytes_per_s,
//                                  exchange_bytes_per_s, collective_latency_s; gamma terms:
//                                  encode_s, decode_add_s, add_s.
// Files of format versions 1 (no counters) and 2 load; version 1 restores no call numbers,
// model inputs or step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/cost_model.h"
#include "error_feedback/residual_store.h"

namespace gradzip::collectives {

// Counter names that start with this hold algo=auto's model inputs; tensor names may not.
inline constexpr std::string_view kAutoModelPrefix = "gradzip.auto/";

// algo=auto's model inputs that were measured (or given) and that a restarted run takes instead
// of measuring again, so that it makes the same choices.
struct AutoModelInputs {
  std::optional<LinkModel> link;
  // By the spec's ranks_per_node (0: the ranks that share memory, with the detected size in
  // nodes.ranks_per_node). Only node structures that were formed.
  std::map<std::uint32_t, AutoHierarchy> hierarchies;
  // By the spec's canonical text.
  std::map<std::string, CodecCost, std::less<>> codec_costs;

  // Adds `other`'s inputs; where both have one, `other`'s wins.
  void merge(const AutoModelInputs& other);
};

// A Communicator's checkpoint beside its residuals.
struct CommunicatorCheckpoint {
  std::map<std::string, std::uint32_t, std::less<>> call_numbers;  // by tensor name
  AutoModelInputs auto_model;
};

// Writes `residuals` and `rest` to `path` (atomically: ResidualStore::save).
void save_communicator_checkpoint(const std::string& path,
                                  const error_feedback::ResidualStore& residuals,
                                  const CommunicatorCheckpoint& rest);
// Loads `path`'s residuals into `residuals` (ResidualStore::load: refusals and all-or-nothing)
// and returns the rest. A call number beyond 32 bits or a malformed model input is io_error,
// and then `residuals` is unchanged too.
CommunicatorCheckpoint load_communicator_checkpoint(const std::string& path,
                                                    error_feedback::ResidualStore& residuals);

// A Reducer's checkpoint: each lane's residuals, the model inputs and the step.
struct ReducerCheckpoint {
  std::vector<std::map<std::string, std::vector<float>, std::less<>>> lane_residuals;
  AutoModelInputs auto_model;
  std::optional<std::uint64_t> step;  // none in a version 1 file
};

// Writes the lanes' residuals (lane l is lanes[l]), `auto_model` and `step` to `path` for
// rank `rank` of `world_size`.
void save_reducer_checkpoint(const std::string& path, std::uint32_t world_size, std::uint32_t rank,
                             std::span<const error_feedback::ResidualStore* const> lanes,
                             const AutoModelInputs& auto_model, std::uint64_t step);
// Reads `path` for rank `rank` of `world_size` and a Reducer of `lanes` lanes. Refuses with
// invalid_argument (naming `who` and the entry) a tensor entry that is not "lane<l>|<key>"
// with l < lanes, and with io_error a counter other than "step" and the model inputs.
ReducerCheckpoint load_reducer_checkpoint(const std::string& path, std::uint32_t world_size,
                                          std::uint32_t rank, std::size_t lanes,
                                          std::string_view who);

// The counter encoding of the model inputs (kAutoModelPrefix names), for the two checkpoints
// above and for tests. get_auto_model ignores counters without the prefix and refuses, with
// io_error naming `path` and the counter, a prefixed counter it cannot read: an unknown name,
// a value that is not finite and >= 0, an incomplete link, a node structure without both links
// (or, for L = 0, without its detected size, a whole number >= 2).
void put_auto_model(const AutoModelInputs& inputs, error_feedback::ResidualStore::Counters& counters);
AutoModelInputs get_auto_model(const error_feedback::ResidualStore::Counters& counters,
                               std::string_view path);

}  // namespace gradzip::collectives
