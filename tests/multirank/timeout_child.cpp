// The processes of tests/multirank/run_timeout_tests.py (a plain MPI program, not gtest: the
// cases end with ranks that time out, abort, or are killed, which gtest's runner cannot judge).
// Each rank that reaches a verdict prints one line to stdout:
//   VERDICT mode=<mode> rank=<r> code=<error code name> elapsed=<s> missing=<ranks> later=<code>
// `elapsed`: seconds from entering the call that timed out to its exception; `missing`: the
// "missing ranks:" entry of the report (up to " ("); `later`: the code of one more call on the
// same communicator after the timeout (it must throw timeout at once, without MPI).
//
// Modes (argv[1]); the deadline comes from GRADZIP_TIMEOUT_S, set by the driver:
//   skip_throw:  10 all-reduces; rank 3 skips the 5th and sleeps past the deadline; on_timeout
//                = throw_error. Ranks 0-2 report their verdicts.
//   skip_abort:  the same with the default on_timeout = abort: the job ends through MPI_Abort.
//   kill:        large all-reduces (4M floats, ring); rank 2 raises SIGKILL from a helper thread
//                after its 3rd call, in the middle of the 4th or later.
//   reducer:     a Reducer (2 lanes, throw_error); rank 3 neither marks ready nor waits in step 3
//                and sleeps past the deadline; the others' wait() must throw timeout.
//   bad_env:     Communicator::world with GRADZIP_TIMEOUT_S set to something that is not a
//                number: prints the error code and whether the message names the variable.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double timeout_seconds() {
  const char* text = std::getenv("GRADZIP_TIMEOUT_S");
  return text != nullptr ? std::atof(text) : 600.0;
}

// The report's "missing ranks: ..." entry, up to the explanation in parentheses.
std::string missing_ranks(const std::string& message) {
  const std::string key = "missing ranks: ";
  const std::size_t at = message.find(key);
  if (at == std::string::npos) return "?";
  const std::size_t begin = at + key.size();
  std::size_t end = message.find(" (never", begin);
  const std::size_t line_end = message.find('\n', begin);
  if (end == std::string::npos || (line_end != std::string::npos && line_end < end)) end = line_end;
  std::string ranks = message.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  for (char& c : ranks)
    if (c == ' ') c = '_';
  return ranks;
}

void print_verdict(const char* mode, int rank, const gradzip::Error& error, double elapsed,
                   const char* later) {
  std::fprintf(stderr, "rank %d caught: %s\n", rank, error.what());
  std::printf("VERDICT mode=%s rank=%d code=%s elapsed=%.3f missing=%s later=%s\n", mode, rank,
              gradzip::error_code_name(error.code()), elapsed, missing_ranks(error.what()).c_str(),
              later);
  std::fflush(stdout);
  std::fflush(stderr);
}

// Ends a rank after its verdict: a pause so that the other ranks print theirs before the
// launcher reacts to this exit (which skips MPI_Finalize: gradzip's atexit leaves MPI alone after
// a timeout), then exit through the atexit handlers. The ranks time out together, give or take
// scheduling: 3 s covers the skew on a loaded 2-core machine (run_timeout_tests.py's
// LOAD_SLACK_S).
[[noreturn]] void finish_after_verdict() {
  std::this_thread::sleep_for(std::chrono::seconds(3));
  std::exit(0);
}

// A rank that skipped a call: sleeps past the others' deadline (plus their grace, the test's
// slack for a loaded machine and their verdicts), then leaves without finalising (its peers are
// gone).
[[noreturn]] void sleep_past_deadline(int rank) {
  std::fprintf(stderr, "rank %d skips the call and sleeps\n", rank);
  std::this_thread::sleep_for(std::chrono::duration<double>(timeout_seconds() * 1.1 + 8.0));
  std::fflush(stdout);
  std::_Exit(0);
}

const char* code_of_later_call(gradzip::Communicator& communicator, std::vector<float>& data) {
  try {
    communicator.allreduce({data.data(), data.size(), gradzip::DType::f32, {}}, "after.timeout",
                           "none");
  } catch (const gradzip::Error& error) {
    return gradzip::error_code_name(error.code());
  }
  return "none";
}

