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

// The most segments the pipelined ring cuts one chunk into. The ring's default codecs (none,
// fp16, bf16) encode and decode at memory speed, so there is little compute to hide and every
// extra message costs: with 4 ranks on 2 cores over shared memory, fp16 at 64 MiB ran 1.35x
// slower than unsegmented in 64 KiB segments (S = 128), 1.16x in 256 KiB, 1.01x in 1 MiB
// (S = 8), while on the emulated 1 Gbit/s cluster 1 MiB segments still took time / wire from
// 1.24 to 1.16 (docs/results.md, "Pipelined ring"). SRA, whose codecs compute more per byte,
// keeps kMaxSegmentsPerChunk.
inline constexpr std::size_t kMaxRingSegmentsPerChunk = 8;

// The fewest ranks the ring pipelines with. With 2 ranks its one neighbour is both the one it
// sends to and the one it receives from, and on the emulated 1 Gbit/s cluster (TCP) the
// segmented ring ran at 1.6-1.8x its wire time there against 1.10 unsegmented (none and fp16,
// 64 MiB; at 3 ranks 1.09 segmented against 1.13): each direction's many large messages share
// one connection with the other direction's, whose rendezvous handshakes then wait behind
// them (the likely cause). SRA, whose compressed segments are small, gains at 2 ranks (qsgd-4:
// 1.09 against 1.89) and is not limited.
inline constexpr int kMinRanksForPipelinedRing = 3;

// How many segments every chunk of `chunk_counts` is cut into: the segment count S that keeps
// each segment's message at about `segment_bytes` (codec.max_encoded_bytes of the largest
// chunk, spread evenly), then lowered so that every chunk has at least S granules (non-empty
// segments) and capped at `max_segments` (at most kMaxSegmentsPerChunk). 1 (no pipelining)
// when segment_bytes is 0, the codec's chunks may not be cut (granularity 0), or the largest
// chunk's message already fits.
std::size_t segments_per_chunk(const Codec& codec, std::span<const std::size_t> chunk_counts,
                               std::size_t segment_bytes,
                               std::size_t max_segments = kMaxSegmentsPerChunk);

// The S + 1 boundaries of a chunk of `count` elements cut into `segments` segments (elements
// from the chunk's start, first 0, last `count`): whole granules of the codec's granularity,
// spread as evenly as possible (shard_begin over the granules), the last granule possibly
// short. Requires segments >= 1 and, for segments > 1, at least `segments` granules.
std::vector<std::size_t> segment_bounds(const Codec& codec, std::size_t count,
                                        std::size_t segments);

// A tensor of `count` elements split into `ranks` chunks (shard_begin, collective_job.h), each
// cut into `segments` segments (segment_bounds): where segment k of chunk c lies. The geometry
// the pipelined ring and SRA share; the same on every rank.
class SegmentedChunks {
 public:
  SegmentedChunks(const Codec& codec, std::size_t count, int ranks, std::size_t segments);

  std::size_t segments() const noexcept { return segments_; }
  std::size_t chunk_begin(int c) const { return chunk_begin_[index(c)]; }
  std::size_t chunk_count(int c) const {
    return chunk_begin_[index(c) + 1] - chunk_begin_[index(c)];
  }
  // Segment k of chunk c: elements [segment_first, segment_first + segment_count) of the
  // tensor, segment_offset of them from the chunk's start.
  std::size_t segment_offset(std::size_t k, int c) const { return segment_begin_[index(c)][k]; }
  std::size_t segment_first(std::size_t k, int c) const {
    return chunk_begin(c) + segment_offset(k, c);
  }
  std::size_t segment_count(std::size_t k, int c) const {
    return segment_begin_[index(c)][k + 1] - segment_begin_[index(c)][k];
  }
  // Segment k of chunk c of `tensor` (count elements).
  std::span<float> segment_of(std::span<float> tensor, std::size_t k, int c) const {
    return tensor.subspan(segment_first(k, c), segment_count(k, c));
  }

 private:
  static std::size_t index(int c) { return static_cast<std::size_t>(c); }

  std::size_t segments_;
  std::vector<std::size_t> chunk_begin_;                 // ranks + 1 chunk boundaries
  std::vector<std::vector<std::size_t>> segment_begin_;  // per chunk, S + 1, from its start
};

}  // namespace gradzip::collectives
