// The checkpoint file of a rank's error-feedback state (error_feedback/checkpoint_file.h).
#include "error_feedback/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
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

constexpr char kMagic[4] = {'G', 'Z', 'E', 'F'};
// Fixed header: magic, version, world size, rank, tensor count.
constexpr std::uint64_t kHeaderBytes = 4 + 4 + 4 + 4 + 8;
// The trailing checksum: FNV-1a 64 (kernels/fnv1a.h) of every byte before it. Byte-serial (about
// 1 GB/s): checkpoints are written rarely, and the format stays simple to verify from any language.
constexpr std::uint64_t kChecksumBytes = 8;
// Smallest record: a 1-byte name and zero values.
constexpr std::uint64_t kMinRecordBytes = 4 + 1 + 8;
// The first version, which has no counters section.
constexpr std::uint32_t kVersionWithoutCounters = 1;
// A counter record: name length, a 1-byte name at least, and its value.
constexpr std::uint64_t kMinCounterBytes = 4 + 1 + 8;

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
  template <typename T>
  void integer(T value) {
    bytes(&value, sizeof value);
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
  template <typename T>
  T integer(std::string_view what) {
    T value;
    bytes(&value, sizeof value, what);
    return value;
  }
  // Reads the trailing checksum (not hashed) and compares it with the hash of what came before.
  void verify_checksum() {
    const std::uint64_t computed = hash_.value();
    // left() >= 8: the tensor count and element count checks kept room for the checksum.
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

// Reads the name of a record (u32 length L, L bytes) of kind `kind` ("tensor", "counter"),
// the `index`-th of its section: the record needs its name, 8 more bytes (an element count or
// a value) and the file's 8-byte checksum, so L is bounded by the bytes left before allocating;
// names strictly increase after `previous` (null for the first).
std::string read_record_name(CheckpointReader& reader, const char* kind, std::uint64_t index,
                             const std::string* previous, const std::string& path) {
  const auto name_bytes = reader.integer<std::uint32_t>(std::string("a ") + kind + " name length");
  const std::uint64_t room = reader.left() >= 16 ? reader.left() - 16 : 0;
  GZ_REQUIRE(name_bytes >= 1 && name_bytes <= room, ErrorCode::io_error,
             "checkpoint load: '", path, "' is corrupt: ", kind, " ", index,
             " has a name length of ", name_bytes, " bytes at offset ", reader.offset() - 4,
             " (must be 1..", room, ")");
  std::string name(name_bytes, '\0');
  reader.bytes(name.data(), name.size(), std::string("a ") + kind + " name");
  GZ_REQUIRE(previous == nullptr || *previous < name, ErrorCode::io_error,
             "checkpoint load: '", path, "' is corrupt: ", kind, " '", name,
             "' does not follow '", previous == nullptr ? std::string() : *previous,
             "' in strictly increasing name order");
  return name;
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
                           std::uint32_t rank, std::span<const CheckpointTensor> tensors,
                           const CheckpointCounters& counters) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    GZ_REQUIRE(!tensors[i].name.empty() && (i == 0 || tensors[i - 1].name < tensors[i].name),
               ErrorCode::invalid_argument, "checkpoint save: tensor ", i, " is named '",
               tensors[i].name, "'", i == 0 ? std::string_view() : std::string_view(" after '"),
               i == 0 ? std::string_view() : tensors[i - 1].name, i == 0 ? "" : "'",
               " (names must be non-empty and strictly increasing)");
  }
  const std::string target = path.string();
  const std::filesystem::path temporary = temporary_path_for(path);
  const std::string temporary_name = temporary.string();

  FileDescriptor fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  GZ_REQUIRE(fd.get() >= 0, ErrorCode::io_error, "checkpoint save: cannot create '",
             temporary_name, "' (temporary file for '", target, "'): ", system_reason(errno));
  try {
    CheckpointWriter writer(fd.get(), temporary_name);
    writer.bytes(kMagic, sizeof kMagic);
    writer.integer<std::uint32_t>(kCheckpointFormatVersion);
    writer.integer<std::uint32_t>(world_size);
    writer.integer<std::uint32_t>(rank);
    writer.integer<std::uint64_t>(tensors.size());
    for (const auto& [name, values] : tensors) {
      GZ_REQUIRE(name.size() <= std::numeric_limits<std::uint32_t>::max(),
                 ErrorCode::invalid_argument, "checkpoint save: tensor name of ",
                 name.size(), " bytes exceeds the format's 32-bit name length");
      writer.integer<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
      writer.bytes(name.data(), name.size());
      writer.integer<std::uint64_t>(values.size());
      writer.bytes(values.data(), values.size() * sizeof(float));
    }
    writer.integer<std::uint64_t>(counters.size());
    for (const auto& [name, value] : counters) {
      GZ_REQUIRE(!name.empty() && name.size() <= std::numeric_limits<std::uint32_t>::max(),
                 ErrorCode::invalid_argument, "checkpoint save: a counter name of ",
                 name.size(), " bytes (must be 1 to 2^32-1)");
      writer.integer<std::uint32_t>(static_cast<std::uint32_t>(name.size()));
      writer.bytes(name.data(), name.size());
      writer.integer<std::uint64_t>(value);
    }
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
  const auto version = reader.integer<std::uint32_t>("the format version");
  GZ_REQUIRE(version == kCheckpointFormatVersion || version == kVersionWithoutCounters,
             ErrorCode::invalid_argument, "checkpoint load: '", name_of_file,
             "' has checkpoint format version ", version, "; this build reads versions ",
             kVersionWithoutCounters, " and ", kCheckpointFormatVersion);
  CheckpointContents contents;
  contents.world_size = reader.integer<std::uint32_t>("the world size");
  contents.rank = reader.integer<std::uint32_t>("the rank");
  const auto tensor_count = reader.integer<std::uint64_t>("the tensor count");
  GZ_REQUIRE(reader.left() >= kChecksumBytes &&
                 tensor_count <= (reader.left() - kChecksumBytes) / kMinRecordBytes,
             ErrorCode::io_error, "checkpoint load: '", name_of_file, "' is corrupt: ",
             tensor_count, " tensors cannot fit in its ", file_bytes, " bytes");

  auto& loaded = contents.tensors;
  for (std::uint64_t t = 0; t < tensor_count; ++t) {
    std::string name = read_record_name(
        reader, "tensor", t, loaded.empty() ? nullptr : &std::prev(loaded.end())->first, name_of_file);
    const auto count = reader.integer<std::uint64_t>("a tensor element count");
    // left() >= 8 here: the name length check kept room for this count and the checksum.
    const std::uint64_t value_room = (reader.left() - kChecksumBytes) / sizeof(float);
    GZ_REQUIRE(count <= value_room, ErrorCode::io_error, "checkpoint load: '", name_of_file,
               "' is corrupt: tensor '", name, "' claims ", count,
               " elements, but only ", reader.left(), " bytes are left in the file");
    std::vector<float> values(static_cast<std::size_t>(count));
    reader.bytes(values.data(), values.size() * sizeof(float), "tensor values");
    loaded.emplace_hint(loaded.end(), std::move(name), std::move(values));
  }
  auto& loaded_counters = contents.counters;
  if (version != kVersionWithoutCounters) {
    const auto counter_count = reader.integer<std::uint64_t>("the counter count");
    GZ_REQUIRE(reader.left() >= kChecksumBytes &&
                   counter_count <= (reader.left() - kChecksumBytes) / kMinCounterBytes,
               ErrorCode::io_error, "checkpoint load: '", name_of_file, "' is corrupt: ",
               counter_count, " counters cannot fit in its ", file_bytes, " bytes");
    for (std::uint64_t c = 0; c < counter_count; ++c) {
      std::string name = read_record_name(
          reader, "counter", c,
          loaded_counters.empty() ? nullptr : &std::prev(loaded_counters.end())->first, name_of_file);
      const auto value = reader.integer<std::uint64_t>("a counter value");
      loaded_counters.emplace_hint(loaded_counters.end(), std::move(name), value);
    }
  }
  reader.verify_checksum();
  return contents;
}

}  // namespace gradzip::error_feedback
