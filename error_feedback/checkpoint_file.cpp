// The checkpoint file of a rank's error-feedback state (error_feedback/checkpoint_file.h).
#include "error_feedback/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <system_error>
#include <utility>

#include "gradzip/error.h"
#include "kernels/fnv1a.h"

namespace gradzip::error_feedback {
namespace {

// Values go to and from the file with memcpy; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "the residual checkpoint format assumes a little-endian host");
static_assert(sizeof(float) == 4);
static_assert(sizeof(double) == 8 && std::numeric_limits<double>::is_iec559);

constexpr char kMagic[4] = {'G', 'Z', 'E', 'F'};
// The trailing checksum: FNV-1a 64 (kernels/fnv1a.h) of every byte before it. Byte-serial (about
// 1 GB/s): checkpoints are written rarely, and the format stays simple to verify from any language.
constexpr std::uint64_t kChecksumBytes = 8;
// The versions before this one: 1 has tensors only, 2 adds named counters (header comment).
constexpr std::uint32_t kVersionWithoutCounters = 1;
constexpr std::uint32_t kVersionWithCounters = 2;
// Smallest records (a 1-byte name, no values): a version 1 or 2 tensor (name length, name,
// element count), a version 3 tensor (lane first), a named u64 (name length, name, value), a
// node structure (ranks_per_node, node size, two links) and a codec cost (spec length, spec,
// three terms).
constexpr std::uint64_t kMinUnlanedTensorBytes = 4 + 1 + 8;
constexpr std::uint64_t kMinLanedTensorBytes = 4 + kMinUnlanedTensorBytes;
constexpr std::uint64_t kMinNamedValueBytes = 4 + 1 + 8;
constexpr std::uint64_t kLinkBytes = 4 * sizeof(double);
constexpr std::uint64_t kHierarchyBytes = 4 + 4 + 2 * kLinkBytes;
constexpr std::uint64_t kCodecCostTermBytes = 3 * sizeof(double);
constexpr std::uint64_t kMinCodecCostBytes = 4 + 1 + kCodecCostTermBytes;
// The largest node size (collectives keep it in an int).
constexpr std::uint32_t kMaxNodeSize = std::numeric_limits<std::int32_t>::max();

// A link's terms in the file's order, with their names.
struct LinkTerm {
  std::string_view name;
  double SavedLink::*term;
};
constexpr LinkTerm kLinkTerms[] = {{"latency_s", &SavedLink::latency_s},
                                   {"bytes_per_s", &SavedLink::bytes_per_s},
                                   {"exchange_bytes_per_s", &SavedLink::exchange_bytes_per_s},
                                   {"collective_latency_s", &SavedLink::collective_latency_s}};
struct CodecCostTerm {
  std::string_view name;
  double SavedCodecCost::*term;
};
constexpr CodecCostTerm kCodecCostTerms[] = {{"encode_s", &SavedCodecCost::encode_s},
                                             {"decode_add_s", &SavedCodecCost::decode_add_s},
                                             {"add_s", &SavedCodecCost::add_s}};

bool is_finite_non_negative(double value) { return std::isfinite(value) && value >= 0; }

// The model-input contracts of the header comment, shared by the writer (invalid_argument) and
// the reader (io_error). Each returns how `where` breaks them, as "<field> = <value> (<rule>)",
// or an empty string when it keeps them.
std::string link_fault(const SavedLink& link, std::string_view where) {
  for (const auto& [name, term] : kLinkTerms) {
    if (!is_finite_non_negative(link.*term))
      return detail::concat(where, ".", name, " = ", link.*term, " (must be finite and >= 0)");
  }
  if (link.bytes_per_s <= 0)
    return detail::concat(where, ".bytes_per_s = ", link.bytes_per_s, " (must be > 0)");
  return {};
}

std::string hierarchy_fault(std::uint32_t ranks_per_node, const SavedHierarchy& hierarchy) {
  const std::string where = detail::concat("node structure ", ranks_per_node);
  if (ranks_per_node == 1 || ranks_per_node > kMaxNodeSize)
    return detail::concat(where, ": ranks_per_node = ", ranks_per_node, " (must be 0 or 2 to ",
                          kMaxNodeSize, ")");
  if (ranks_per_node == 0 && (hierarchy.node_size < 2 || hierarchy.node_size > kMaxNodeSize))
    return detail::concat(where, " (ranks that share memory): node size = ", hierarchy.node_size,
                          " (must be the detected size, 2 to ", kMaxNodeSize, ")");
  if (ranks_per_node != 0 && hierarchy.node_size != ranks_per_node)
    return detail::concat(where, ": node size = ", hierarchy.node_size,
                          " (must equal its ranks_per_node)");
  if (std::string fault = link_fault(hierarchy.intra, where + " intra"); !fault.empty()) return fault;
  return link_fault(hierarchy.across, where + " across");
}

std::string codec_cost_fault(std::string_view spec, const SavedCodecCost& cost) {
  if (spec.empty()) return "codec cost '': an empty spec (must be the spec's text)";
  for (const auto& [name, term] : kCodecCostTerms) {
    if (!is_finite_non_negative(cost.*term))
      return detail::concat("codec cost '", spec, "'.", name, " = ", cost.*term,
                            " (must be finite and >= 0)");
  }
  return {};
}

std::string system_reason(int error_number) {
  return std::generic_category().message(error_number);
}

// Owns a file descriptor; closes it on destruction (errors of that close are not reported,
// callers that care call close() themselves).
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  // Closes now; returns errno of a failed close, or 0.
  int close() noexcept {
    const int fd = std::exchange(fd_, -1);
    return fd >= 0 && ::close(fd) != 0 ? errno : 0;
  }

