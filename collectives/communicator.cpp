// The public Communicator: per call it checks the arguments, runs the call check
// (collectives/call_check.h), makes the f32 working buffer (f16 / bf16 converted, divided by
// the rank count for ReduceOp::average), picks the algorithm (collectives/algorithm_choice.h),
// runs it with this communicator's residual store, writes the result back, and returns the
// stats.
#include "gradzip/communicator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithm_choice.h"
#include "collectives/algorithm_table.h"
#include "collectives/call_check.h"
#include "collectives/codec_table.h"
#include "collectives/collective_job.h"
#include "collectives/communicator_state.h"
#include "collectives/device_memory.h"
#include "collectives/link_calibration.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/nonfinite_cpu.h"
#include "kernels/tunables.h"

namespace gradzip {
namespace collectives {
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

constexpr std::string_view kAutoPrefix = "gradzip.auto/";
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

std::string allgather_residual_key(std::string_view name) {
  return std::string("allgather:") + std::string(name);
}

namespace {

// One call as the user made it.
struct Call {
  CollectiveKind kind = CollectiveKind::allreduce;
  TensorView tensor;
  std::string_view name;
  ReduceOp op = ReduceOp::sum;
  std::optional<CompressionSpec> spec;  // empty when the spec text did not parse
  std::string spec_text;                // canonical when it parsed, else as given
  std::optional<Error> error;           // this rank's first argument error
  // The step given by the caller (allreduce_at_step); empty: the name's call number.
  std::optional<std::uint32_t> explicit_step;
  // Set by begin_call: the ranks whose input holds NaN or Inf (the same on every rank).
  std::vector<NonfiniteInput> nonfinite;
  // Set by begin_call: counting the non-finite input of a CUDA tensor waited for the thread's
  // work stream, so the work queued before the call is done (open_call_memory skips its wait).
  bool device_work_finished = false;
  // Set by begin_call: the input elements, summed over ranks, beyond what the spec's 16-bit
  // wire type carries through the reduction (wire_range_limit); > 0 runs the call uncompressed.
  std::uint64_t beyond_wire_range = 0;
};

Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   const CompressionSpec& spec) {
  return Call{kind, tensor, name, op, spec, spec.to_string(), std::nullopt, std::nullopt, {}, false, 0};
}

Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   std::string_view spec_text) {
  Call call{kind, tensor, name, op, std::nullopt, std::string(spec_text), std::nullopt,
            std::nullopt, {}, false, 0};
  try {
    call.spec = CompressionSpec::parse(spec_text);
    call.spec_text = call.spec->to_string();
  } catch (const Error& error) {
    call.error = error;
  }
  return call;
}

void check_arguments(const Call& call) {
  const std::string_view op = collective_kind_name(call.kind);
  const TensorView& tensor = call.tensor;
  GZ_REQUIRE(!call.name.empty(), ErrorCode::invalid_argument, op,
             ": the tensor name is empty (it keys error feedback and the mismatch check)");
  // Checkpoints store call numbers under the tensor names, next to algo=auto's inputs.
  GZ_REQUIRE(!call.name.starts_with(kAutoPrefix), ErrorCode::invalid_argument, op,
             ": the tensor name '", call.name, "' starts with '", kAutoPrefix,
             "', which checkpoints reserve for algo=auto's model inputs");
  if (tensor.device.kind == DeviceKind::cuda && tensor.count > 0) {
    GZ_REQUIRE(device_memory_built(), ErrorCode::unsupported, op, " of '", call.name,
               "': the tensor is on CUDA device ", tensor.device.index,
               "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
    require_device_pointer(tensor.data, tensor.device.index, std::string(op) + " of '" +
                           std::string(call.name) + "'", "the tensor");
  }
  GZ_REQUIRE(tensor.dtype == DType::f32 || tensor.dtype == DType::f16 || tensor.dtype == DType::bf16,
             ErrorCode::invalid_argument, op, " of '", call.name, "': dtype ",
             static_cast<int>(tensor.dtype), " is not f32, f16 or bf16");
  GZ_REQUIRE(tensor.data != nullptr || tensor.count == 0, ErrorCode::invalid_argument, op,
             " of '", call.name, "': null data for ", tensor.count, " elements");
}

// The call check's memory field (collectives/call_check.h).
std::uint64_t memory_field(const CommunicatorState& state, const TensorView& tensor) {
  if (tensor.device.kind == DeviceKind::cpu) return 0;
  return 1 + static_cast<std::uint64_t>(state.cuda_path());
}

// The largest magnitude an input element may have for the spec's 16-bit wire values (fp16 and
// bf16, top-k and random-k with values=fp16) to carry the whole reduction without saturating
// anywhere: the type's largest finite value for an average (every rank's values are divided by
// the rank count first, so every partial sum of them is at most the largest input) and for an
// all-gather (no sums), that over the rank count for a sum (a partial sum of up to P inputs).
// Conservative: a call may fall back although its actual sums would have fitted. 0: the spec
// narrows nothing.
float wire_range_limit(const CompressionSpec& spec, CollectiveKind kind, ReduceOp op, int ranks) {
  constexpr float kF16Max = 65504.0f;
  constexpr float kBf16Max = 3.38953139e38f;  // 0x7F7F0000
  const DType wire = wire_value_type(spec);
  if (wire == DType::f32) return 0.0f;
  const float type_max = wire == DType::f16 ? kF16Max : kBf16Max;
  const bool sums = kind != CollectiveKind::allgather && op == ReduceOp::sum;
  return sums ? type_max / static_cast<float>(std::max(ranks, 1)) : type_max;
}

// Checks the arguments, runs the call check with every rank, and counts the call. Returns the
// call's step. Throws on every rank when any rank's arguments are bad or the ranks disagree.
std::uint32_t begin_call(CommunicatorState& state, Call& call) {
  if (!call.error) {
    try {
      check_arguments(call);
      const int only = state.transport().device_only();
      GZ_REQUIRE(only < 0 || (call.tensor.device.kind == DeviceKind::cuda &&
                              call.tensor.device.index == only),
                 ErrorCode::invalid_argument, collective_kind_name(call.kind), " of '", call.name,
                 "': this communicator was made from an ncclComm_t of cuda:", only,
                 " and reduces tensors of that device only; the tensor is ",
                 call.tensor.device.kind == DeviceKind::cpu
                     ? std::string("in host memory")
                     : detail::concat("on cuda:", call.tensor.device.index));
      if (const std::optional<std::string> other = state.claim_tensor_id(call.name)) {
        GZ_THROW(ErrorCode::invalid_argument, collective_kind_name(call.kind), " of '", call.name,
                 "': the name's tensor id 0x", std::hex, tensor_id_of(call.name), std::dec,
                 " (a 32-bit hash that keys the random streams) is also that of '", *other,
                 "', which this communicator uses: the two would draw the same random numbers. "
                 "Rename one of them");
      }
    } catch (const Error& error) {
      call.error = error;
    }
  }
  // This rank's non-finite input, counted only when its arguments are valid (a bad pointer
  // must not be read): the whole tensor, or for an all-gather the rank's own shard.
  NonfiniteInput mine;
  // Elements a narrowing wire type would saturate (host and CUDA tensors alike).
  std::uint64_t beyond = 0;
  if (!call.error && call.tensor.count > 0) {
    try {
      const Transport& transport = state.transport();
      const bool shard_only = call.kind == CollectiveKind::allgather;
      const std::size_t begin =
          shard_only ? shard_begin(call.tensor.count, transport.size(), transport.rank()) : 0;
      const std::size_t end = shard_only ? shard_begin(call.tensor.count, transport.size(),
                                                       transport.rank() + 1)
                                         : call.tensor.count;
      const float limit = call.spec ? wire_range_limit(*call.spec, call.kind, call.op,
                                                       transport.size())
                                    : 0.0f;
      if (call.tensor.device.kind == DeviceKind::cuda) {
        const NonfiniteOnDevice found = count_nonfinite_on_device(call.tensor, begin, end, limit);
        mine = NonfiniteInput{0, found.count, begin + found.first};
        beyond = found.beyond;
        call.device_work_finished = found.work_stream_drained;
      } else {
        if (limit > 0.0f) {
          const kernels::cpu::RangeCount found =
              kernels::cpu::count_nonfinite_and_beyond(call.tensor, begin, end - begin, limit);
          mine = NonfiniteInput{0, found.nonfinite.count, begin + found.nonfinite.first};
          beyond = found.beyond;
        } else {
          const kernels::cpu::NonfiniteCount found =
              kernels::cpu::count_nonfinite(call.tensor, begin, end - begin);
          mine = NonfiniteInput{0, found.count, begin + found.first};
        }
      }
    } catch (const Error& error) {
      call.error = error;
    }
  }
  state.start_call();
  const std::uint32_t step = call.explicit_step ? *call.explicit_step : state.step_of(call.name);
  call.nonfinite =
      check_call(state.transport(),
                 CallDescription{call.kind, call.name, call.tensor.count, call.tensor.dtype, call.op,
                                 call.spec_text, step, memory_field(state, call.tensor),
                                 call.error ? &*call.error : nullptr, mine.count, mine.first,
                                 beyond},
                 &call.beyond_wire_range);
  if (!call.explicit_step) state.count_call(call.name);
  return step;
}

CollectiveStats start_stats(const Call& call, const Transport& transport) {
  CollectiveStats stats;
  stats.spec = call.spec_text;
  stats.count = call.tensor.count;
  stats.ranks = transport.size();
  return stats;
}

// Where one call's f32 working values live and what moves them. Host tensors: the tensor
// itself (f32) or the state's f32 scratch, over the host transport. CUDA tensors run on device
// memory over NCCL (or CUDA-aware MPI) when cuda_route allows it, else they are staged: copied
// into the state's host staging buffer and then treated as a host tensor.
struct CallMemory {
  Transport* transport = nullptr;
  Device device{};          // cuda: data is device memory (NCCL or CUDA-aware MPI)
  std::span<float> data;    // the f32 values the algorithm works on
  TensorView host;          // host paths: the host-side tensor (the user's, or the staging copy)
};

// How a CUDA tensor's call travels.
struct CudaRoute {
  enum class Kind { nccl, cuda_aware_mpi, staged } kind = Kind::staged;
  std::string why_staged;  // for Kind::staged: the reason, for the stats' note
};

// The route of a CUDA call whose algorithm is `algorithm` (nullopt: the uncompressed transport
// sum) under `spec`: on device memory over NCCL when the build has it, else over the host
// transport when MPI is CUDA-aware, else staged; random-k's shared-index path
// (`shared_index`), the hierarchical, halving/doubling and tree all-reduces and cuda_path
// staged are always staged. The same on every rank: the call check has compared everything that decides it (spec, count,
// step, cuda_path; the build and MPI library are the same everywhere). cuda_path nccl in a
// build without NCCL throws unsupported.
CudaRoute cuda_route(const CommunicatorState& state, const CompressionSpec& spec,
                     std::optional<Algorithm> algorithm, bool shared_index = false) {
  const auto staged = [&](std::string why) {
    GZ_REQUIRE(state.transport().device_only() < 0, ErrorCode::unsupported,
               "this communicator was made from an ncclComm_t and has no host transport, but ",
               why);
    return CudaRoute{CudaRoute::Kind::staged, std::move(why)};
  };
  if (state.cuda_path() == CudaPath::staged) return staged("cuda_path is staged");
  GZ_REQUIRE(state.cuda_path() != CudaPath::nccl || nccl_transport_built(), ErrorCode::unsupported,
             "cuda_path is nccl, but this gradzip was built without NCCL");
  if (algorithm) {
    const AlgorithmRow& row =
        shared_index ? algorithm_row(ModeledAlgorithm::randk) : algorithm_row(*algorithm);
    if (!row.host_only_reason.empty()) return staged(std::string(row.host_only_reason));
  }
  if (nccl_transport_built()) {
    // NCCL receives exactly the size the sender sends, and the ring does not exchange sizes.
    if (algorithm && *algorithm == Algorithm::ring && message_size_varies(spec))
      return staged(detail::concat("approximate ", codec_kind_name(spec.codec),
                                   " messages vary in size, which the ring over NCCL cannot receive"));
    return CudaRoute{CudaRoute::Kind::nccl, ""};
  }
  if (state.cuda_path() == CudaPath::automatic &&
      state.transport().moves_device_memory())
    return CudaRoute{CudaRoute::Kind::cuda_aware_mpi, ""};
  return staged("this build has no NCCL and MPI is not CUDA-aware");
}

// Prepares elements [begin, end) of the call's tensor (the rest is left for the algorithm to
// overwrite). For CUDA tensors `route` (cuda_route) picks the path; every path of a CUDA
// tensor says in the stats' note which it took.
CallMemory open_call_memory(CommunicatorState& state, const Call& call, std::size_t begin,
                            std::size_t end, const CudaRoute& route, CollectiveStats& stats) {
  const TensorView& tensor = call.tensor;
  CallMemory memory;
  memory.transport = &state.transport();
  memory.host = tensor;
  if (tensor.device.kind == DeviceKind::cuda && route.kind != CudaRoute::Kind::staged) {
    const bool nccl = route.kind == CudaRoute::Kind::nccl;
    if (nccl) memory.transport = &state.nccl_transport(tensor.device.index);
    // The transport may read the tensor from a stream of its own: the work that produced it
    // (earlier work of blocking streams, as the contract says) must be done first. Counting
    // the non-finite input already waited for it, with nothing queued since; then one wait
    // is enough.
    if (!call.device_work_finished)
      finish_queued_work(tensor.device.index, "a collective on a CUDA tensor");
    memory.device = tensor.device;
    stats.note += detail::concat(stats.note.empty() ? "" : "; ",
                                 nccl ? "over NCCL" : "over CUDA-aware MPI");
    float* const data = tensor.dtype == DType::f32
                            ? static_cast<float*>(tensor.data)
                            : state.device_f32_scratch(tensor.device.index, tensor.count);
    if (tensor.dtype != DType::f32) widen_on_device(tensor, begin, end, data);
    memory.data = {data, tensor.count};
    return memory;
  }
  if (tensor.device.kind == DeviceKind::cuda) {
    const std::size_t element = dtype_size(tensor.dtype);
    std::vector<std::byte>& staging = state.host_staging();
    if (staging.size() < tensor.size_bytes()) staging.resize(tensor.size_bytes());
    if (end > begin) {
      copy_device_to_host(staging.data() + begin * element,
                          static_cast<const std::byte*>(tensor.data) + begin * element,
                          (end - begin) * element, tensor.device.index, "staging a CUDA tensor");
    }
    stats.note += detail::concat(stats.note.empty() ? "" : "; ", "staged through host memory (",
                                 route.why_staged, ")");
    memory.host = TensorView{staging.data(), tensor.count, tensor.dtype, Device{}};
  }
  if (memory.host.dtype == DType::f32) {
    memory.data = {static_cast<float*>(memory.host.data), tensor.count};
    return memory;
  }
  std::vector<float>& scratch = state.f32_scratch();
  if (scratch.size() < tensor.count) scratch.resize(tensor.count);
  if (end > begin) kernels::cpu::load_as_f32(memory.host, begin, end - begin, scratch.data() + begin);
  memory.data = {scratch.data(), tensor.count};
  return memory;
}

// Elements [begin, end) of the f32 result into the tensor: rounded to nearest even for f16 /
// bf16 (nothing to do for f32, which the algorithm wrote in place), and copied back to the
// device for a staged CUDA tensor.
void close_call_memory(const CallMemory& memory, const TensorView& tensor, std::size_t begin,
                       std::size_t end) {
  if (end <= begin) return;
  if (memory.device.kind == DeviceKind::cuda) {
    if (tensor.dtype != DType::f32) narrow_on_device(memory.data.data(), begin, end, tensor);
    return;
  }
  if (memory.host.dtype != DType::f32)
    kernels::cpu::store_from_f32(memory.data.data() + begin, end - begin, memory.host, begin);
  if (tensor.device.kind == DeviceKind::cuda) {
    const std::size_t element = dtype_size(tensor.dtype);
    copy_host_to_device(static_cast<std::byte*>(tensor.data) + begin * element,
                        static_cast<const std::byte*>(memory.host.data) + begin * element,
                        (end - begin) * element, tensor.device.index, "writing back a CUDA tensor");
  }
}

// ReduceOp::average: every contribution is divided by the rank count before it is encoded or
// summed (reduced-precision sums of undivided gradients overflow at scale). The device path
// divides with the same IEEE division.
void divide_for_average(const CallMemory& memory, ReduceOp op) {
  if (op != ReduceOp::average) return;
  const float divisor = static_cast<float>(memory.transport->size());
  if (memory.device.kind == DeviceKind::cuda) {
    divide_on_device(memory.data.data(), memory.data.size(), divisor, memory.device.index);
    return;
  }
  for (float& value : memory.data) value /= divisor;
}

// The job an algorithm receives: the call memory's transport, data and device; residuals keyed
// by `residual_key` (the algorithms register them, each with the sizes it needs) under this
// call's ef_resize policy; random streams keyed by (spec.seed, step, tensor_id_of(name)).
ReduceJob make_job(CommunicatorState& state, const CompressionSpec& spec, const CallMemory& memory,
                   std::string residual_key, std::string_view name, std::uint32_t step,
                   CollectiveStats& stats) {
  error_feedback::ResidualStore* residuals = nullptr;
  if (spec.error_feedback) {
    residuals = &state.residuals();
    residuals->set_resize_policy(spec.ef_resize);
  }
  const EncodeContext ctx{spec.seed, step, tensor_id_of(name), 0};
  return ReduceJob{*memory.transport, state.codec_for(spec), memory.data, std::move(residual_key),
                   residuals, ctx, stats, memory.device};
}

// The spec of a warm-up call: no compression, no error feedback.
CompressionSpec warmup_spec(const CompressionSpec& spec) {
  CompressionSpec dense;
  dense.codec = CodecKind::none;
  dense.error_feedback = false;
  dense.seed = spec.seed;
  return dense;
}

// Runs one call: the stats header, the call check (which gives the step), then
// body(step, stats), all timed as the call's total.
template <typename Body>
CollectiveStats run_call(CommunicatorState& state, Call& call, Body&& body) {
  CollectiveStats stats = start_stats(call, state.transport());
  // What a timeout report names (collectives/transport/deadline.h): this call, its step and its
  // number among the communicator's calls (begin_call's start_call opens calls_started() + 1).
  const OperationScope operation(CurrentOperation{
      collective_kind_name(call.kind), call.name,
      call.explicit_step ? *call.explicit_step : state.step_of(call.name),
      state.calls_started() + 1, "the call check"});
  {
    StageTimer total(stats.total_seconds);
    const std::uint32_t step = begin_call(state, call);
    set_operation_phase("the data exchange");
    body(step, stats);
  }
  return stats;
}

// The spec a reduce-scatter / all-gather runs with: the call's, or uncompressed in warm-up.
CompressionSpec sharded_spec(const ShardedChoice& choice, const CompressionSpec& spec,
                             CollectiveStats& stats) {
  stats.algorithm = choice.name;
  stats.note = choice.note;
  return choice.warmup ? warmup_spec(spec) : spec;
}

// cuda_route for CUDA tensors; the default (unused) route for host tensors.
CudaRoute route_of(const CommunicatorState& state, const TensorView& tensor,
                   const CompressionSpec& spec, std::optional<Algorithm> algorithm,
                   bool shared_index = false) {
  if (tensor.device.kind != DeviceKind::cuda) return CudaRoute{};
  return cuda_route(state, spec, algorithm, shared_index);
}

// "1,3": the ranks of `inputs`.
std::string rank_list(const std::vector<NonfiniteInput>& inputs) {
  std::string out;
  for (const NonfiniteInput& input : inputs) out += detail::concat(out.empty() ? "" : ",", input.rank);
  return out;
}

// The nonfinite= policy (compression_spec.h) of a call whose input holds NaN or Inf on some
// rank. call.nonfinite came out of the call check, so it is the same on every rank and every
// rank takes the same branch. Returns false when no rank has non-finite input (the call runs
// as usual); else runs the policy and returns true, or throws (nonfinite=error). No branch
// adds, updates or even registers an error-feedback residual (worker or server side): a NaN
// must never reach one.
void run_uncompressed(CommunicatorState& state, const Call& call, std::uint32_t step,
                      CollectiveStats& stats);

bool run_nonfinite_policy(CommunicatorState& state, const Call& call, std::uint32_t step,
                          CollectiveStats& stats) {
  if (call.nonfinite.empty()) return false;
  const CompressionSpec& spec = *call.spec;
  const TensorView& tensor = call.tensor;
  const std::size_t count = tensor.count;
  const std::string ranks = rank_list(call.nonfinite);
  switch (spec.nonfinite) {
    case NonfinitePolicy::error: {
      std::string found;
      for (const NonfiniteInput& input : call.nonfinite) {
        found += detail::concat(found.empty() ? "" : "; ", "rank ", input.rank, ": ", input.count,
                                " non-finite element(s), the first at index ", input.first);
      }
      GZ_THROW(ErrorCode::nonfinite, collective_kind_name(call.kind), " of '", call.name,
               "' on rank ", state.transport().rank(), ": NaN or Inf in the input of rank(s) ",
               ranks, " (", found, "); the spec says nonfinite=error, so nothing was reduced "
               "and the tensor is left as passed");
    }
    case NonfinitePolicy::skip: {
      // Zero bits are +0 in f32, f16 and bf16: the same finite result on every rank.
      if (tensor.device.kind == DeviceKind::cuda) {
        zero_on_device(tensor.data, tensor.size_bytes(), tensor.device.index);
      } else if (count > 0) {
        std::memset(tensor.data, 0, tensor.size_bytes());
      }
      stats.algorithm = "skip";
      stats.skipped = true;
      stats.note = detail::concat("non-finite input on rank(s) ", ranks,
                                  ": skipped (nonfinite=skip), the tensor is zeros on every rank; "
                                  "error feedback untouched");
      return true;
    }
    case NonfinitePolicy::propagate: break;
  }
  // propagate: the raw input, uncompressed, without error feedback, so the NaN / Inf land
  // where a plain all-reduce puts them.
  stats.note = detail::concat("non-finite input on rank(s) ", ranks,
                              ": reduced uncompressed; error feedback untouched");
  run_uncompressed(state, call, step, stats);
  return true;
}

// The wire-range fallback: a call whose spec narrows values to a 16-bit type (fp16, bf16, or
// top-k / random-k with values=fp16) and whose input holds, on some rank, a finite value that
// the narrowing could saturate somewhere in the reduction (wire_range_limit) runs uncompressed
// in f32, with the true values, instead of returning a silently clipped sum; error feedback
// is left untouched. Every rank learned the count through the call check, so every rank takes
// the same branch. Returns whether it ran the call.
bool run_wire_range_fallback(CommunicatorState& state, const Call& call, std::uint32_t step,
                             CollectiveStats& stats) {
  if (call.beyond_wire_range == 0) return false;
  stats.note = detail::concat(call.beyond_wire_range, " input element(s) beyond what ",
                              call.spec->to_string(), "'s 16-bit values carry through this "
                              "reduction (|x| > ", wire_range_limit(*call.spec, call.kind, call.op,
                              state.transport().size()), "): reduced uncompressed in f32 "
                              "(the true values, not a saturated sum); error feedback untouched");
  run_uncompressed(state, call, step, stats);
  return true;
}

// Runs the call with the `none` codec and no error feedback (what nonfinite=propagate and the
// wire-range fallback do): the transport's own sum for an all-reduce, the ring for a
// reduce-scatter, the all-gather for an all-gather.
void run_uncompressed(CommunicatorState& state, const Call& call, std::uint32_t step,
                      CollectiveStats& stats) {
  const CompressionSpec& spec = *call.spec;
  const TensorView& tensor = call.tensor;
  const std::size_t count = tensor.count;
  const CompressionSpec dense = warmup_spec(spec);
  const Transport& transport = state.transport();
  switch (call.kind) {
    case CollectiveKind::allreduce: {
      stats.algorithm = "mpi";
      const CallMemory memory = open_call_memory(state, call, 0, count,
                                                 route_of(state, tensor, dense, std::nullopt), stats);
      divide_for_average(memory, call.op);
      {
        StageTimer communicate(stats.communicate_seconds);
        memory.transport->allreduce_f32_sum(memory.data);
      }
      close_call_memory(memory, tensor, 0, count);
      return;
    }
    case CollectiveKind::reduce_scatter: {
      stats.algorithm = "ring";
      const CallMemory memory = open_call_memory(
          state, call, 0, count, route_of(state, tensor, dense, Algorithm::ring), stats);
      divide_for_average(memory, call.op);
      ReduceJob job = make_job(state, dense, memory, std::string(call.name), call.name, step, stats);
      ring_reduce_scatter(job);
      const Transport& moved_by = *memory.transport;
      close_call_memory(memory, tensor, shard_begin(count, moved_by.size(), moved_by.rank()),
                        shard_begin(count, moved_by.size(), moved_by.rank() + 1));
      return;
    }
    case CollectiveKind::allgather: {
      stats.algorithm = "allgather";
      const CallMemory memory = open_call_memory(
          state, call, shard_begin(count, transport.size(), transport.rank()),
          shard_begin(count, transport.size(), transport.rank() + 1),
          route_of(state, tensor, dense, Algorithm::allgather), stats);
      ReduceJob job = make_job(state, dense, memory, allgather_residual_key(call.name), call.name,
                               step, stats);
      compressed_allgather(job);
      close_call_memory(memory, tensor, 0, count);
      return;
    }
  }
}

CollectiveStats run_allreduce(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_nonfinite_policy(state, call, step, stats)) return;
    if (run_wire_range_fallback(state, call, step, stats)) return;
    const CompressionSpec& spec = *call.spec;
    const std::size_t count = call.tensor.count;
    // algo=auto's model: the link and γ are measured at the first call that needs them (every
    // rank reaches this point in the same call with the same spec, count and step: the call
    // check compared them), then kept.
    // A cached choice is used in place (its name and note are copied once, into the stats);
    // nothing in this call changes the cache.
    AllreduceChoice fixed;
    const AllreduceChoice* chosen = nullptr;
    if (!auto_uses_model(spec, count, step, state.transport().size(),
                         call.tensor.device.kind == DeviceKind::cuda)) {
      fixed = choose_allreduce(spec, count, step);
      chosen = &fixed;
    } else if ((chosen = state.cached_auto_choice(call.spec_text, count)) == nullptr) {
      set_operation_phase("algo=auto's calibration of the link and the codec");
      const LinkModel link = state.auto_link();
      const AutoModel model{state.codec_for(spec), state.auto_codec_cost(spec), link,
                            state.transport().size(), state.auto_hierarchy(spec.ranks_per_node)};
      set_operation_phase("the data exchange");
      chosen = &state.cache_auto_choice(call.spec_text, count,
                                        choose_allreduce(spec, count, step, &model));
    }
    const AllreduceChoice& choice = *chosen;
    stats.algorithm = choice.name;
    stats.note = choice.note;

    std::optional<Algorithm> algorithm;  // nullopt: the transport's own sum
    if (choice.path == AllreducePath::hierarchical) algorithm = Algorithm::hier;
    if (choice.path == AllreducePath::flat) {
      algorithm = choice.algorithm == Algorithm::auto_select ? default_flat_algorithm(spec.codec)
                                                             : choice.algorithm;
    }
    const bool shared_index = choice.path == AllreducePath::flat &&
                              choice.algorithm == Algorithm::auto_select &&
                              codec_row(spec.codec).shared_indices;
    const CallMemory memory =
        open_call_memory(state, call, 0, count,
                         route_of(state, call.tensor, spec, algorithm, shared_index), stats);
    divide_for_average(memory, call.op);
    if (choice.path == AllreducePath::transport_sum) {
      StageTimer communicate(stats.communicate_seconds);
      memory.transport->allreduce_f32_sum(memory.data);
    } else {
      ReduceJob job = make_job(state, spec, memory, std::string(call.name), call.name, step, stats);
      if (choice.path == AllreducePath::flat) {
        run_flat_allreduce(job, choice.algorithm);
      } else {
        CommunicatorState::NodeTransports& node = state.node_transports(spec.ranks_per_node);
        hierarchical_allreduce(job, *node.intra, *node.inter, choice.algorithm);
      }
    }
    close_call_memory(memory, call.tensor, 0, count);
  });
}

