// How the NCCL transport's allgatherv lays out its padded blocks and strips the padding.
// Header-only and free of NCCL and CUDA, so the unit tests (which also build against a
// host-only copy of the library) check it on any machine.
//
// NCCL has no allgatherv: every rank contributes a block of padded_block = max(counts) bytes
// (its own counts[rank] bytes, then padding), ncclAllGather puts rank r's padded block at
// r * padded_block of a scratch buffer, and `copies` moves the real bytes to their places in
// the caller's compact output (block r at offsets[r]). Copies of empty blocks are left out and
// runs that are contiguous on both sides are merged, so equal counts need a single copy.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "gradzip/error.h"

namespace gradzip::collectives {

struct NcclAllgatherLayout {
  struct Copy {
    std::size_t source = 0;       // byte offset in the padded scratch buffer
    std::size_t destination = 0;  // byte offset in the compact output
    std::size_t bytes = 0;        // never 0
    bool operator==(const Copy&) const = default;
  };
  std::size_t padded_block = 0;       // max(counts): the bytes each rank contributes
  std::size_t padded_total = 0;       // padded_block * counts.size(): the scratch size
  std::size_t total = 0;              // sum(counts): the compact output size
  std::vector<std::size_t> offsets;   // offsets[r] = counts[0] + ... + counts[r - 1]
  std::vector<Copy> copies;           // padded scratch -> compact output, in rank order
};

// The layout for blocks of `counts[r]` bytes from rank r. Throws ErrorCode::invalid_argument
// when the padded or compact total does not fit in std::size_t.
inline NcclAllgatherLayout nccl_allgather_layout(std::span<const std::size_t> counts) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  NcclAllgatherLayout layout;
  layout.offsets.reserve(counts.size());
  for (const std::size_t count : counts) {
    GZ_REQUIRE(count <= kMax - layout.total, ErrorCode::invalid_argument,
               "allgatherv (nccl): the blocks of ", counts.size(),
               " ranks add up to more than a size_t holds");
    layout.offsets.push_back(layout.total);
    layout.total += count;
    layout.padded_block = std::max(layout.padded_block, count);
  }
  GZ_REQUIRE(counts.empty() || layout.padded_block <= kMax / counts.size(),
             ErrorCode::invalid_argument, "allgatherv (nccl): ", counts.size(),
             " padded blocks of ", layout.padded_block, " bytes exceed a size_t");
  layout.padded_total = layout.padded_block * counts.size();
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] == 0) continue;
    const NcclAllgatherLayout::Copy copy{r * layout.padded_block, layout.offsets[r], counts[r]};
    if (!layout.copies.empty()) {
      NcclAllgatherLayout::Copy& last = layout.copies.back();
      if (last.source + last.bytes == copy.source &&
          last.destination + last.bytes == copy.destination) {
        last.bytes += copy.bytes;
        continue;
      }
    }
    layout.copies.push_back(copy);
  }
  return layout;
}

}  // namespace gradzip::collectives