 private:
  int fd_;
};

// Appends bytes to a file while hashing them.
class CheckpointWriter {
 public:
  CheckpointWriter(int fd, const std::string& path) : fd_(fd), path_(path) {}

  void bytes(const void* data, std::size_t count) {
    hash_.update(data, count);
    write_all(data, count);
  }
  // An integer or f64, little-endian.
  template <typename T>
  void value(T field) {
    bytes(&field, sizeof field);
  }
  // The trailing checksum is not part of what it covers.
  void checksum() {
    const std::uint64_t value = hash_.value();
    write_all(&value, sizeof value);
  }

 private:
  void write_all(const void* data, std::size_t count) {
    const auto* p = static_cast<const char*>(data);
    while (count > 0) {
      // Linux writes at most ~2 GiB per call; loop for the rest.
      const ssize_t written = ::write(fd_, p, count);
      if (written < 0 && errno == EINTR) continue;
      GZ_REQUIRE(written > 0, ErrorCode::io_error, "checkpoint save: cannot write '", path_,
                 "': ", system_reason(written < 0 ? errno : EIO));
      p += written;
      count -= static_cast<std::size_t>(written);
    }
  }

  int fd_;
  const std::string& path_;
  Fnv1a64 hash_;
};

// Reads a file of known size front to back while hashing; every read is checked against the
// bytes left first, so a corrupt length can never make the caller allocate beyond the file.
class CheckpointReader {
 public:
  CheckpointReader(int fd, std::uint64_t file_bytes, const std::string& path)
      : fd_(fd), file_bytes_(file_bytes), path_(path) {}

  std::uint64_t offset() const noexcept { return offset_; }
  std::uint64_t left() const noexcept { return file_bytes_ - offset_; }

  // Reads `count` bytes of the field `what`; io_error if the file has fewer left.
  void bytes(void* out, std::size_t count, std::string_view what) {
    GZ_REQUIRE(count <= left(), ErrorCode::io_error, "checkpoint load: '", path_,
               "' is truncated: ", what, " needs ", count, " bytes at offset ", offset_,
               ", the file has ", file_bytes_, " bytes");
    read_all(out, count);
    hash_.update(out, count);
  }
  // An integer or f64 (little-endian) of the field `what`.
  template <typename T>
  T value(std::string_view what) {
    T field;
    bytes(&field, sizeof field, what);
    return field;
  }
  // Reads the trailing checksum (not hashed) and compares it with the hash of what came before.
  void verify_checksum() {
    const std::uint64_t computed = hash_.value();
    // left() >= 8: every count and length check kept room for the checksum.
    GZ_REQUIRE(left() == kChecksumBytes, ErrorCode::io_error, "checkpoint load: '", path_,
               "' is corrupt: ", left() - kChecksumBytes,
               " unexpected bytes between the last record (ending at offset ", offset_,
               ") and the ", kChecksumBytes, "-byte checksum");
    std::uint64_t stored;
    read_all(&stored, sizeof stored);
    GZ_REQUIRE(stored == computed, ErrorCode::io_error, "checkpoint load: '", path_,
               "' is corrupt: checksum mismatch (stored 0x", std::hex, stored, ", computed 0x",
               computed, std::dec, ")");
  }

