// The emulated NCCL (collectives/transport/nccl/nccl_emulated.h says what it does and where it
// differs from NCCL).
#include "collectives/transport/nccl/nccl_emulated.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradzip/error.h"
#include "kernels/emulated/emulated_device.h"
#include "kernels/fnv1a.h"

namespace gradzip::collectives {
namespace {

using Clock = std::chrono::steady_clock;
using detail::concat;

// ---- constants and small helpers ----------------------------------------------------------

constexpr std::uint32_t kMessageMagic = 0x677a6e63;        // "gznc"
constexpr std::uint64_t kHelloMagic = 0x677a2d656d752d31;  // "gz-emu-1"
// Larger than any message gradzip sends; a header announcing more is taken as corruption.
constexpr std::uint64_t kLargestMessage = std::uint64_t{1} << 40;

// What a message is; every message carries one, so no kind consumes another's message.
enum Kind : std::uint32_t { kP2p = 1, kAllReduce = 2, kAllGather = 3, kSplit = 4 };

const char* kind_name(std::uint32_t kind) {
  switch (kind) {
    case kP2p: return "ncclSend";
    case kAllReduce: return "ncclAllReduce";
    case kAllGather: return "ncclAllGather";
    case kSplit: return "ncclCommSplit";
    default: return "an unknown message";
  }
}

std::size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: break;
  }
  // FP8 types exist from NCCL 2.24 on; compare by value so older headers build too.
  if (static_cast<int>(type) == 10 || static_cast<int>(type) == 11) return 1;
  return 0;
}

const char* type_name(int type) {
  switch (type) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    case 10: return "float8e4m3";
    case 11: return "float8e5m2";
    default: return "an unknown datatype";
  }
}

const char* op_name(int op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "an unknown op";
  }
}

// GRADZIP_TIMEOUT_S when it is a finite number > 0, else 600 s: the bound of the setup waits.
std::chrono::duration<double> setup_timeout() {
  if (const char* text = std::getenv("GRADZIP_TIMEOUT_S"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    if (end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0) {
      return std::chrono::duration<double>(seconds);
    }
  }
  return std::chrono::duration<double>(600.0);
}

Clock::time_point setup_deadline() {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(setup_timeout());
}

std::string errno_text(int error) { return std::strerror(error); }

// The calling thread's last error text (ncclGetLastError).
thread_local std::string t_last_error;

// ---- the communicator's state ------------------------------------------------------------------

struct Message {
  std::uint32_t kind = 0;
  std::uint32_t detail = 0;  // collectives: datatype << 8 | op
  std::uint64_t seq = 0;     // collectives and splits: the sender's sequence number
  std::size_t bytes = 0;
  std::unique_ptr<std::byte[]> data;
};

struct WireHeader {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint32_t detail;
  std::uint32_t reserved;
  std::uint64_t seq;
  std::uint64_t bytes;
};
static_assert(sizeof(WireHeader) == 32);

struct Hello {
  std::uint64_t magic;
  std::uint64_t id_hash;
  std::int32_t rank;
  std::int32_t nranks;
};

struct Peer {
  int fd = -1;            // -1 for self and after the shutdown; changed under send_mutex
  std::mutex send_mutex;  // one writer at a time
  std::thread reader;
  // Under State::mutex:
  std::deque<Message> data;       // point-to-point and collectives, in arrival order
  std::deque<Message> bootstrap;  // ncclCommSplit's exchange
  bool closed = false;
  std::string closed_reason;
};

struct State {
  int rank = 0;
  int nranks = 1;
  int device = 0;
  ncclUniqueId id{};
  std::vector<std::unique_ptr<Peer>> peers;  // one per rank, self included

  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<bool> aborted{false};              // set under mutex
  std::atomic<ncclResult_t> error{ncclSuccess};  // set once, under mutex, after error_message
  std::string error_message;
  int outstanding = 0;  // stream operations queued and not finished
  bool connections_down = false;

  std::atomic<std::uint64_t> collective_seq{0};
  std::uint64_t split_count = 0;

  State(int r, int n, int d, const ncclUniqueId& i) : rank(r), nranks(n), device(d), id(i) {
    peers.reserve(static_cast<std::size_t>(n));
    for (int p = 0; p < n; ++p) peers.push_back(std::make_unique<Peer>());
  }
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  std::string who() const { return concat("rank ", rank, " of ", nranks); }
  Peer& peer(int p) { return *peers[static_cast<std::size_t>(p)]; }
  bool broken() const { return aborted.load() || error.load() != ncclSuccess; }
};

// What ncclComm_t points at: a handle, so that operations still queued keep the state alive
// after ncclCommAbort frees the handle.
struct CommHandle {
  std::shared_ptr<State> state;
};

CommHandle* handle_of(ncclComm_t comm) { return reinterpret_cast<CommHandle*>(comm); }
ncclComm_t comm_of(CommHandle* handle) { return reinterpret_cast<ncclComm_t>(handle); }

// The first asynchronous error sticks; it is printed once. Nothing after an abort.
void set_error(State& s, ncclResult_t code, const std::string& message) {
  {
    const std::lock_guard lock(s.mutex);
    if (s.aborted.load() || s.error.load() != ncclSuccess) return;
    s.error_message = concat("emulated NCCL, ", s.who(), ": ", message);
    s.error.store(code);
  }
  s.cv.notify_all();
  std::fprintf(stderr, "gradzip: %s\n", s.error_message.c_str());
}

// A stream operation that met an error holds its stream, as a failed NCCL kernel would, until
// the communicator is aborted.
void block_until_aborted(State& s) {
  std::unique_lock lock(s.mutex);
  s.cv.wait(lock, [&] { return s.aborted.load(); });
}

// ---- sockets ------------------------------------------------------------------------------------

// 0: all bytes; 1: end of stream before the first byte; -1: error or end of stream inside.
int read_exact(int fd, void* buffer, std::size_t bytes, std::string& why) {
  auto* p = static_cast<char*>(buffer);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::recv(fd, p + done, bytes - done, 0);
    if (got > 0) {
      done += static_cast<std::size_t>(got);
    } else if (got == 0) {
      why = "it closed the connection";
      return done == 0 ? 1 : -1;
    } else if (errno != EINTR) {
      why = concat("reading from its connection failed: ", errno_text(errno));
      return -1;
    }
  }
  return 0;
}

bool write_all(int fd, const void* buffer, std::size_t bytes, std::string& why) {
  const auto* p = static_cast<const char*>(buffer);
  while (bytes > 0) {
    const ssize_t sent = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (sent >= 0) {
      p += sent;
      bytes -= static_cast<std::size_t>(sent);
    } else if (errno != EINTR) {
      why = errno == EPIPE || errno == ECONNRESET
                ? std::string("it closed the connection")
                : concat("writing to its connection failed: ", errno_text(errno));
      return false;
    }
  }
  return true;
}