CollectiveStats run_reduce_scatter(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_nonfinite_policy(state, call, step, stats)) return;
    if (run_wire_range_fallback(state, call, step, stats)) return;
    const ShardedChoice choice = choose_reduce_scatter(*call.spec, step);
    const CompressionSpec spec = sharded_spec(choice, *call.spec, stats);
    const std::size_t count = call.tensor.count;
    const CallMemory memory = open_call_memory(
        state, call, 0, count, route_of(state, call.tensor, spec, choice.algorithm), stats);
    divide_for_average(memory, call.op);
    ReduceJob job = make_job(state, spec, memory, std::string(call.name), call.name, step, stats);
    if (choice.algorithm == Algorithm::sra)
      sra_reduce_scatter(job);
    else
      ring_reduce_scatter(job);
    const Transport& transport = *memory.transport;
    close_call_memory(memory, call.tensor, shard_begin(count, transport.size(), transport.rank()),
                      shard_begin(count, transport.size(), transport.rank() + 1));
  });
}

CollectiveStats run_allgather(CommunicatorState& state, Call call) {
  return run_call(state, call, [&](std::uint32_t step, CollectiveStats& stats) {
    if (run_nonfinite_policy(state, call, step, stats)) return;
    if (run_wire_range_fallback(state, call, step, stats)) return;
    Transport& transport = state.transport();
    const ShardedChoice choice = choose_allgather(*call.spec, step);
    const CompressionSpec spec = sharded_spec(choice, *call.spec, stats);
    const std::size_t count = call.tensor.count;
    // Only this rank's shard holds data on entry; the algorithm writes every other shard.
    const CallMemory memory = open_call_memory(
        state, call, shard_begin(count, transport.size(), transport.rank()),
        shard_begin(count, transport.size(), transport.rank() + 1),
        route_of(state, call.tensor, spec, Algorithm::allgather), stats);
    ReduceJob job = make_job(state, spec, memory, allgather_residual_key(call.name), call.name,
                             step, stats);
    compressed_allgather(job);
    close_call_memory(memory, call.tensor, 0, count);
  });
}

}  // namespace

