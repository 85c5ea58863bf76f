// gradzip-bench model: the α-β-γ cost model of collectives/cost_model.h put to work
// (docs/cost-model.md).
//   1. γ of every codec, measured here (encode with error feedback where the spec has it,
//      decode_add, f32 add);
//   2. validation: every row of `gradzip-bench allreduce --json` files (measured, e.g. on the
//      emulated cluster) against the model's time for the same algorithm, codec, size and rank
//      count, with the link given by --link-gbps / --link-latency-us; the relative error per
//      row and its median and maximum;
//   3. projection: for model sizes (ResNet-50, BERT-large, 7B), link speeds and P = 2 .. 4096,
//      the algorithm algo=auto runs for each codec (choose_allreduce with this model: the
//      codec's default unless another of its auto candidates is predicted at least 15% faster;
//      never an algorithm auto excludes as compressing too often) and its speedup over the
//      dense f32 all-reduce (`none`) and the dense 16-bit one (`fp16`), each the cheapest of
//      all its algorithms: the baselines a tuned library already gives a user;
//   4. break-even: per codec and P, the link bandwidth above which the codec no longer beats
//      each baseline.
// --json FILE writes all four as JSON (benchmarks/reproduce.py's cost_model suite).
// Single process, no MPI.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/bench_support.h"
#include "collectives/algorithm_choice.h"
#include "collectives/algorithm_table.h"
#include "collectives/codec_table.h"
#include "collectives/cost_model.h"
#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"