 private:
  void read_all(void* out, std::size_t count) {
    auto* p = static_cast<char*>(out);
    while (count > 0) {
      const ssize_t got = ::read(fd_, p, count);
      if (got < 0 && errno == EINTR) continue;
      GZ_REQUIRE(got >= 0, ErrorCode::io_error, "checkpoint load: cannot read '", path_,
                 "' at offset ", offset_, ": ", system_reason(errno));
      GZ_REQUIRE(got > 0, ErrorCode::io_error, "checkpoint load: '", path_,
                 "' ended at offset ", offset_, " before its size of ", file_bytes_,
                 " bytes (it changed while being read)");
      p += got;
      count -= static_cast<std::size_t>(got);
      offset_ += static_cast<std::uint64_t>(got);
    }
  }

  int fd_;
  std::uint64_t file_bytes_;
  const std::string& path_;
  std::uint64_t offset_ = 0;
  Fnv1a64 hash_;
};

// Reads the name of a record (u32 length L, L bytes) of kind `kind` ("tensor", "counter", ...),
// the `index`-th of its section. The record needs its name, `bytes_after` more bytes and the
// file's checksum, so L is bounded by the bytes left before allocating. When `previous` is
// given (the section is sorted by name and this is not its first record), the name must
// follow it in strictly increasing order.
std::string read_record_name(CheckpointReader& reader, std::string_view kind, std::uint64_t index,
                             std::uint64_t bytes_after, const std::string* previous,
                             const std::string& path) {
  const auto name_bytes = reader.value<std::uint32_t>(detail::concat("a ", kind, " name length"));
  const std::uint64_t needed = bytes_after + kChecksumBytes;
  const std::uint64_t room = reader.left() >= needed ? reader.left() - needed : 0;
  GZ_REQUIRE(name_bytes >= 1 && name_bytes <= room, ErrorCode::io_error,
             "checkpoint load: '", path, "' is corrupt: ", kind, " ", index,
             " has a name length of ", name_bytes, " bytes at offset ", reader.offset() - 4,
             " (must be 1..", room, ")");
  std::string name(name_bytes, '\0');
  reader.bytes(name.data(), name.size(), detail::concat("a ", kind, " name"));
  GZ_REQUIRE(previous == nullptr || *previous < name, ErrorCode::io_error,
             "checkpoint load: '", path, "' is corrupt: ", kind, " '", name,
             "' does not follow '", previous == nullptr ? std::string() : *previous,
             "' in strictly increasing name order");
  return name;
}

// Reads a section's u64 (or, with T = u32, u32) record count and bounds it by the bytes left
// before the checksum: `kind`s records take at least `min_record_bytes` each.
template <typename T>
std::uint64_t read_record_count(CheckpointReader& reader, std::string_view kind,
                                std::uint64_t min_record_bytes, std::uint64_t file_bytes,
                                const std::string& path) {
  const std::uint64_t count = reader.value<T>(detail::concat("the ", kind, " count"));
  GZ_REQUIRE(reader.left() >= kChecksumBytes &&
                 count <= (reader.left() - kChecksumBytes) / min_record_bytes,
             ErrorCode::io_error, "checkpoint load: '", path, "' is corrupt: ", count, " ", kind,
             "s cannot fit in its ", file_bytes, " bytes");
  return count;
}

// Reads a "present" byte (0 or 1) of the field `what`.
bool read_present_flag(CheckpointReader& reader, std::string_view what, const std::string& path) {
  const auto flag = reader.value<std::uint8_t>(what);
  GZ_REQUIRE(flag <= 1, ErrorCode::io_error, "checkpoint load: '", path, "' is corrupt: ", what,
             " is ", static_cast<unsigned>(flag), " at offset ", reader.offset() - 1,
             " (must be 0 or 1)");
  return flag == 1;
}

SavedLink read_link(CheckpointReader& reader, std::string_view where) {
  SavedLink link;
  for (const auto& [name, term] : kLinkTerms)
    link.*term = reader.value<double>(detail::concat(where, ".", name));
  return link;
}

// Reads the tensors section: version 3's records carry a lane and are sorted by (lane, name),
// versions 1 and 2's are lane 0's, sorted by name.
CheckpointTensors read_tensors(CheckpointReader& reader, std::uint32_t version,
                               std::uint64_t file_bytes, const std::string& path) {
  const bool laned = version == kCheckpointFormatVersion;
  const std::uint64_t count = read_record_count<std::uint64_t>(
      reader, "tensor", laned ? kMinLanedTensorBytes : kMinUnlanedTensorBytes, file_bytes, path);
  CheckpointTensors tensors;
  for (std::uint64_t t = 0; t < count; ++t) {
    const CheckpointTensorKey* previous = tensors.empty() ? nullptr : &std::prev(tensors.end())->first;
    CheckpointTensorKey key;
    if (laned) {
      key.lane = reader.value<std::uint32_t>("a tensor lane");
      key.name = read_record_name(reader, "tensor", t, 8, nullptr, path);
      GZ_REQUIRE(previous == nullptr || *previous < key, ErrorCode::io_error,
                 "checkpoint load: '", path, "' is corrupt: tensor '", key.name, "' of lane ",
                 key.lane, " does not follow tensor '", previous->name, "' of lane ",
                 previous->lane, " in strictly increasing (lane, name) order");
    } else {
      key.name = read_record_name(reader, "tensor", t, 8,
                                  previous == nullptr ? nullptr : &previous->name, path);
    }
    const auto elements = reader.value<std::uint64_t>("a tensor element count");
    // left() >= 8 here: the name length check kept room for this count and the checksum.
    const std::uint64_t value_room = (reader.left() - kChecksumBytes) / sizeof(float);
    GZ_REQUIRE(elements <= value_room, ErrorCode::io_error, "checkpoint load: '", path,
               "' is corrupt: tensor '", key.name, "' claims ", elements,
               " elements, but only ", reader.left(), " bytes are left in the file");
    std::vector<float> values(static_cast<std::size_t>(elements));
    reader.bytes(values.data(), values.size() * sizeof(float), "tensor values");
    tensors.emplace_hint(tensors.end(), std::move(key), std::move(values));
  }
  return tensors;
}

// Reads a section of named u64 values (version 2's counters, version 3's call numbers), each
// record of kind `kind`.
CheckpointCounters read_named_values(CheckpointReader& reader, std::string_view kind,
                                     std::uint64_t file_bytes, const std::string& path) {
  const std::uint64_t count =
      read_record_count<std::uint64_t>(reader, kind, kMinNamedValueBytes, file_bytes, path);
  CheckpointCounters values;
  for (std::uint64_t c = 0; c < count; ++c) {
    std::string name = read_record_name(
        reader, kind, c, 8, values.empty() ? nullptr : &std::prev(values.end())->first, path);
    const auto value = reader.value<std::uint64_t>(detail::concat("a ", kind, " value"));
    values.emplace_hint(values.end(), std::move(name), value);
  }
  return values;
}

// Reads version 3's step and model inputs (after the call numbers).
void read_step_and_model_inputs(CheckpointReader& reader, CheckpointOwnerState& state,
                                std::uint64_t file_bytes, const std::string& path) {
  const bool has_step = read_present_flag(reader, "the step's present byte", path);
  const auto step = reader.value<std::uint64_t>("the step");
  GZ_REQUIRE(has_step || step == 0, ErrorCode::io_error, "checkpoint load: '", path,
             "' is corrupt: the absent step holds ", step, " (must be 0)");
  if (has_step) state.step = step;

  CheckpointModelInputs& inputs = state.model_inputs;
  const bool has_link = read_present_flag(reader, "the link's present byte", path);
  const SavedLink link = read_link(reader, "link");
  if (has_link) {
    const std::string fault = link_fault(link, "link");
    GZ_REQUIRE(fault.empty(), ErrorCode::io_error, "checkpoint load: '", path,
               "' is corrupt: ", fault);
    inputs.link = link;
  } else {
    const bool all_zero = std::all_of(std::begin(kLinkTerms), std::end(kLinkTerms),
                                      [&](const LinkTerm& term) {
                                        return std::bit_cast<std::uint64_t>(link.*term.term) == 0;
                                      });
    GZ_REQUIRE(all_zero, ErrorCode::io_error, "checkpoint load: '", path,
               "' is corrupt: the absent link's terms are not all 0");
  }

  const std::uint64_t hierarchy_count =
      read_record_count<std::uint32_t>(reader, "node structure", kHierarchyBytes, file_bytes, path);
  for (std::uint64_t h = 0; h < hierarchy_count; ++h) {
    const auto ranks_per_node = reader.value<std::uint32_t>("a node structure's ranks_per_node");
    GZ_REQUIRE(inputs.hierarchies.empty() || std::prev(inputs.hierarchies.end())->first < ranks_per_node,
               ErrorCode::io_error, "checkpoint load: '", path, "' is corrupt: node structure ",
               ranks_per_node, " does not follow node structure ",
               std::prev(inputs.hierarchies.end())->first,
               " in strictly increasing ranks_per_node order");
    SavedHierarchy hierarchy;
    hierarchy.node_size = reader.value<std::uint32_t>("a node structure's node size");
    const std::string where = detail::concat("node structure ", ranks_per_node);
    hierarchy.intra = read_link(reader, where + " intra");
    hierarchy.across = read_link(reader, where + " across");
    const std::string fault = hierarchy_fault(ranks_per_node, hierarchy);
    GZ_REQUIRE(fault.empty(), ErrorCode::io_error, "checkpoint load: '", path,
               "' is corrupt: ", fault);
    inputs.hierarchies.emplace_hint(inputs.hierarchies.end(), ranks_per_node, hierarchy);
  }

  const std::uint64_t cost_count =
      read_record_count<std::uint32_t>(reader, "codec cost", kMinCodecCostBytes, file_bytes, path);
  for (std::uint64_t c = 0; c < cost_count; ++c) {
    std::string spec = read_record_name(
        reader, "codec cost", c, kCodecCostTermBytes,
        inputs.codec_costs.empty() ? nullptr : &std::prev(inputs.codec_costs.end())->first, path);
    SavedCodecCost cost;
    for (const auto& [name, term] : kCodecCostTerms)
      cost.*term = reader.value<double>(detail::concat("codec cost '", spec, "'.", name));
    const std::string fault = codec_cost_fault(spec, cost);
    GZ_REQUIRE(fault.empty(), ErrorCode::io_error, "checkpoint load: '", path,
               "' is corrupt: ", fault);
    inputs.codec_costs.emplace_hint(inputs.codec_costs.end(), std::move(spec), cost);
  }
}

// The largest length or count the file stores (as u32).
constexpr std::uint64_t kMaxLength = std::numeric_limits<std::uint32_t>::max();

}  // namespace