int run_skip(const char* mode, gradzip::TimeoutAction action) {
  gradzip::CommunicatorOptions options;
  options.on_timeout = action;
  gradzip::Communicator communicator = gradzip::Communicator::world(options);
  const int rank = communicator.rank();
  std::vector<float> data(1024, 1.0f);
  for (int call = 0; call < 10; ++call) {
    if (call == 4 && rank == 3) sleep_past_deadline(rank);
    const Clock::time_point start = Clock::now();
    try {
      communicator.allreduce({data.data(), data.size(), gradzip::DType::f32, {}}, "layer1.weight",
                             "none");
    } catch (const gradzip::Error& error) {
      const double elapsed = seconds_since(start);
      const Clock::time_point later_start = Clock::now();
      const char* later = code_of_later_call(communicator, data);
      std::fprintf(stderr, "rank %d: the later call threw in %.3f s\n", rank,
                   seconds_since(later_start));
      print_verdict(mode, rank, error, elapsed, later);
      finish_after_verdict();
    }
  }
  std::printf("NO_TIMEOUT mode=%s rank=%d\n", mode, rank);
  return 1;
}

std::atomic<int> calls_done{0};

int run_kill() {
  gradzip::Communicator communicator = gradzip::Communicator::world();
  const int rank = communicator.rank();
  std::vector<float> data(std::size_t{4} << 20, 0.5f);
  if (rank == 2) {
    std::thread([] {
      while (calls_done.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // inside the next call
      std::raise(SIGKILL);
    }).detach();
  }
  for (int call = 0; call < 200; ++call) {
    communicator.allreduce({data.data(), data.size(), gradzip::DType::f32, {}}, "big",
                           "none:algo=ring");
    calls_done.store(call + 1);
  }
  std::printf("NO_FAILURE mode=kill rank=%d\n", rank);
  return 0;
}

int run_reducer() {
  gradzip::CommunicatorOptions options;
  options.on_timeout = gradzip::TimeoutAction::throw_error;
  gradzip::Communicator communicator = gradzip::Communicator::world(options);
  const int rank = communicator.rank();
  std::vector<float> a(3000, 1.0f), b(5000, 2.0f);
  gradzip::ReducerOptions reducer_options;
  reducer_options.spec = "none";
  reducer_options.lanes = 2;
  reducer_options.chunk_bytes = 4096;  // several chunks on both lanes
  gradzip::Reducer reducer(communicator, reducer_options);
  reducer.add("layer0.weight", {a.data(), a.size(), gradzip::DType::f32, {}});
  reducer.add("layer1.weight", {b.data(), b.size(), gradzip::DType::f32, {}});
  for (int step = 0; step < 6; ++step) {
    if (step == 3 && rank == 3) sleep_past_deadline(rank);
    const Clock::time_point start = Clock::now();
    try {
      reducer.mark_ready("layer1.weight");
      reducer.mark_ready("layer0.weight");
      reducer.wait();
      reducer.step();
    } catch (const gradzip::Error& error) {
      print_verdict("reducer", rank, error, seconds_since(start), "-");
      finish_after_verdict();
    }
  }
  std::printf("NO_TIMEOUT mode=reducer rank=%d\n", rank);
  return 1;
}

int run_bad_env() {
  try {
    gradzip::Communicator communicator = gradzip::Communicator::world();
  } catch (const gradzip::Error& error) {
    const bool names = std::string(error.what()).find("GRADZIP_TIMEOUT_S") != std::string::npos;
    std::printf("VERDICT mode=bad_env code=%s names_variable=%d\n",
                gradzip::error_code_name(error.code()), names ? 1 : 0);
    std::fprintf(stderr, "%s\n", error.what());
    return 0;
  }
  std::printf("VERDICT mode=bad_env code=none names_variable=0\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "skip_throw") return run_skip("skip_throw", gradzip::TimeoutAction::throw_error);
  if (mode == "skip_abort") return run_skip("skip_abort", gradzip::TimeoutAction::abort);
  if (mode == "kill") return run_kill();
  if (mode == "reducer") return run_reducer();
  if (mode == "bad_env") return run_bad_env();
  std::fprintf(stderr, "usage: %s skip_throw|skip_abort|kill|reducer|bad_env\n", argv[0]);
  return 2;
}
