#include "collectives/transport/self_transport.h"

#include <algorithm>
#include <cstring>

#include "gradzip/error.h"

namespace gradzip::collectives {

void SelfTransport::require_self(int peer, const char* op) const {
  GZ_REQUIRE(peer == 0, ErrorCode::invalid_argument, op, " on ", describe(), ": peer ", peer,
             " does not exist (the only rank is 0)");
}

Transport::Request SelfTransport::isend(int peer, int tag, std::span<const std::byte> data) {
  require_self(peer, "isend");
  GZ_REQUIRE(data.size() <= kMaxMessageBytes, ErrorCode::invalid_argument, "isend on ", describe(),
             ": ", data.size(), " bytes exceed the message limit");
  queued_[tag].emplace_back(data.begin(), data.end());
  pending_.push_back(Pending{false, tag, {}, data.size(), true});
  return Request{pending_.size() - 1};
}

Transport::Request SelfTransport::irecv(int peer, int tag, std::span<std::byte> buffer) {
  require_self(peer, "irecv");
  pending_.push_back(Pending{true, tag, buffer, 0, true});
  return Request{pending_.size() - 1};
}

std::size_t SelfTransport::wait(Request request) {
  GZ_REQUIRE(request.id < pending_.size() && pending_[request.id].active, ErrorCode::invalid_argument,
             "wait on ", describe(), ": request ", request.id, " is not pending");
  Pending& pending = pending_[request.id];
  pending.active = false;
  std::size_t bytes = pending.bytes;
  if (pending.receive) {
    auto& queue = queued_[pending.tag];
    GZ_REQUIRE(!queue.empty(), ErrorCode::internal, "wait on ", describe(),
               ": a receive of tag ", pending.tag, " has no message sent to match it");
    const std::vector<std::byte> message = std::move(queue.front());
    queue.pop_front();
    GZ_REQUIRE(message.size() <= pending.buffer.size(), ErrorCode::malformed_message, "wait on ",
               describe(), ": a message of ", message.size(), " bytes for a receive buffer of ",
               pending.buffer.size());
    if (!message.empty()) std::memcpy(pending.buffer.data(), message.data(), message.size());
    bytes = message.size();
  }
  if (std::none_of(pending_.begin(), pending_.end(), [](const Pending& p) { return p.active; }))
    pending_.clear();
  return bytes;
}

void SelfTransport::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                               std::span<const std::size_t> counts) {
  GZ_REQUIRE(counts.size() == 1 && counts[0] == mine.size() && all.size() == mine.size(),
             ErrorCode::size_mismatch, "allgatherv on ", describe(), ": ", mine.size(),
             " bytes into ", all.size(), " with ", counts.size(), " counts");
  if (!mine.empty()) std::memmove(all.data(), mine.data(), mine.size());
}

void SelfTransport::alltoallv(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                              std::span<std::byte> recv, std::span<const std::size_t> recv_counts) {
  GZ_REQUIRE(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0] &&
                 send.size() == send_counts[0] && recv.size() == recv_counts[0],
             ErrorCode::size_mismatch, "alltoallv on ", describe(), ": block sizes disagree");
  if (!send.empty()) std::memmove(recv.data(), send.data(), send.size());
}

void SelfTransport::allgather_u64(std::span<const std::uint64_t> mine, std::span<std::uint64_t> all) {
  GZ_REQUIRE(all.size() == mine.size(), ErrorCode::size_mismatch, "allgather_u64 on ", describe(),
             ": ", mine.size(), " words into ", all.size());
  std::copy(mine.begin(), mine.end(), all.begin());
}

void SelfTransport::allreduce_f32_sum(std::span<float> /*data*/) {}  // the sum of one rank

std::unique_ptr<Transport> SelfTransport::split(int color, int /*key*/) {
  GZ_REQUIRE(color >= 0, ErrorCode::invalid_argument, "split on ", describe(), ": color ", color);
  return std::make_unique<SelfTransport>();
}

std::unique_ptr<Transport> SelfTransport::split_by_node() { return std::make_unique<SelfTransport>(); }

}  // namespace gradzip::collectives
