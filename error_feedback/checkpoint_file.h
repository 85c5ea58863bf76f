// The checkpoint file of one rank's error-feedback state: its residuals (ResidualStore, the
// in-memory side) and named counters, in one self-checking file. This file is the only place
// that knows the layout.
//
// Format (version 2). Integers and f32 values are little-endian:
//
//   offset  size  field
//   0       4     magic "GZEF"
//   4       4     u32 format version (kCheckpointFormatVersion)
//   8       4     u32 world size
//   12      4     u32 rank
//   16      8     u64 number of tensors N
//   24      ...   N records, sorted by name (byte-wise, strictly increasing):
//                   u32 name length L (>= 1), L name bytes, u64 element count C, C f32 values
//   ...     8     u64 number of counters M
//   ...     ...   M records, sorted by name (byte-wise, strictly increasing):
//                   u32 name length L (>= 1), L name bytes, u64 value
//   end-8   8     u64 checksum: FNV-1a 64 over every byte before it
//
// Counters are what the residual store's owner needs beside the residuals to continue a run exactly (the
// Communicator's per-name call numbers, algo=auto's model inputs, the Reducer's step); the
// file does not interpret them: collectives/checkpoint.h lays the typed checkpoints into it.
// Version 1 is version 2 without the counters section (and its count); read_checkpoint_file()
// reads both.
//
// write_checkpoint_file() writes the whole file to a temporary file in the target's directory,
// fsyncs it and renames it over the target, so a crash leaves either the old checkpoint or the
// new one, never a half-written file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gradzip::error_feedback {

// The version write_checkpoint_file() writes; read_checkpoint_file() reads it and version 1.
inline constexpr std::uint32_t kCheckpointFormatVersion = 2;

// Named u64 values saved beside the residuals.
using CheckpointCounters = std::map<std::string, std::uint64_t, std::less<>>;
// Residuals by tensor name.
using CheckpointTensors = std::map<std::string, std::vector<float>, std::less<>>;

// One tensor to write: a view of its name and values.
struct CheckpointTensor {
  std::string_view name;
  std::span<const float> values;
};

// What a checkpoint file holds.
struct CheckpointContents {
  std::uint32_t world_size = 0;
  std::uint32_t rank = 0;
  CheckpointTensors tensors;
  CheckpointCounters counters;  // empty for a version 1 file
};

// Writes the file (format above; atomically, as described). `tensors` must be in strictly
// increasing name order with non-empty names, counter names non-empty. Throws
// ErrorCode::io_error naming the path and the system's reason when the file cannot be written
// (the target is then left as it was and the temporary file is removed), invalid_argument for a
// name longer than 2^32 - 1 bytes or an empty counter name.
void write_checkpoint_file(const std::filesystem::path& path, std::uint32_t world_size,
                           std::uint32_t rank, std::span<const CheckpointTensor> tensors,
                           const CheckpointCounters& counters);

// Reads and verifies a whole file. Refusals:
//   io_error          the file cannot be opened or read; it is shorter than its fields say; the
//                     magic is wrong; a name length, element count or counter count exceeds
//                     the bytes left in the file (checked before allocating); names are not
//                     strictly increasing; bytes trail the last record; the checksum differs.
//   invalid_argument  a format version other than 1 and 2 (checked right after the magic,
//                     before anything that version may lay out differently).
CheckpointContents read_checkpoint_file(const std::filesystem::path& path);

}  // namespace gradzip::error_feedback