std::string model_inputs_fault(const CheckpointModelInputs& inputs) {
  std::string fault = inputs.link ? link_fault(*inputs.link, "link") : std::string();
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) {
    if (fault.empty()) fault = hierarchy_fault(ranks_per_node, hierarchy);
  }
  for (const auto& [spec, cost] : inputs.codec_costs) {
    if (fault.empty()) fault = spec.size() > kMaxLength ? "a codec cost's spec beyond 2^32-1 bytes"
                                                        : codec_cost_fault(spec, cost);
  }
  return fault;
}

namespace {

// Refuses, before anything is written, what the format cannot hold or the reader would refuse.
void require_writable(std::span<const CheckpointTensorView> tensors,
                      const CheckpointOwnerState& state) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensorView& tensor = tensors[i];
    const bool follows = i == 0 || tensors[i - 1].lane < tensor.lane ||
                         (tensors[i - 1].lane == tensor.lane && tensors[i - 1].name < tensor.name);
    GZ_REQUIRE(!tensor.name.empty() && tensor.name.size() <= kMaxLength && follows,
               ErrorCode::invalid_argument, "checkpoint save: tensor ", i, " is named '",
               tensor.name, "' in lane ", tensor.lane,
               i == 0 ? std::string()
                      : detail::concat(" after '", tensors[i - 1].name, "' in lane ", tensors[i - 1].lane),
               " (names must be 1 to 2^32-1 bytes, (lane, name) strictly increasing)");
  }
  for (const auto& [name, value] : state.call_numbers) {
    GZ_REQUIRE(!name.empty() && name.size() <= kMaxLength, ErrorCode::invalid_argument,
               "checkpoint save: a call number's tensor name of ", name.size(),
               " bytes (must be 1 to 2^32-1)");
  }
  const CheckpointModelInputs& inputs = state.model_inputs;
  GZ_REQUIRE(inputs.hierarchies.size() <= kMaxLength && inputs.codec_costs.size() <= kMaxLength,
             ErrorCode::invalid_argument, "checkpoint save: ", inputs.hierarchies.size(),
             " node structures and ", inputs.codec_costs.size(),
             " codec costs (each at most 2^32-1)");
  const std::string fault = model_inputs_fault(inputs);
  GZ_REQUIRE(fault.empty(), ErrorCode::invalid_argument,
             "checkpoint save: algo=auto's model input ", fault);
}