namespace gradzip::bench {
namespace {

using collectives::CodecCost;
using collectives::CostEstimate;
using collectives::LinkModel;
using collectives::AlgorithmId;

struct ModelSize {
  std::string name;
  std::size_t parameters;
};

struct Options {
  bool help = false;
  bool choice_cost = false;  // --choice-cost: time algo=auto's choice, then stop
  // --device cuda: γ measured on CUDA device 0 and the projection of stream-ordered device
  // calls (LinkModel::stream_ordered: CUDA tensors over NCCL).
  bool device_calls = false;
  std::vector<std::string> codecs = {"fp16", "qsgd:bits=4", "qsgd:bits=8", "sign",
                                     "topk:ratio=0.01", "randk:ratio=0.01"};
  std::vector<int> ranks = {2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::vector<double> gbps = {1, 10, 25, 100, 400};
  double latency_us = 10;  // α of the projection's links
  std::vector<ModelSize> models = {{"resnet50", 25557032},
                                   {"bert-large", 340000000},
                                   {"7b", 7000000000}};
  std::size_t sample = std::size_t{1} << 22;
  std::vector<std::string> validate;  // allreduce --json files
  double link_gbps = 1;               // link of the validation measurements
  double link_latency_us = 50;
  double link_efficiency = 1448.0 / 1538.0;  // TCP payload per wire byte at MTU 1500
  // Cores the measured ranks shared: with more ranks than cores (the emulated cluster on this
  // host), each rank's compute ran ranks / cores times slower than γ measured alone.
  double cores = std::max(1u, std::thread::hardware_concurrency());
  std::string csv_path;
  std::string json_path;
};

void print_help() {
  std::printf(
      "usage: gradzip-bench model [--codec SPEC]... [--ranks P,P,...] [--gbps G,G,...]\n"
      "                           [--latency-us A] [--sample N] [--csv FILE]\n"
      "                           [--validate FILE]... [--link-gbps G] [--link-latency-us A]\n"
      "                           [--link-efficiency F] [--cores C] [--models LIST]\n"
      "                           [--json FILE] [--choice-cost] [--device cuda]\n"
      "  --codec SPEC        codecs to model (default fp16, qsgd:bits=4, qsgd:bits=8, sign,\n"
      "                      topk:ratio=0.01, randk:ratio=0.01); the baselines none and fp16\n"
      "                      (dense rings) are always modelled\n"
      "  --ranks LIST        rank counts of the projection (default 2,4,...,4096)\n"
      "  --gbps LIST         link speeds of the projection in Gbit/s (default 1,10,25,100,400)\n"
      "  --latency-us A      α of the projection's links (default 10)\n"
      "  --sample N          elements per γ measurement (default 2^22)\n"
      "  --csv FILE          every projected point (model, gbps, ranks, spec, algorithm,\n"
      "                      seconds, speedups) for plotting\n"
      "  --validate FILE     rows of `gradzip-bench allreduce --json` to compare with the model\n"
      "  --link-gbps G       nominal link speed of those measurements (default 1)\n"
      "  --link-latency-us A α of those measurements (default 50)\n"
      "  --link-efficiency F payload bytes per wire byte (default 1448/1538: TCP at MTU 1500)\n"
      "  --cores C           cores the measured ranks shared (default: this machine's); with\n"
      "                      P > C ranks, gamma is scaled by P / C for those rows\n"
      "  --models LIST       model sizes of the projection, among resnet50, bert-large, 7b\n"
      "                      (default all three)\n"
      "  --json FILE         gamma, validation rows and error quantiles, projection and\n"
      "                      break-even speeds as JSON (break-even null: still ahead at 1e5)\n"
      "  --choice-cost       only time algo=auto's choice per call (with the model, and the\n"
      "                      fixed per-codec choice) for each codec, and stop\n"
      "  --device cuda       measure gamma on CUDA device 0 (the device codecs) and project\n"
      "                      calls on CUDA tensors over NCCL (stream-ordered: the ring and SRA\n"
      "                      pipelined on streams, no size exchanges, one completion\n"
      "                      all-reduce; each codec's default algorithm, which is what\n"
      "                      algo=auto runs there); with GRADZIP_DEVICE=emulated gamma is the\n"
      "                      CPU twins' (not a GPU's); not with --validate (host measurements).\n"
      "                      --device host: the default\n");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ',')) parts.push_back(part);
  return parts;
}

Options parse(int argc, char** argv) {
  Options options;
  bool codecs_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      GZ_REQUIRE(i + 1 < argc, ErrorCode::invalid_argument, "model: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      options.help = true;
    } else if (arg == "--codec") {
      if (!codecs_given) options.codecs.clear();
      codecs_given = true;
      options.codecs.push_back(value());
    } else if (arg == "--ranks") {
      options.ranks.clear();
      for (const std::string& p : split_list(value()))
        options.ranks.push_back(static_cast<int>(parse_count("model", p.c_str(), "--ranks")));
      for (int p : options.ranks)
        GZ_REQUIRE(p >= 2, ErrorCode::invalid_argument, "model: --ranks takes counts >= 2, got ", p);
    } else if (arg == "--gbps") {
      options.gbps.clear();
      for (const std::string& g : split_list(value()))
        options.gbps.push_back(parse_positive("model", g, "--gbps"));
    } else if (arg == "--latency-us") {
      options.latency_us = parse_positive("model", value(), "--latency-us");
    } else if (arg == "--sample") {
      options.sample = parse_count("model", value().c_str(), "--sample");
      GZ_REQUIRE(options.sample > 0, ErrorCode::invalid_argument, "model: --sample must be > 0");
    } else if (arg == "--csv") {
      options.csv_path = value();
    } else if (arg == "--json") {
      options.json_path = value();
    } else if (arg == "--models") {
      std::vector<ModelSize> chosen;
      const std::vector<ModelSize> all = Options{}.models;
      for (const std::string& name : split_list(value())) {
        const auto known = std::find_if(all.begin(), all.end(),
                                        [&](const ModelSize& m) { return m.name == name; });
        GZ_REQUIRE(known != all.end(), ErrorCode::invalid_argument,
                   "model: --models: unknown model '", name, "' (known: resnet50, bert-large, 7b)");
        chosen.push_back(*known);
      }
      GZ_REQUIRE(!chosen.empty(), ErrorCode::invalid_argument, "model: --models needs a name");
      options.models = std::move(chosen);
    } else if (arg == "--validate") {
      options.validate.push_back(value());
    } else if (arg == "--link-gbps") {
      options.link_gbps = parse_positive("model", value(), "--link-gbps");
    } else if (arg == "--link-latency-us") {
      options.link_latency_us = parse_positive("model", value(), "--link-latency-us");
    } else if (arg == "--choice-cost") {
      options.choice_cost = true;
    } else if (arg == "--device") {
      const std::string device = value();
      GZ_REQUIRE(device == "cuda" || device == "host", ErrorCode::invalid_argument,
                 "model: --device takes cuda or host, got '", device, "'");
      options.device_calls = device == "cuda";
    } else if (arg == "--cores") {
      options.cores = parse_positive("model", value(), "--cores");
    } else if (arg == "--link-efficiency") {
      options.link_efficiency = parse_positive("model", value(), "--link-efficiency");
    } else {
      GZ_THROW(ErrorCode::invalid_argument, "model: unknown option '", arg, "' (see --help)");
    }
  }
  GZ_REQUIRE(!options.device_calls || options.validate.empty(), ErrorCode::invalid_argument,
             "model: --validate compares host measurements; it cannot be combined with --device cuda");
  return options;
}

