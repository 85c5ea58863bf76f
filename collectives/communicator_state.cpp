// CommunicatorState (collectives/communicator_state.h): what one Communicator keeps between
// calls: its transports (host, NCCL per device, node groups), the codec and algo=auto caches,
// the residual store and call numbers, algo=auto's measured model inputs, and the checkpoint
// that holds the last three.
#include "collectives/communicator_state.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call_check.h"
#include "collectives/link_calibration.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {

namespace {

std::unique_ptr<Transport> require_transport(std::unique_ptr<Transport> transport) {
  GZ_REQUIRE(transport != nullptr, ErrorCode::invalid_argument,
             "Communicator: the transport is null");
  return transport;
}

// GRADZIP_COMPRESSOR when it is set (to anything, its default "none" included, so that it can
// switch compression off), else the options' default. Presence is asked of the environment
// directly because kernels/tunables.h reports values only, not whether a variable is set.
CompressionSpec resolve_default_spec(const CommunicatorOptions& options) {
  const bool from_environment = std::getenv("GRADZIP_COMPRESSOR") != nullptr;
  const std::string text = from_environment ? kernels::tunable_value("GRADZIP_COMPRESSOR")
                                            : options.default_spec;
  try {
    return CompressionSpec::parse(text);
  } catch (const Error& error) {
    GZ_THROW(error.code(), "Communicator: the default spec '", text, "' from ",
             from_environment ? "GRADZIP_COMPRESSOR" : "CommunicatorOptions::default_spec",
             " does not parse: ", error.what());
  }
}

// The link of GRADZIP_LINK when it is set (presence is asked of the environment directly:
// kernels/tunables.h reports values only), else of CommunicatorOptions::link_*; nullopt when
// neither gives one (algo=auto then measures it).
std::optional<LinkModel> resolve_link(const CommunicatorOptions& options) {
  if (std::getenv("GRADZIP_LINK") != nullptr)
    return parse_link_variable(kernels::tunable_value("GRADZIP_LINK"));
  return given_link(options.link_latency_us, options.link_gbps, options.link_exchange_gbps);
}

}  // namespace

CommunicatorState::CommunicatorState(std::unique_ptr<Transport> transport, CommunicatorOptions options)
    : transport_(require_transport(std::move(transport))),
      default_spec_(resolve_default_spec(options)),
      residuals_(static_cast<std::uint32_t>(transport_->size()),
                 static_cast<std::uint32_t>(transport_->rank()), ResizePolicy::error),
      cuda_path_(options.cuda_path),
      release_window_(options.release_unused_after_calls) {
  deadline_policy_ = resolve_deadline_policy(options);
  transport_->set_deadline_policy(deadline_policy_);
  link_ = resolve_link(options);
}

const LinkModel& CommunicatorState::model_link() {
  if (!link_) link_ = measure_link(*transport_);
  return *link_;
}

const std::optional<AutoHierarchy>& CommunicatorState::model_hierarchy(std::uint32_t ranks_per_node) {
  if (const auto found = hierarchies_.find(ranks_per_node); found != hierarchies_.end())
    return found->second;
  const int ranks = transport_->size();
  std::optional<AutoHierarchy> hierarchy;
  // Nodes of ranks_per_node consecutive ranks, or for 0 the ranks that share memory
  // (node_transports), whose size every rank learns here: a candidate only when all nodes
  // have one size (shared_memory_node_size says 0 otherwise).
  const std::uint32_t node_size = ranks_per_node == 0 && may_form_nodes(ranks, 0)
                                      ? shared_memory_node_size()
                                      : ranks_per_node;
  if (forms_nodes(ranks, node_size)) {
    NodeTransports& node = node_transports(ranks_per_node);
    const LinkModel intra = agreed_link(*transport_, measure_link(*node.intra));
    // All inter groups at once, as the hierarchical all-reduce runs them: each gets its share
    // of the node's link. Their collective start-ups are not taken from this measurement: a
    // group that measures them while another still moves its large rounds waits behind those
    // in the link's queue (on the emulated cluster the groups' figures varied from 0.1 to
    // 5 ms); a world collective's start-up, measured by model_link with every rank idle, stands
    // in for them.
    LinkModel across = agreed_link(*transport_, measure_link(*node.inter));
    across.collective_latency_s = model_link().collective_latency_s;
    hierarchy = AutoHierarchy{HierarchyModel{static_cast<int>(node_size), intra}, across,
                              ranks_per_node == 0};
  }
  return hierarchies_.emplace(ranks_per_node, hierarchy).first->second;
}