void write_link(CheckpointWriter& writer, const SavedLink& link) {
  for (const auto& [name, term] : kLinkTerms) writer.value<double>(link.*term);
}

void write_name(CheckpointWriter& writer, std::string_view name) {
  writer.value<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
  writer.bytes(name.data(), name.size());
}

// Writes everything but the checksum (version 3; require_writable has checked the contents).
void write_contents(CheckpointWriter& writer, std::uint32_t world_size, std::uint32_t rank,
                    std::span<const CheckpointTensorView> tensors,
                    const CheckpointOwnerState& state) {
  writer.bytes(kMagic, sizeof kMagic);
  writer.value<std::uint32_t>(kCheckpointFormatVersion);
  writer.value<std::uint32_t>(world_size);
  writer.value<std::uint32_t>(rank);
  writer.value<std::uint64_t>(tensors.size());
  for (const auto& [lane, name, values] : tensors) {
    writer.value<std::uint32_t>(lane);
    write_name(writer, name);
    writer.value<std::uint64_t>(values.size());
    writer.bytes(values.data(), values.size() * sizeof(float));
  }
  writer.value<std::uint64_t>(state.call_numbers.size());
  for (const auto& [name, call_number] : state.call_numbers) {
    write_name(writer, name);
    writer.value<std::uint64_t>(call_number);
  }
  writer.value<std::uint8_t>(state.step.has_value() ? 1 : 0);
  writer.value<std::uint64_t>(state.step.value_or(0));
  const CheckpointModelInputs& inputs = state.model_inputs;
  writer.value<std::uint8_t>(inputs.link.has_value() ? 1 : 0);
  write_link(writer, inputs.link.value_or(SavedLink{}));
  writer.value<std::uint32_t>(static_cast<std::uint32_t>(inputs.hierarchies.size()));
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) {
    writer.value<std::uint32_t>(ranks_per_node);
    writer.value<std::uint32_t>(hierarchy.node_size);
    write_link(writer, hierarchy.intra);
    write_link(writer, hierarchy.across);
  }
  writer.value<std::uint32_t>(static_cast<std::uint32_t>(inputs.codec_costs.size()));
  for (const auto& [spec, cost] : inputs.codec_costs) {
    write_name(writer, spec);
    for (const auto& [name, term] : kCodecCostTerms) writer.value<double>(cost.*term);
  }
}