// Waits for `fd` to be readable until `deadline`: 1 ready, 0 timed out, -1 error (in why).
int poll_readable(int fd, Clock::time_point deadline, std::string& why) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd entry{fd, POLLIN, 0};
    const int ready = ::poll(&entry, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready > 0) return 1;
    if (ready < 0 && errno != EINTR) {
      why = concat("poll failed: ", errno_text(errno));
      return -1;
    }
  }
}

void reader_loop(State* s, int p) {
  Peer& peer = s->peer(p);
  const int fd = peer.fd;  // stays open until this thread is joined
  std::string why;
  for (;;) {
    WireHeader header{};
    if (read_exact(fd, &header, sizeof header, why) != 0) break;
    if (header.magic != kMessageMagic || header.bytes > kLargestMessage) {
      why = "it sent a malformed message";
      break;
    }
    Message message;
    message.kind = header.kind;
    message.detail = header.detail;
    message.seq = header.seq;
    message.bytes = static_cast<std::size_t>(header.bytes);
    message.data = std::make_unique_for_overwrite<std::byte[]>(message.bytes);
    if (message.bytes != 0 && read_exact(fd, message.data.get(), message.bytes, why) != 0) break;
    {
      const std::lock_guard lock(s->mutex);
      (message.kind == kSplit ? peer.bootstrap : peer.data).push_back(std::move(message));
    }
    s->cv.notify_all();
  }
  {
    const std::lock_guard lock(s->mutex);
    peer.closed = true;
    peer.closed_reason = why;
  }
  s->cv.notify_all();
}

void start_readers(State& s) {
  for (int p = 0; p < s.nranks; ++p) {
    if (p != s.rank && s.peer(p).fd >= 0) s.peer(p).reader = std::thread(reader_loop, &s, p);
  }
}

// Shuts every connection down (wakes the readers and any writer), joins the readers, closes.
void close_connections(State& s) {
  {
    const std::lock_guard lock(s.mutex);
    if (s.connections_down) return;
    s.connections_down = true;
  }
  for (auto& peer : s.peers) {
    // Reading fd without send_mutex: only this function (once) and the setup change it.
    if (peer->fd >= 0) ::shutdown(peer->fd, SHUT_RDWR);
  }
  for (auto& peer : s.peers) {
    if (peer->reader.joinable()) peer->reader.join();
  }
  for (auto& peer : s.peers) {
    const std::lock_guard lock(peer->send_mutex);
    if (peer->fd >= 0) ::close(peer->fd);
    peer->fd = -1;
  }
}

State::~State() { close_connections(*this); }

// One message to `p` ("" when sent, else why not). To self: straight into the FIFO.
std::string send_message(State& s, int p, std::uint32_t kind, std::uint32_t detail,
                         std::uint64_t seq, const void* data, std::size_t bytes) {
  if (p == s.rank) {
    Message message{kind, detail, seq, bytes, std::make_unique_for_overwrite<std::byte[]>(bytes)};
    if (bytes != 0) std::memcpy(message.data.get(), data, bytes);
    {
      const std::lock_guard lock(s.mutex);
      Peer& self = s.peer(p);
      (kind == kSplit ? self.bootstrap : self.data).push_back(std::move(message));
    }
    s.cv.notify_all();
    return {};
  }
  Peer& peer = s.peer(p);
  const std::lock_guard lock(peer.send_mutex);
  if (peer.fd < 0) return "its connection is closed";
  const WireHeader header{kMessageMagic, kind, detail, 0, seq, bytes};
  std::string why;
  if (!write_all(peer.fd, &header, sizeof header, why)) return why;
  if (bytes != 0 && !write_all(peer.fd, data, bytes, why)) return why;
  return {};
}

enum class Taken { message, aborted, closed, timed_out };

// The next message from `p` (of its bootstrap FIFO or its data FIFO); waits until one is there,
// the peer closed its connection, the communicator is aborted, or (when given) the deadline.
Taken take_message(State& s, int p, bool bootstrap, Message& out, const Clock::time_point* deadline,
                   std::string* closed_reason = nullptr) {
  Peer& peer = s.peer(p);
  std::deque<Message>& fifo = bootstrap ? peer.bootstrap : peer.data;
  std::unique_lock lock(s.mutex);
  for (;;) {
    if (s.aborted.load()) return Taken::aborted;
    if (!fifo.empty()) {
      out = std::move(fifo.front());
      fifo.pop_front();
      return Taken::message;
    }
    if (peer.closed) {
      if (closed_reason != nullptr) *closed_reason = peer.closed_reason;
      return Taken::closed;
    }
    if (deadline == nullptr) {
      s.cv.wait(lock);
    } else if (s.cv.wait_until(lock, *deadline) == std::cv_status::timeout && fifo.empty() &&
               !peer.closed && !s.aborted.load()) {
      return Taken::timed_out;
    }
  }
}

// ---- ids and setup ------------------------------------------------------------------------------

std::uint64_t id_hash(const ncclUniqueId& id) {
  Fnv1a64 hash;
  hash.update(id.internal, sizeof id.internal);
  return hash.value();
}

ncclUniqueId random_id() {
  std::random_device device;
  std::uint64_t words[sizeof(ncclUniqueId) / 8];
  for (std::uint64_t& word : words) {
    word = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }
  words[0] ^= static_cast<std::uint64_t>(::getpid()) << 20;
  words[1] ^= static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  words[2] ^=
      static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  static std::atomic<std::uint64_t> calls{0};
  words[3] ^= ++calls;
  ncclUniqueId id{};
  std::memcpy(id.internal, words, sizeof id.internal);
  return id;
}

ncclUniqueId split_id(const ncclUniqueId& parent, std::uint64_t split, int color) {
  std::uint64_t words[sizeof(ncclUniqueId) / 8];
  for (std::uint32_t i = 0; i < sizeof(ncclUniqueId) / 8; ++i) {
    Fnv1a64 hash;
    hash.update(parent.internal, sizeof parent.internal);
    hash.update("split", 5);
    hash.update(&split, sizeof split);
    hash.update(&color, sizeof color);
    hash.update(&i, sizeof i);
    words[i] = hash.value();
  }
  ncclUniqueId id{};
  std::memcpy(id.internal, words, sizeof id.internal);
  return id;
}

