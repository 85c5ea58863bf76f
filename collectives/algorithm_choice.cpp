#include "collectives/algorithm_choice.h"

#include <cstdio>
#include <vector>

#include "collectives/algorithm_table.h"
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

void require_element_codec(const CompressionSpec& spec, std::string_view collective) {
  GZ_REQUIRE(codec_row(spec.codec).element_codec, ErrorCode::unsupported, collective,
             ": powersgd compresses whole gradient matrices and runs in the Reducer "
             "(pipeline/), not in a single collective; use none, fp16, bf16, qsgd, sign, topk "
             "or randk here");
}

// What run_flat_allreduce(auto) runs for this codec, by its stats name.
std::string auto_flat_name(CodecKind codec) { return std::string(default_path_name(codec)); }

std::string warmup_note(const CompressionSpec& spec, std::uint32_t step) {
  return detail::concat("warm-up call ", step + 1, " of ", spec.warmup, ": uncompressed");
}

// count * 4 < min_bytes, i.e. count < ceil(min_bytes / 4), without computing count * 4 (it may
// overflow).
bool below_min_bytes(const CompressionSpec& spec, std::size_t count) {
  return count < spec.min_bytes / sizeof(float) ||
         (count == spec.min_bytes / sizeof(float) && spec.min_bytes % sizeof(float) != 0);
}

Algorithm algorithm_of(AlgorithmId modeled) {
  const AlgorithmRow& row = algorithm_row(modeled);
  GZ_REQUIRE(row.spec_value && row.run_flat != nullptr, ErrorCode::internal, "algo=auto: the model chose '",
             row.name, "', which is not a flat algorithm of the library");
  return *row.spec_value;
}

// The predicted gain an algorithm other than the codec's default needs before algo=auto takes
// it: the model's median error on the emulated cluster was 14% for tensors of 1 MiB and more
// (docs/results.md, "Cost model"), so smaller predicted gains are as likely to be losses. The
// default also compresses each element least often or as often as the others, which makes it
// the better guess when the times are close.
constexpr double kAutoSwitchGain = 0.15;

// "%.3g" of milliseconds.
std::string milliseconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", seconds * 1e3);
  return text;
}

// algo=auto by the model: the codec's default (the first candidate), unless the fastest other
// candidate is predicted at least kAutoSwitchGain faster; then, with fallback=dense, the
// transport's dense all-reduce when it is predicted no slower than that choice (an exact result
// at no more time is the better trade; on a tie it wins).
void choose_by_model(const CompressionSpec& spec, std::size_t count, const AutoModel& model,
                     AllreduceChoice& choice) {
  std::vector<AlgorithmId> candidates = auto_candidates(spec.codec);
  if (model.hierarchy) candidates.push_back(AlgorithmId::hier);
  std::string times;
  CostEstimate fallback, fastest;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const bool hier = candidates[i] == AlgorithmId::hier;
    // hier: the codec's default algorithm across nodes, on each inter group's link.
    const CostEstimate estimate = estimate_allreduce(
        candidates[i], model.codec, model.cost, count, model.ranks,
        hier ? model.hierarchy->across : model.link, hier ? model.hierarchy->nodes : HierarchyModel{});
    if (i == 0) fallback = estimate;
    if (i == 1 || (i > 1 && estimate.seconds < fastest.seconds)) fastest = estimate;
    times += detail::concat(i == 0 ? "" : ", ", algorithm_id_name(candidates[i]), " ",
                            milliseconds(estimate.seconds));
  }
  const bool switch_away =
      candidates.size() > 1 && fastest.seconds < (1.0 - kAutoSwitchGain) * fallback.seconds;
  const CostEstimate& best = switch_away ? fastest : fallback;
  if (best.algorithm == AlgorithmId::hier) {
    choice.path = AllreducePath::hierarchical;
    choice.algorithm = Algorithm::auto_select;
    choice.name = "hier/" + auto_flat_name(spec.codec);
  } else if (codec_row(spec.codec).shared_indices) {
    // Random-k's shared-index path (its only candidate) has no algo= value: auto runs it.
    choice.algorithm = Algorithm::auto_select;
    choice.name = auto_flat_name(spec.codec);
  } else {
    choice.algorithm = algorithm_of(best.algorithm);
    choice.name = algorithm_id_name(best.algorithm);
  }
  std::string dense_reason;
  if (spec.fallback == FallbackPolicy::dense) {
    const CostEstimate dense = estimate_dense_allreduce(model.cost, count, model.ranks, model.link,
                                                        /*flush_residual=*/spec.error_feedback);
    times += detail::concat(", dense ", milliseconds(dense.seconds));
    if (dense.seconds <= best.seconds) {
      dense_reason = detail::concat(" (fallback=dense: dense ", milliseconds(dense.seconds),
                                    " ms <= ", choice.name, " ", milliseconds(best.seconds), " ms",
                                    spec.error_feedback ? "; residual flushed into it" : "", ")");
      choice.path = AllreducePath::transport_sum;
      choice.algorithm = Algorithm::auto_select;
      choice.name = kTransportSumName;
      choice.dense_fallback = true;
    }
  }
  const std::string exchange =
      model.link.exchange_bytes_per_s > 0
          ? detail::concat(", exchange ", model.link.exchange_bytes_per_s / 1e6, " MB/s")
          : std::string();
  const std::string collective =
      model.link.collective_latency_s > 0
          ? detail::concat(", collective ", milliseconds(model.link.collective_latency_s), " ms")
          : std::string();
  const std::string nodes =
      model.hierarchy
          ? detail::concat("; nodes of ", model.hierarchy->nodes.ranks_per_node,
                           model.hierarchy->shared_memory ? " (shared memory)" : "", ": inside ",
                           milliseconds(model.hierarchy->nodes.intra.latency_s), " ms, ",
                           model.hierarchy->nodes.intra.bytes_per_s / 1e6, " MB/s, across ",
                           milliseconds(model.hierarchy->across.latency_s), " ms, ",
                           model.hierarchy->across.bytes_per_s / 1e6, " MB/s")
          : std::string();
  choice.note = detail::concat("auto: model ms: ", times, " (link ",
                               milliseconds(model.link.latency_s), " ms, ",
                               model.link.bytes_per_s / 1e6, " MB/s", exchange, collective, nodes,
                               ") -> ", choice.name, dense_reason);
}

}  // namespace