std::uint32_t CommunicatorState::shared_memory_node_size() {
  const std::uint64_t mine = static_cast<std::uint64_t>(node_transports(0).intra->size());
  std::vector<std::uint64_t> sizes(static_cast<std::size_t>(transport_->size()));
  transport_->allgather_u64(std::span<const std::uint64_t>(&mine, 1), sizes);
  const bool one_size =
      std::all_of(sizes.begin(), sizes.end(), [&](std::uint64_t size) { return size == mine; });
  return one_size ? static_cast<std::uint32_t>(mine) : 0;
}

const AllreduceChoice* CommunicatorState::cached_auto_choice(std::string_view spec_text,
                                                            std::size_t count) const {
  const auto spec = auto_choices_.find(spec_text);
  if (spec == auto_choices_.end()) return nullptr;
  const auto found = spec->second.find(count);
  return found == spec->second.end() ? nullptr : &found->second;
}

const AllreduceChoice& CommunicatorState::cache_auto_choice(std::string_view spec_text,
                                                            std::size_t count,
                                                            AllreduceChoice choice) {
  if (auto_choice_count_ >= kMaxCachedChoices) forget_auto_choices();
  auto spec = auto_choices_.find(spec_text);
  if (spec == auto_choices_.end())
    spec = auto_choices_.emplace(std::string(spec_text), std::map<std::size_t, AllreduceChoice>{}).first;
  const auto [stored, added] = spec->second.insert_or_assign(count, std::move(choice));
  if (added) ++auto_choice_count_;
  return stored->second;
}

const CodecCost& CommunicatorState::model_codec_cost(const CompressionSpec& spec) {
  const std::string key = spec.to_string();
  if (const auto found = codec_costs_.find(key); found != codec_costs_.end()) return found->second;
  if (codec_costs_.size() >= kMaxCachedCodecs) codec_costs_.clear();
  const CodecCost cost = agreed_codec_cost(*transport_, codec_for(spec));
  return codec_costs_.emplace(key, cost).first->second;
}

Transport& CommunicatorState::nccl_transport(int device) {
  if (transport_->device_only() >= 0) {
    GZ_REQUIRE(device == transport_->device_only(), ErrorCode::internal, "nccl_transport: cuda:",
               device, " on a communicator of cuda:", transport_->device_only());
    return *transport_;
  }
  if (const auto found = nccl_transports_.find(device); found != nccl_transports_.end())
    return *found->second;
  std::unique_ptr<Transport> made = make_nccl_transport(*transport_, device);
  made->set_deadline_policy(deadline_policy_);
  return *nccl_transports_.emplace(device, std::move(made)).first->second;
}

void CommunicatorState::prepare_device_transport(int device) {
  if (transport_->device_only() >= 0) {
    transport_->connect_eagerly();
    return;
  }
  if (cuda_path_ == CudaPath::staged || !nccl_transport_built()) return;
  nccl_transport(device).connect_eagerly();
}

float* CommunicatorState::device_f32_scratch(int device, std::size_t count) {
  std::unique_ptr<DeviceAllocation>& scratch = device_scratch_[device];
  const std::size_t bytes = count * sizeof(float);
  if (scratch == nullptr || scratch->size() < bytes) {
    scratch.reset();  // free the old block before taking the larger one
    scratch = std::make_unique<DeviceAllocation>(bytes, device, "device f32 scratch");
  }
  return reinterpret_cast<float*>(scratch->data());
}

std::uint32_t CommunicatorState::call_number_of(std::string_view name) const {
  const auto found = call_numbers_.find(name);
  return found == call_numbers_.end() ? 0 : found->second.call_number;
}

void CommunicatorState::count_call(std::string_view name) {
  auto found = call_numbers_.find(name);
  if (found == call_numbers_.end()) found = call_numbers_.emplace(std::string(name), NameUse{}).first;
  ++found->second.call_number;
  found->second.last_use = calls_started_ - 1;  // the call start_call opened
}

