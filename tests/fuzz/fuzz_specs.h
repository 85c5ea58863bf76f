// The codec specs the fuzz targets and the seed-corpus writer share, and the input layout of
// fuzz_decode (tests/fuzz/fuzz_decode.cpp):
//
//   offset  size  field
//   0       1     spec      index into kFuzzSpecs, taken modulo its size
//   1       2     count     u16 little-endian, taken modulo kFuzzMaxCount + 1: the output's count
//   3       1     isa       kernels::cpu::Isa forced for the call, modulo 3 (capped at the CPU's)
//   4       ...   message   the bytes handed to decode / decode_add, exactly
//
// The specs are the codec rows' example specs (compressors/codec_descriptor.h), row by row in
// gradzip/codec_list.h's order: the conformance list of every element codec. The seed corpus
// (tests/fuzz/corpus/, written by write_seed_corpus.cpp) depends on that order: a new codec's
// specs come last (its row is the list's last line), so the corpus only gains its files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "compressors/codec_descriptor.h"

namespace gradzip::fuzz {

// Every row's example specs, as C strings (they are string literals in the rows).
inline std::vector<const char*> every_example_spec() {
  std::vector<const char*> specs;
  for (const compressors::CodecDescriptor& row : compressors::codec_descriptors())
    for (const std::string_view spec : row.example_specs) specs.push_back(spec.data());
  return specs;
}

inline const std::vector<const char*> kFuzzSpecs = every_example_spec();
inline const std::size_t kFuzzSpecCount = kFuzzSpecs.size();

// Largest output count a fuzz input selects.
inline constexpr std::size_t kFuzzMaxCount = 4096;

// Bytes before the message in a fuzz_decode input.
inline constexpr std::size_t kFuzzDecodePrefixBytes = 4;

}  // namespace gradzip::fuzz
