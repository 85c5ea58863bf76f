// The checkpoint file of one rank: its error-feedback residuals and what their owner needs
// beside them to continue a run exactly (call numbers, a step, algo=auto's model inputs), as
// typed sections in one self-checking file. This file is the only place that knows the layout;
// collectives/checkpoint.h maps the Communicator's and the Reducer's checkpoints onto these types.
//
// Format (version 3). Integers, f32 and f64 values are little-endian; names are byte strings
// compared byte-wise:
//
//   offset  size  field
//   0       4     magic "GZEF"
//   4       4     u32 format version (kCheckpointFormatVersion)
//   8       4     u32 world size
//   12      4     u32 rank
//   16      8     u64 number of tensors N
//   24      ...   N records, sorted by (lane, name), strictly increasing:
//                   u32 lane, u32 name length L (>= 1), L name bytes, u64 element count C,
//                   C f32 values
//   ...     8     u64 number of call numbers M
//   ...     ...   M records, sorted by name, strictly increasing:
//                   u32 name length L (>= 1), L name bytes, u64 call number
//   ...     1     u8 step present (0 or 1)
//   ...     8     u64 step (0 when absent)
//   ...     1     u8 link present (0 or 1)
//   ...     32    link: f64 latency_s, bytes_per_s, exchange_bytes_per_s, collective_latency_s
//                 (all 0 when absent)
//   ...     4     u32 number of node structures H
//   ...     ...   H records, sorted by ranks_per_node, strictly increasing:
//                   u32 ranks_per_node, u32 node size, 4 f64 intra link, 4 f64 across link
//                   (each link's terms in the order above)
//   ...     4     u32 number of codec costs K
//   ...     ...   K records, sorted by spec text, strictly increasing:
//                   u32 spec length L (>= 1), L spec bytes, f64 encode_s, decode_add_s, add_s
//   end-8   8     u64 checksum: FNV-1a 64 (kernels/fnv1a.h) over every byte before it
//
// Every f64 is finite and >= 0, and every present link's bytes_per_s (the flat link's and both
// of each node structure's) > 0; node sizes follow SavedHierarchy's contract.
// read_checkpoint_file() refuses a file that breaks any of these.
//
// Versions 1 and 2 (written by earlier builds) are read too. Version 2 is, after the header,
// N records sorted by name (u32 name length, name, u64 element count, f32 values: version 3's
// tensor record without the lane), then u64 M and M named u64 "counters" sorted by name (u32
// name length, name, u64 value), then the checksum; version 1 has no counters section. Those
// counters held the call numbers, the step and the model inputs under names only the owner
// can interpret, so this file returns them as they are (CheckpointContents::version2_counters)
// and collectives/checkpoint.cpp converts them.
//
// write_checkpoint_file() writes the whole file to a temporary file in the target's directory,
// fsyncs it and renames it over the target, so a crash leaves either the old checkpoint or the
// new one, never a half-written file.
#pragma once

#include <compare>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gradzip::error_feedback {

// The version write_checkpoint_file() writes; read_checkpoint_file() reads it, 1 and 2.
inline constexpr std::uint32_t kCheckpointFormatVersion = 3;

// A tensor's place in the file: its owner's lane (the Communicator writes lane 0, a Reducer
// lane l for its lane l's residuals) and its name (non-empty). Ordered by lane, then name.
struct CheckpointTensorKey {
  std::uint32_t lane = 0;
  std::string name;
  friend auto operator<=>(const CheckpointTensorKey&, const CheckpointTensorKey&) = default;
  friend bool operator==(const CheckpointTensorKey&, const CheckpointTensorKey&) = default;
};
// Residuals by (lane, name).
using CheckpointTensors = std::map<CheckpointTensorKey, std::vector<float>>;

// One tensor to write: views of its name and values.
struct CheckpointTensorView {
  std::uint32_t lane = 0;
  std::string_view name;
  std::span<const float> values;
};

// A link of algo=auto's cost model as saved (collectives::LinkModel's terms). Every term is
// finite and >= 0, and bytes_per_s > 0.
struct SavedLink {
  double latency_s = 0;             // α: one message's start-up, seconds
  double bytes_per_s = 0;           // 1/β: the rate of a ring step, > 0
  double exchange_bytes_per_s = 0;  // the rate of a pairwise exchange; 0: as bytes_per_s
  double collective_latency_s = 0;  // the start-up of one small collective; 0: not known
  friend bool operator==(const SavedLink&, const SavedLink&) = default;
};

