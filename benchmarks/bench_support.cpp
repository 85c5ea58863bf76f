#include "benchmarks/bench_support.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>

#if GRADZIP_HAVE_MPI
#include <mpi.h>
#endif

namespace gradzip::bench {

std::size_t parse_count(const char* command, const char* text, std::string_view flag) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  GZ_REQUIRE(end != text && *end == '\0' && text[0] != '-', ErrorCode::invalid_argument, command,
             ": ", flag, " expects a non-negative integer, got '", text, "'");
  return static_cast<std::size_t>(value);
}

double parse_positive(const char* command, const std::string& text, std::string_view flag) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  GZ_REQUIRE(!text.empty() && end == text.c_str() + text.size() && std::isfinite(value) && value > 0,
             ErrorCode::invalid_argument, command, ": ", flag, " expects a positive number, got '",
             text, "'");
  return value;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

void write_json_file(const char* command, const std::string& path, const std::string& body) {
  std::ofstream json(path);
  GZ_REQUIRE(json.good(), ErrorCode::io_error, command, ": cannot write --json file '", path, "'");
  json << body;
  GZ_REQUIRE(json.good(), ErrorCode::io_error, command, ": writing --json file '", path, "' failed");
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

#if !GRADZIP_HAVE_MPI

int report_mpi_unavailable(const char* command) {
  std::fprintf(stderr,
               "gradzip-bench %s: unavailable: this gradzip was built without MPI "
               "(GRADZIP_WITH_MPI=OFF, or no MPI was found at configure time)\n",
               command);
  return 1;
}

#else

double max_over_ranks(double value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

std::uint64_t max_over_ranks(std::uint64_t value) {
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return value;
}

int run_under_mpi(const char* command, int argc, char** argv, const std::function<int()>& run) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // The Reducer's lanes drive MPI from their own threads (and gradzip itself requests
    // MPI_THREAD_MULTIPLE when it initialises MPI: the same level either way).
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int status = 0;
  try {
    status = run();
  } catch (const std::exception& error) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "gradzip-bench %s (rank %d): %s\n", command, rank, error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (!initialized) MPI_Finalize();
  return status;
}

#endif

}  // namespace gradzip::bench