// A name for the temporary file unique within this host: directory of the target, process id,
// and a per-process counter (two saves to one path from one process never share it).
std::filesystem::path temporary_path_for(const std::filesystem::path& path) {
  static std::atomic<std::uint64_t> counter{0};
  std::filesystem::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  return temporary;
}

// Makes the rename durable. Best effort: the rename is atomic without it (a crash leaves the
// old or the new complete file); some file systems refuse fsync on directories.
void sync_directory_of(const std::filesystem::path& path) {
  std::filesystem::path directory = path.parent_path();
  if (directory.empty()) directory = ".";
  FileDescriptor fd(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() >= 0) ::fsync(fd.get());
}

}  // namespace

void write_checkpoint_file(const std::filesystem::path& path, std::uint32_t world_size,
                           std::uint32_t rank, std::span<const CheckpointTensorView> tensors,
                           const CheckpointOwnerState& owner_state) {
  require_writable(tensors, owner_state);
  const std::string target = path.string();
  const std::filesystem::path temporary = temporary_path_for(path);
  const std::string temporary_name = temporary.string();

  FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  GZ_REQUIRE(fd.get() >= 0, ErrorCode::io_error, "checkpoint save: cannot create '",
             temporary_name, "' (temporary file for '", target, "'): ", system_reason(errno));
  try {
    CheckpointWriter writer(fd.get(), temporary_name);
    write_contents(writer, world_size, rank, tensors, owner_state);
    writer.checksum();
    GZ_REQUIRE(::fsync(fd.get()) == 0, ErrorCode::io_error, "checkpoint save: cannot flush '",
               temporary_name, "' to disk: ", system_reason(errno));
    const int close_error = fd.close();
    GZ_REQUIRE(close_error == 0, ErrorCode::io_error, "checkpoint save: cannot close '",
               temporary_name, "': ", system_reason(close_error));
    GZ_REQUIRE(::rename(temporary.c_str(), path.c_str()) == 0, ErrorCode::io_error,
               "checkpoint save: cannot rename '", temporary_name, "' to '", target,
               "': ", system_reason(errno));
  } catch (...) {
    fd.close();
    ::unlink(temporary.c_str());
    throw;
  }
  sync_directory_of(path);
}