// One codec: its spec, codec object and measured γ.
struct ModeledCodec {
  std::string text;
  CompressionSpec spec;
  std::unique_ptr<Codec> codec;
  CodecCost cost;
};

ModeledCodec model_codec(const std::string& text, std::size_t sample, Device where = Device{}) {
  ModeledCodec modeled;
  modeled.spec = CompressionSpec::parse(text);
  GZ_REQUIRE(modeled.spec.codec != CodecKind::powersgd, ErrorCode::unsupported,
             "model: powersgd is a Reducer-level compressor; the model covers the all-reduce "
             "algorithms");
  modeled.text = text;
  modeled.codec = make_codec(modeled.spec);
  modeled.cost = collectives::measure_codec_cost(*modeled.codec, sample, 3, where);
  return modeled;
}

LinkModel link_of(double gbps, double latency_us, double efficiency = 1.0) {
  return LinkModel{latency_us * 1e-6, gbps * 1e9 / 8 * efficiency};
}

// ---- validation ---------------------------------------------------------------------------

struct MeasuredRow {
  std::string spec, algo;
  int ranks = 0;
  std::size_t bytes = 0;
  double time_s = 0;
};

// The value of "key" in one line of allreduce --json output (one object per line).
std::optional<std::string> json_field(const std::string& line, const std::string& key) {
  const std::string quoted = "\"" + key + "\": ";
  const std::size_t at = line.find(quoted);
  if (at == std::string::npos) return std::nullopt;
  std::size_t begin = at + quoted.size();
  if (line[begin] == '"') {
    const std::size_t end = line.find('"', begin + 1);
    if (end == std::string::npos) return std::nullopt;
    return line.substr(begin + 1, end - begin - 1);
  }
  std::size_t end = line.find_first_of(",}", begin);
  return line.substr(begin, end - begin);
}

std::vector<MeasuredRow> read_measurements(const std::string& path) {
  std::ifstream file(path);
  GZ_REQUIRE(file.good(), ErrorCode::io_error, "model: cannot read --validate file '", path, "'");
  std::vector<MeasuredRow> rows;
  std::string line;
  while (std::getline(file, line)) {
    const auto spec = json_field(line, "spec"), algo = json_field(line, "algo"),
               ranks = json_field(line, "ranks"), bytes = json_field(line, "bytes"),
               time = json_field(line, "time_s");
    if (!spec || !algo || !ranks || !bytes || !time) continue;
    rows.push_back({*spec, *algo, std::atoi(ranks->c_str()),
                    static_cast<std::size_t>(std::strtoull(bytes->c_str(), nullptr, 10)),
                    std::strtod(time->c_str(), nullptr)});
  }
  GZ_REQUIRE(!rows.empty(), ErrorCode::io_error, "model: '", path,
             "' holds no `gradzip-bench allreduce --json` rows");
  return rows;
}

std::optional<AlgorithmId> algorithm_of(const std::string& algo) {
  const collectives::AlgorithmRow* row = collectives::find_algorithm_row(algo);
  // "mpi" and "hier/<inner>" are not modelled per row.
  if (row == nullptr || row->path == AlgorithmId::hier) return std::nullopt;
  return row->path;
}

