#include "collectives/algorithm_choice.h"

#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

void require_element_codec(const CompressionSpec& spec, std::string_view collective) {
  GZ_REQUIRE(spec.codec != CodecKind::powersgd, ErrorCode::unsupported, collective,
             ": powersgd compresses whole gradient matrices and runs in the Reducer "
             "(pipeline/), not in a single collective; use none, fp16, bf16, qsgd, sign, topk "
             "or randk here");
}

// What run_flat_allreduce(auto) runs for this codec, by its stats name.
std::string auto_flat_name(CodecKind codec) {
  if (codec == CodecKind::randk) return "randk";
  return std::string(algorithm_name(default_flat_algorithm(codec)));
}

std::string warmup_note(const CompressionSpec& spec, std::uint32_t step) {
  return detail::concat("warm-up call ", step + 1, " of ", spec.warmup, ": uncompressed");
}

}  // namespace

AllreduceChoice choose_allreduce(const CompressionSpec& spec, std::size_t count, std::uint32_t step) {
  require_element_codec(spec, "allreduce");
  AllreduceChoice choice;
  if (step < spec.warmup) {
    choice.path = AllreducePath::transport_sum;
    choice.name = "mpi";
    choice.note = warmup_note(spec, step);
    return choice;
  }
  switch (spec.algo) {
    case Algorithm::auto_select:
      // count * 4 < min_bytes, i.e. count < ceil(min_bytes / 4), without computing count * 4
      // (it may overflow).
      if (count < spec.min_bytes / sizeof(float) ||
          (count == spec.min_bytes / sizeof(float) && spec.min_bytes % sizeof(float) != 0)) {
        choice.path = AllreducePath::transport_sum;
        choice.name = "mpi";
        choice.note = detail::concat(count * sizeof(float), " B < min_bytes=", spec.min_bytes,
                                     ": uncompressed");
        return choice;
      }
      choice.path = AllreducePath::flat;
      choice.algorithm = Algorithm::auto_select;
      choice.name = auto_flat_name(spec.codec);
      choice.note = detail::concat("auto: ", codec_kind_name(spec.codec), " -> ", choice.name);
      return choice;
    case Algorithm::ring:
    case Algorithm::sra:
    case Algorithm::allgather:
    case Algorithm::rhd:
    case Algorithm::tree:
      choice.path = AllreducePath::flat;
      choice.algorithm = spec.algo;
      choice.name = std::string(algorithm_name(spec.algo));
      return choice;
    case Algorithm::hier:
      choice.path = AllreducePath::hierarchical;
      choice.algorithm = Algorithm::auto_select;
      choice.name = "hier/" + auto_flat_name(spec.codec);
      return choice;
  }
  GZ_THROW(ErrorCode::internal, "choose_allreduce: unknown algorithm ",
           static_cast<int>(spec.algo));
}

ShardedChoice choose_reduce_scatter(const CompressionSpec& spec, std::uint32_t step) {
  require_element_codec(spec, "reduce_scatter");
  ShardedChoice choice;
  if (step < spec.warmup) {
    choice.algorithm = Algorithm::ring;
    choice.warmup = true;
    choice.name = "ring";
    choice.note = warmup_note(spec, step);
    return choice;
  }
  const bool sra = spec.algo == Algorithm::sra ||
                   (spec.algo == Algorithm::auto_select &&
                    default_flat_algorithm(spec.codec) == Algorithm::sra);
  choice.algorithm = sra ? Algorithm::sra : Algorithm::ring;
  choice.name = sra ? "sra" : "ring";
  if (spec.algo == Algorithm::allgather || spec.algo == Algorithm::hier ||
      spec.algo == Algorithm::rhd || spec.algo == Algorithm::tree)
    choice.note = detail::concat("algo=", algorithm_name(spec.algo),
                                 " has no reduce-scatter: ring");
  return choice;
}

ShardedChoice choose_allgather(const CompressionSpec& spec, std::uint32_t step) {
  require_element_codec(spec, "allgather");
  ShardedChoice choice;
  choice.algorithm = Algorithm::allgather;
  choice.name = "allgather";
  if (step < spec.warmup) {
    choice.warmup = true;
    choice.note = warmup_note(spec, step);
  }
  return choice;
}

}  // namespace gradzip::collectives
