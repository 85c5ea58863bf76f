#include "collectives/collective_job.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>

#include "collectives/algorithm_table.h"
#include "collectives/device_memory.h"
#include "collectives/segment_plan.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

// SplitMix64 finaliser: a bijective mix, so distinct ranks give distinct seeds.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::size_t shard_begin(std::size_t count, int ranks, int r) noexcept {
  __extension__ typedef unsigned __int128 u128;  // count * r needs 128 bits for huge counts
  if (ranks <= 0) return 0;
  return static_cast<std::size_t>(static_cast<u128>(count) * static_cast<unsigned>(r) /
                                  static_cast<unsigned>(ranks));
}

EncodeContext encode_context(const ReduceJob& job, std::uint64_t element_offset, bool server) {
  EncodeContext ctx = job.ctx;
  ctx.element_offset = element_offset;
  if (!codec_row(job.codec.spec().codec).shared_indices) {
    const std::uint64_t stream = (server ? (std::uint64_t{1} << 32) : 0) +
                                 static_cast<std::uint64_t>(job.transport.rank());
    ctx.seed = job.ctx.seed ^ mix64(stream);
  }
  return ctx;
}

void count_sent(CollectiveStats& stats, std::span<const std::byte> message, Device where) {
  std::array<std::byte, compressors::kWireHeaderBytes> header_copy{};
  const std::size_t copied = std::min(message.size(), header_copy.size());
  if (where.kind == DeviceKind::cuda) {
    copy_device_to_host(header_copy.data(), message.data(), copied, where.index, "count_sent");
  } else if (copied > 0) {
    std::memcpy(header_copy.data(), message.data(), copied);
  }
  const compressors::WireHeader header = compressors::read_header_copy(
      std::span<const std::byte>(header_copy).first(copied), message.size(), "count_sent");
  const std::uint64_t index_bytes = compressors::index_bytes(header);
  stats.sent_header_bytes += compressors::kWireHeaderBytes;
  stats.sent_index_bytes += index_bytes;
  stats.sent_payload_bytes += header.payload_bytes - index_bytes;
}

void count_sent(const ReduceJob& job, std::span<const std::byte> message) {
  // Sparse codecs' messages carry index bytes, which only the header can split off.
  if (job.device.kind != DeviceKind::cuda || job.codec.sparse() || message.size() < compressors::kWireHeaderBytes)
    return count_sent(job.stats, message, job.device);
  job.stats.sent_header_bytes += compressors::kWireHeaderBytes;
  job.stats.sent_payload_bytes += message.size() - compressors::kWireHeaderBytes;
}

void count_sent(const ReduceJob& job, std::span<const std::byte> message, std::size_t elements) {
  const CompressionSpec& spec = job.codec.spec();
  if (!job.sizes_known || !job.codec.sparse() || spec.codec != CodecKind::topk || spec.approx)
    return count_sent(job, message);
  // Exact top-k: k_for(elements) entries, 32- or 64-bit indices by the element count.
  const std::uint64_t index_bytes =
      spec.k_for(elements) * (elements > compressors::kTopkMaxNarrowCount ? 8 : 4);
  GZ_REQUIRE(message.size() >= compressors::kWireHeaderBytes + index_bytes, ErrorCode::internal,
             "count_sent: a top-k message of ", message.size(), " bytes for ", elements,
             " elements");
  job.stats.sent_header_bytes += compressors::kWireHeaderBytes;
  job.stats.sent_index_bytes += index_bytes;
  job.stats.sent_payload_bytes += message.size() - compressors::kWireHeaderBytes - index_bytes;
}

void require_known_size(const ReduceJob& job, std::size_t elements, std::size_t bytes) {
  if (!job.sizes_known) return;
  const std::size_t expected = job.codec.max_encoded_bytes(elements);
  GZ_REQUIRE(bytes == expected, ErrorCode::internal, job.codec.name(), ": a message of ", bytes,
             " bytes for ", elements, " elements, where every rank assumed max_encoded_bytes = ",
             expected);
}

void MessageBuffer::resize(std::size_t bytes) {
  if (bytes > capacity_) {
    if (device_.kind == DeviceKind::cuda) {
      device_memory_.reset();  // free the old block before taking the larger one
      device_memory_ = std::make_unique<DeviceAllocation>(bytes, device_.index, "message buffer");
      data_ = device_memory_->data();
    } else {
      host_.reset();
      host_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      data_ = host_.get();
    }
    capacity_ = bytes;
  }
  size_ = bytes;
}

void MessageBuffer::assign(std::span<const std::byte> from) {
  resize(from.size());
  if (from.empty()) return;
  if (device_.kind == DeviceKind::cuda) copy_on_device(data_, from.data(), from.size(), device_.index);
  else std::memcpy(data_, from.data(), from.size());
}

PendingRequests::~PendingRequests() {
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (!completed_[i]) {
      try {
        transport_.wait(requests_[i]);
      } catch (...) {  // NOLINT(bugprone-empty-catch): the first error is already leaving
      }
    }
  }
}

std::size_t PendingRequests::add(Transport::Request request) {
  requests_.push_back(request);
  completed_.push_back(false);
  return requests_.size() - 1;
}

std::size_t PendingRequests::wait(std::size_t handle) {
  completed_[handle] = true;  // the transport forgets the request even when wait throws
  return transport_.wait(requests_[handle]);
}

std::size_t PendingRequests::timed_wait(std::size_t handle, CollectiveStats& stats) {
  StageTimer timer(stats, Stage::communicate);
  const std::size_t bytes = wait(handle);
  timer.note_bytes(bytes);
  return bytes;
}