// `sample`: the largest tensor γ is measured on. Appends `"validation": {...}, ` to `json`.
void run_validation(const Options& options, std::size_t sample, std::string& json) {
  const LinkModel link = link_of(options.link_gbps, options.link_latency_us, options.link_efficiency);
  std::printf("\n== validation: model against measured rows (link %.3g Gbit/s x %.4f payload "
              "efficiency = %.1f MB/s, alpha %.0f us; gamma measured on each row's size, "
              "x max(1, P / %.0f cores))\n",
              options.link_gbps, options.link_efficiency, link.bytes_per_s / 1e6,
              options.link_latency_us, options.cores);
  std::printf("%-30s %-16s %5s %10s %11s %11s %8s  %s\n", "spec", "algo", "ranks", "size",
              "measured_s", "model_s", "error", "model: latency / transfer / compute");
  std::vector<double> errors;
  std::string json_rows;
  std::vector<std::unique_ptr<ModeledCodec>> cache;
  for (const std::string& path : options.validate) {
    for (const MeasuredRow& row : read_measurements(path)) {
      const std::optional<AlgorithmId> algorithm = algorithm_of(row.algo);
      if (!algorithm || row.ranks < 2 || row.time_s <= 0) continue;
      // γ measured on a tensor of the row's own size (up to `sample`): a 1 MiB tensor is
      // encoded from cache, a 64 MiB one from memory, and γ differs by up to 3x between them.
      const std::size_t elements = std::max<std::size_t>(1, std::min(sample, row.bytes / 4));
      const std::string key = row.spec + "@" + std::to_string(elements);
      auto found = std::find_if(cache.begin(), cache.end(),
                                [&](const auto& c) { return c->text == key; });
      if (found == cache.end()) {
        cache.push_back(std::make_unique<ModeledCodec>(model_codec(row.spec, elements)));
        cache.back()->text = key;
        found = cache.end() - 1;
      }
      const ModeledCodec& modeled = **found;
      const double sharing = std::max(1.0, row.ranks / options.cores);
      const CodecCost shared{modeled.cost.encode_s * sharing, modeled.cost.decode_add_s * sharing,
                             modeled.cost.add_s * sharing};
      const CostEstimate estimate = collectives::estimate_allreduce(
          *algorithm, *modeled.codec, shared, row.bytes / 4, row.ranks, link);
      const double error = (estimate.seconds - row.time_s) / row.time_s;
      errors.push_back(std::fabs(error));
      json_rows += detail::concat(json_rows.empty() ? "" : ",\n", "  {\"spec\": ", json_string(row.spec),
                                  ", \"algo\": ", json_string(row.algo), ", \"ranks\": ", row.ranks,
                                  ", \"bytes\": ", row.bytes, ", \"measured_s\": ",
                                  json_number(row.time_s), ", \"model_s\": ",
                                  json_number(estimate.seconds), ", \"error\": ", json_number(error),
                                  "}");
      std::printf("%-30s %-16s %5d %10s %11.4e %11.4e %+7.1f%%  %.2e / %.2e / %.2e\n",
                  row.spec.c_str(), row.algo.c_str(), row.ranks, human_bytes(row.bytes).c_str(),
                  row.time_s, estimate.seconds, 100 * error, estimate.latency_s,
                  estimate.transfer_s, estimate.compute_s);
    }
  }
  GZ_REQUIRE(!errors.empty(), ErrorCode::invalid_argument,
             "model: no measured row has an algorithm the model covers");
  std::sort(errors.begin(), errors.end());
  const double median = errors[errors.size() / 2],
               p90 = errors[std::min(errors.size() - 1, errors.size() * 9 / 10)];
  std::printf("%zu rows: |error| median %.1f%%, 90th percentile %.1f%%, max %.1f%%\n",
              errors.size(), 100 * median, 100 * p90, 100 * errors.back());
  json += detail::concat("\"validation\": {\"link_gbps\": ", json_number(options.link_gbps),
                         ", \"link_latency_us\": ", json_number(options.link_latency_us),
                         ", \"link_efficiency\": ", json_number(options.link_efficiency),
                         ", \"cores\": ", json_number(options.cores), ", \"sample\": ", sample,
                         ", \"median_abs_error\": ", json_number(median),
                         ", \"p90_abs_error\": ", json_number(p90),
                         ", \"max_abs_error\": ", json_number(errors.back()), ", \"rows\": [\n",
                         json_rows, "]},\n");
}

// ---- projection -----------------------------------------------------------------------------

