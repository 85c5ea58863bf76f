// The one list of gradzip's codecs: each codec's name (its spec name and its CodecKind
// enumerator, in the spec grammar's order) and the codec byte its messages carry on the wire
// (0: it sends no messages of its own; powersgd compresses whole matrices inside the Reducer).
//
// Everything else about a codec lives in its row (compressors/codec_descriptor.h: keys, factory,
// traits the collectives read, device path), which the library finds through this list. Adding
// a codec is one line here and its row; a codec byte is never reused (old messages must not
// decode as a new codec), and the order is CodecKind's, so a new codec goes at the end.
//
// GRADZIP_CODECS(X) expands X(name, wire_id) once per codec.
#pragma once

#define GRADZIP_CODECS(X) \
  X(none, 1)              \
  X(fp16, 2)              \
  X(bf16, 3)              \
  X(qsgd, 4)              \
  X(sign, 5)              \
  X(topk, 6)              \
  X(randk, 7)             \
  X(powersgd, 0)          \
  X(terngrad, 8)          \
  X(fp8, 9)
