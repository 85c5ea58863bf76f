// How the pipelined algorithms cut a chunk into segments: the pieces whose encode, transfer and
// decode overlap one another inside one call (collectives/sra_pipelined.cpp).
//
// A segment boundary lies on a multiple of the codec's granularity counted from the chunk's
// start (segment_granularity, collectives/codec_table.h: whole buckets and whole code bytes), so
// the segments' messages carry, headers aside, exactly the payload bytes of the chunk's one
// message and decode to the same values (stochastic rounding is keyed by the element's index in
// the tensor, which the segment's encode context keeps). What pipelining adds on the wire is one
// 32-byte header per extra segment message.
//
// The segment count comes from the spec's `segment` key (the target message size, in bytes) and
// the chunk's size alone, so every rank derives the same plan.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "gradzip/codec.h"

namespace gradzip::collectives {

// The most segments one chunk is cut into (bounds the requests a call posts).
inline constexpr std::size_t kMaxSegmentsPerChunk = 1024;

// How many segments every chunk of `chunk_counts` is cut into: the segment count S that keeps
// each segment's message at about `segment_bytes` (codec.max_encoded_bytes of the largest
// chunk, spread evenly), then lowered so that every chunk has at least S granules (non-empty
// segments) and capped at kMaxSegmentsPerChunk. 1 (no pipelining) when segment_bytes is 0, the
// codec's chunks may not be cut (granularity 0), or the largest chunk's message already fits.
std::size_t segments_per_chunk(const Codec& codec, std::span<const std::size_t> chunk_counts,
                               std::size_t segment_bytes);

// The S + 1 boundaries of a chunk of `count` elements cut into `segments` segments (elements
// from the chunk's start, first 0, last `count`): whole granules of the codec's granularity,
// spread as evenly as possible (shard_begin over the granules), the last granule possibly
// short. Requires segments >= 1 and, for segments > 1, at least `segments` granules.
std::vector<std::size_t> segment_bounds(const Codec& codec, std::size_t count,
                                        std::size_t segments);

}  // namespace gradzip::collectives
