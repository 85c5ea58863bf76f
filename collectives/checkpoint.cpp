#include "collectives/checkpoint.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <utility>

#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

using error_feedback::CheckpointContents;
using error_feedback::CheckpointCounters;
using error_feedback::CheckpointModelInputs;
using error_feedback::CheckpointOwnerState;
using error_feedback::CheckpointTensorView;
using error_feedback::ResidualStore;
using error_feedback::SavedCodecCost;
using error_feedback::SavedHierarchy;
using error_feedback::SavedLink;

error_feedback::SavedLink to_saved_link(const LinkModel& link) {
  return {link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s, link.collective_latency_s};
}

LinkModel from_saved_link(const SavedLink& link) {
  return {link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s, link.collective_latency_s};
}

// ---- files of format versions 1 and 2 -------------------------------------------------------
// Their layout inside version 2's named tensors and counters is checkpoint.h's; these are the
// only functions that read those names.

constexpr std::string_view kLinkTerms[] = {"latency_s", "bytes_per_s", "exchange_bytes_per_s",
                                            "collective_latency_s"};
constexpr std::string_view kGammaTerms[] = {"encode_s", "decode_add_s", "add_s"};
// The Reducer's step counter, and the separator of its lane prefix "lane<l>|".
constexpr std::string_view kStepCounter = "step";
constexpr char kLaneSeparator = '|';

// The model inputs of a version 2 file's counters. Ignores counters without kAutoModelPrefix;
// refuses, with io_error naming `path` and the counter, a prefixed counter it cannot read: an
// unknown name, a value that is not finite and >= 0, an incomplete link, a node structure
// without both links (or, for L = 0, without its detected size, a whole number >= 2).
CheckpointModelInputs model_inputs_from_version2(const CheckpointCounters& counters,
                                                 std::string_view path) {
  // Links by their counter prefix ("link/", "hier/<L>/intra/", "hier/<L>/across/"; L = 0 for
  // nodes of ranks that share memory), with the number of terms read.
  std::map<std::string, std::pair<SavedLink, std::size_t>, std::less<>> links;
  std::map<std::string, SavedCodecCost, std::less<>> costs;
  std::optional<double> shared_memory_node_size;  // "hier/0/ranks_per_node"
  for (const auto& [name, bits] : counters) {
    if (!name.starts_with(kAutoModelPrefix)) continue;
    const std::string_view rest = std::string_view(name).substr(kAutoModelPrefix.size());
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
      SavedCodecCost& cost = costs[std::string(rest.substr(6, slash - 6))];
      double* const fields[] = {&cost.encode_s, &cost.decode_add_s, &cost.add_s};
      const auto at = std::find(std::begin(kGammaTerms), std::end(kGammaTerms), term);
      known = at != std::end(kGammaTerms);
      if (known) *fields[at - std::begin(kGammaTerms)] = value;
    } else {
      known = false;
    }
    GZ_REQUIRE(known, ErrorCode::io_error, "loading '", path, "': the counter '", name, "' = ",
               value, " is not one of algo=auto's model inputs (", kAutoModelPrefix,
               "link/<term>, hier/<L>/intra|across/<term> or gamma/<spec>/<term>, a finite "
               "value >= 0; hier/0/ranks_per_node a whole number >= 2)");
  }
  std::map<std::uint32_t, SavedHierarchy> hierarchies;
  for (const auto& [prefix, entry] : links) {
    const auto& [link, read] = entry;
    GZ_REQUIRE(read == std::size(kLinkTerms) && link.bytes_per_s > 0, ErrorCode::io_error,
               "loading '", path, "': algo=auto's link '", kAutoModelPrefix, prefix, "' is incomplete (",
               read, " of ", std::size(kLinkTerms), " terms, rate ", link.bytes_per_s, " B/s)");
    if (prefix == "link/") continue;
    std::uint32_t ranks_per_node = 0;
    std::sscanf(prefix.c_str(), "hier/%u/", &ranks_per_node);
    SavedHierarchy& hierarchy = hierarchies[ranks_per_node];
    hierarchy.node_size = ranks_per_node;
    (prefix.ends_with("/intra/") ? hierarchy.intra : hierarchy.across) = link;
  }
  if (shared_memory_node_size && !hierarchies.contains(0)) hierarchies[0];  // reported below
  for (auto& [ranks_per_node, hierarchy] : hierarchies) {
    const std::string base = detail::concat("hier/", ranks_per_node, "/");
    GZ_REQUIRE(links.contains(base + "intra/") && links.contains(base + "across/"),
               ErrorCode::io_error, "loading '", path, "': algo=auto's node structure '",
               kAutoModelPrefix, base, "' lacks its ", links.contains(base + "intra/") ? "across" : "intra",
               " link");
    if (ranks_per_node != 0) continue;
    GZ_REQUIRE(shared_memory_node_size.has_value(), ErrorCode::io_error, "loading '", path,
               "': algo=auto's node structure '", kAutoModelPrefix,
               "hier/0/' (ranks that share memory) lacks its detected size, '", kAutoModelPrefix,
               "hier/0/ranks_per_node'");
    hierarchy.node_size = static_cast<std::uint32_t>(*shared_memory_node_size);
  }
  CheckpointModelInputs inputs;
  if (const auto found = links.find("link/"); found != links.end()) inputs.link = found->second.first;
  inputs.codec_costs = std::move(costs);
  inputs.hierarchies = std::move(hierarchies);
  return inputs;
}

