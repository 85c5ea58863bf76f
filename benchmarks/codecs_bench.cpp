// gradzip-bench codecs: for each codec, on N(0, 1) f32 data of --size elements,
//   ratio        input bytes / encoded bytes (header included)
//   encode GB/s  input bytes / best encode time of --repeat runs
//   decode GB/s  input bytes / best decode time (into f32) of --repeat runs
//   EF enc GB/s  input bytes / best time of the encode with error feedback, the path the
//                collectives run when the spec has ef=on (ErrorFeedbackCodec::encode_chunk:
//                g + e, encode, decode, e = g + e - D), whatever the spec's own ef= says
//   memcpy GB/s  the same input bytes copied by memcpy, best of --repeat runs, measured in this run
//   rel_error    ||g - D(C(g))|| / ||g||, in double
// Throughputs are also printed as fractions of memcpy, the baseline measured in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/bench_support.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/error.h"
#include "kernels/cpu/cpu_features.h"

namespace gradzip::bench {
namespace {

struct Options {
  std::size_t size = std::size_t{16} << 20;
  std::vector<std::string> codecs;
  int repeat = 5;
  std::string json_path;
  std::string isa = "auto";
};

const std::vector<std::string> kDefaultCodecs = {
    "none",  "fp16", "bf16", "qsgd:bits=8", "qsgd:bits=4", "qsgd:bits=2", "terngrad", "sign",
    "topk:ratio=0.01", "topk:ratio=0.01,approx=on", "topk:ratio=0.001", "randk:ratio=0.01"};

struct Result {
  std::string codec;
  double ratio = 0;
  double encode_gbps = 0;
  double decode_gbps = 0;
  double ef_encode_gbps = 0;
  double rel_error = 0;
};

void print_help() {
  std::printf(
      "usage: gradzip-bench codecs [--size N] [--codec SPEC]... [--repeat R] [--isa ISA] "
      "[--json FILE]\n"
      "  --size N      f32 elements of N(0,1) data (default 16777216)\n"
      "  --codec SPEC  a compression spec; repeat for several (default: a standard set)\n"
      "  --repeat R    timed runs per measurement, the best is reported (default 5)\n"
      "  --isa ISA     auto, avx512, avx2 or scalar (default auto)\n"
      "  --json FILE   also write one JSON object per codec to FILE\n");
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* {
      GZ_REQUIRE(i + 1 < argc, ErrorCode::invalid_argument, "codecs: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--size") {
      options.size = parse_count("codecs", value(), arg);
    } else if (arg == "--codec") {
      options.codecs.emplace_back(value());
    } else if (arg == "--repeat") {
      options.repeat = static_cast<int>(parse_count("codecs", value(), arg));
      GZ_REQUIRE(options.repeat >= 1, ErrorCode::invalid_argument, "codecs: --repeat must be >= 1");
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--isa") {
      options.isa = value();
    } else if (arg == "--help" || arg == "-h") {
      print_help();
      std::exit(0);
    } else {
      GZ_THROW(ErrorCode::invalid_argument, "codecs: unknown option '", arg,
               "' (see gradzip-bench codecs --help)");
    }
  }
  if (options.codecs.empty()) options.codecs = kDefaultCodecs;
  return options;
}

// Forces --isa. An ISA this CPU lacks is refused rather than run as the next lower one, which
// would print that ISA's figures under the requested name.
void apply_isa(const std::string& isa) {
  using kernels::cpu::Isa;
  if (isa == "auto") return;
  Isa forced = Isa::scalar;
  if (isa == "avx512") forced = Isa::avx512;
  else if (isa == "avx2") forced = Isa::avx2;
  else if (isa != "scalar")
    GZ_THROW(ErrorCode::invalid_argument, "codecs: --isa '", isa,
             "' is not one of auto, avx512, avx2, scalar");
  GZ_REQUIRE(forced <= kernels::cpu::detected_isa(), ErrorCode::unsupported, "codecs: --isa ", isa,
             ": this CPU lacks it (it has ", kernels::cpu::isa_name(kernels::cpu::detected_isa()), ")");
  kernels::cpu::set_isa_override(forced);
}

// Best wall time of `repeat` calls, after one untimed warm-up call.
template <typename Body>
double best_seconds(int repeat, Body&& body) {
  body();
  double best = 1e300;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(stop - start).count());
  }
  return best;
}

double gbps(std::size_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

}  // namespace