std::string socket_path(const ncclUniqueId& id, int rank) {
  char text[64];
  std::snprintf(text, sizeof text, "/tmp/gz-emu-nccl-%016llx-%d",
                static_cast<unsigned long long>(id_hash(id)), rank);
  return text;
}

bool fill_address(sockaddr_un& address, const std::string& path) {
  std::memset(&address, 0, sizeof address);
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return true;
}

struct SetupFailure {
  ncclResult_t code = ncclSuccess;
  std::string message;
};

// Connects the full mesh of `s` (its peers' fds) and starts the readers. Lower ranks are
// connected to (retrying until their socket exists), higher ones accepted.
SetupFailure connect_mesh(State& s, Clock::time_point deadline) {
  if (s.nranks == 1) return {};
  const std::uint64_t hash = id_hash(s.id);
  const std::string my_path = socket_path(s.id, s.rank);
  int listener = -1;
  bool bound = false;
  auto fail = [&](ncclResult_t code, std::string message) {
    if (listener >= 0) ::close(listener);
    if (bound) ::unlink(my_path.c_str());
    for (auto& peer : s.peers) {
      if (peer->fd >= 0) ::close(peer->fd);
      peer->fd = -1;
    }
    return SetupFailure{code, concat("ncclCommInitRank (emulated, ", s.who(), "): ", message)};
  };
  const double timeout = setup_timeout().count();

  if (s.rank < s.nranks - 1) {
    sockaddr_un address{};
    if (!fill_address(address, my_path)) return fail(ncclSystemError, "socket path too long");
    listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return fail(ncclSystemError, concat("socket() failed: ", errno_text(errno)));
    if (::bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      const int error = errno;
      return fail(
          ncclSystemError,
          concat("bind(", my_path, ") failed: ", errno_text(error),
                 error == EADDRINUSE ? " (another process claims this rank of this id)" : ""));
    }
    bound = true;
    if (::listen(listener, s.nranks) != 0) {
      return fail(ncclSystemError, concat("listen(", my_path, ") failed: ", errno_text(errno)));
    }
  }

  // Lower ranks: connect, retrying while their socket is not there yet, then say who we are.
  for (int p = 0; p < s.rank; ++p) {
    const std::string path = socket_path(s.id, p);
    sockaddr_un address{};
    if (!fill_address(address, path)) return fail(ncclSystemError, "socket path too long");
    auto pause = std::chrono::milliseconds(1);
    int last_error = 0;
    for (;;) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return fail(ncclSystemError, concat("socket() failed: ", errno_text(errno)));
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
        s.peer(p).fd = fd;
        break;
      }
      last_error = errno;
      ::close(fd);
      if (last_error != ENOENT && last_error != ECONNREFUSED && last_error != EAGAIN &&
          last_error != EINTR) {
        return fail(ncclSystemError,
                    concat("connect(", path, ") to rank ", p, " failed: ", errno_text(last_error)));
      }
      if (Clock::now() >= deadline) {
        return fail(ncclRemoteError,
                    concat("rank ", p, " did not open ", path, " within ", timeout,
                           " s (GRADZIP_TIMEOUT_S; last connect: ", errno_text(last_error),
                           "): is it running with the same ncclUniqueId?"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    const Hello hello{kHelloMagic, hash, s.rank, s.nranks};
    std::string why;
    if (!write_all(s.peer(p).fd, &hello, sizeof hello, why)) {
      return fail(ncclRemoteError, concat("greeting rank ", p, " failed: ", why));
    }
  }

  // Higher ranks: accept them; each names itself first.
  for (int accepted = 0; accepted < s.nranks - 1 - s.rank; ++accepted) {
    std::string why;
    const int ready = poll_readable(listener, deadline, why);
    if (ready < 0) return fail(ncclSystemError, why);
    std::string missing;
    for (int p = s.rank + 1; p < s.nranks; ++p) {
      if (s.peer(p).fd < 0) missing += concat(missing.empty() ? "" : ", ", p);
    }
    if (ready == 0) {
      return fail(ncclRemoteError, concat("rank(s) ", missing, " did not connect within ", timeout,
                                          " s (GRADZIP_TIMEOUT_S)"));
    }
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) {
        --accepted;
        continue;
      }
      return fail(ncclSystemError, concat("accept failed: ", errno_text(errno)));
    }
    Hello hello{};
    const int readable = poll_readable(fd, deadline, why);
    if (readable <= 0 || read_exact(fd, &hello, sizeof hello, why) != 0) {
      ::close(fd);
      return fail(ncclRemoteError, concat("a connecting rank sent no greeting (",
                                          readable == 0 ? "timed out" : why, ")"));
    }
    if (hello.magic != kHelloMagic || hello.id_hash != hash || hello.nranks != s.nranks ||
        hello.rank <= s.rank || hello.rank >= s.nranks || s.peer(hello.rank).fd >= 0) {
      ::close(fd);
      return fail(ncclRemoteError,
                  concat("a connecting process greeted as rank ", hello.rank, " of ", hello.nranks,
                         hello.magic != kHelloMagic || hello.id_hash != hash
                             ? " with another ncclUniqueId"
                             : " (not a higher rank of this communicator still missing)"));
    }
    s.peer(hello.rank).fd = fd;
  }
  if (listener >= 0) ::close(listener);
  if (bound) ::unlink(my_path.c_str());
  start_readers(s);
  return {};
}

// ---- the calling thread's group -----------------------------------------------------------------

enum class OpType { send, recv, allreduce, allgather };

struct Op {
  std::shared_ptr<State> comm;
  void* stream = nullptr;
  OpType type = OpType::send;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  std::size_t count = 0;
  std::size_t bytes = 0;  // of one message: count x the datatype's size
  ncclDataType_t datatype = ncclUint8;
  ncclRedOp_t redop = ncclSum;
  int peer = -1;
  std::uint64_t seq = 0;  // collectives: the communicator's collective number
};

const char* op_call_name(OpType type) {
  switch (type) {
    case OpType::send: return "ncclSend";
    case OpType::recv: return "ncclRecv";
    case OpType::allreduce: return "ncclAllReduce";
    case OpType::allgather: return "ncclAllGather";
  }
  return "NCCL";
}

// A blocking host task deferred to the outermost ncclGroupEnd (ncclCommInitRank, ncclCommSplit):
// run(false) does it, run(true) drops it (the group failed); the result and its message.
using HostTask = std::function<SetupFailure(bool discard)>;

struct GroupState {
  int depth = 0;
  std::vector<Op> ops;
  std::vector<HostTask> host_tasks;
  ncclResult_t first_error = ncclSuccess;
  std::string first_message;
};

thread_local GroupState t_group;

