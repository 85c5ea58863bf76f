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

using error_feedback::ResidualStore;

constexpr std::string_view kLinkTerms[] = {"latency_s", "bytes_per_s", "exchange_bytes_per_s",
                                            "collective_latency_s"};
constexpr std::string_view kGammaTerms[] = {"encode_s", "decode_add_s", "add_s"};
// The Reducer's step counter, and the separator of its lane prefix "lane<l>|".
constexpr std::string_view kStepCounter = "step";
constexpr char kLaneSeparator = '|';

}  // namespace

void AutoModelInputs::merge(const AutoModelInputs& other) {
  if (other.link) link = other.link;
  for (const auto& [ranks_per_node, hierarchy] : other.hierarchies) hierarchies[ranks_per_node] = hierarchy;
  for (const auto& [spec, cost] : other.codec_costs) codec_costs[spec] = cost;
}

void put_auto_model(const AutoModelInputs& inputs, ResidualStore::Counters& counters) {
  const auto put = [&](const std::string& name, double value) {
    counters[detail::concat(kAutoModelPrefix, name)] = std::bit_cast<std::uint64_t>(value);
  };
  const auto put_link = [&](const std::string& prefix, const LinkModel& link) {
    const double terms[] = {link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s,
                            link.collective_latency_s};
    for (std::size_t i = 0; i < std::size(terms); ++i) put(detail::concat(prefix, kLinkTerms[i]), terms[i]);
  };
  if (inputs.link) put_link("link/", *inputs.link);
  for (const auto& [ranks_per_node, hierarchy] : inputs.hierarchies) {
    put_link(detail::concat("hier/", ranks_per_node, "/intra/"), hierarchy.nodes.intra);
    put_link(detail::concat("hier/", ranks_per_node, "/across/"), hierarchy.across);
    // Nodes of ranks that share memory: their detected size.
    if (ranks_per_node == 0) put("hier/0/ranks_per_node", hierarchy.nodes.ranks_per_node);
  }
  for (const auto& [spec, cost] : inputs.codec_costs) {
    const double terms[] = {cost.encode_s, cost.decode_add_s, cost.add_s};
    for (std::size_t i = 0; i < std::size(terms); ++i)
      put(detail::concat("gamma/", spec, "/", kGammaTerms[i]), terms[i]);
  }
}

AutoModelInputs get_auto_model(const ResidualStore::Counters& counters, std::string_view path) {
  // Links by their counter prefix ("link/", "hier/<L>/intra/", "hier/<L>/across/"; L = 0 for
  // nodes of ranks that share memory), with the number of terms read.
  std::map<std::string, std::pair<LinkModel, std::size_t>, std::less<>> links;
  std::map<std::string, CodecCost, std::less<>> costs;
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
      CodecCost& cost = costs[std::string(rest.substr(6, slash - 6))];
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
  std::map<std::uint32_t, AutoHierarchy> hierarchies;
  for (const auto& [prefix, entry] : links) {
    const auto& [link, read] = entry;
    GZ_REQUIRE(read == std::size(kLinkTerms) && link.bytes_per_s > 0, ErrorCode::io_error,
               "loading '", path, "': algo=auto's link '", kAutoModelPrefix, prefix, "' is incomplete (",
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
               kAutoModelPrefix, base, "' lacks its ", links.contains(base + "intra/") ? "across" : "intra",
               " link");
    if (ranks_per_node != 0) continue;
    GZ_REQUIRE(shared_memory_node_size.has_value(), ErrorCode::io_error, "loading '", path,
               "': algo=auto's node structure '", kAutoModelPrefix,
               "hier/0/' (ranks that share memory) lacks its detected size, '", kAutoModelPrefix,
               "hier/0/ranks_per_node'");
    hierarchy.nodes.ranks_per_node = static_cast<int>(*shared_memory_node_size);
    hierarchy.shared_memory = true;
  }
  AutoModelInputs inputs;
  if (const auto found = links.find("link/"); found != links.end()) inputs.link = found->second.first;
  inputs.codec_costs = std::move(costs);
  inputs.hierarchies = std::move(hierarchies);
  return inputs;
}