std::size_t PendingRequests::wait_receive(std::size_t handle, CollectiveStats& stats) {
  const std::size_t bytes = timed_wait(handle, stats);
  stats.received_bytes += bytes;
  return bytes;
}

namespace {

double& stage_seconds(CollectiveStats& stats, Stage stage) {
  switch (stage) {
    case Stage::encode: return stats.encode_seconds;
    case Stage::communicate: return stats.communicate_seconds;
    case Stage::decode: return stats.decode_seconds;
    case Stage::total: break;
  }
  return stats.total_seconds;
}

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::encode: return "encode";
    case Stage::communicate: return "communicate";
    case Stage::decode: return "decode";
    case Stage::total: break;
  }
  return "total";
}

}  // namespace

StageTimer::StageTimer(CollectiveStats& stats, Stage stage)
    : stats_(stats),
      stage_(stage),
      timeline_(stage == Stage::total ? ThreadTimeline{} : current_thread_timeline()),
      start_(std::chrono::steady_clock::now()) {
  if (timeline_.timeline == nullptr) return;
  sent_at_start_ = stats.sent_bytes();
  received_at_start_ = stats.received_bytes;
  encoded_input_at_start_ = stats.encoded_input_bytes;
  encoded_message_at_start_ = stats.encoded_message_bytes;
}

StageTimer::~StageTimer() {
  const auto end = std::chrono::steady_clock::now();
  stage_seconds(stats_, stage_) += std::chrono::duration<double>(end - start_).count();
  if (timeline_.timeline == nullptr) return;
  std::string args;
  const auto add = [&](const char* key, std::uint64_t value) {
    if (value != 0) args += detail::concat(args.empty() ? "" : ",", "\"", key, "\":", value);
  };
  add("bytes", noted_bytes_);
  add("sent_bytes", stats_.sent_bytes() - sent_at_start_);
  add("received_bytes", stats_.received_bytes - received_at_start_);
  add("encoded_input_bytes", stats_.encoded_input_bytes - encoded_input_at_start_);
  add("encoded_message_bytes", stats_.encoded_message_bytes - encoded_message_at_start_);
  try {
    timeline_.timeline->span(timeline_.track, stage_name(stage_), "stage", start_, end, args);
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a trace event; drop it
  }
}

void MalformedHold::agree(Transport& transport, CollectiveStats& stats, std::string_view op,
                          std::string_view name) const {
  if (transport.size() == 1) {
    if (held_) throw *held_;
    return;
  }
  std::vector<std::uint64_t> failed(static_cast<std::size_t>(transport.size()));
  {
    StageTimer timer(stats, Stage::communicate);
    const std::uint64_t mine = held_ ? 1 : 0;
    transport.allgather_u64(std::span<const std::uint64_t>(&mine, 1), failed);
  }
  if (held_) throw *held_;
  std::string who;
  for (std::size_t r = 0; r < failed.size(); ++r) {
    if (failed[r] == 0) continue;
    if (!who.empty()) who += ',';
    who += std::to_string(r);
  }
  GZ_REQUIRE(who.empty(), ErrorCode::malformed_message, op, " of '", name, "' (",
             transport.describe(), "): rank(s) ", who,
             " received malformed messages (their errors say which); the result here is "
             "unspecified");
}

bool transport_pipelines(const Transport& transport) {
  return !transport.waits_complete_whole_batches() && !transport.messages_are_expensive();
}

std::size_t pipeline_segments(const ReduceJob& job, std::size_t max_segments,
                              bool stream_ordered_device) {
  const int ranks = job.transport.size();
  if (ranks == 1) return 1;
  if (job.device.kind == DeviceKind::cuda) {
    if (!stream_ordered_device || !job.stream_ordered || !job.sizes_known) return 1;
  } else if (!transport_pipelines(job.transport)) {
    return 1;
  }
  std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
  for (int c = 0; c < ranks; ++c)
    counts[static_cast<std::size_t>(c)] =
        shard_begin(job.data.size(), ranks, c + 1) - shard_begin(job.data.size(), ranks, c);
  return segments_per_chunk(job.codec, counts, job.segment_bytes, max_segments);
}

void fill_zero(std::span<float> data, Device where) {
  if (where.kind == DeviceKind::cuda) zero_on_device(data.data(), data.size_bytes(), where.index);
  else std::fill(data.begin(), data.end(), 0.0f);
}

void count_encoded(CollectiveStats& stats, std::size_t input_elements, std::size_t message_bytes) {
  stats.encoded_input_bytes += input_elements * sizeof(float);
  stats.encoded_message_bytes += message_bytes;
  stats.compression_ratio = stats.encoded_message_bytes > 0
                                ? static_cast<double>(stats.encoded_input_bytes) /
                                      static_cast<double>(stats.encoded_message_bytes)
                                : 1.0;
}

const Codec& uncompressed_codec() {
  static const std::unique_ptr<Codec> codec = make_codec(CompressionSpec{});
  return *codec;
}

void run_flat_allreduce(ReduceJob& job, Algorithm algo) {
  const AlgorithmRow& row = algo == Algorithm::auto_select
                                ? algorithm_row(codec_row(job.codec.spec().codec).default_path)
                                : algorithm_row(algo);
  GZ_REQUIRE(row.run_flat != nullptr, ErrorCode::invalid_argument, "run_flat_allreduce of '",
             job.name, "': algorithm '", row.name,
             "' is not a flat algorithm (ring, sra, sparse, rhd or tree)");
  job.stats.algorithm = std::string(row.name);
  row.run_flat(job);
}

}  // namespace gradzip::collectives