// Records a call's failure: the thread's last error, and the group's first error.
ncclResult_t failed(ncclResult_t code, std::string message) {
  message = concat("emulated NCCL: ", message);
  if (t_group.depth > 0 && t_group.first_error == ncclSuccess) {
    t_group.first_error = code;
    t_group.first_message = message;
  }
  t_last_error = std::move(message);
  return code;
}

ncclResult_t check_comm(ncclComm_t comm, const char* call, State*& state) {
  if (comm == nullptr)
    return failed(ncclInvalidArgument, concat(call, ": the communicator is null"));
  state = handle_of(comm)->state.get();
  if (const ncclResult_t error = state->error.load(); error != ncclSuccess) {
    return failed(
        error,
        concat(call, ": the communicator has an asynchronous error: ", state->error_message));
  }
  return ncclSuccess;
}

// ---- running a group's operations on a stream ---------------------------------------------------

std::string describe(const Message& m) {
  if (m.kind == kP2p) return concat(kind_name(m.kind), " of ", m.bytes, " bytes");
  if (m.kind == kAllReduce) {
    return concat(kind_name(m.kind), " #", m.seq, " of ", m.bytes, " bytes (",
                  type_name(static_cast<int>(m.detail >> 8)), " ",
                  op_name(static_cast<int>(m.detail & 0xff)), ")");
  }
  if (m.kind == kAllGather) {
    return concat(kind_name(m.kind), " #", m.seq, " of ", m.bytes, " bytes (",
                  type_name(static_cast<int>(m.detail >> 8)), ")");
  }
  return concat(kind_name(m.kind), " #", m.seq);
}

// The next data message from `p` for `expected`; false (error set, or aborted) when there is
// none that matches.
bool receive_matching(State& s, int p, const Message& expected, const std::string& what,
                      Message& out) {
  std::string reason;
  switch (take_message(s, p, false, out, nullptr, &reason)) {
    case Taken::message: break;
    case Taken::aborted: return false;
    case Taken::timed_out:  // no deadline here
    case Taken::closed:
      set_error(s, ncclRemoteError,
                concat(what, " waits for rank ", p, ", but its connection ended (",
                       reason.empty() ? "it closed the connection" : reason, "): rank ", p,
                       " ended, or destroyed or aborted its communicator"));
      return false;
  }
  const bool same =
      out.kind == expected.kind && out.bytes == expected.bytes &&
      (expected.kind == kP2p || (out.seq == expected.seq && out.detail == expected.detail));
  if (same) return true;
  if (out.kind == kP2p && expected.kind == kP2p) {
    set_error(s, ncclInvalidUsage,
              concat(what, " matched rank ", p, "'s ncclSend of ", out.bytes,
                     " bytes: NCCL needs the same size on both sides; the receive buffer is left "
                     "unwritten"));
  } else {
    set_error(s, ncclInvalidUsage,
              concat(what, " took the next message from rank ", p, " and found its ", describe(out),
                     " instead of ", describe(expected),
                     ": the ranks issued their NCCL operations in different orders or with "
                     "different arguments; nothing was written"));
  }
  return false;
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ncclSum: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case ncclProd: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ncclMax: return std::max(a, b);
      case ncclMin: return std::min(a, b);
      default: return a;
    }
  } else {
    switch (op) {
      case ncclSum: return a + b;
      case ncclProd: return a * b;
      case ncclMax: return std::fmax(a, b);  // as NCCL's kernels (fmaxf): a NaN loses
      case ncclMin: return std::fmin(a, b);
      default: return a;
    }
  }
}

template <typename T>
void combine_into(std::byte* accumulator, const std::byte* block, std::size_t count,
                  ncclRedOp_t op) {
  for (std::size_t i = 0; i < count; ++i) {
    T a;
    T b;
    std::memcpy(&a, accumulator + i * sizeof(T), sizeof(T));
    std::memcpy(&b, block + i * sizeof(T), sizeof(T));
    const T c = combine(a, b, op);
    std::memcpy(accumulator + i * sizeof(T), &c, sizeof(T));
  }
}

void combine_blocks(std::byte* accumulator, const std::byte* block, std::size_t count,
                    ncclDataType_t type, ncclRedOp_t op) {
  switch (type) {
    case ncclInt8: combine_into<std::int8_t>(accumulator, block, count, op); break;
    case ncclUint8: combine_into<std::uint8_t>(accumulator, block, count, op); break;
    case ncclInt32: combine_into<std::int32_t>(accumulator, block, count, op); break;
    case ncclUint32: combine_into<std::uint32_t>(accumulator, block, count, op); break;
    case ncclInt64: combine_into<std::int64_t>(accumulator, block, count, op); break;
    case ncclUint64: combine_into<std::uint64_t>(accumulator, block, count, op); break;
    case ncclFloat32: combine_into<float>(accumulator, block, count, op); break;
    case ncclFloat64: combine_into<double>(accumulator, block, count, op); break;
    default: break;  // refused when the call was made
  }
}

bool reducible(ncclDataType_t type, ncclRedOp_t op) {
  const bool type_ok = type == ncclInt8 || type == ncclUint8 || type == ncclInt32 ||
                       type == ncclUint32 || type == ncclInt64 || type == ncclUint64 ||
                       type == ncclFloat32 || type == ncclFloat64;
  const bool op_ok = op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin;
  return type_ok && op_ok;
}

std::uint32_t collective_detail(const Op& op) {
  return (static_cast<std::uint32_t>(op.datatype) << 8) |
         (op.type == OpType::allreduce ? static_cast<std::uint32_t>(op.redop) & 0xff : 0xff);
}

// Sends this rank's block to every peer, then receives every peer's; the received blocks by
// rank (this rank's empty). False when an error was set or the communicator aborted.
bool exchange_blocks(State& s, const Op& op, std::uint32_t kind, std::vector<Message>& blocks) {
  const std::uint32_t detail = collective_detail(op);
  const std::string what = concat(op_call_name(op.type), " #", op.seq);
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    if (std::string why = send_message(s, p, kind, detail, op.seq, op.sendbuff, op.bytes);
        !why.empty()) {
      set_error(s, ncclRemoteError, concat(what, " could not send to rank ", p, ": ", why));
      return false;
    }
  }
  blocks.resize(static_cast<std::size_t>(s.nranks));
  Message expected;
  expected.kind = kind;
  expected.detail = detail;
  expected.seq = op.seq;
  expected.bytes = op.bytes;
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    if (!receive_matching(s, p, expected, concat(what, " of ", op.bytes, " bytes"),
                          blocks[static_cast<std::size_t>(p)])) {
      return false;
    }
  }
  return true;
}