bool spec_uses_model(const CompressionSpec& spec) noexcept {
  const CodecRow& row = codec_row(spec.codec);
  return spec.algo == Algorithm::auto_select && row.element_codec &&
         (!row.shared_indices || spec.fallback == FallbackPolicy::dense);
}

bool forms_nodes(int ranks, std::uint32_t ranks_per_node) noexcept {
  return ranks_per_node >= 2 && ranks_per_node <= static_cast<std::uint32_t>(ranks) / 2 &&
         ranks % static_cast<int>(ranks_per_node) == 0;
}

bool may_form_nodes(int ranks, std::uint32_t ranks_per_node) noexcept {
  return ranks_per_node == 0 ? ranks >= 4 : forms_nodes(ranks, ranks_per_node);
}

bool auto_uses_model(const CompressionSpec& spec, std::size_t count, std::uint32_t step, int ranks,
                     bool cuda) {
  return spec_uses_model(spec) && step >= spec.warmup && !below_min_bytes(spec, count) &&
         ranks > 1 && !cuda;
}

AllreduceChoice choose_allreduce(const CompressionSpec& spec, std::size_t count, std::uint32_t step,
                                 const AutoModel* model) {
  require_element_codec(spec, "allreduce");
  AllreduceChoice choice;
  if (step < spec.warmup) {
    choice.path = AllreducePath::transport_sum;
    choice.name = kTransportSumName;
    choice.note = warmup_note(spec, step);
    return choice;
  }
  if (spec.algo == Algorithm::auto_select) {
    if (below_min_bytes(spec, count)) {
      choice.path = AllreducePath::transport_sum;
      choice.name = kTransportSumName;
      choice.note = detail::concat(count * sizeof(float), " B < min_bytes=", spec.min_bytes,
                                   ": uncompressed");
      return choice;
    }
    choice.path = AllreducePath::flat;
    if (model != nullptr && spec_uses_model(spec)) {
      choose_by_model(spec, count, *model, choice);
      return choice;
    }
    choice.algorithm = Algorithm::auto_select;
    choice.name = auto_flat_name(spec.codec);
    choice.note = detail::concat("auto: ", codec_kind_name(spec.codec), " -> ", choice.name);
    return choice;
  }
  if (spec.algo == Algorithm::hier) {
    choice.path = AllreducePath::hierarchical;
    choice.algorithm = Algorithm::auto_select;
    choice.name = "hier/" + auto_flat_name(spec.codec);
    return choice;
  }
  // Every other algo= value names a flat path of the algorithm table (internal error if not).
  choice.path = AllreducePath::flat;
  choice.algorithm = spec.algo;
  choice.name = std::string(algorithm_row(spec.algo).name);
  return choice;
}

ShardedChoice choose_reduce_scatter(const CompressionSpec& spec, std::uint32_t step) {
  require_element_codec(spec, "reduce_scatter");
  ShardedChoice choice;
  if (step < spec.warmup) {
    choice.algorithm = Algorithm::ring;
    choice.warmup = true;
    choice.name = algorithm_name(Algorithm::ring);
    choice.note = warmup_note(spec, step);
    return choice;
  }
  // algo= (auto: the codec's default algorithm) when its row runs as a reduce-scatter, else
  // the ring.
  const Algorithm wanted =
      spec.algo == Algorithm::auto_select ? default_flat_algorithm(spec.codec) : spec.algo;
  const bool runs_wanted = algorithm_row(wanted).run_reduce_scatter != nullptr;
  choice.algorithm = runs_wanted ? wanted : Algorithm::ring;
  choice.name = std::string(algorithm_name(*choice.algorithm));
  if (spec.algo != Algorithm::auto_select && !runs_wanted)
    choice.note = detail::concat("algo=", algorithm_name(spec.algo),
                                 " has no reduce-scatter: ring");
  return choice;
}

ShardedChoice choose_allgather(const CompressionSpec& spec, std::uint32_t step) {
  require_element_codec(spec, "allgather");
  ShardedChoice choice;
  choice.name = "allgather";  // the collective's name: it has one algorithm
  if (step < spec.warmup) {
    choice.warmup = true;
    choice.note = warmup_note(spec, step);
  }
  return choice;
}

}  // namespace gradzip::collectives