// A node structure of algo=auto's model, saved under the spec's ranks_per_node (0, or 2 to
// 2^31 - 1).
struct SavedHierarchy {
  // Ranks per node: for ranks_per_node 0 (the ranks that share memory) the detected size, a
  // whole number from 2 to 2^31 - 1; otherwise equal to ranks_per_node.
  std::uint32_t node_size = 0;
  SavedLink intra;   // the link inside a node
  SavedLink across;  // the link of each group across the nodes
  friend bool operator==(const SavedHierarchy&, const SavedHierarchy&) = default;
};

// γ of one codec (collectives::CodecCost), seconds per f32 element; each finite and >= 0.
struct SavedCodecCost {
  double encode_s = 0;      // encode (with error feedback when the spec has it)
  double decode_add_s = 0;  // decode_add, per element of the message
  double add_s = 0;         // one f32 add of a vector
  friend bool operator==(const SavedCodecCost&, const SavedCodecCost&) = default;
};

// algo=auto's model inputs as saved; empty when none were measured or given.
struct CheckpointModelInputs {
  std::optional<SavedLink> link;
  std::map<std::uint32_t, SavedHierarchy> hierarchies;  // by the spec's ranks_per_node
  std::map<std::string, SavedCodecCost, std::less<>> codec_costs;  // by spec text (non-empty)
  friend bool operator==(const CheckpointModelInputs&, const CheckpointModelInputs&) = default;
};

// How `inputs` breaks the contracts above, as "<field> = <value> (<rule>)", or an empty string
// when it keeps them: what a save refuses (invalid_argument) and a load calls corrupt.
std::string model_inputs_fault(const CheckpointModelInputs& inputs);

// Named u64 values: the Communicator's call numbers (by tensor name), and version 2's counters.
using CheckpointCounters = std::map<std::string, std::uint64_t, std::less<>>;

// What the residuals' owner saves beside them.
struct CheckpointOwnerState {
  CheckpointCounters call_numbers;    // by tensor name (non-empty); the Communicator's
  std::optional<std::uint64_t> step;  // the Reducer's
  CheckpointModelInputs model_inputs;
  friend bool operator==(const CheckpointOwnerState&, const CheckpointOwnerState&) = default;
};

// What a checkpoint file holds.
struct CheckpointContents {
  std::uint32_t format_version = 0;  // 1, 2 or 3
  std::uint32_t world_size = 0;
  std::uint32_t rank = 0;
  // A version 1 or 2 file's tensors are all in lane 0 under their stored names.
  CheckpointTensors tensors;
  // Empty for a version 1 or 2 file: their owner state is in version2_counters.
  CheckpointOwnerState owner_state;
  // A version 2 file's counters, uninterpreted; empty for versions 1 and 3.
  CheckpointCounters version2_counters;
};

// Writes the file (version 3, atomically, as described above). Refuses with invalid_argument,
// before creating anything, `tensors` not in strictly increasing (lane, name) order, an empty
// name, a call number with an empty name, a name, spec or count beyond the format's 32 bits,
// and model inputs that break the contracts above (naming the field). Throws io_error naming
// the path and the system's reason when the file cannot be written (the target is then left as
// it was and the temporary file is removed).
void write_checkpoint_file(const std::filesystem::path& path, std::uint32_t world_size,
                           std::uint32_t rank, std::span<const CheckpointTensorView> tensors,
                           const CheckpointOwnerState& owner_state);

// Reads and verifies a whole file of version 1, 2 or 3. Refusals:
//   io_error          the file cannot be opened or read; it is shorter than its fields say; the
//                     magic is wrong; a length or count exceeds the bytes left in the file
//                     (checked before allocating); records are not strictly increasing; a
//                     present byte is neither 0 nor 1, or an absent value is not 0; a model
//                     input breaks its contract; bytes trail the last record; the checksum
//                     differs. Each message names the path and the field.
//   invalid_argument  a format version other than 1, 2 and 3 (checked right after the magic,
//                     before anything that version may lay out differently).
CheckpointContents read_checkpoint_file(const std::filesystem::path& path);

// Refuses contents of another world size (size_mismatch: "... was written in a world of N
// ranks; this store belongs to a world of M") or another rank (invalid_argument); messages
// start with `who` and name `path` and both values (scripts match the world size's wording).
void require_same_world_and_rank(const CheckpointContents& contents, std::uint32_t world_size,
                                 std::uint32_t rank, std::string_view path, std::string_view who);

}  // namespace gradzip::error_feedback
