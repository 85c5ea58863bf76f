// AutoModelCache (collectives/auto_model_cache.h).
#include "collectives/auto_model_cache.h"

#include <cstdlib>
#include <utility>

#include "collectives/collective_job.h"
#include "collectives/link_calibration.h"
#include "collectives/transport/deadline.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {
namespace {

// The link of GRADZIP_LINK when it is set (presence is asked of the environment directly:
// kernels/tunables.h reports values only), else of CommunicatorOptions::link_*; nullopt when
// neither gives one (algo=auto then measures it).
std::optional<LinkModel> resolve_link(const CommunicatorOptions& options) {
  if (std::getenv("GRADZIP_LINK") != nullptr)
    return parse_link_variable(kernels::tunable_value("GRADZIP_LINK"));
  return given_link(options.link_latency_us, options.link_gbps, options.link_exchange_gbps);
}

}  // namespace

AutoModelCache::AutoModelCache(TransportSet& transports, CodecCache& codecs,
                               const CommunicatorOptions& options)
    : transports_(transports), codecs_(codecs), link_(resolve_link(options)) {}

const AllreduceChoice& AutoModelCache::choice(const CompressionSpec& spec,
                                              std::string_view spec_text, std::size_t count,
                                              std::uint32_t step) {
  if (const auto cached = choices_.find(spec_text); cached != choices_.end()) {
    if (const auto found = cached->second.find(count); found != cached->second.end())
      return found->second;
  }
  set_operation_phase("algo=auto's calibration of the link and the codec");
  Transport& world = transports_.world();
  // The model's pipelined paths only where this transport runs them (its across-node groups
  // are splits of it, alike).
  LinkModel modeled_link = link();
  modeled_link.pipelined = transport_pipelines(world);
  AutoModel model{codecs_.codec_for(spec), codec_cost(spec), modeled_link, world.size(),
                  hierarchy(spec.ranks_per_node)};
  if (model.hierarchy) model.hierarchy->across.pipelined = modeled_link.pipelined;
  set_operation_phase("the data exchange");
  AllreduceChoice made = choose_allreduce(spec, count, step, &model);
  if (choice_count_ >= kMaxCachedChoices) forget_choices();
  auto by_spec = choices_.find(spec_text);
  if (by_spec == choices_.end())
    by_spec = choices_.emplace(std::string(spec_text), std::map<std::size_t, AllreduceChoice>{}).first;
  const auto [stored, added] = by_spec->second.insert_or_assign(count, std::move(made));
  if (added) ++choice_count_;
  return stored->second;
}

const LinkModel& AutoModelCache::link() {
  if (!link_) link_ = measure_link(transports_.world());
  return *link_;
}

void AutoModelCache::set_link(const LinkModel& link) {
  link_ = link;
  forget_choices();
}

const CodecCost& AutoModelCache::codec_cost(const CompressionSpec& spec) {
  const std::string key = spec.to_string();
  if (const auto found = codec_costs_.find(key); found != codec_costs_.end()) return found->second;
  if (codec_costs_.size() >= kMaxCachedCosts) codec_costs_.clear();
  const CodecCost cost = agreed_codec_cost(transports_.world(), codecs_.codec_for(spec));
  return codec_costs_.emplace(key, cost).first->second;
}

const std::optional<AutoHierarchy>& AutoModelCache::hierarchy(std::uint32_t ranks_per_node) {
  if (const auto found = hierarchies_.find(ranks_per_node); found != hierarchies_.end())
    return found->second;
  Transport& world = transports_.world();
  const int ranks = world.size();
  std::optional<AutoHierarchy> made;
  // Nodes of ranks_per_node consecutive ranks, or for 0 the ranks that share memory
  // (node_transports), whose size every rank learns here: a candidate only when all nodes
  // have one size (shared_memory_node_size says 0 otherwise).
  const std::uint32_t node_size = ranks_per_node == 0 && may_form_nodes(ranks, 0)
                                      ? transports_.shared_memory_node_size()
                                      : ranks_per_node;
  if (forms_nodes(ranks, node_size)) {
    TransportSet::NodeTransports& node = transports_.node_transports(ranks_per_node);
    const LinkModel intra = agreed_link(world, measure_link(*node.intra));
    // All inter groups at once, as the hierarchical all-reduce runs them: each gets its share
    // of the node's link. Their collective start-ups are not taken from this measurement: a
    // group that measures them while another still moves its large rounds waits behind those
    // in the link's queue (on the emulated cluster the groups' figures varied from 0.1 to
    // 5 ms); a world collective's start-up, measured by link() with every rank idle, stands
    // in for them.
    LinkModel across = agreed_link(world, measure_link(*node.inter));
    across.collective_latency_s = link().collective_latency_s;
    made = AutoHierarchy{HierarchyModel{static_cast<int>(node_size), intra}, across,
                         ranks_per_node == 0};
  }
  return hierarchies_.emplace(ranks_per_node, made).first->second;
}

void AutoModelCache::set_hierarchy(std::uint32_t ranks_per_node,
                                   const std::optional<AutoHierarchy>& hierarchy) {
  hierarchies_[ranks_per_node] = hierarchy;
  forget_choices();
}

AutoModelInputs AutoModelCache::inputs() const {
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

void AutoModelCache::adopt(const AutoModelInputs& inputs) {
  forget_choices();
  if (inputs.link) link_ = inputs.link;
  for (const auto& [spec, cost] : inputs.codec_costs) codec_costs_[spec] = cost;
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) hierarchies_[ranks_per_node] = hierarchy;
}

}  // namespace gradzip::collectives