// Appends a loaded call number (names arrive sorted), refusing one beyond the Communicator's
// 32-bit counter: the file format stores 64 bits, for any version.
void add_call_number(CommunicatorCheckpoint& loaded, const std::string& name, std::uint64_t value,
                     std::string_view path) {
  GZ_REQUIRE(value <= UINT32_MAX, ErrorCode::io_error, "Communicator::load_residuals: '", path,
             "' gives tensor '", name, "' the call number ", value, ", beyond the 32-bit counter");
  loaded.call_numbers.emplace_hint(loaded.call_numbers.end(), name,
                                   static_cast<std::uint32_t>(value));
}

// A version 1 or 2 Communicator checkpoint's call numbers (the counters without
// kAutoModelPrefix) and model inputs.
CommunicatorCheckpoint communicator_checkpoint_from_version2(const CheckpointContents& contents,
                                                             std::string_view path) {
  CommunicatorCheckpoint loaded;
  loaded.auto_model =
      from_checkpoint_model_inputs(model_inputs_from_version2(contents.version2_counters, path));
  for (const auto& [name, value] : contents.version2_counters) {
    if (name.starts_with(kAutoModelPrefix)) continue;
    add_call_number(loaded, name, value, path);
  }
  return loaded;
}

// A version 1 or 2 Reducer checkpoint: lane l's residual `key` from the tensor
// "lane<l>|<key>", the step from the counter "step", the model inputs from the others.
ReducerCheckpoint reducer_checkpoint_from_version2(CheckpointContents& contents,
                                                   std::string_view path, std::size_t lanes,
                                                   std::string_view who) {
  ReducerCheckpoint checkpoint;
  checkpoint.lane_residuals.resize(lanes);
  for (auto& [stored, values] : contents.tensors) {
    const std::string& key = stored.name;
    std::size_t lane = 0;
    const auto bar = key.find(kLaneSeparator);
    const bool well_formed = key.starts_with("lane") && bar != std::string::npos && bar > 4 &&
                             std::sscanf(key.c_str() + 4, "%zu", &lane) == 1 && lane < lanes;
    GZ_REQUIRE(well_formed, ErrorCode::invalid_argument, who, "('", path, "'): entry '", key,
               "' is not 'lane<L>|<key>' with L below this Reducer's ", lanes,
               " lanes (saved by another Reducer or with other options?)");
    checkpoint.lane_residuals[lane].emplace(key.substr(bar + 1), std::move(values));
  }
  const CheckpointCounters& counters = contents.version2_counters;
  for (const auto& [name, value] : counters) {
    GZ_REQUIRE(name == kStepCounter || name.starts_with(kAutoModelPrefix), ErrorCode::io_error, who,
               "('", path, "'): the counter '", name, "' = ", value,
               " is neither the step nor one of algo=auto's model inputs (a Communicator's "
               "checkpoint?)");
  }
  checkpoint.auto_model = from_checkpoint_model_inputs(model_inputs_from_version2(counters, path));
  if (const auto step = counters.find(kStepCounter); step != counters.end()) checkpoint.step = step->second;
  return checkpoint;
}

// ---- files of format version 3 ---------------------------------------------------------------

CommunicatorCheckpoint communicator_checkpoint_from(const CheckpointOwnerState& state,
                                                    std::string_view path) {
  GZ_REQUIRE(!state.step.has_value(), ErrorCode::io_error, "Communicator::load_residuals: '",
             path, "' holds a step (", state.step.value_or(0),
             "): it is a Reducer's checkpoint, not a Communicator's");
  CommunicatorCheckpoint loaded;
  for (const auto& [name, value] : state.call_numbers) add_call_number(loaded, name, value, path);
  loaded.auto_model = from_checkpoint_model_inputs(state.model_inputs);
  return loaded;
}

ReducerCheckpoint reducer_checkpoint_from(CheckpointContents& contents, std::string_view path,
                                          std::size_t lanes, std::string_view who) {
  const CheckpointOwnerState& state = contents.owner_state;
  GZ_REQUIRE(state.call_numbers.empty(), ErrorCode::io_error, who, "('", path,
             "'): holds call numbers (tensor '",
             state.call_numbers.empty() ? std::string() : state.call_numbers.begin()->first,
             "' first): it is a Communicator's checkpoint, not a Reducer's");
  GZ_REQUIRE(state.step.has_value(), ErrorCode::io_error, who, "('", path,
             "'): holds no step: it is a Communicator's checkpoint, not a Reducer's");
  ReducerCheckpoint checkpoint;
  checkpoint.lane_residuals.resize(lanes);
  for (auto& [key, values] : contents.tensors) {
    GZ_REQUIRE(key.lane < lanes, ErrorCode::invalid_argument, who, "('", path, "'): tensor '",
               key.name, "' of lane ", key.lane, " is beyond this Reducer's ", lanes,
               " lanes (saved by another Reducer or with other options?)");
    checkpoint.lane_residuals[key.lane].emplace(key.name, std::move(values));
  }
  checkpoint.step = state.step;
  checkpoint.auto_model = from_checkpoint_model_inputs(state.model_inputs);
  return checkpoint;
}

}  // namespace