CollectiveStats allreduce_at_step(CommunicatorState& state, TensorView tensor, std::string_view name,
                                  const CompressionSpec& spec, ReduceOp op, std::uint32_t step,
                                  const Error* preset_error) {
  CompressionSpec without_warmup = spec;
  without_warmup.warmup = 0;
  Call call = describe_call(CollectiveKind::allreduce, tensor, name, op, without_warmup);
  call.explicit_step = step;
  if (preset_error != nullptr) call.error = *preset_error;
  return run_allreduce(state, std::move(call));
}

CommunicatorState& state_of(Communicator& communicator) noexcept { return *communicator.state_; }

}  // namespace collectives

Communicator Communicator::from_nccl(void* nccl_comm, CommunicatorOptions options) {
  // NCCL for every CUDA call: there is no host transport to stage through.
  options.cuda_path = CudaPath::nccl;
  return collectives::make_communicator(collectives::adopt_nccl_communicator(nccl_comm),
                                        std::move(options));
}

std::string CollectiveStats::to_string() const {
  char numbers[160];
  std::snprintf(numbers, sizeof numbers,
                "ratio=%.2f encode=%.3f ms communicate=%.3f ms decode=%.3f ms total=%.3f ms",
                compression_ratio, encode_seconds * 1e3, communicate_seconds * 1e3,
                decode_seconds * 1e3, total_seconds * 1e3);
  std::string line = detail::concat(
      algorithm.empty() ? "?" : algorithm, " '", spec, "' count=", count, " ranks=", ranks,
      " sent=", sent_bytes(), " B (header ", sent_header_bytes, ", index ", sent_index_bytes,
      ", payload ", sent_payload_bytes, ") received=", received_bytes, " B ", numbers);
  if (!note.empty()) line += " (" + note + ")";
  return line;
}

