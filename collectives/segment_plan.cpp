// Segment plans of the pipelined algorithms (collectives/segment_plan.h).
#include "collectives/segment_plan.h"

#include <algorithm>

#include "collectives/codec_table.h"
#include "collectives/collective_job.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

std::size_t granules(std::size_t count, std::size_t granularity) {
  return count / granularity + (count % granularity != 0);
}

}  // namespace

std::size_t segments_per_chunk(const Codec& codec, std::span<const std::size_t> chunk_counts,
                               std::size_t segment_bytes, std::size_t max_segments) {
  const std::size_t granularity = segment_granularity(codec.spec());
  if (segment_bytes == 0 || granularity == 0 || chunk_counts.empty()) return 1;
  const std::size_t largest = *std::max_element(chunk_counts.begin(), chunk_counts.end());
  const std::size_t smallest = *std::min_element(chunk_counts.begin(), chunk_counts.end());
  // The payload of the largest chunk's message spread over segments of about segment_bytes
  // each, headers included: S = ceil(payload / (segment_bytes - header)).
  const std::size_t payload = codec.max_encoded_bytes(largest) - compressors::kWireHeaderBytes;
  const std::size_t per_segment =
      segment_bytes > compressors::kWireHeaderBytes ? segment_bytes - compressors::kWireHeaderBytes : 1;
  std::size_t segments = payload / per_segment + (payload % per_segment != 0);
  segments = std::min({segments, max_segments, kMaxSegmentsPerChunk, granules(smallest, granularity)});
  return std::max<std::size_t>(segments, 1);
}

std::vector<std::size_t> segment_bounds(const Codec& codec, std::size_t count,
                                        std::size_t segments) {
  GZ_REQUIRE(segments >= 1, ErrorCode::internal, "segment_bounds: 0 segments");
  std::vector<std::size_t> bounds(segments + 1);
  bounds.front() = 0;
  bounds.back() = count;
  if (segments == 1) return bounds;
  const std::size_t granularity = segment_granularity(codec.spec());
  const std::size_t units = granularity == 0 ? 0 : granules(count, granularity);
  GZ_REQUIRE(units >= segments && segments <= kMaxSegmentsPerChunk, ErrorCode::internal,
             "segment_bounds: ", segments, " segments of a chunk of ", count,
             " elements (granularity ", granularity, ")");
  for (std::size_t k = 1; k < segments; ++k)
    bounds[k] = std::min(count, granularity * shard_begin(units, static_cast<int>(segments),
                                                          static_cast<int>(k)));
  return bounds;
}

SegmentedChunks::SegmentedChunks(const Codec& codec, std::size_t count, int ranks,
                                 std::size_t segments)
    : segments_(segments) {
  GZ_REQUIRE(ranks >= 1, ErrorCode::internal, "SegmentedChunks: ", ranks, " ranks");
  for (int c = 0; c <= ranks; ++c) chunk_begin_.push_back(shard_begin(count, ranks, c));
  for (int c = 0; c < ranks; ++c)
    segment_begin_.push_back(segment_bounds(codec, chunk_count(c), segments));
}

}  // namespace gradzip::collectives