void AutoModelInputs::merge(const AutoModelInputs& other) {
  if (other.link) link = other.link;
  for (const auto& [ranks_per_node, hierarchy] : other.hierarchies) hierarchies[ranks_per_node] = hierarchy;
  for (const auto& [spec, cost] : other.codec_costs) codec_costs[spec] = cost;
}

CheckpointModelInputs to_checkpoint_model_inputs(const AutoModelInputs& inputs) {
  CheckpointModelInputs saved;
  if (inputs.link) saved.link = to_saved_link(*inputs.link);
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) {
    saved.hierarchies.emplace_hint(
        saved.hierarchies.end(), ranks_per_node,
        SavedHierarchy{static_cast<std::uint32_t>(hierarchy.nodes.ranks_per_node),
                       to_saved_link(hierarchy.nodes.intra), to_saved_link(hierarchy.across)});
  }
  for (const auto& [spec, cost] : inputs.codec_costs) {
    saved.codec_costs.emplace_hint(saved.codec_costs.end(), spec,
                                   SavedCodecCost{cost.encode_s, cost.decode_add_s, cost.add_s});
  }
  return saved;
}

AutoModelInputs from_checkpoint_model_inputs(const CheckpointModelInputs& saved) {
  AutoModelInputs inputs;
  if (saved.link) inputs.link = from_saved_link(*saved.link);
  for (const auto& [ranks_per_node, hierarchy] : saved.hierarchies) {
    AutoHierarchy& loaded = inputs.hierarchies[ranks_per_node];
    loaded.nodes.ranks_per_node = static_cast<int>(hierarchy.node_size);
    loaded.nodes.intra = from_saved_link(hierarchy.intra);
    loaded.across = from_saved_link(hierarchy.across);
    loaded.shared_memory = ranks_per_node == 0;
  }
  for (const auto& [spec, cost] : saved.codec_costs)
    inputs.codec_costs.emplace_hint(inputs.codec_costs.end(), spec,
                                    CodecCost{cost.encode_s, cost.decode_add_s, cost.add_s});
  return inputs;
}

void save_communicator_checkpoint(const std::string& path, const ResidualStore& residuals,
                                  const CommunicatorCheckpoint& rest) {
  CheckpointOwnerState state;
  for (const auto& [name, call_number] : rest.call_numbers)
    state.call_numbers.emplace_hint(state.call_numbers.end(), name, call_number);
  state.model_inputs = to_checkpoint_model_inputs(rest.auto_model);
  residuals.save(path, state);
}

CommunicatorCheckpoint load_communicator_checkpoint(const std::string& path, ResidualStore& residuals) {
  CheckpointContents contents = error_feedback::read_checkpoint_file(path);
  residuals.require_loadable(path, contents);
  CommunicatorCheckpoint loaded =
      contents.format_version < error_feedback::kCheckpointFormatVersion
          ? communicator_checkpoint_from_version2(contents, path)
          : communicator_checkpoint_from(contents.owner_state, path);
  residuals.adopt_tensors(contents);
  return loaded;
}

void save_reducer_checkpoint(const std::string& path, std::uint32_t world_size, std::uint32_t rank,
                             std::span<const ResidualStore* const> lanes,
                             const AutoModelInputs& auto_model, std::uint64_t step) {
  GZ_REQUIRE(lanes.size() <= UINT32_MAX, ErrorCode::invalid_argument, "Reducer::save_state: ",
             lanes.size(), " lanes (the checkpoint holds at most 2^32-1)");
  // Names outlive the views below; lanes in order, names sorted: (lane, name) increases.
  std::vector<std::vector<std::string>> names;
  names.reserve(lanes.size());
  std::vector<CheckpointTensorView> tensors;
  for (std::size_t l = 0; l < lanes.size(); ++l) {
    names.push_back(lanes[l]->names());
    for (const std::string& key : names.back())
      tensors.push_back({static_cast<std::uint32_t>(l), key, lanes[l]->residual(key)});
  }
  CheckpointOwnerState state;
  state.step = step;
  state.model_inputs = to_checkpoint_model_inputs(auto_model);
  error_feedback::write_checkpoint_file(path, world_size, rank, tensors, state);
}

ReducerCheckpoint load_reducer_checkpoint(const std::string& path, std::uint32_t world_size,
                                          std::uint32_t rank, std::size_t lanes,
                                          std::string_view who) {
  CheckpointContents contents = error_feedback::read_checkpoint_file(path);
  error_feedback::require_same_world_and_rank(contents, world_size, rank, path, who);
  return contents.format_version < error_feedback::kCheckpointFormatVersion
             ? reducer_checkpoint_from_version2(contents, path, lanes, who)
             : reducer_checkpoint_from(contents, path, lanes, who);
}

}  // namespace gradzip::collectives