CheckpointContents read_checkpoint_file(const std::filesystem::path& path) {
  const std::string name_of_file = path.string();
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  GZ_REQUIRE(fd.get() >= 0, ErrorCode::io_error, "checkpoint load: cannot open '",
             name_of_file, "': ", system_reason(errno));
  struct stat status {};
  GZ_REQUIRE(::fstat(fd.get(), &status) == 0, ErrorCode::io_error,
             "checkpoint load: cannot stat '", name_of_file, "': ", system_reason(errno));
  GZ_REQUIRE(S_ISREG(status.st_mode), ErrorCode::io_error, "checkpoint load: '",
             name_of_file, "' is not a regular file");
  const auto file_bytes = static_cast<std::uint64_t>(status.st_size);
  CheckpointReader reader(fd.get(), file_bytes, name_of_file);

  char magic[sizeof kMagic];
  reader.bytes(magic, sizeof magic, "the magic");
  GZ_REQUIRE(std::memcmp(magic, kMagic, sizeof kMagic) == 0, ErrorCode::io_error,
             "checkpoint load: '", name_of_file,
             "' is not a gradzip error-feedback checkpoint (magic is not \"GZEF\")");
  // Another version may lay out everything after this field differently: refuse before reading
  // on.
  CheckpointContents contents;
  contents.format_version = reader.value<std::uint32_t>("the format version");
  const std::uint32_t version = contents.format_version;
  GZ_REQUIRE(version == kVersionWithoutCounters || version == kVersionWithCounters ||
                 version == kCheckpointFormatVersion,
             ErrorCode::invalid_argument, "checkpoint load: '", name_of_file,
             "' has checkpoint format version ", version, "; this build reads versions ",
             kVersionWithoutCounters, ", ", kVersionWithCounters, " and ",
             kCheckpointFormatVersion);
  contents.world_size = reader.value<std::uint32_t>("the world size");
  contents.rank = reader.value<std::uint32_t>("the rank");
  contents.tensors = read_tensors(reader, version, file_bytes, name_of_file);
  if (version == kVersionWithCounters) {
    contents.version2_counters = read_named_values(reader, "counter", file_bytes, name_of_file);
  } else if (version == kCheckpointFormatVersion) {
    contents.owner_state.call_numbers =
        read_named_values(reader, "call number", file_bytes, name_of_file);
    read_step_and_model_inputs(reader, contents.owner_state, file_bytes, name_of_file);
  }
  reader.verify_checksum();
  return contents;
}

void require_same_world_and_rank(const CheckpointContents& contents, std::uint32_t world_size,
                                 std::uint32_t rank, std::string_view path, std::string_view who) {
  GZ_REQUIRE(contents.world_size == world_size, ErrorCode::size_mismatch, who, ": '", path,
             "' was written in a world of ", contents.world_size,
             " ranks; this store belongs to a world of ", world_size);
  GZ_REQUIRE(contents.rank == rank, ErrorCode::invalid_argument, who, ": '", path,
             "' holds the residuals of rank ", contents.rank, "; this store belongs to rank ",
             rank);
}

}  // namespace gradzip::error_feedback