void CommunicatorState::start_call() {
  const std::uint64_t call = calls_started_++;
  if (release_window_ != 0 && call != 0 && call % release_window_ == 0) {
    // The window [call - N, call) just ended: forget what it did not use.
    const std::uint64_t oldest_kept = call - release_window_;
    std::vector<std::string> released;
    residuals_.release_unused_before(oldest_kept, &released);
    released_residuals_ += released.size();
    if (!released.empty() && !warned_release_) {
      // Once per communicator: a name that comes back starts error feedback anew, which is
      // right for a tensor that is gone but wrong for one only paused (say, by a long
      // evaluation loop of other all-reduces), so the first release is said aloud.
      warned_release_ = true;
      std::string names;
      for (std::size_t i = 0; i < released.size() && i < 5; ++i)
        names += detail::concat(i == 0 ? "" : ", ", "'", released[i], "'");
      if (released.size() > 5) names += detail::concat(" and ", released.size() - 5, " more");
      std::fprintf(stderr,
                   "gradzip: warning: released the error-feedback residuals of %s (rank %d): no "
                   "call used them for %llu calls of this communicator "
                   "(CommunicatorOptions::release_unused_after_calls); such a name that comes "
                   "back starts with zero residuals. Set release_unused_after_calls = 0 to keep "
                   "every residual. (Said once per communicator.)\n",
                   names.c_str(), transport_->rank(),
                   static_cast<unsigned long long>(release_window_));
    }
    std::erase_if(call_numbers_, [&](const auto& entry) { return entry.second.last_use < oldest_kept; });
    stream_claims_.release_unused_before(oldest_kept);
  }
  residuals_.set_use_clock(call);
}

std::optional<std::string> CommunicatorState::claim_random_stream(std::uint64_t seed,
                                                                 std::string_view name) {
  return stream_claims_.claim(seed, name, calls_started_);
}

AutoModelInputs CommunicatorState::auto_model_inputs() const {
  AutoModelInputs inputs;
  inputs.link = link_;
  for (const auto& [ranks_per_node, hierarchy] : hierarchies_) {
    // Not a candidate: follows from the rank count alone, or (shared memory) from a detection
    // that a restarted run repeats.
    if (hierarchy) inputs.hierarchies.emplace(ranks_per_node, *hierarchy);
  }
  for (const auto& [spec, cost] : codec_costs_) inputs.codec_costs.emplace(spec, cost);
  return inputs;
}

void CommunicatorState::adopt_auto_model_inputs(const AutoModelInputs& inputs) {
  forget_auto_choices();
  if (inputs.link) link_ = inputs.link;
  for (const auto& [spec, cost] : inputs.codec_costs) codec_costs_[spec] = cost;
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) hierarchies_[ranks_per_node] = hierarchy;
}

void CommunicatorState::save_checkpoint(const std::string& path) const {
  CommunicatorCheckpoint checkpoint;
  for (const auto& [name, use] : call_numbers_)
    checkpoint.call_numbers.emplace_hint(checkpoint.call_numbers.end(), name, use.call_number);
  checkpoint.auto_model = auto_model_inputs();
  save_communicator_checkpoint(path, residuals_, checkpoint);
}

void CommunicatorState::load_checkpoint(const std::string& path) {
  const CommunicatorCheckpoint checkpoint = load_communicator_checkpoint(path, residuals_);
  adopt_auto_model_inputs(checkpoint.auto_model);
  call_numbers_.clear();
  // Loaded names count as used now, so the next window does not release them at once.
  const std::uint64_t now = calls_started_ == 0 ? 0 : calls_started_ - 1;
  for (const auto& [name, call_number] : checkpoint.call_numbers)
    call_numbers_.emplace_hint(call_numbers_.end(), name, NameUse{call_number, now});
}

const Codec& CommunicatorState::codec_for(const CompressionSpec& spec) {
  const std::string key = spec.to_string();
  if (const auto found = codecs_.find(key); found != codecs_.end()) return *found->second;
  if (codecs_.size() >= kMaxCachedCodecs) codecs_.clear();
  return *codecs_.emplace(key, make_codec(spec)).first->second;
}

CommunicatorState::NodeTransports& CommunicatorState::node_transports(std::uint32_t ranks_per_node) {
  if (const auto found = nodes_.find(ranks_per_node); found != nodes_.end()) return found->second;
  const int rank = transport_->rank();
  // More ranks per node than ranks: one node (and no int overflow in the division).
  const int per_node =
      static_cast<int>(std::min<std::uint32_t>(ranks_per_node, static_cast<std::uint32_t>(transport_->size())));
  NodeTransports node;
  node.intra = ranks_per_node == 0 ? transport_->split_by_node()
                                   : transport_->split(rank / per_node, rank);
  node.inter = transport_->split(node.intra->rank(), rank);
  node.intra->set_deadline_policy(deadline_policy_);
  node.inter->set_deadline_policy(deadline_policy_);
  return nodes_.emplace(ranks_per_node, std::move(node)).first->second;
}

Communicator make_communicator(std::unique_ptr<Transport> transport, CommunicatorOptions options) {
  return CommunicatorAccess::wrap(
      std::make_unique<CommunicatorState>(std::move(transport), std::move(options)));
}

}  // namespace gradzip::collectives
