// The emulated NCCL: every function of NcclApi (nccl_library.h) implemented by gradzip on the
// CPU, for the emulated CUDA device (kernels/emulated/emulated_device.h). nccl_api() returns it
// instead of loading libnccl.so.2 when kernels::emulated::active() (GRADZIP_DEVICE=emulated, or a
// build without the CUDA toolkit); it never dlopens a real NCCL then.
//
// Scope: the ranks of a communicator are processes (or threads) of ONE host. Bytes move over
// Unix stream sockets, one per pair of ranks; device memory is host memory, and every
// operation NCCL would run on a CUDA stream is queued on the emulated stream with
// kernels::emulated::enqueue, so it runs asynchronously to the caller, after the stream's earlier
// work, as on a GPU.
//
// Semantics, NCCL's unless said otherwise:
// - ncclGetUniqueId: 128 random bytes (std::random_device, the pid, the clocks).
//   ncclCommInitRank: rank r listens on /tmp/gz-emu-nccl-<16 hex of the id's FNV-1a>-<r> (a
//   filesystem Unix socket), connects to every lower rank (retrying until its socket exists) and
//   accepts every higher one (the connector's first message names its rank and the id); the
//   socket file is removed once the mesh is connected, and on failure. One rank needs no socket.
//   The setup ends within GRADZIP_TIMEOUT_S (a finite number > 0), else 600 s: ncclRemoteError
//   when a peer did not connect in time or sent a wrong greeting, ncclSystemError when a socket
//   call failed here; ncclGetLastError says which. *comm is null after a failure.
//   ncclCommInitAll: ndev ranks in this process, connected by socketpair(); devlist null means
//   devices 0..ndev-1; each device must be < kernels::emulated::device_count() (several ranks
//   may share one device, which real NCCL refuses).
//   ncclCommCuDevice: the calling thread's current emulated device at ncclCommInitRank (the
//   parent's device for ncclCommSplit).
// - Messages: a 32-byte header (magic, kind, datatype/op, sequence number, byte count) and the
//   bytes. Each connection has a reader thread that moves every arriving message into a FIFO
//   of this rank in memory, so a send never waits for the peer to post its receive (no
//   deadlock when both sides send first). Sends to self go straight into the FIFO.
// - Groups: ncclGroupStart / ncclGroupEnd nest (a thread-local depth); operations outside a group
//   are a group of their own. At the outermost ncclGroupEnd, for each stream of the group one
//   operation is queued that runs, per communicator: every ncclSend in posting order, then every
//   ncclRecv in posting order (each takes the next message from its peer's FIFO), then the
//   group's collectives in posting order. A group with several communicators runs each
//   communicator's part on a thread of its own (so ranks of one process driven from one thread,
//   as after ncclCommInitAll, do not wait for each other); a group with several streams runs
//   when every stream has reached it, and each of those streams completes with it.
//   ncclCommInitRank and ncclCommSplit inside a group run at the outermost ncclGroupEnd, all
//   of them concurrently (one thread each): that is how one thread initialises or splits
//   several ranks. An argument error inside a group is returned by the call and again by
//   ncclGroupEnd, and then nothing of the group runs.
// - Matching: a rank's messages to one peer form ONE ordered stream shared by point-to-point
//   operations and collectives, and each message carries its kind (and, for collectives, the
//   communicator's collective sequence number, datatype and operation). A receive that finds a
//   message of another kind, sequence number, datatype/op or size does not write its buffer and
//   sets the communicator's asynchronous error to ncclInvalidUsage with a message naming both
//   sides (sizes, ranks, operations). Where real NCCL would hang or corrupt on such a mismatch,
//   the emulation reports it. Zero-byte ncclSend/ncclRecv are messages like any other;
//   collectives with count 0 do nothing.
// - Collectives: ncclAllReduce of int8, uint8, int32, uint32, int64, uint64, float32 and
//   float64 with ncclSum, ncclProd, ncclMax or ncclMin (others: ncclInvalidArgument); each rank
//   sends its data to every peer and combines the ranks' data in rank order 0..P-1, so every rank
//   gets bit-identical results. ncclAllGather: any datatype, as bytes. Both may run in place
//   (sendbuff == recvbuff; for the all-gather sendbuff == recvbuff + rank * sendcount elements).
// - ncclCommSplit: blocking and host-side, not stream-ordered: (color, key) of every rank is
//   exchanged over the parent's connections (a FIFO of its own, so it never meets the parent's
//   stream traffic, ended or not), ranks of one color form a communicator ordered by (key, old
//   rank), whose id is derived from the parent's id, the parent's split count and the color;
//   NCCL_SPLIT_NOCOLOR gives *newcomm == nullptr. config is ignored (may be null). The exchange
//   and the new mesh end within the setup deadline above.
// - Errors: the first asynchronous error is sticky (ncclCommGetAsyncError returns it and copies
//   its text to the calling thread's ncclGetLastError) and is printed once to stderr:
//   ncclInvalidUsage for a mismatch, ncclRemoteError when a peer closed its connection (it
//   ended, destroyed or aborted its communicator) while a receive waits for it or a send goes
//   to it, ncclUnhandledCudaError when a buffer is not emulated device memory (checked when the
//   operation runs). An operation that met an error, and every later one of the communicator,
//   then blocks its stream until ncclCommAbort, as a failed NCCL kernel would: the stream stays
//   incomplete, and a caller polling it (the NCCL transport) sees the error and aborts. Calls on
//   a communicator with an asynchronous error return that error. Receives wait without a
//   deadline, as NCCL's do; ncclCommAbort wakes them.
// - ncclCommAbort: marks the communicator aborted, wakes every wait, shuts the sockets down
//   (peers see their connection closed), joins the reader threads and frees the handle.
//   Operations still queued or running finish without writing any buffer. ncclCommDestroy
//   waits until the communicator's queued operations have run (NCCL flushes), then closes the
//   connections cleanly; a communicator with an asynchronous error, or whose operations have
//   not run within the setup deadline, is aborted instead (the latter with a note on stderr).
//   Both accept a null communicator.
// - ncclGetLastError: the calling thread's last error text (comm is not consulted), as NCCL's
//   last-error text; it stays until the next error of that thread.
// - Threads: one host thread at a time per communicator for its calls, as NCCL asks; a
//   communicator's operations on two streams at once may interleave their messages.
#pragma once

#include "collectives/transport/nccl/nccl_library.h"

namespace gradzip::collectives {

// The emulated NCCL's version: what ncclGetVersion answers (2.28.9, the API these signatures
// follow).
inline constexpr int kEmulatedNcclVersion = 22809;

// Every member filled; path "emulated NCCL (gradzip)", found_by "GRADZIP_DEVICE=emulated".
NcclApi emulated_nccl_api();

}  // namespace gradzip::collectives