void save_communicator_checkpoint(const std::string& path, const ResidualStore& residuals,
                                  const CommunicatorCheckpoint& rest) {
  ResidualStore::Counters counters;
  for (const auto& [name, call_number] : rest.call_numbers)
    counters.emplace_hint(counters.end(), name, call_number);
  put_auto_model(rest.auto_model, counters);
  residuals.save(path, counters);
}

CommunicatorCheckpoint load_communicator_checkpoint(const std::string& path, ResidualStore& residuals) {
  ResidualStore::Counters counters;
  residuals.load(path, &counters);
  CommunicatorCheckpoint loaded;
  loaded.auto_model = get_auto_model(counters, path);
  for (const auto& [name, value] : counters) {
    if (name.starts_with(kAutoModelPrefix)) continue;
    GZ_REQUIRE(value <= UINT32_MAX, ErrorCode::io_error, "Communicator::load_residuals: '",
               path, "' gives tensor '", name, "' the call number ", value,
               ", beyond the 32-bit counter");
    loaded.call_numbers.emplace_hint(loaded.call_numbers.end(), name, static_cast<std::uint32_t>(value));
  }
  return loaded;
}

void save_reducer_checkpoint(const std::string& path, std::uint32_t world_size, std::uint32_t rank,
                             std::span<const ResidualStore* const> lanes,
                             const AutoModelInputs& auto_model, std::uint64_t step) {
  ResidualStore merged(world_size, rank, ResizePolicy::error);
  for (std::size_t l = 0; l < lanes.size(); ++l) {
    for (const std::string& key : lanes[l]->names()) {
      const std::span<const float> values = lanes[l]->residual(key);
      const std::span<float> copy =
          merged.residual(detail::concat("lane", l, kLaneSeparator, key), values.size());
      std::copy(values.begin(), values.end(), copy.begin());
    }
  }
  ResidualStore::Counters counters{{std::string(kStepCounter), step}};
  put_auto_model(auto_model, counters);
  merged.save(path, counters);
}

ReducerCheckpoint load_reducer_checkpoint(const std::string& path, std::uint32_t world_size,
                                          std::uint32_t rank, std::size_t lanes,
                                          std::string_view who) {
  ResidualStore loaded(world_size, rank, ResizePolicy::error);
  ResidualStore::Counters counters;
  loaded.load(path, &counters);
  ReducerCheckpoint checkpoint;
  checkpoint.lane_residuals.resize(lanes);
  for (const std::string& key : loaded.names()) {
    std::size_t lane = 0;
    const auto bar = key.find(kLaneSeparator);
    const bool well_formed = key.starts_with("lane") && bar != std::string::npos && bar > 4 &&
                             std::sscanf(key.c_str() + 4, "%zu", &lane) == 1 && lane < lanes;
    GZ_REQUIRE(well_formed, ErrorCode::invalid_argument, who, "('", path, "'): entry '", key,
               "' is not 'lane<L>|<key>' with L below this Reducer's ", lanes,
               " lanes (saved by another Reducer or with other options?)");
    const std::span<const float> values = loaded.residual(key);
    checkpoint.lane_residuals[lane].emplace(key.substr(bar + 1),
                                            std::vector<float>(values.begin(), values.end()));
  }
  for (const auto& [name, value] : counters) {
    GZ_REQUIRE(name == kStepCounter || name.starts_with(kAutoModelPrefix), ErrorCode::io_error, who,
               "('", path, "'): the counter '", name, "' = ", value,
               " is neither the step nor one of algo=auto's model inputs (a Communicator's "
               "checkpoint?)");
  }
  checkpoint.auto_model = get_auto_model(counters, path);
  if (const auto step = counters.find(kStepCounter); step != counters.end()) checkpoint.step = step->second;
  return checkpoint;
}

}  // namespace gradzip::collectives