Communicator::Communicator(std::unique_ptr<collectives::CommunicatorState> state)
    : state_(std::move(state)) {
  GZ_REQUIRE(state_ != nullptr, ErrorCode::invalid_argument, "Communicator: null state");
}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

int Communicator::rank() const noexcept { return state_->transport().rank(); }
int Communicator::size() const noexcept { return state_->transport().size(); }

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name,
                                        const CompressionSpec& spec, ReduceOp op) {
  return collectives::run_allreduce(
      *state_, collectives::describe_call(collectives::CollectiveKind::allreduce, tensor, name, op, spec));
}

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name,
                                        std::string_view spec, ReduceOp op) {
  return collectives::run_allreduce(
      *state_, collectives::describe_call(collectives::CollectiveKind::allreduce, tensor, name, op, spec));
}

CollectiveStats Communicator::allreduce(TensorView tensor, std::string_view name, ReduceOp op) {
  return allreduce(tensor, name, state_->default_spec(), op);
}

CollectiveStats Communicator::reduce_scatter(TensorView tensor, std::string_view name,
                                             const CompressionSpec& spec, ReduceOp op) {
  return collectives::run_reduce_scatter(
      *state_,
      collectives::describe_call(collectives::CollectiveKind::reduce_scatter, tensor, name, op, spec));
}

CollectiveStats Communicator::allgather(TensorView tensor, std::string_view name,
                                        const CompressionSpec& spec) {
  return collectives::run_allgather(
      *state_, collectives::describe_call(collectives::CollectiveKind::allgather, tensor, name,
                                          ReduceOp::sum, spec));
}

std::size_t Communicator::shard_begin(std::size_t count, int r) const noexcept {
  return collectives::shard_begin(count, size(), r);
}

void Communicator::save_residuals(const std::string& path) const { state_->save_checkpoint(path); }

void Communicator::load_residuals(const std::string& path) { state_->load_checkpoint(path); }

const CompressionSpec& Communicator::default_spec() const noexcept {
  return state_->default_spec();
}

}  // namespace gradzip