// The time of a baseline's cheapest algorithm among every one that runs its codec: what a
// tuned dense all-reduce would take.
CostEstimate best_of(const ModeledCodec& codec, std::size_t count, int ranks, const LinkModel& link) {
  return collectives::cheapest_allreduce(collectives::candidate_algorithms(codec.spec), *codec.codec,
                                         codec.cost, count, ranks, link);
}

// The time of what algo=auto runs for `codec`: choose_allreduce itself, given this model
// (collectives/algorithm_choice.h; no node structure, so never hier), then that algorithm's
// estimate. An explicit algo= in the spec is what it runs, as in a call.
CostEstimate auto_choice_of(const ModeledCodec& codec, std::size_t count, int ranks,
                            const LinkModel& link) {
  // On CUDA tensors algo=auto runs the codec's default path (it does not consult the model:
  // collectives/algorithm_choice.h, auto_uses_model), which runs stream-ordered over NCCL.
  if (link.stream_ordered && codec.spec.algo == Algorithm::auto_select) {
    return collectives::estimate_allreduce(collectives::codec_row(codec.spec.codec).default_path,
                                           *codec.codec, codec.cost, count, ranks, link);
  }
  const collectives::AutoModel model{*codec.codec, codec.cost, link, ranks, std::nullopt};
  const collectives::AllreduceChoice choice =
      collectives::choose_allreduce(codec.spec, count, codec.spec.warmup, &model);
  const collectives::AlgorithmRow* row = collectives::find_algorithm_row(choice.name);
  GZ_REQUIRE(choice.path == collectives::AllreducePath::flat && row != nullptr,
             ErrorCode::internal, "model: algo=auto chose '", choice.name, "' for ",
             codec.text, " at ", count, " elements, which the projection does not model");
  return collectives::estimate_allreduce(row->path, *codec.codec, codec.cost, count, ranks, link);
}

// The bandwidth (Gbit/s) at which `codec` and `baseline` take the same time, by bisection in
// log space on [0.01, 1e5]; +inf when the codec wins over the whole range, 0 when it never does.
double break_even_gbps(const ModeledCodec& codec, const ModeledCodec& baseline, std::size_t count,
                       int ranks, double latency_us, bool stream_ordered) {
  const auto advantage = [&](double gbps) {
    LinkModel link = link_of(gbps, latency_us);
    link.stream_ordered = stream_ordered;
    return best_of(baseline, count, ranks, link).seconds -
           auto_choice_of(codec, count, ranks, link).seconds;
  };
  double low = 0.01, high = 1e5;
  if (advantage(low) <= 0) return 0;
  if (advantage(high) > 0) return INFINITY;
  for (int i = 0; i < 60; ++i) {
    const double middle = std::sqrt(low * high);
    (advantage(middle) > 0 ? low : high) = middle;
  }
  return std::sqrt(low * high);
}

std::string gbps_text(double gbps) {
  if (gbps == 0) return "never";
  if (std::isinf(gbps)) return ">1e5";
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", gbps);
  return text;
}

// What algo=auto's model costs per call (collectives/algorithm_choice.h): 2 x 10^5 choices of
// a 2^20-element all-reduce at 4 ranks with a model (its candidates' estimates and the note),
// against the fixed per-codec choice; time per choice, the best of 3 runs.
int run_choice_cost(const Options& options) {
  std::printf("gradzip-bench model --choice-cost: microseconds per algo=auto choice, 2^20 elements, "
              "4 ranks\n%-24s %12s %12s\n", "spec", "with model", "fixed");
  constexpr int kChoices = 200000;
  for (const std::string& text : options.codecs) {
    const CompressionSpec spec = CompressionSpec::parse(text);
    if (spec.codec == CodecKind::powersgd) continue;
    const std::unique_ptr<Codec> codec = make_codec(spec);
    const collectives::AutoModel model{*codec, CodecCost{1e-9, 1e-9, 0.3e-9},
                                       LinkModel{25e-6, 1.25e9, 0, 100e-6}, 4, std::nullopt};
    std::size_t names = 0;  // keeps the loops from being optimised away
    const auto per_choice = [&](const collectives::AutoModel* with) {
      double best = 1e30;
      for (int run = 0; run < 3; ++run) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kChoices; ++i)
          names += collectives::choose_allreduce(spec, std::size_t{1} << 20, 0, with).name.size();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      return best / kChoices * 1e6;
    };
    const double modeled = per_choice(&model), fixed = per_choice(nullptr);
    std::printf("%-24s %12.2f %12.2f%s\n", text.c_str(), modeled, fixed, names == 0 ? " ?" : "");
  }
  return 0;
}

