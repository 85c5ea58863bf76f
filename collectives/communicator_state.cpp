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

const LinkModel& CommunicatorState::auto_link() {
  if (!link_) link_ = measure_link(*transport_);
  return *link_;
}

const std::optional<AutoHierarchy>& CommunicatorState::auto_hierarchy(std::uint32_t ranks_per_node) {
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
    // 5 ms); a world collective's start-up, measured by auto_link with every rank idle, stands
    // in for them.
    LinkModel across = agreed_link(*transport_, measure_link(*node.inter));
    across.collective_latency_s = auto_link().collective_latency_s;
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

const CodecCost& CommunicatorState::auto_codec_cost(const CompressionSpec& spec) {
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

std::uint32_t CommunicatorState::step_of(std::string_view name) const {
  const auto found = steps_.find(name);
  return found == steps_.end() ? 0 : found->second.step;
}

void CommunicatorState::count_call(std::string_view name) {
  auto found = steps_.find(name);
  if (found == steps_.end()) found = steps_.emplace(std::string(name), NameUse{}).first;
  ++found->second.step;
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
    std::erase_if(steps_, [&](const auto& entry) { return entry.second.last_use < oldest_kept; });
    std::erase_if(tensor_ids_, [&](const auto& entry) { return entry.second.last_use < oldest_kept; });
  }
  residuals_.set_use_clock(call);
}

std::optional<std::string> CommunicatorState::claim_tensor_id(std::string_view name) {
  const std::uint32_t id = tensor_id_of(name);
  const auto [entry, inserted] = tensor_ids_.try_emplace(id, IdUse{std::string(name), calls_started_});
  if (!inserted && entry->second.name != name) return entry->second.name;
  entry->second.last_use = calls_started_;
  return std::nullopt;
}

namespace {

constexpr std::string_view kLinkTerms[] = {"latency_s", "bytes_per_s", "exchange_bytes_per_s",
                                            "collective_latency_s"};
constexpr std::string_view kGammaTerms[] = {"encode_s", "decode_add_s", "add_s"};

}  // namespace

void CommunicatorState::export_auto_model(error_feedback::ResidualStore::Counters& counters) const {
  const auto put = [&](const std::string& name, double value) {
    counters[detail::concat(kAutoPrefix, name)] = std::bit_cast<std::uint64_t>(value);
  };
  const auto put_link = [&](const std::string& prefix, const LinkModel& link) {
    const double terms[] = {link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s,
                            link.collective_latency_s};
    for (std::size_t i = 0; i < std::size(terms); ++i) put(detail::concat(prefix, kLinkTerms[i]), terms[i]);
  };
  if (link_) put_link("link/", *link_);
  for (const auto& [ranks_per_node, hierarchy] : hierarchies_) {
    // Not a candidate: follows from the rank count alone, or (shared memory) from a detection
    // that a restarted run repeats.
    if (!hierarchy) continue;
    put_link(detail::concat("hier/", ranks_per_node, "/intra/"), hierarchy->nodes.intra);
    put_link(detail::concat("hier/", ranks_per_node, "/across/"), hierarchy->across);
    // Nodes of ranks that share memory: their detected size.
    if (ranks_per_node == 0) put("hier/0/ranks_per_node", hierarchy->nodes.ranks_per_node);
  }
  for (const auto& [spec, cost] : codec_costs_) {
    const double terms[] = {cost.encode_s, cost.decode_add_s, cost.add_s};
    for (std::size_t i = 0; i < 3; ++i) put(detail::concat("gamma/", spec, "/", kGammaTerms[i]), terms[i]);
  }
}

void CommunicatorState::import_auto_model(const error_feedback::ResidualStore::Counters& counters,
                                          std::string_view path) {
  // Links by their counter prefix ("link/", "hier/<L>/intra/", "hier/<L>/across/"; L = 0 for
  // nodes of ranks that share memory), with the number of terms read.
  std::map<std::string, std::pair<LinkModel, std::size_t>, std::less<>> links;
  std::map<std::string, CodecCost, std::less<>> costs;
  std::optional<double> shared_memory_node_size;  // "hier/0/ranks_per_node"
  for (const auto& [name, bits] : counters) {
    if (!name.starts_with(kAutoPrefix)) continue;
    const std::string_view rest = std::string_view(name).substr(kAutoPrefix.size());
    const double value = std::bit_cast<double>(bits);
    const std::size_t slash = rest.rfind('/');
    const std::string_view term = slash == std::string_view::npos ? rest : rest.substr(slash + 1);
    bool known = std::isfinite(value) && value >= 0 && slash != std::string_view::npos;
    const std::string_view prefix = known ? rest.substr(0, slash + 1) : std::string_view();
    // "hier/<L>/intra/" or "hier/<L>/across/" with L >= 2 or 0, written as export does.
    std::uint32_t ranks_per_node = 0;
    const bool hier_prefix =
        std::sscanf(std::string(prefix).c_str(), "hier/%u/", &ranks_per_node) == 1 &&
        (ranks_per_node >= 2 || ranks_per_node == 0) &&
        (prefix == detail::concat("hier/", ranks_per_node, "/intra/") ||
         prefix == detail::concat("hier/", ranks_per_node, "/across/"));
    if (known && prefix == "hier/0/" && term == "ranks_per_node") {
      // A detected node size: a whole number of ranks, at least 2.
      known = value >= 2 && value <= INT32_MAX && value == std::floor(value);
      shared_memory_node_size = value;
    } else if (known && (prefix == "link/" || hier_prefix)) {
      auto& [link, read] = links[std::string(prefix)];
      double* const fields[] = {&link.latency_s, &link.bytes_per_s, &link.exchange_bytes_per_s,
                                &link.collective_latency_s};
      const auto at = std::find(std::begin(kLinkTerms), std::end(kLinkTerms), term);
      known = at != std::end(kLinkTerms);
      if (known) *fields[at - std::begin(kLinkTerms)] = value, ++read;
    } else if (known && rest.starts_with("gamma/") && slash > 6) {
      CodecCost& cost = costs[std::string(rest.substr(6, slash - 6))];
      double* const fields[] = {&cost.encode_s, &cost.decode_add_s, &cost.add_s};
      const auto at = std::find(std::begin(kGammaTerms), std::end(kGammaTerms), term);
      known = at != std::end(kGammaTerms);
      if (known) *fields[at - std::begin(kGammaTerms)] = value;
    } else {
      known = false;
    }
    GZ_REQUIRE(known, ErrorCode::io_error, "loading '", path, "': the counter '", name, "' = ",
               value, " is not one of algo=auto's model inputs (", kAutoPrefix,
               "link/<term>, hier/<L>/intra|across/<term> or gamma/<spec>/<term>, a finite "
               "value >= 0; hier/0/ranks_per_node a whole number >= 2)");
  }
  std::map<std::uint32_t, AutoHierarchy> hierarchies;
  for (const auto& [prefix, entry] : links) {
    const auto& [link, read] = entry;
    GZ_REQUIRE(read == std::size(kLinkTerms) && link.bytes_per_s > 0, ErrorCode::io_error,
               "loading '", path, "': algo=auto's link '", kAutoPrefix, prefix, "' is incomplete (",
               read, " of ", std::size(kLinkTerms), " terms, rate ", link.bytes_per_s, " B/s)");
    if (prefix == "link/") continue;
    std::uint32_t ranks_per_node = 0;
    std::sscanf(prefix.c_str(), "hier/%u/", &ranks_per_node);
    AutoHierarchy& hierarchy = hierarchies[ranks_per_node];
    hierarchy.nodes.ranks_per_node = static_cast<int>(ranks_per_node);
    (prefix.ends_with("/intra/") ? hierarchy.nodes.intra : hierarchy.across) = link;
  }
  if (shared_memory_node_size && !hierarchies.contains(0)) hierarchies[0];  // reported below
  for (auto& [ranks_per_node, hierarchy] : hierarchies) {
    const std::string base = detail::concat("hier/", ranks_per_node, "/");
    GZ_REQUIRE(links.contains(base + "intra/") && links.contains(base + "across/"),
               ErrorCode::io_error, "loading '", path, "': algo=auto's node structure '",
               kAutoPrefix, base, "' lacks its ", links.contains(base + "intra/") ? "across" : "intra",
               " link");
    if (ranks_per_node != 0) continue;
    GZ_REQUIRE(shared_memory_node_size.has_value(), ErrorCode::io_error, "loading '", path,
               "': algo=auto's node structure '", kAutoPrefix,
               "hier/0/' (ranks that share memory) lacks its detected size, '", kAutoPrefix,
               "hier/0/ranks_per_node'");
    hierarchy.nodes.ranks_per_node = static_cast<int>(*shared_memory_node_size);
    hierarchy.shared_memory = true;
  }
  forget_auto_choices();
  if (const auto found = links.find("link/"); found != links.end()) link_ = found->second.first;
  for (auto& [spec, cost] : costs) codec_costs_[spec] = cost;
  for (auto& [ranks_per_node, hierarchy] : hierarchies) hierarchies_[ranks_per_node] = hierarchy;
}

void CommunicatorState::save_checkpoint(const std::string& path) const {
  error_feedback::ResidualStore::Counters call_numbers;
  for (const auto& [name, use] : steps_) call_numbers.emplace_hint(call_numbers.end(), name, use.step);
  export_auto_model(call_numbers);
  residuals_.save(path, call_numbers);
}

void CommunicatorState::load_checkpoint(const std::string& path) {
  error_feedback::ResidualStore::Counters counters;
  residuals_.load(path, &counters);
  // The "gradzip.auto/" counters are algo=auto's model inputs, the others call numbers.
  error_feedback::ResidualStore::Counters call_numbers = counters;
  std::erase_if(call_numbers, [](const auto& entry) { return entry.first.starts_with(kAutoPrefix); });
  for (const auto& [name, value] : call_numbers) {
    GZ_REQUIRE(value <= UINT32_MAX, ErrorCode::io_error, "Communicator::load_residuals: '",
               path, "' gives tensor '", name, "' the call number ", value,
               ", beyond the 32-bit counter");
  }
  import_auto_model(counters, path);
  steps_.clear();
  // Loaded names count as used now, so the next window does not release them at once.
  const std::uint64_t now = calls_started_ == 0 ? 0 : calls_started_ - 1;
  for (const auto& [name, value] : call_numbers)
    steps_.emplace_hint(steps_.end(), name, NameUse{static_cast<std::uint32_t>(value), now});
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
  return Communicator(std::make_unique<CommunicatorState>(std::move(transport), std::move(options)));
}

std::uint32_t tensor_id_of(std::string_view name) noexcept {
  const std::uint64_t hash = fingerprint64(name);
  return static_cast<std::uint32_t>(hash >> 32) ^ static_cast<std::uint32_t>(hash);
}

}  // namespace gradzip::collectives
