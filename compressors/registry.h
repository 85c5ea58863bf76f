// One factory per codec file; make_codec() (registry.cpp) picks one by spec.codec.
#pragma once

#include <memory>

#include "gradzip/codec.h"

namespace gradzip::compressors {

std::unique_ptr<Codec> make_none_codec(const CompressionSpec& spec);
std::unique_ptr<Codec> make_cast_codec(const CompressionSpec& spec);   // fp16, bf16
std::unique_ptr<Codec> make_qsgd_codec(const CompressionSpec& spec);
std::unique_ptr<Codec> make_sign_codec(const CompressionSpec& spec);
std::unique_ptr<Codec> make_topk_codec(const CompressionSpec& spec);   // exact and approx
std::unique_ptr<Codec> make_randk_codec(const CompressionSpec& spec);

}  // namespace gradzip::compressors