int run(const Options& options) {
  if (options.choice_cost) return run_choice_cost(options);
  const Device where = options.device_calls ? Device{DeviceKind::cuda, 0} : Device{};
  std::printf("gradzip-bench model: alpha-beta-gamma cost of gradzip's all-reduce algorithms "
              "(collectives/cost_model.h, docs/cost-model.md)%s\n\n== gamma, measured %s on "
              "%zu elements (ns per element)\n",
              options.device_calls ? ", calls on CUDA tensors over NCCL (stream-ordered)" : "",
              options.device_calls ? "on CUDA device 0" : "here", options.sample);
  std::printf("%-24s %10s %12s %8s\n", "spec", "encode", "decode_add", "add");
  std::vector<std::unique_ptr<ModeledCodec>> codecs;
  auto dense = std::make_unique<ModeledCodec>(model_codec("none", options.sample, where));
  auto half = std::make_unique<ModeledCodec>(model_codec("fp16", options.sample, where));
  for (const std::string& text : options.codecs) {
    codecs.push_back(std::make_unique<ModeledCodec>(model_codec(text, options.sample, where)));
    // A codec that is a baseline's spec shares the baseline's γ, so that it ties with it.
    for (const ModeledCodec* baseline : {dense.get(), half.get()})
      if (codecs.back()->spec == baseline->spec) codecs.back()->cost = baseline->cost;
  }
  for (const ModeledCodec* c : {dense.get(), half.get()})
    std::printf("%-24s %10.3f %12.3f %8.3f\n", c->text.c_str(), c->cost.encode_s * 1e9,
                c->cost.decode_add_s * 1e9, c->cost.add_s * 1e9);
  for (const auto& c : codecs)
    if (c->spec != dense->spec && c->spec != half->spec) std::printf("%-24s %10.3f %12.3f %8.3f\n", c->text.c_str(), c->cost.encode_s * 1e9,
                c->cost.decode_add_s * 1e9, c->cost.add_s * 1e9);

  std::string json = detail::concat("{\"calls\": ",
                                    json_string(options.device_calls ? "cuda stream-ordered" : "host"),
                                    ",\n\"gamma\": [\n");
  {
    bool first = true;
    const auto gamma_row = [&](const ModeledCodec& c) {
      json += detail::concat(first ? "" : ",\n", "  {\"spec\": ", json_string(c.text),
                             ", \"encode_ns\": ", json_number(c.cost.encode_s * 1e9),
                             ", \"decode_add_ns\": ", json_number(c.cost.decode_add_s * 1e9),
                             ", \"add_ns\": ", json_number(c.cost.add_s * 1e9), "}");
      first = false;
    };
    gamma_row(*dense);
    gamma_row(*half);
    for (const auto& c : codecs)
      if (c->spec != dense->spec && c->spec != half->spec) gamma_row(*c);
    json += "],\n";
  }
  if (!options.validate.empty()) run_validation(options, options.sample, json);

  std::FILE* csv = nullptr;
  if (!options.csv_path.empty()) {
    csv = std::fopen(options.csv_path.c_str(), "w");
    GZ_REQUIRE(csv != nullptr, ErrorCode::io_error, "model: cannot write --csv file '",
               options.csv_path, "'");
    std::fprintf(csv, "model,parameters,gbps,ranks,spec,algorithm,seconds,dense_f32_seconds,"
                      "dense_f16_seconds,speedup_vs_f32,speedup_vs_f16\n");
  }
  std::printf("\n== projection: speedup of the algorithm algo=auto runs for each codec over the "
              "dense f32 all-reduce / the dense 16-bit all-reduce, each with its own cheapest "
              "algorithm (alpha %.0f us; the codec's algorithm in brackets)\n",
              options.latency_us);
  json += detail::concat("\"projection\": {\"latency_us\": ", json_number(options.latency_us),
                         ", \"rows\": [\n");
  bool first_projection = true;
  for (const ModelSize& model : options.models) {
    for (double gbps : options.gbps) {
      LinkModel link = link_of(gbps, options.latency_us);
      link.stream_ordered = options.device_calls;
      std::printf("\n%s (%zu parameters), %.3g Gbit/s\n%6s %11s %11s", model.name.c_str(),
                  model.parameters, gbps, "P", "dense_f32_s", "dense_f16_s");
      for (const auto& c : codecs) std::printf(" %22s", c->text.c_str());
      std::printf("\n");
      for (int ranks : options.ranks) {
        const double f32 = best_of(*dense, model.parameters, ranks, link).seconds;
        const double f16 = best_of(*half, model.parameters, ranks, link).seconds;
        std::printf("%6d %11.4e %11.4e", ranks, f32, f16);
        for (const auto& c : codecs) {
          const CostEstimate best = auto_choice_of(*c, model.parameters, ranks, link);
          char cell[64];
          std::snprintf(cell, sizeof cell, "%.2f/%.2f [%s]", f32 / best.seconds,
                        f16 / best.seconds, collectives::algorithm_id_name(best.algorithm));
          std::printf(" %22s", cell);
          if (csv != nullptr) {
            std::fprintf(csv, "%s,%zu,%.6g,%d,%s,%s,%.6e,%.6e,%.6e,%.6g,%.6g\n", model.name.c_str(),
                         model.parameters, gbps, ranks, c->text.c_str(),
                         collectives::algorithm_id_name(best.algorithm), best.seconds, f32,
                         f16, f32 / best.seconds, f16 / best.seconds);
          }
          json += detail::concat(
              first_projection ? "" : ",\n", "  {\"model\": ", json_string(model.name),
              ", \"parameters\": ", model.parameters, ", \"gbps\": ", json_number(gbps),
              ", \"ranks\": ", ranks, ", \"spec\": ", json_string(c->text), ", \"algorithm\": ",
              json_string(collectives::algorithm_id_name(best.algorithm)), ", \"seconds\": ",
              json_number(best.seconds), ", \"dense_f32_seconds\": ", json_number(f32),
              ", \"dense_f16_seconds\": ", json_number(f16), "}");
          first_projection = false;
        }
        std::printf("\n");
      }
    }
  }
  if (csv != nullptr) std::fclose(csv);
  json += "]},\n\"break_even\": [\n";
  bool first_break_even = true;

  std::printf("\n== break-even link bandwidth (Gbit/s): above it the codec no longer beats the "
              "dense f32 / the dense 16-bit all-reduce (alpha %.0f us; 'never': not even at "
              "0.01 Gbit/s, '>1e5': still ahead at 1e5)\n", options.latency_us);
  for (const ModelSize& model : options.models) {
    std::printf("\n%s\n%6s", model.name.c_str(), "P");
    for (const auto& c : codecs) std::printf(" %22s", c->text.c_str());
    std::printf("\n");
    for (int ranks : options.ranks) {
      std::printf("%6d", ranks);
      for (const auto& c : codecs) {
        const double vs_f32 = break_even_gbps(*c, *dense, model.parameters, ranks,
                                              options.latency_us, options.device_calls),
                     vs_f16 = break_even_gbps(*c, *half, model.parameters, ranks,
                                              options.latency_us, options.device_calls);
        const std::string cell = gbps_text(vs_f32) + " / " + gbps_text(vs_f16);
        std::printf(" %22s", cell.c_str());
        json += detail::concat(first_break_even ? "" : ",\n", "  {\"model\": ",
                               json_string(model.name), ", \"ranks\": ", ranks, ", \"spec\": ",
                               json_string(c->text), ", \"vs_f32_gbps\": ", json_number(vs_f32),
                               ", \"vs_f16_gbps\": ", json_number(vs_f16), "}");
        first_break_even = false;
      }
      std::printf("\n");
    }
  }
  json += "]}\n";
  if (!options.json_path.empty()) write_json_file("model", options.json_path, json);
  return 0;
}

}  // namespace

int run_model(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "gradzip-bench model: %s\n", error.what());
    return 2;
  }
  if (options.help) {
    print_help();
    return 0;
  }
  return run(options);
}

}  // namespace gradzip::bench