int run_codecs(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  apply_isa(options.isa);

  std::vector<float> gradient(options.size);
  std::mt19937_64 engine(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& value : gradient) value = normal(engine);
  const std::size_t input_bytes = gradient.size() * sizeof(float);

  // Destination buffers are written once before timing so page faults are not measured.
  std::vector<float> copy(gradient.size(), 1.0f);
  std::vector<float> decoded(gradient.size(), 1.0f);
  const double memcpy_seconds = best_seconds(options.repeat, [&] {
    std::memcpy(copy.data(), gradient.data(), input_bytes);
  });
  const double memcpy_gbps = gbps(input_bytes, memcpy_seconds);

  std::printf("gradzip-bench codecs: %zu f32 elements (%.1f MiB) of N(0,1), best of %d runs, "
              "cpu isa %s\n",
              options.size, static_cast<double>(input_bytes) / (1 << 20), options.repeat,
              std::string(kernels::cpu::isa_name(kernels::cpu::active_isa())).c_str());
  std::printf("memcpy baseline: %.2f GB/s\n\n", memcpy_gbps);
  std::printf("%-44s %9s %9s %8s %9s %8s %9s %8s %10s\n", "codec", "ratio", "enc GB/s", "enc/cpy",
              "dec GB/s", "dec/cpy", "EF GB/s", "EF/cpy", "rel_error");

  std::vector<Result> results;
  int failures = 0;
  for (const std::string& text : options.codecs) {
    try {
      const std::shared_ptr<const Codec> codec = make_codec(text);
      std::vector<std::byte> message(codec->max_encoded_bytes(gradient.size()));
      std::fill(message.begin(), message.end(), std::byte{0});
      const EncodeContext ctx{.seed = 1, .step = 1, .tensor_id = 7, .element_offset = 0};
      const ConstTensorView input = host_view(gradient.data(), gradient.size());
      std::size_t encoded_bytes = 0;
      const double encode_seconds = best_seconds(options.repeat, [&] {
        encoded_bytes = codec->encode(input, message, ctx);
      });
      const std::span<const std::byte> encoded(message.data(), encoded_bytes);
      // Error feedback around the same codec, into its own message buffer (the residual
      // changes with every run; the work per run does not).
      error_feedback::ResidualStore store(1, 0, ResizePolicy::error);
      error_feedback::ErrorFeedbackCodec with_feedback(codec, store);
      std::vector<std::byte> ef_message(codec->max_encoded_bytes(gradient.size()), std::byte{0});
      const double ef_encode_seconds = best_seconds(options.repeat, [&] {
        with_feedback.encode_chunk("bench", gradient.size(), input, ef_message, ctx);
      });
      const double decode_seconds = best_seconds(options.repeat, [&] {
        codec->decode(encoded, host_view(decoded.data(), decoded.size()));
      });
      double error_sq = 0, norm_sq = 0;
      for (std::size_t i = 0; i < gradient.size(); ++i) {
        const double diff = static_cast<double>(gradient[i]) - decoded[i];
        error_sq += diff * diff;
        norm_sq += static_cast<double>(gradient[i]) * gradient[i];
      }
      Result result{codec->name(), static_cast<double>(input_bytes) / encoded_bytes,
                    gbps(input_bytes, encode_seconds), gbps(input_bytes, decode_seconds),
                    gbps(input_bytes, ef_encode_seconds),
                    norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : 0.0};
      result.codec = text;
      std::printf("%-44s %9.2f %9.2f %8.2f %9.2f %8.2f %9.2f %8.2f %10.3e\n", text.c_str(),
                  result.ratio, result.encode_gbps, result.encode_gbps / memcpy_gbps,
                  result.decode_gbps, result.decode_gbps / memcpy_gbps, result.ef_encode_gbps,
                  result.ef_encode_gbps / memcpy_gbps, result.rel_error);
      results.push_back(result);
    } catch (const Error& error) {
      std::printf("%-44s failed: %s\n", text.c_str(), error.what());
      ++failures;
    }
  }

  if (!options.json_path.empty()) {
    std::ofstream json(options.json_path);
    GZ_REQUIRE(json.good(), ErrorCode::io_error, "codecs: cannot write --json file '",
               options.json_path, "'");
    json.precision(9);
    json << "[\n";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      json << "  {\"codec\": \"" << r.codec << "\", \"ratio\": " << r.ratio
           << ", \"encode_gbps\": " << r.encode_gbps << ", \"decode_gbps\": " << r.decode_gbps
           << ", \"ef_encode_gbps\": " << r.ef_encode_gbps
           << ", \"memcpy_gbps\": " << memcpy_gbps << ", \"rel_error\": " << r.rel_error
           << ", \"size\": " << options.size << ", \"isa\": \""
           << kernels::cpu::isa_name(kernels::cpu::active_isa()) << "\"}"
           << (i + 1 < results.size() ? "," : "")
           << "\n";
    }
    json << "]\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace gradzip::bench