bool run_allreduce(State& s, const Op& op) {
  std::vector<Message> blocks;
  if (!exchange_blocks(s, op, kAllReduce, blocks)) return false;
  auto block_of = [&](int p) -> const std::byte* {
    return p == s.rank ? static_cast<const std::byte*>(op.sendbuff)
                       : blocks[static_cast<std::size_t>(p)].data.get();
  };
  // Rank order 0..P-1 on every rank: the same bits everywhere. Into a copy first: the
  // operation may run in place.
  auto accumulator = std::make_unique_for_overwrite<std::byte[]>(op.bytes);
  std::memcpy(accumulator.get(), block_of(0), op.bytes);
  for (int p = 1; p < s.nranks; ++p) {
    combine_blocks(accumulator.get(), block_of(p), op.count, op.datatype, op.redop);
  }
  std::memcpy(op.recvbuff, accumulator.get(), op.bytes);
  return true;
}

bool run_allgather(State& s, const Op& op) {
  std::vector<Message> blocks;
  if (!exchange_blocks(s, op, kAllGather, blocks)) return false;
  auto* const out = static_cast<std::byte*>(op.recvbuff);
  for (int p = 0; p < s.nranks; ++p) {
    std::byte* const slot = out + static_cast<std::size_t>(p) * op.bytes;
    if (p == s.rank) {
      if (slot != op.sendbuff) std::memmove(slot, op.sendbuff, op.bytes);
    } else {
      std::memcpy(slot, blocks[static_cast<std::size_t>(p)].data.get(), op.bytes);
    }
  }
  return true;
}

// A buffer the operation touches must be emulated device memory, as a GPU would fault on
// anything else. Empty when all are.
std::string check_buffers(const Op& op, int nranks) {
  try {
    switch (op.type) {
      case OpType::send:
        kernels::emulated::require_device_range(op.sendbuff, op.bytes, "ncclSend's buffer");
        break;
      case OpType::recv:
        kernels::emulated::require_device_range(op.recvbuff, op.bytes, "ncclRecv's buffer");
        break;
      case OpType::allreduce:
        kernels::emulated::require_device_range(op.sendbuff, op.bytes, "ncclAllReduce's sendbuff");
        kernels::emulated::require_device_range(op.recvbuff, op.bytes, "ncclAllReduce's recvbuff");
        break;
      case OpType::allgather:
        kernels::emulated::require_device_range(op.sendbuff, op.bytes, "ncclAllGather's sendbuff");
        kernels::emulated::require_device_range(
            op.recvbuff, op.bytes * static_cast<std::size_t>(nranks), "ncclAllGather's recvbuff");
        break;
    }
  } catch (const std::exception& error) {
    return error.what();
  }
  return {};
}

// One communicator's part of a group, on a stream's thread: its sends, its receives, its
// collectives, each in posting order.
void run_task(State& s, const std::vector<Op>& ops) {
  try {
    if (s.broken()) {
      block_until_aborted(s);
      return;
    }
    for (const Op& op : ops) {
      if (std::string why = check_buffers(op, s.nranks); !why.empty()) {
        set_error(s, ncclUnhandledCudaError, concat(op_call_name(op.type), ": ", why));
        block_until_aborted(s);
        return;
      }
    }
    for (const Op& op : ops) {
      if (op.type != OpType::send) continue;
      if (std::string why = send_message(s, op.peer, kP2p, 0, 0, op.sendbuff, op.bytes);
          !why.empty()) {
        set_error(s, ncclRemoteError,
                  concat("ncclSend of ", op.bytes, " bytes to rank ", op.peer, " failed: ", why));
        block_until_aborted(s);
        return;
      }
    }
    for (const Op& op : ops) {
      if (op.type != OpType::recv) continue;
      Message expected;
      expected.kind = kP2p;
      expected.bytes = op.bytes;
      Message got;
      if (!receive_matching(s, op.peer, expected,
                            concat("ncclRecv of ", op.bytes, " bytes from rank ", op.peer), got)) {
        block_until_aborted(s);
        return;
      }
      if (op.bytes != 0) std::memcpy(op.recvbuff, got.data.get(), op.bytes);
    }
    for (const Op& op : ops) {
      bool ok = true;
      if (op.type == OpType::allreduce) ok = run_allreduce(s, op);
      if (op.type == OpType::allgather) ok = run_allgather(s, op);
      if (!ok) {
        block_until_aborted(s);
        return;
      }
    }
  } catch (const std::exception& error) {
    set_error(s, ncclSystemError, concat("an operation failed: ", error.what()));
    block_until_aborted(s);
  }
}

struct GroupWork {
  std::vector<std::pair<std::shared_ptr<State>, std::vector<Op>>> tasks;
  int streams = 1;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  bool done = false;

  void run_tasks() {
    if (tasks.size() == 1) {
      run_task(*tasks[0].first, tasks[0].second);
      return;
    }
    // Several communicators (ranks of this process): each on a thread, so that they can wait
    // for one another.
    std::vector<std::thread> threads;
    threads.reserve(tasks.size() - 1);
    for (std::size_t i = 1; i < tasks.size(); ++i) {
      threads.emplace_back([this, i] { run_task(*tasks[i].first, tasks[i].second); });
    }
    run_task(*tasks[0].first, tasks[0].second);
    for (std::thread& thread : threads) thread.join();
  }

  bool any_aborted() const {
    return std::any_of(tasks.begin(), tasks.end(),
                       [](const auto& task) { return task.first->aborted.load(); });
  }

  // The body of the operation queued on each of the group's streams.
  void run_on_stream() {
    if (streams == 1) {
      run_tasks();
    } else {
      bool last = false;
      {
        const std::lock_guard lock(mutex);
        last = ++arrived == streams;
      }
      if (last) {
        run_tasks();
        {
          const std::lock_guard lock(mutex);
          done = true;
        }
        cv.notify_all();
      } else {
        std::unique_lock lock(mutex);
        while (!done && !any_aborted()) cv.wait_for(lock, std::chrono::milliseconds(10));
      }
    }
    for (auto& task : tasks) {
      State& s = *task.first;
      {
        const std::lock_guard lock(s.mutex);
        --s.outstanding;
      }
      s.cv.notify_all();
    }
  }
};

