// What the gradzip-bench subcommands (codecs_bench.cpp, allreduce_bench.cpp, overlap_bench.cpp)
// share: option parsing, the text and JSON formatting of their reports, and, in builds with MPI,
// the entry of a subcommand that runs under mpirun.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>

#include "gradzip/error.h"

namespace gradzip::bench {

// `text` as a non-negative decimal integer, the value of option `flag` of subcommand `command`.
// Throws Error(invalid_argument) "<command>: <flag> expects a non-negative integer, got '<text>'"
// when `text` is empty, has anything after the digits, or starts with '-' (which strtoull would
// otherwise wrap around to a huge value).
std::size_t parse_count(const char* command, const char* text, std::string_view flag);

// `text` as a finite number > 0, the value of option `flag` of subcommand `command`. Throws
// Error(invalid_argument) "<command>: <flag> expects a positive number, got '<text>'" when
// `text` is empty, has anything after the number, or is not finite and positive.
double parse_positive(const char* command, const std::string& text, std::string_view flag);

// `bytes` in the largest of B, KiB, MiB, GiB that leaves at least 1: "512 B", "1.5 KiB".
std::string human_bytes(double bytes);

// `text` as a JSON string: in double quotes, with '"' and '\' escaped (the benchmarks' names
// and specs hold no control characters).
std::string json_string(const std::string& text);

// Writes `body` to `path` (replacing it). Throws Error(io_error) "<command>: cannot write
// --json file '<path>'" when the file cannot be opened or written.
void write_json_file(const char* command, const std::string& path, const std::string& body);

// `value` as a JSON number with 9 significant digits (%.9g); JSON has no infinity or NaN, so
// those become null (and fail any check that reads them).
std::string json_number(double value);

#if !GRADZIP_HAVE_MPI

// The whole of an MPI subcommand in a build without MPI: prints "gradzip-bench <command>:
// unavailable: ..." to stderr and returns 1.
int report_mpi_unavailable(const char* command);

#else

// The maximum of `value` over the ranks of MPI_COMM_WORLD (a collective: every rank calls it).
double max_over_ranks(double value);
std::uint64_t max_over_ranks(std::uint64_t value);

// Runs `run` between MPI_Init_thread(MPI_THREAD_MULTIPLE) and MPI_Finalize, unless MPI is
// already initialised (then it neither initialises nor finalises). If `run` throws, prints
// "gradzip-bench <command> (rank R): <what>" to stderr and calls MPI_Abort on MPI_COMM_WORLD:
// one rank failing alone would leave the others waiting in a collective. Returns run's status.
int run_under_mpi(const char* command, int argc, char** argv, const std::function<int()>& run);

// The entry of a subcommand that runs under mpirun. `parse(argc, argv)` reads the options
// before MPI starts, so that --help and bad options need no MPI run: an Error it throws is
// printed as "gradzip-bench <command>: <what>" and gives 2; options with `.help` set call
// `help()` and give 0. Otherwise `run(options)` runs under run_under_mpi().
template <typename ParseFn, typename HelpFn, typename RunFn>
int run_mpi_command(const char* command, int argc, char** argv, ParseFn parse, HelpFn help,
                    RunFn run) {
  std::invoke_result_t<ParseFn&, int, char**> options;
  try {
    options = parse(argc, argv);
  } catch (const Error& error) {
    std::fprintf(stderr, "gradzip-bench %s: %s\n", command, error.what());
    return 2;
  }
  if (options.help) {
    help();
    return 0;
  }
  return run_under_mpi(command, argc, argv, [&] { return run(options); });
}

#endif

}  // namespace gradzip::bench
