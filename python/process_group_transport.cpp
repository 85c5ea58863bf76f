#include "process_group_transport.h"

#include <Python.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "collectives/transport/deadline.h"
#include "gradzip/error.h"

namespace py = pybind11;

namespace gradzip::python {
namespace {

// A memoryview over memory the C++ side owns for the duration of the operation. Sends are
// exposed writable too (torch.frombuffer warns on read-only buffers); the engine never writes
// into a send buffer.
py::memoryview view_of(const void* data, std::size_t bytes) {
  return py::memoryview::from_memory(const_cast<void*>(data), static_cast<py::ssize_t>(bytes),
                                     /*readonly=*/false);
}

py::list list_of(std::span<const std::size_t> values) {
  py::list list;
  for (const std::size_t value : values) list.append(value);
  return list;
}

bool exception_is(const py::error_already_set& error, const char* name) {
  const py::object type = error.type();
  return py::hasattr(type, "__name__") && py::str(type.attr("__name__")).cast<std::string>() == name;
}

}  // namespace

ProcessGroupTransport::ProcessGroupTransport(py::object engine)
    : engine_(std::move(engine)), policy_(collectives::resolve_deadline_policy({})) {
  py::gil_scoped_acquire gil;
  rank_ = engine_.attr("rank").cast<int>();
  size_ = engine_.attr("size").cast<int>();
}

ProcessGroupTransport::~ProcessGroupTransport() {
  // The engine goes with the GIL held; after the interpreter has finalised (a communicator
  // kept until the C++ runtime's exit) it is left to the process's end.
  if (Py_IsInitialized() == 0) {
    engine_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  engine_ = py::object();
}

std::string ProcessGroupTransport::describe() const {
  return detail::concat("torch.distributed (gloo) rank ", rank_, " of ", size_);
}

template <typename Call>
auto ProcessGroupTransport::run(const char* op, Call&& call) {
  GZ_REQUIRE(!dead_, ErrorCode::timeout, op, " (", describe(),
             "): an earlier wait of this transport timed out; it is dead, end the job");
  py::gil_scoped_acquire gil;
  try {
    return call();
  } catch (py::error_already_set& error) {
    const std::string text = error.what();
    if (exception_is(error, "WaitTimeout")) {
      time_out(op, py::str(error.value()).cast<std::string>());
    }
    if (exception_is(error, "MessageTooLong")) {
      GZ_THROW(ErrorCode::malformed_message, op, " (", describe(), "): ",
               py::str(error.value()).cast<std::string>());
    }
    GZ_THROW(ErrorCode::unsupported, op, " (", describe(), "): torch.distributed failed: ", text);
  }
}

void ProcessGroupTransport::time_out(const char* op, const std::string& pending) {
  char limit[32];
  std::snprintf(limit, sizeof limit, "%.3f", policy_.seconds);
  std::string report = detail::concat(
      "gradzip: timeout on ", describe(), ": ", op, " did not complete within ", limit,
      " s\n  during: ", collectives::describe_current_operation(), "\n  still pending: ", pending,
      "\n  missing ranks: unknown (the torch transport does not ask the others)\n");
  report += policy_.action == TimeoutAction::abort
                ? "  action: ending this process (CommunicatorOptions::on_timeout = abort)\n"
                : "  action: throwing ErrorCode::timeout; this communicator is dead, end the job\n";
  // No note_timeout(): that flag stops gradzip's MPI_Finalize at exit, which an MPI operation
  // left pending could hang; a torch.distributed wait leaves none.
  collectives::write_timeout_report(report);
  if (policy_.action == TimeoutAction::abort) abort_job();
  dead_ = true;
  GZ_THROW(ErrorCode::timeout, op, " (", describe(), "): no completion within ", limit,
           " s; still pending: ", pending);
}

void ProcessGroupTransport::abort_job() noexcept {
  std::fflush(nullptr);
  std::_Exit(124);
}

void ProcessGroupTransport::require_peer(const char* op, int peer) const {
  GZ_REQUIRE(peer >= 0 && peer < size_, ErrorCode::invalid_argument, op, " (", describe(),
             "): peer ", peer, " is not a rank of ", size_);
}

// ---- point-to-point ---------------------------------------------------------------------------

collectives::Transport::Request ProcessGroupTransport::isend(int peer, int tag,
                                                              std::span<const std::byte> data) {
  require_peer("isend", peer);
  GZ_REQUIRE(data.size() <= collectives::kMaxMessageBytes, ErrorCode::invalid_argument, "isend (",
             describe(), "): ", data.size(), " bytes exceed the limit of one message");
  return run("isend", [&] {
    return Request{engine_.attr("isend")(peer, tag, view_of(data.data(), data.size())).cast<std::size_t>()};
  });
}

collectives::Transport::Request ProcessGroupTransport::irecv(int peer, int tag,
                                                              std::span<std::byte> buffer) {
  require_peer("irecv", peer);
  return run("irecv", [&] {
    return Request{
        engine_.attr("irecv")(peer, tag, view_of(buffer.data(), buffer.size())).cast<std::size_t>()};
  });
}

std::size_t ProcessGroupTransport::wait(Request request) {
  return run("wait", [&] { return engine_.attr("wait")(request.id, policy_.seconds).cast<std::size_t>(); });
}

// ---- collectives ------------------------------------------------------------------------------

void ProcessGroupTransport::allgatherv(std::span<const std::byte> mine, std::span<std::byte> all,
                                       std::span<const std::size_t> counts) {
  GZ_REQUIRE(counts.size() == static_cast<std::size_t>(size_), ErrorCode::invalid_argument,
             "allgatherv (", describe(), "): ", counts.size(), " counts for ", size_, " ranks");
  std::size_t total = 0;
  for (const std::size_t count : counts) total += count;
  GZ_REQUIRE(mine.size() == counts[static_cast<std::size_t>(rank_)] && all.size() >= total,
             ErrorCode::invalid_argument, "allgatherv (", describe(), "): ", mine.size(),
             " bytes of mine for a count of ", counts[static_cast<std::size_t>(rank_)],
             ", output of ", all.size(), " bytes for ", total);
  run("allgatherv", [&] {
    engine_.attr("allgatherv")(view_of(mine.data(), mine.size()), view_of(all.data(), total),
                               list_of(counts), policy_.seconds);
  });
}

void ProcessGroupTransport::alltoallv(std::span<const std::byte> send,
                                      std::span<const std::size_t> send_counts,
                                      std::span<std::byte> recv,
                                      std::span<const std::size_t> recv_counts) {
  GZ_REQUIRE(send_counts.size() == static_cast<std::size_t>(size_) &&
                 recv_counts.size() == static_cast<std::size_t>(size_),
             ErrorCode::invalid_argument, "alltoallv (", describe(), "): ", send_counts.size(),
             " send and ", recv_counts.size(), " receive counts for ", size_, " ranks");
  std::size_t send_total = 0, recv_total = 0;
  for (const std::size_t count : send_counts) send_total += count;
  for (const std::size_t count : recv_counts) recv_total += count;
  GZ_REQUIRE(send.size() >= send_total && recv.size() >= recv_total, ErrorCode::invalid_argument,
             "alltoallv (", describe(), "): buffers of ", send.size(), " / ", recv.size(),
             " bytes for ", send_total, " / ", recv_total);
  run("alltoallv", [&] {
    engine_.attr("alltoallv")(view_of(send.data(), send_total), list_of(send_counts),
                              view_of(recv.data(), recv_total), list_of(recv_counts),
                              policy_.seconds);
  });
}

void ProcessGroupTransport::allgather_u64(std::span<const std::uint64_t> mine,
                                          std::span<std::uint64_t> all) {
  GZ_REQUIRE(all.size() == mine.size() * static_cast<std::size_t>(size_), ErrorCode::invalid_argument,
             "allgather_u64 (", describe(), "): output of ", all.size(), " values for ", mine.size(),
             " per rank and ", size_, " ranks");
  run("allgather_u64", [&] {
    py::list values;
    for (const std::uint64_t value : mine) values.append(value);
    const py::list gathered = engine_.attr("allgather_u64")(values, policy_.seconds);
    GZ_REQUIRE(gathered.size() == all.size(), ErrorCode::internal, "allgather_u64 (", describe(),
               "): the engine returned ", gathered.size(), " values for ", all.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = gathered[i].cast<std::uint64_t>();
  });
}

void ProcessGroupTransport::allreduce_f32_sum(std::span<float> data) {
  run("allreduce_f32_sum", [&] {
    engine_.attr("allreduce_f32_sum")(view_of(data.data(), data.size_bytes()), policy_.seconds);
  });
}

void ProcessGroupTransport::barrier() {
  run("barrier", [&] { engine_.attr("barrier")(policy_.seconds); });
}

std::unique_ptr<collectives::Transport> ProcessGroupTransport::split(int color, int key) {
  py::object made = run("split", [&] { return engine_.attr("split")(color, key, policy_.seconds); });
  auto transport = std::make_unique<ProcessGroupTransport>(std::move(made));
  transport->set_deadline_policy(policy_);
  return transport;
}

std::unique_ptr<collectives::Transport> ProcessGroupTransport::split_by_node() {
  py::object made = run("split_by_node", [&] { return engine_.attr("split_by_node")(policy_.seconds); });
  auto transport = std::make_unique<ProcessGroupTransport>(std::move(made));
  transport->set_deadline_policy(policy_);
  return transport;
}

}  // namespace gradzip::python
