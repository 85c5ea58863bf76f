// The codec specs the fuzz targets and the seed-corpus writer share, and the input layout of
// fuzz_decode (tests/fuzz/fuzz_decode.cpp):
//
//   offset  size  field
//   0       1     spec      index into kFuzzSpecs, taken modulo its size
//   1       2     count     u16 little-endian, taken modulo kFuzzMaxCount + 1: the output's count
//   3       1     isa       kernels::cpu::Isa forced for the call, modulo 3 (capped at the CPU's)
//   4       ...   message   the bytes handed to decode / decode_add, exactly
//
// The seed corpus (tests/fuzz/corpus/, written by write_seed_corpus.cpp) depends on the order
// of this list: append new specs at the end and rewrite the corpus.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gradzip::fuzz {

inline constexpr const char* kFuzzSpecs[] = {
    "none",
    "fp16",
    "bf16",
    "qsgd:bits=1,bucket=1",
    "qsgd:bits=1,bucket=64",
    "qsgd:bits=2,bucket=7",
    "qsgd:bits=2,bucket=512",
    "qsgd:bits=4,bucket=3",
    "qsgd:bits=4,bucket=128",
    "qsgd:bits=8,bucket=1",
    "qsgd:bits=8,bucket=512",
    "sign:bucket=1",
    "sign:bucket=13",
    "sign:bucket=512",
    "topk:ratio=0.1",
    "topk:k=1",
    "topk:ratio=0.5,approx=on",
    "topk:ratio=0.1,values=fp16",
    "topk:ratio=0.3,approx=on,values=fp16",
    "randk:ratio=0.1",
    "randk:k=1",
    "randk:ratio=0.5,values=fp16",
    "terngrad:bucket=1",
    "terngrad:bucket=7",
    "terngrad:bucket=512",
};
inline constexpr std::size_t kFuzzSpecCount = sizeof(kFuzzSpecs) / sizeof(kFuzzSpecs[0]);
static_assert(kFuzzSpecCount <= 256, "the spec index is one byte");

// Largest output count a fuzz input selects.
inline constexpr std::size_t kFuzzMaxCount = 4096;

// Bytes before the message in a fuzz_decode input.
inline constexpr std::size_t kFuzzDecodePrefixBytes = 4;

}  // namespace gradzip::fuzz