ncclResult_t launch(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  auto work = std::make_shared<GroupWork>();
  std::vector<void*> streams;
  for (Op& op : ops) {
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end())
      streams.push_back(op.stream);
    auto task = std::find_if(work->tasks.begin(), work->tasks.end(),
                             [&](const auto& t) { return t.first == op.comm; });
    if (task == work->tasks.end()) {
      work->tasks.emplace_back(op.comm, std::vector<Op>{});
      task = work->tasks.end() - 1;
    }
    task->second.push_back(std::move(op));
  }
  work->streams = static_cast<int>(streams.size());
  for (auto& task : work->tasks) {
    const std::lock_guard lock(task.first->mutex);
    task.first->outstanding += work->streams;
  }
  const char* what = "ncclGroupEnd (emulated NCCL)";
  if (ops.size() == 1) what = op_call_name(work->tasks[0].second[0].type);
  for (std::size_t i = 0; i < streams.size(); ++i) {
    try {
      kernels::emulated::enqueue(streams[i], what, [work] { work->run_on_stream(); });
    } catch (const std::exception& error) {
      // The streams not reached never run their part: undo their counts.
      const int missing = static_cast<int>(streams.size() - i);
      for (auto& task : work->tasks) {
        {
          const std::lock_guard lock(task.first->mutex);
          task.first->outstanding -= missing;
        }
        task.first->cv.notify_all();
      }
      return failed(ncclUnhandledCudaError,
                    concat(what, ": queuing on the stream failed: ", error.what()));
    }
  }
  return ncclSuccess;
}

// Runs deferred host tasks, all at once (one thread each when several); the first failure.
SetupFailure run_host_tasks(std::vector<HostTask>& tasks) {
  std::vector<SetupFailure> results(tasks.size());
  auto run = [&](std::size_t i) {
    try {
      results[i] = tasks[i](false);
    } catch (const std::exception& error) {
      results[i] = {ncclSystemError, concat("ncclGroupEnd: ", error.what())};
    }
  };
  if (tasks.size() == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < tasks.size(); ++i) threads.emplace_back(run, i);
    for (std::thread& thread : threads) thread.join();
  }
  for (SetupFailure& result : results) {
    if (result.code != ncclSuccess) return std::move(result);
  }
  return {};
}

// ---- the API ------------------------------------------------------------------------------------

ncclResult_t emu_get_version(int* version) {
  if (version == nullptr) return failed(ncclInvalidArgument, "ncclGetVersion: version is null");
  *version = kEmulatedNcclVersion;
  return ncclSuccess;
}

ncclResult_t emu_get_unique_id(ncclUniqueId* id) {
  if (id == nullptr) return failed(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  try {
    *id = random_id();
  } catch (const std::exception& error) {
    return failed(ncclSystemError, concat("ncclGetUniqueId: ", error.what()));
  }
  return ncclSuccess;
}

const char* emu_get_error_string(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (ncclGetLastError has details)";
    case ncclSystemError: return "unhandled system error (ncclGetLastError has details)";
    case ncclInternalError: return "internal error (emulated NCCL)";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError has details)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError has details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* emu_get_last_error(ncclComm_t /*comm*/) { return t_last_error.c_str(); }

ncclResult_t emu_comm_init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr) return failed(ncclInvalidArgument, "ncclCommInitRank: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return failed(ncclInvalidArgument,
                  concat("ncclCommInitRank: rank ", rank, " of ", nranks, " is out of range"));
  }
  auto handle = std::make_unique<CommHandle>();
  try {
    handle->state = std::make_shared<State>(rank, nranks, kernels::emulated::current_device(), id);
  } catch (const std::exception& error) {
    return failed(ncclSystemError, concat("ncclCommInitRank: ", error.what()));
  }
  if (t_group.depth > 0) {
    // Connected at the outermost ncclGroupEnd, beside the group's other setups.
    CommHandle* const raw = handle.release();
    *comm = comm_of(raw);
    t_group.host_tasks.push_back([raw, comm](bool discard) -> SetupFailure {
      SetupFailure result;
      if (!discard) result = connect_mesh(*raw->state, setup_deadline());
      if (discard || result.code != ncclSuccess) {
        *comm = nullptr;
        delete raw;
      }
      return result;
    });
    return ncclSuccess;
  }
  SetupFailure result = connect_mesh(*handle->state, setup_deadline());
  if (result.code != ncclSuccess) {
    t_last_error = std::move(result.message);
    return result.code;
  }
  *comm = comm_of(handle.release());
  return ncclSuccess;
}

ncclResult_t emu_comm_init_all(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return failed(ncclInvalidArgument, "ncclCommInitAll: comm is null");
  if (ndev < 1) return failed(ncclInvalidArgument, concat("ncclCommInitAll: ndev is ", ndev));
  const int devices = kernels::emulated::device_count();
  for (int i = 0; i < ndev; ++i) {
    const int device = devlist != nullptr ? devlist[i] : i;
    if (device < 0 || device >= devices) {
      return failed(ncclInvalidArgument,
                    concat("ncclCommInitAll: rank ", i, "'s device ", device, " is not one of the ",
                           devices, " emulated devices (GRADZIP_EMULATED_DEVICES)"));
    }
  }
  std::vector<std::unique_ptr<CommHandle>> handles;
  try {
    const ncclUniqueId id = random_id();
    for (int i = 0; i < ndev; ++i) {
      handles.push_back(std::make_unique<CommHandle>());
      handles.back()->state =
          std::make_shared<State>(i, ndev, devlist != nullptr ? devlist[i] : i, id);
    }
    for (int i = 0; i < ndev; ++i) {
      for (int j = i + 1; j < ndev; ++j) {
        int pair[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
          // The states' destructors close what was opened.
          return failed(ncclSystemError,
                        concat("ncclCommInitAll: socketpair failed: ", errno_text(errno)));
        }
        handles[static_cast<std::size_t>(i)]->state->peer(j).fd = pair[0];
        handles[static_cast<std::size_t>(j)]->state->peer(i).fd = pair[1];
      }
    }
    for (auto& handle : handles) start_readers(*handle->state);
  } catch (const std::exception& error) {
    return failed(ncclSystemError, concat("ncclCommInitAll: ", error.what()));
  }
  for (int i = 0; i < ndev; ++i) comms[i] = comm_of(handles[static_cast<std::size_t>(i)].release());
  return ncclSuccess;
}

