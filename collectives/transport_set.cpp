// TransportSet (collectives/transport_set.h).
#include "collectives/transport_set.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

std::unique_ptr<Transport> require_transport(std::unique_ptr<Transport> transport) {
  GZ_REQUIRE(transport != nullptr, ErrorCode::invalid_argument,
             "Communicator: the transport is null");
  return transport;
}

}  // namespace

TransportSet::TransportSet(std::unique_ptr<Transport> world, const CommunicatorOptions& options)
    : world_(require_transport(std::move(world))),
      cuda_path_(options.cuda_path),
      deadline_policy_(resolve_deadline_policy(options)) {
  world_->set_deadline_policy(deadline_policy_);
}

TransportSet::NodeTransports& TransportSet::node_transports(std::uint32_t ranks_per_node) {
  if (const auto found = nodes_.find(ranks_per_node); found != nodes_.end()) return found->second;
  const int rank = world_->rank();
  // More ranks per node than ranks: one node (and no int overflow in the division).
  const int per_node =
      static_cast<int>(std::min<std::uint32_t>(ranks_per_node, static_cast<std::uint32_t>(world_->size())));
  NodeTransports node;
  node.intra = ranks_per_node == 0 ? world_->split_by_node() : world_->split(rank / per_node, rank);
  node.inter = world_->split(node.intra->rank(), rank);
  node.intra->set_deadline_policy(deadline_policy_);
  node.inter->set_deadline_policy(deadline_policy_);
  return nodes_.emplace(ranks_per_node, std::move(node)).first->second;
}

std::uint32_t TransportSet::shared_memory_node_size() {
  const std::uint64_t mine = static_cast<std::uint64_t>(node_transports(0).intra->size());
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(world_->size()));
  world_->allgather_u64(std::span<const std::uint64_t>(&mine, 1), sizes);
  const bool one_size =
      std::all_of(sizes.begin(), sizes.end(), [&](std::uint64_t size) { return size == mine; });
  return one_size ? static_cast<std::uint32_t>(mine) : 0;
}

Transport& TransportSet::nccl_transport(int device) {
  if (world_->device_only() >= 0) {
    GZ_REQUIRE(device == world_->device_only(), ErrorCode::internal, "nccl_transport: cuda:",
               device, " on a communicator of cuda:", world_->device_only());
    return *world_;
  }
  if (const auto found = nccl_transports_.find(device); found != nccl_transports_.end())
    return *found->second;
  std::unique_ptr<Transport> made = make_nccl_transport(*world_, device);
  made->set_deadline_policy(deadline_policy_);
  return *nccl_transports_.emplace(device, std::move(made)).first->second;
}

void TransportSet::prepare_device_transport(int device) {
  if (world_->device_only() >= 0) {
    world_->connect_eagerly();
    return;
  }
  if (cuda_path_ == CudaPath::staged || !nccl_transport_built()) return;
  nccl_transport(device).connect_eagerly();
}

}  // namespace gradzip::collectives
