// Helpers of the multi-rank tests (run under mpirun; MPI is initialised by mpi_test_main.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/transport/transport.h"
#include "gradzip/compression_spec.h"

namespace gradzip::testing {

int world_rank();
int world_size();

// True when `bytes` is byte-identical on every rank of MPI_COMM_WORLD (sizes and a 64-bit hash
// are all-gathered and compared). Collective: every rank must call it.
bool identical_on_all_ranks(std::span<const std::byte> bytes);
bool identical_on_all_ranks(std::span<const float> values);

// Rank r's contribution: small integers in [-range, range] stored as floats, so any sum over up
// to 2^24 / range ranks is exact in f32 and equals the f64 sum. Deterministic in (seed, rank).
std::vector<float> integer_contribution(std::size_t count, int rank, std::uint64_t seed,
                                        int range = 1000);
// Rank r's contribution drawn from N(0, 1), deterministic in (seed, rank).
std::vector<float> gaussian_contribution(std::size_t count, int rank, std::uint64_t seed);

// The exact (f64) element-wise sum over ranks 0 .. ranks-1 of `contribution(count, r, seed)`,
// computed locally on every rank.
std::vector<double> exact_sum(std::size_t count, int ranks, std::uint64_t seed,
                              std::vector<float> (*contribution)(std::size_t, int, std::uint64_t));

// The smallest cosine_estimate (compressors/codec_descriptor.h) of `spec`'s codec over the
// inputs contribution(count, r, seed)[begin, end) of ranks 0 .. ranks-1, computed locally.
double smallest_cosine_estimate(const CompressionSpec& spec, std::size_t count, int ranks,
                                std::uint64_t seed,
                                std::vector<float> (*contribution)(std::size_t, int, std::uint64_t),
                                std::size_t begin, std::size_t end);

// Every rank's `mine` (the same length on every rank), in rank order (MPI_Allgather on
// MPI_COMM_WORLD: a collective).
std::vector<std::vector<float>> gather_all(const std::vector<float>& mine);

// The index of the first element of `data` that differs from the exact sum over `ranks` ranks
// of integer_contribution(data.size(), r, seed), or data.size() when every element equals it
// (integer contributions: every f32 partial sum is exact, whatever the order).
std::size_t first_difference_from_integer_sum(std::span<const float> data, int ranks,
                                              std::uint64_t seed);

// A directory of this process's own (`<temp>/<prefix>-<pid>`), removed with its files when the
// object goes: checkpoints of one rank per test.
class ScratchDirectory {
 public:
  explicit ScratchDirectory(const std::string& prefix);
  ~ScratchDirectory();
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A transport that forwards every call to an inner one. Tests that damage messages derive from
// it and override only the calls they tamper with (always on every rank alike, so every rank
// fails at the same step and none waits for another).
class ForwardingTransport : public collectives::Transport {
 public:
  explicit ForwardingTransport(collectives::Transport& inner) : inner_(&inner) {}
  explicit ForwardingTransport(std::unique_ptr<collectives::Transport> owned)
      : owned_(std::move(owned)), inner_(owned_.get()) {}

  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  std::string describe() const override { return inner_->describe(); }
  Request isend(int peer, int tag, std::span<const std::byte> data) override {
    return inner_->isend(peer, tag, data);
  }
  Request irecv(int peer, int tag, std::span<std::byte> buffer) override {
    return inner_->irecv(peer, tag, buffer);
  }
  std::size_t wait(Request request) override { return inner_->wait(request); }
  void allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                  std::span<const std::size_t> counts) override {
    inner_->allgatherv(mine, all, counts);
  }
  void alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                 std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    inner_->alltoallv(send, send_counts, recv, recv_counts);
  }
  void allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) override {
    inner_->allgather_u64(mine, all);
  }
  void allreduce_f32_sum(std::span<float> data) override { inner_->allreduce_f32_sum(data); }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<collectives::Transport> split(int color, int key) override {
    return inner_->split(color, key);
  }
  std::unique_ptr<collectives::Transport> split_by_node() override {
    return inner_->split_by_node();
  }
  bool waits_complete_whole_batches() const noexcept override {
    return inner_->waits_complete_whole_batches();
  }
  bool moves_device_memory() const noexcept override { return inner_->moves_device_memory(); }
  int device_only() const noexcept override { return inner_->device_only(); }
  void start_posted() override { inner_->start_posted(); }
  bool orders_with_streams() const noexcept override { return inner_->orders_with_streams(); }
  void begin_stream_order(void* work_stream) override { inner_->begin_stream_order(work_stream); }
  void end_stream_order() noexcept override { inner_->end_stream_order(); }
  void wait_for_stream(std::string_view op) override { inner_->wait_for_stream(op); }

 protected:
  collectives::Transport& inner() const { return *inner_; }

 private:
  std::unique_ptr<collectives::Transport> owned_;
  collectives::Transport* inner_;
};

// Forwards to `inner` and calls received(buffer, bytes) once each point-to-point receive has
// completed (its wait returned), in the order this rank completes them: tests that damage
// received messages override it.
class ReceiveWatchingTransport : public ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Request irecv(int peer, int tag, std::span<std::byte> buffer) override {
    const Request request = inner().irecv(peer, tag, buffer);
    receive_buffers_[request.id] = buffer;
    return request;
  }
  std::size_t wait(Request request) override {
    const auto receive = receive_buffers_.find(request.id);
    std::span<std::byte> buffer;
    if (receive != receive_buffers_.end()) {
      buffer = receive->second;
      receive_buffers_.erase(receive);
    }
    const std::size_t bytes = inner().wait(request);
    if (!buffer.empty()) received(buffer, bytes);
    return bytes;
  }

 protected:
  virtual void received(std::span<std::byte> buffer, std::size_t bytes) = 0;

 private:
  std::map<std::size_t, std::span<std::byte>> receive_buffers_;
};

// Forwards to `inner`; the last rank damages the messages it sends with any of `tags` (one
// phase of a point-to-point algorithm): a flipped magic byte, or 64 bytes more than the message
// (longer than any receive buffer sized for it). The damaged copies live as long as the
// transport, so make it outlive every wait on them.
class TagDamagingTransport final : public ForwardingTransport {
 public:
  enum class Damage { bad_magic, too_long };
  TagDamagingTransport(collectives::Transport& inner, std::vector<int> tags, Damage damage)
      : ForwardingTransport(inner), tags_(std::move(tags)), damage_(damage) {}

  std::string describe() const override { return "damaging " + inner().describe(); }
  Request isend(int peer, int tag, std::span<const std::byte> data) override {
    if (std::find(tags_.begin(), tags_.end(), tag) == tags_.end() || rank() != size() - 1)
      return inner().isend(peer, tag, data);
    std::vector<std::byte>& copy = copies_.emplace_back(data.begin(), data.end());
    if (damage_ == Damage::bad_magic) copy[0] ^= std::byte{0xFF};
    else copy.resize(copy.size() + 64, std::byte{0});
    return inner().isend(peer, tag, copy);
  }

 private:
  std::vector<int> tags_;
  Damage damage_;
  std::deque<std::vector<std::byte>> copies_;
};

}  // namespace gradzip::testing
