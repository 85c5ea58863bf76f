// The walk program of scripts/walk.py. Against a gradzip library compiled with
// -finstrument-functions, it records every function entry and exit of one
// Communicator::allreduce call (rank 0, after two warm-up calls of the same spec and size, so
// that caches and scratch are built) and writes them for walk.py, which maps the functions to
// their source files with addr2line.
//
//   mpirun -np P walk SPEC ELEMENTS OUT
//
// OUT gets one line per event: "> addr tid" (entry) or "< addr tid" (exit), addr the function's
// offset in the object that holds it (this executable: the library is static), tid a small
// number per thread in the order threads first appear (0 = the calling thread).
#include <dlfcn.h>
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gradzip/communicator.h"

namespace {

// A fixed array, so that the hooks call no template the instrumented library may also have
// instantiated (its copy would call the hooks again).
struct Event {
  void* function;
  std::uint32_t thread;
  char kind;  // '>' entry, '<' exit
};
constexpr std::size_t kMaxEvents = std::size_t{1} << 22;
Event g_events[kMaxEvents];
std::atomic<std::size_t> g_count{0};
std::atomic<bool> g_recording{false};
std::atomic<std::uint32_t> g_threads{0};
thread_local std::uint32_t t_thread = ~0u;

__attribute__((no_instrument_function)) void record(char kind, void* function) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  if (t_thread == ~0u) t_thread = g_threads.fetch_add(1);
  const std::size_t at = g_count.fetch_add(1);
  if (at < kMaxEvents) g_events[at] = Event{function, t_thread, kind};
}

}  // namespace

extern "C" {
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void* function, void*) {
  record('>', function);
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void* function, void*) {
  record('<', function);
}
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: walk SPEC ELEMENTS OUT\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    gradzip::Communicator comm = gradzip::Communicator::world();
    const std::size_t count = std::strtoull(argv[2], nullptr, 10);
    std::vector<float> values(count);
    for (std::size_t i = 0; i < count; ++i)
      values[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    std::vector<float> tensor = values;
    for (int warm = 0; warm < 2; ++warm) {
      tensor = values;
      comm.allreduce(gradzip::host_view(tensor.data(), count), "walk", argv[1]);
    }
    tensor = values;
    // The calling thread records first, so that it is thread 0.
    t_thread = 0;
    g_threads = 1;
    g_recording = true;
    comm.allreduce(gradzip::host_view(tensor.data(), count), "walk", argv[1]);
    g_recording = false;
    if (g_count.load() > kMaxEvents) {
      std::fprintf(stderr, "walk: %zu events, more than the %zu recorded\n", g_count.load(),
                   kMaxEvents);
      status = 1;
    }
    if (comm.rank() == 0 && status == 0) {
      std::FILE* out = std::fopen(argv[3], "w");
      if (out == nullptr) {
        std::perror(argv[3]);
        status = 1;
      } else {
        for (std::size_t i = 0; i < g_count.load(); ++i) {
          Dl_info info{};
          auto address = reinterpret_cast<std::uintptr_t>(g_events[i].function);
          if (dladdr(g_events[i].function, &info) != 0 && info.dli_fbase != nullptr)
            address -= reinterpret_cast<std::uintptr_t>(info.dli_fbase);
          std::fprintf(out, "%c %zx %u\n", g_events[i].kind, static_cast<std::size_t>(address),
                       g_events[i].thread);
        }
        std::fclose(out);
      }
    }
  }
  MPI_Finalize();
  return status;
}