// The split itself: blocking, on the calling thread (or a group's helper thread).
SetupFailure split_now(const std::shared_ptr<State>& parent, int color, int key,
                       ncclComm_t* newcomm) {
  State& s = *parent;
  const std::string what = concat("ncclCommSplit (emulated, ", s.who(), ")");
  if (s.broken()) {
    return {s.aborted.load() ? ncclInvalidUsage : s.error.load(),
            concat(what, ": the communicator ",
                   s.aborted.load() ? "is aborted" : "has an asynchronous error")};
  }
  const std::uint64_t seq = ++s.split_count;
  const std::int32_t mine[2] = {color, key};
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    if (std::string why = send_message(s, p, kSplit, 0, seq, mine, sizeof mine); !why.empty()) {
      return {ncclRemoteError, concat(what, ": sending to rank ", p, " failed: ", why)};
    }
  }
  const Clock::time_point deadline = setup_deadline();
  std::vector<std::pair<std::int32_t, std::int32_t>> colors(static_cast<std::size_t>(s.nranks));
  colors[static_cast<std::size_t>(s.rank)] = {color, key};
  for (int p = 0; p < s.nranks; ++p) {
    if (p == s.rank) continue;
    Message message;
    std::string reason;
    switch (take_message(s, p, true, message, &deadline, &reason)) {
      case Taken::message: break;
      case Taken::aborted:
        return {ncclInvalidUsage, concat(what, ": the communicator was aborted")};
      case Taken::closed:
        return {ncclRemoteError,
                concat(what, ": rank ", p, " closed its connection (", reason, ")")};
      case Taken::timed_out:
        return {ncclRemoteError,
                concat(what, ": rank ", p, " did not join split #", seq, " within ",
                       setup_timeout().count(), " s (GRADZIP_TIMEOUT_S)")};
    }
    if (message.kind != kSplit || message.seq != seq || message.bytes != sizeof mine) {
      return {ncclInvalidUsage,
              concat(what, ": split #", seq, " met rank ", p, "'s ", describe(message))};
    }
    std::int32_t theirs[2];
    std::memcpy(theirs, message.data.get(), sizeof theirs);
    colors[static_cast<std::size_t>(p)] = {theirs[0], theirs[1]};
  }
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return {};
  }
  std::vector<int> members;
  for (int p = 0; p < s.nranks; ++p) {
    if (colors[static_cast<std::size_t>(p)].first == color) members.push_back(p);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    const int key_a = colors[static_cast<std::size_t>(a)].second;
    const int key_b = colors[static_cast<std::size_t>(b)].second;
    return key_a != key_b ? key_a < key_b : a < b;
  });
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), s.rank) - members.begin());
  auto handle = std::make_unique<CommHandle>();
  handle->state = std::make_shared<State>(new_rank, static_cast<int>(members.size()), s.device,
                                          split_id(s.id, seq, color));
  SetupFailure result = connect_mesh(*handle->state, setup_deadline());
  if (result.code != ncclSuccess) {
    result.message = concat(what, ", the new communicator: ", result.message);
    return result;
  }
  *newcomm = comm_of(handle.release());
  return {};
}

ncclResult_t emu_comm_split(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* /*config*/) {
  State* state = nullptr;
  if (const ncclResult_t status = check_comm(comm, "ncclCommSplit", state); status != ncclSuccess)
    return status;
  if (newcomm == nullptr) return failed(ncclInvalidArgument, "ncclCommSplit: newcomm is null");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return failed(ncclInvalidArgument, concat("ncclCommSplit: color ", color, " is negative"));
  }
  *newcomm = nullptr;
  std::shared_ptr<State> parent = handle_of(comm)->state;
  if (t_group.depth > 0) {
    t_group.host_tasks.push_back([parent, color, key, newcomm](bool discard) -> SetupFailure {
      if (discard) return {};
      return split_now(parent, color, key, newcomm);
    });
    return ncclSuccess;
  }
  SetupFailure result;
  try {
    result = split_now(parent, color, key, newcomm);
  } catch (const std::exception& error) {
    result = {ncclSystemError, concat("ncclCommSplit: ", error.what())};
  }
  if (result.code != ncclSuccess) {
    t_last_error = std::move(result.message);
    return result.code;
  }
  return ncclSuccess;
}

ncclResult_t emu_comm_abort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  CommHandle* const handle = handle_of(comm);
  State& s = *handle->state;
  {
    const std::lock_guard lock(s.mutex);
    s.aborted.store(true);
  }
  s.cv.notify_all();
  close_connections(s);
  delete handle;  // operations still queued hold the state
  return ncclSuccess;
}

ncclResult_t emu_comm_destroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  State& s = *handle_of(comm)->state;
  bool clean = false;
  {
    std::unique_lock lock(s.mutex);
    clean = s.cv.wait_until(lock, setup_deadline(), [&] {
      return s.outstanding == 0 || s.error.load() != ncclSuccess || s.aborted.load();
    });
    clean = clean && s.outstanding == 0 && s.error.load() == ncclSuccess && !s.aborted.load();
    if (!clean && s.error.load() == ncclSuccess && !s.aborted.load()) {
      std::fprintf(stderr,
                   "gradzip: emulated NCCL, %s: ncclCommDestroy: %d queued operations did not "
                   "finish within %.0f s (GRADZIP_TIMEOUT_S); aborting the communicator\n",
                   s.who().c_str(), s.outstanding, setup_timeout().count());
    }
  }
  if (!clean) return emu_comm_abort(comm);
  close_connections(s);
  delete handle_of(comm);
  return ncclSuccess;
}

ncclResult_t emu_comm_get_async_error(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return failed(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is null");
  }
  State& s = *handle_of(comm)->state;
  *async_error = s.error.load();
  if (*async_error != ncclSuccess) t_last_error = s.error_message;  // set once, before the error
  return ncclSuccess;
}

ncclResult_t emu_comm_count(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr)
    return failed(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = handle_of(comm)->state->nranks;
  return ncclSuccess;
}

ncclResult_t emu_comm_cu_device(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr)
    return failed(ncclInvalidArgument, "ncclCommCuDevice: null argument");
  *device = handle_of(comm)->state->device;
  return ncclSuccess;
}

ncclResult_t emu_comm_user_rank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr)
    return failed(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = handle_of(comm)->state->rank;
  return ncclSuccess;
}

