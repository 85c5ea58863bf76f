// One factory per codec file; make_codec() (registry.cpp) calls the one that the codec's row in
// compressors/codec_descriptor.cpp names.
#pragma once

#include <memory>

#include "gradzip/codec.h"

namespace gradzip::compressors {

std::unique_ptr<Codec> make_none_codec(const CompressionSpec& spec);
std::unique_ptr<Codec> make_fp16_codec(const CompressionSpec& spec);   // cast_codec.cpp
std::unique_ptr<Codec> make_bf16_codec(const CompressionSpec& spec);   // cast_codec.cpp
std::unique_ptr<Codec> make_topk_codec(const CompressionSpec& spec);   // exact and approx

}  // namespace gradzip::compressors
