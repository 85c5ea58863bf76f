// The checkpoint: what a rank saves to continue a run exactly, as types, and how those types
// map onto the checkpoint file's typed sections (error_feedback/checkpoint_file.h, which alone
// knows the layout, version 3):
//   Communicator::save_residuals   tensors: its residuals in lane 0 under their keys
//                                  (job_encoder.h); call numbers: each tensor name's; model
//                                  inputs: algo=auto's.
//   Reducer::save_state            tensors: lane l's residual `key` in lane l under `key`; the
//                                  step; model inputs: algo=auto's, merged over the lanes.
// Each loader refuses the other's file (call numbers are not a Reducer's, a step or a lane
// other than 0 not a Communicator's).
//
// Files of format versions 1 and 2 (earlier builds) still load, to the checkpoints they loaded
// to before. Their tensors and named u64 counters held everything under names, which only the
// version 2 conversion in checkpoint.cpp reads:
//   Communicator                   tensors: the residuals under their keys; counters: each
//                                  name's call number under the name itself, and the model
//                                  inputs under kAutoModelPrefix.
//   Reducer                        tensors: lane l's residual `key` as "lane<l>|<key>";
//                                  counters: "step" (the Reducer's step) and the model inputs.
//   model inputs                   "gradzip.auto/link/<term>", "gradzip.auto/hier/<L>/intra/<term>",
//                                  "gradzip.auto/hier/<L>/across/<term>",
//                                  "gradzip.auto/hier/0/ranks_per_node" (the detected size of
//                                  nodes of ranks that share memory) and
//                                  "gradzip.auto/gamma/<spec>/<term>"; each a double stored as its
//                                  64 bits. Link terms: latency_s, bytes_per_s,
//                                  exchange_bytes_per_s, collective_latency_s; gamma terms:
//                                  encode_s, decode_add_s, add_s.
// Version 1 files have no counters: they restore no call numbers, model inputs or step.
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
#include "error_feedback/checkpoint_file.h"
#include "error_feedback/residual_store.h"

namespace gradzip::collectives {

// Version 2 counter names that start with this hold algo=auto's model inputs. call.cpp refuses
// tensor names that start with it: version 2 files could not tell such a call number from a
// model input (version 3 files keep them in separate sections).
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

// Writes `residuals` (lane 0) and `rest` to `path` (atomically: ResidualStore::save).
void save_communicator_checkpoint(const std::string& path,
                                  const error_feedback::ResidualStore& residuals,
                                  const CommunicatorCheckpoint& rest);
// Loads `path`'s residuals into `residuals` and returns the rest. All or nothing: the file is
// read and checked whole before `residuals` changes. Refusals: ResidualStore::load's (another
// world or rank, another tensor set in a non-empty store, a tensor in a lane other than 0), and
// io_error for a call number beyond 32 bits, a step (a Reducer's checkpoint) or, in a version 2
// file, a malformed model input counter (naming it).
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
// Reads `path` for rank `rank` of `world_size` and a Reducer of `lanes` lanes. Refusals, each
// naming `who` and the path: another world size (size_mismatch) or rank (invalid_argument); a
// tensor of a lane l >= lanes, or in a version 1 or 2 file an entry that is not
// "lane<l>|<key>" with l < lanes (invalid_argument, naming the entry); call numbers or no step
// in a version 3 file, a counter other than "step" and the model inputs in a version 2 file
// (io_error: a Communicator's checkpoint); a malformed model input counter (io_error).
ReducerCheckpoint load_reducer_checkpoint(const std::string& path, std::uint32_t world_size,
                                          std::uint32_t rank, std::size_t lanes,
                                          std::string_view who);

// algo=auto's model inputs as the file saves them, and back. to_checkpoint_model_inputs keeps
// node structures under their spec's ranks_per_node, with the node size (for 0: the detected
// size); from_checkpoint_model_inputs marks the ranks_per_node 0 structure as nodes of ranks
// that share memory. Inputs the file layer refuses (a link rate of 0, a term that is not finite
// and >= 0, a node size that breaks SavedHierarchy's contract) are refused when saved.
error_feedback::CheckpointModelInputs to_checkpoint_model_inputs(const AutoModelInputs& inputs);
AutoModelInputs from_checkpoint_model_inputs(const error_feedback::CheckpointModelInputs& saved);

}  // namespace gradzip::collectives