ncclResult_t emu_group_start() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t emu_group_end() {
  if (t_group.depth == 0) return failed(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  GroupState group = std::move(t_group);
  t_group = GroupState{};
  if (group.first_error != ncclSuccess) {
    for (HostTask& task : group.host_tasks) task(true);
    t_last_error = group.first_message;
    return group.first_error;
  }
  if (!group.host_tasks.empty()) {
    SetupFailure failure;
    try {
      failure = run_host_tasks(group.host_tasks);
    } catch (const std::exception& error) {
      failure = {ncclSystemError, concat("ncclGroupEnd: ", error.what())};
    }
    if (failure.code != ncclSuccess) {
      t_last_error = std::move(failure.message);
      return failure.code;
    }
  }
  try {
    return launch(std::move(group.ops));
  } catch (const std::exception& error) {
    return failed(ncclSystemError, concat("ncclGroupEnd: ", error.what()));
  }
}

// Adds `op` to the calling thread's group (a group of its own outside one).
ncclResult_t post(Op op) {
  if (t_group.depth > 0) {
    t_group.ops.push_back(std::move(op));
    return ncclSuccess;
  }
  emu_group_start();
  t_group.ops.push_back(std::move(op));
  return emu_group_end();
}

// Argument checks shared by the operations; the message byte count in `bytes`.
ncclResult_t check_op(const char* call, ncclComm_t comm, ncclDataType_t datatype, std::size_t count,
                      State*& state, std::size_t& bytes) {
  if (const ncclResult_t status = check_comm(comm, call, state); status != ncclSuccess)
    return status;
  const std::size_t size = type_size(datatype);
  if (size == 0) {
    return failed(ncclInvalidArgument,
                  concat(call, ": datatype ", static_cast<int>(datatype), " is unknown"));
  }
  if (count > kLargestMessage / size) {
    return failed(ncclInvalidArgument, concat(call, ": count ", count, " is too large"));
  }
  bytes = count * size;
  return ncclSuccess;
}

ncclResult_t emu_send(const void* sendbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  State* s = nullptr;
  std::size_t bytes = 0;
  if (const ncclResult_t status = check_op("ncclSend", comm, datatype, count, s, bytes);
      status != ncclSuccess) {
    return status;
  }
  if (peer < 0 || peer >= s->nranks) {
    return failed(ncclInvalidArgument,
                  concat("ncclSend: peer ", peer, " is not a rank of ", s->nranks));
  }
  if (bytes != 0 && sendbuff == nullptr)
    return failed(ncclInvalidArgument, "ncclSend: sendbuff is null");
  Op op;
  op.comm = handle_of(comm)->state;
  op.stream = static_cast<void*>(stream);
  op.type = OpType::send;
  op.sendbuff = sendbuff;
  op.count = count;
  op.bytes = bytes;
  op.datatype = datatype;
  op.peer = peer;
  return post(std::move(op));
}

ncclResult_t emu_recv(void* recvbuff, std::size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  State* s = nullptr;
  std::size_t bytes = 0;
  if (const ncclResult_t status = check_op("ncclRecv", comm, datatype, count, s, bytes);
      status != ncclSuccess) {
    return status;
  }
  if (peer < 0 || peer >= s->nranks) {
    return failed(ncclInvalidArgument,
                  concat("ncclRecv: peer ", peer, " is not a rank of ", s->nranks));
  }
  if (bytes != 0 && recvbuff == nullptr)
    return failed(ncclInvalidArgument, "ncclRecv: recvbuff is null");
  Op op;
  op.comm = handle_of(comm)->state;
  op.stream = static_cast<void*>(stream);
  op.type = OpType::recv;
  op.recvbuff = recvbuff;
  op.count = count;
  op.bytes = bytes;
  op.datatype = datatype;
  op.peer = peer;
  return post(std::move(op));
}

ncclResult_t emu_all_reduce(const void* sendbuff, void* recvbuff, std::size_t count,
                            ncclDataType_t datatype, ncclRedOp_t redop, ncclComm_t comm,
                            cudaStream_t stream) {
  State* s = nullptr;
  std::size_t bytes = 0;
  if (const ncclResult_t status = check_op("ncclAllReduce", comm, datatype, count, s, bytes);
      status != ncclSuccess) {
    return status;
  }
  if (!reducible(datatype, redop)) {
    return failed(
        ncclInvalidArgument,
        concat("ncclAllReduce: ", type_name(static_cast<int>(datatype)), " with ",
               op_name(static_cast<int>(redop)),
               " is not emulated (int8, uint8, int32, "
               "uint32, int64, uint64, float32 and float64 with sum, prod, max and min are)"));
  }
  if (bytes != 0 && (sendbuff == nullptr || recvbuff == nullptr)) {
    return failed(ncclInvalidArgument, "ncclAllReduce: sendbuff or recvbuff is null");
  }
  if (count == 0) return ncclSuccess;
  Op op;
  op.comm = handle_of(comm)->state;
  op.stream = static_cast<void*>(stream);
  op.type = OpType::allreduce;
  op.sendbuff = sendbuff;
  op.recvbuff = recvbuff;
  op.count = count;
  op.bytes = bytes;
  op.datatype = datatype;
  op.redop = redop;
  op.seq = ++s->collective_seq;
  return post(std::move(op));
}

ncclResult_t emu_all_gather(const void* sendbuff, void* recvbuff, std::size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  State* s = nullptr;
  std::size_t bytes = 0;
  if (const ncclResult_t status = check_op("ncclAllGather", comm, datatype, sendcount, s, bytes);
      status != ncclSuccess) {
    return status;
  }
  if (bytes != 0 && (sendbuff == nullptr || recvbuff == nullptr)) {
    return failed(ncclInvalidArgument, "ncclAllGather: sendbuff or recvbuff is null");
  }
  if (sendcount == 0) return ncclSuccess;
  Op op;
  op.comm = handle_of(comm)->state;
  op.stream = static_cast<void*>(stream);
  op.type = OpType::allgather;
  op.sendbuff = sendbuff;
  op.recvbuff = recvbuff;
  op.count = sendcount;
  op.bytes = bytes;
  op.datatype = datatype;
  op.seq = ++s->collective_seq;
  return post(std::move(op));
}

}  // namespace

NcclApi emulated_nccl_api() {
  NcclApi api;
  api.path = "emulated NCCL (gradzip)";
  api.found_by = "GRADZIP_DEVICE=emulated";
  api.version = kEmulatedNcclVersion;
  api.ncclGetVersion = &emu_get_version;
  api.ncclGetUniqueId = &emu_get_unique_id;
  api.ncclGetErrorString = &emu_get_error_string;
  api.ncclGetLastError = &emu_get_last_error;
  api.ncclCommInitRank = &emu_comm_init_rank;
  api.ncclCommInitAll = &emu_comm_init_all;
  api.ncclCommSplit = &emu_comm_split;
  api.ncclCommDestroy = &emu_comm_destroy;
  api.ncclCommAbort = &emu_comm_abort;
  api.ncclCommGetAsyncError = &emu_comm_get_async_error;
  api.ncclCommCount = &emu_comm_count;
  api.ncclCommCuDevice = &emu_comm_cu_device;
  api.ncclCommUserRank = &emu_comm_user_rank;
  api.ncclAllReduce = &emu_all_reduce;
  api.ncclAllGather = &emu_all_gather;
  api.ncclSend = &emu_send;
  api.ncclRecv = &emu_recv;
  api.ncclGroupStart = &emu_group_start;
  api.ncclGroupEnd = &emu_group_end;
  return api;
}

}  // namespace gradzip::collectives
