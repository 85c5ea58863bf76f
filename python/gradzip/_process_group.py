"""The byte engine of gradzip's "torch" transport: torch.distributed's gloo backend.

gradzip's collectives (ring, SRA, the sparse all-reduce, the call check) talk to a C++
Transport (collectives/transport/transport.h). Under torchrun there is no MPI world, so the
transport of a communicator made with transport="torch" is python/process_group_transport.cpp,
which forwards each operation to a ProcessGroupEngine here. The engine moves the bytes with
torch.distributed on a gloo process group of its own:

- Its own group (dist.new_group(backend="gloo")) over the ranks of the application's group, so
  that gradzip's traffic, issued from gradzip's communication thread, never interleaves with the
  collectives the application (DDP's buffer broadcasts, its own all-reduces) issues on its
  groups: two threads issuing collectives on one group would pair them up wrongly. gloo, not
  the application's backend, because gradzip hands the transport host memory (CUDA tensors go
  over gradzip's own NCCL communicator, whose unique id travels over this transport).
- Point-to-point messages have sizes the receiver does not know in advance (a receive buffer is
  a capacity, as in MPI), and gloo ends the process when a message is longer than the buffer
  posted for it. So every send is two gloo messages: the length (8 bytes, tag 2t) and then,
  when not empty, the bytes (tag 2t + 1); the receiver posts the length receive at once and the
  data receive, of exactly that length, once the length has arrived (a longer message than the
  caller's buffer is received into scratch and reported as MessageTooLong). Receives of one
  (peer, tag) complete in posting order, so data receives are posted in that order too.
- Sends are buffered: isend copies the bytes and returns, and wait() of a send returns at once.
  gloo completes a send only once the receiver has posted its receive, and its send handles
  never report completion without a blocking wait, so a caller that waited for its send before
  its receive (legal over MPI) would deadlock against a peer doing the same. A reaper thread
  waits for the sends in the background and drops their copies; a send that failed is reported
  by the next operation of the engine.
- Every wait ends within the deadline the C++ side passes (gloo's wait(timeout)); past it,
  WaitTimeout is raised and the transport reports and acts per the communicator's policy.

Memory is the C++ side's: each operation receives memoryviews of it, wrapped as tensors with
torch.frombuffer (no copy), kept alive here until the operation completes.
"""
import hashlib
import inspect
import socket
import time
from datetime import timedelta

from . import _lifecycle



class WaitTimeout(Exception):
    """A wait passed its deadline (process_group_transport.cpp turns it into the timeout report)."""


class MessageTooLong(Exception):
    """A message longer than its receive buffer (turned into ErrorCode::malformed_message)."""


def _bytes_of(torch, view):
    """A uint8 tensor over a memoryview (empty views give a fresh empty tensor)."""
    if len(view) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


class _Send:
    def __init__(self, bytes_):
        self.bytes = bytes_


class _SendReaper:
    """Waits for buffered sends in the background (see the module docstring) and keeps their
    tensors alive until gloo is done with them; a gradzip/_lifecycle.py worker, stopped at
    interpreter exit. `failure` names the first send that failed."""

    def __init__(self, finished):
        self.failure = None
        self._finished = finished
        self._worker = _lifecycle.Worker("gradzip-torch-sends", self._reap)

    def put(self, item):
        self._worker.submit(item)

    def _reap(self, item):
        works, tensors, what = item
        try:
            for work in works:
                work.wait()
                self._finished.keep(work, *tensors)
        except Exception as error:  # noqa: BLE001 - reported by the engine's next call
            if self.failure is None:
                self.failure = f"{what} failed: {error}"


class _Receive:
    def __init__(self, peer, tag, buffer, length_tensor, length_work):
        self.peer = peer
        self.tag = tag
        self.buffer = buffer            # uint8 tensor over the caller's memory (or None if empty)
        self.capacity = 0 if buffer is None else buffer.numel()
        self.length_tensor = length_tensor
        self.length_work = length_work
        self.data_work = None
        self.data_tensor = None
        self.bytes = None               # known once the length has arrived
        self.error = None


class ProcessGroupEngine:
    """Point-to-point and collectives of bytes among `ranks` (global ranks, in group order)."""

    def __init__(self, group, ranks, timeout_s):
        import torch
        import torch.distributed as dist
        self._torch = torch
        self._dist = dist
        self._group = group
        self._ranks = list(ranks)
        self._timeout_s = float(timeout_s)
        me = dist.get_rank()
        self.rank = self._ranks.index(me)
        self.size = len(self._ranks)
        self._next_handle = 0
        self._requests = {}
        # Receives per (peer, tag) in posting order, not yet given a data receive.
        self._unsized = {}
        # Finished works stay referenced here for a while: see _lifecycle.FinishedWorks.
        self._finished = _lifecycle.FinishedWorks()
        self._reaper = _SendReaper(self._finished)

    # ---- making engines -----------------------------------------------------------------------

    @classmethod
    def over_group(cls, process_group, timeout_s):
        """An engine over the ranks of `process_group` (None: the default group) with a new gloo
        group of its own. Collective over the default group (every rank of the job calls it)
        when the group spans the job; else over the group's ranks only (each rank of the job
        makes the engine of its own group, e.g. FSDP's replicate groups; this needs
        new_group(use_local_synchronization=True), PyTorch 2.1 or later)."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            from . import _gradzip
            error = _gradzip.Error(
                "gradzip.Communicator(transport='torch'): torch.distributed is not initialised; "
                "call torch.distributed.init_process_group(...) first (under torchrun, "
                "init_process_group('gloo') or ('nccl') reads the launcher's variables)")
            error.code = "invalid_argument"
            raise error
        group = process_group if process_group is not None else dist.group.WORLD
        ranks = [_global_rank(dist, group, r) for r in range(dist.get_world_size(group))]
        spans_job = len(ranks) == dist.get_world_size()
        return cls(_new_gloo_group(dist, ranks, timeout_s, every_rank_calls=spans_job), ranks,
                   timeout_s)

    def split(self, color, key, timeout_s):
        """MPI_Comm_split over this engine's ranks: ranks with the same color form an engine,
        ordered by (key, rank). Collective over this engine."""
        entries = self.allgather_u64([color & 0xFFFFFFFFFFFFFFFF, key & 0xFFFFFFFFFFFFFFFF], timeout_s)
        colors = [entries[2 * r] for r in range(self.size)]
        keys = [_signed(entries[2 * r + 1]) for r in range(self.size)]
        mine = colors[self.rank]
        members = sorted((r for r in range(self.size) if colors[r] == mine), key=lambda r: (keys[r], r))
        ranks = [self._ranks[r] for r in members]
        spans_world = self.size == self._dist.get_world_size()
        if spans_world:
            # new_group is collective over the whole job: every rank makes every color's group,
            # in the same order (by color), and keeps its own.
            made = None
            for color in sorted(set(colors)):
                group_members = sorted((r for r in range(self.size) if colors[r] == color),
                                       key=lambda r: (keys[r], r))
                group = _new_gloo_group(self._dist, [self._ranks[r] for r in group_members],
                                        timeout_s, every_rank_calls=True)
                if color == mine:
                    made = group
            return ProcessGroupEngine(made, ranks, timeout_s)
        group = _new_gloo_group(self._dist, ranks, timeout_s, every_rank_calls=False)
        return ProcessGroupEngine(group, ranks, timeout_s)

    def split_by_node(self, timeout_s):
        """The ranks of this engine on this host (same host name), ordered by rank."""
        digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=8).digest()
        mine = int.from_bytes(digest, "little") & 0x7FFFFFFFFFFFFFFF
        hosts = self.allgather_u64([mine], timeout_s)
        color = hosts.index(mine)  # the first rank on this host names the node
        return self.split(color, self.rank, timeout_s)

    # ---- point-to-point -------------------------------------------------------------------------

    def isend(self, peer, tag, view):
        torch, dist = self._torch, self._dist
        self._raise_send_failure()
        data = _bytes_of(torch, view).clone()  # buffered: the caller may reuse its memory now
        length = torch.tensor([data.numel()], dtype=torch.int64)
        works = [dist.isend(length, self._ranks[peer], group=self._group, tag=2 * tag)]
        if data.numel() > 0:
            works.append(dist.isend(data, self._ranks[peer], group=self._group, tag=2 * tag + 1))
        self._reaper.put((works, (length, data), f"send of {data.numel()} bytes to rank {peer}"))
        return self._remember(_Send(data.numel()))

    def irecv(self, peer, tag, view):
        torch, dist = self._torch, self._dist
        self._raise_send_failure()
        buffer = None if len(view) == 0 else torch.frombuffer(view, dtype=torch.uint8)
        length = torch.zeros(1, dtype=torch.int64)
        work = dist.irecv(length, self._ranks[peer], group=self._group, tag=2 * tag)
        receive = _Receive(peer, tag, buffer, length, work)
        self._unsized.setdefault((peer, tag), []).append(receive)
        return self._remember(receive)

    def wait(self, handle, timeout_s):
        """Completes request `handle`; returns its bytes. Raises MessageTooLong for a message
        longer than its receive buffer (its bytes are consumed, so the stream stays in step)."""
        request = self._requests.pop(handle)
        if isinstance(request, _Send):
            self._raise_send_failure()
            return request.bytes
        deadline = time.monotonic() + timeout_s
        # The earlier receives of the same (peer, tag) get their data receives first: gloo
        # matches messages of one slot in posting order.
        queue = self._unsized.get((request.peer, request.tag), [])
        while request.bytes is None:
            self._post_data_receive(queue.pop(0), deadline)
        if not queue:
            self._unsized.pop((request.peer, request.tag), None)
        self._finished.keep(request.length_work, request.length_tensor)
        if request.data_work is not None:
            self._wait_work(request.data_work, deadline, self._pending_text(request))
            self._finished.keep(request.data_work, request.data_tensor)
        if request.error is not None:
            raise MessageTooLong(request.error)
        return request.bytes

    def _post_data_receive(self, receive, deadline):
        torch, dist = self._torch, self._dist
        self._wait_work(receive.length_work, deadline, self._pending_text(receive))
        count = int(receive.length_tensor.item())
        receive.bytes = count
        if count > receive.capacity:
            receive.error = (f"a message of {count} bytes from rank {receive.peer} "
                             f"(tag {receive.tag}) for a receive buffer of {receive.capacity}")
            receive.data_tensor = torch.empty(count, dtype=torch.uint8)
        elif count > 0:
            receive.data_tensor = receive.buffer[:count]
        if count > 0:
            receive.data_work = dist.irecv(receive.data_tensor, self._ranks[receive.peer],
                                           group=self._group, tag=2 * receive.tag + 1)

    def _wait_work(self, work, deadline, what):
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(what)
        try:
            work.wait(timeout=timedelta(seconds=left))
        except RuntimeError as error:
            if time.monotonic() >= deadline or "imed out" in str(error):
                raise WaitTimeout(what) from error
            raise

    def _raise_send_failure(self):
        failure = self._reaper.failure
        if failure is not None:
            raise RuntimeError(f"an earlier {failure}")

    def _pending_text(self, request):
        if request.bytes is None:
            return f"receive from rank {request.peer} (tag {request.tag}): no length yet"
        return f"receive of {request.bytes} bytes from rank {request.peer} (tag {request.tag})"

    def _remember(self, request):
        handle = self._next_handle
        self._next_handle += 1
        self._requests[handle] = request
        return handle

    # ---- collectives ----------------------------------------------------------------------------

    def _finish(self, work, what, timeout_s, *tensors):
        """Waits for collective `work` on `tensors`, then keeps both referenced for a while."""
        self._raise_send_failure()
        self._wait_work(work, time.monotonic() + timeout_s, what)
        self._finished.keep(work, *tensors)

    def allgatherv(self, mine, out, counts, timeout_s):
        torch, dist = self._torch, self._dist
        padded = max(counts) if counts else 0
        if padded == 0:
            return
        block = torch.zeros(padded, dtype=torch.uint8)
        if len(mine) > 0:
            block[:len(mine)] = _bytes_of(torch, mine)
        blocks = [torch.empty(padded, dtype=torch.uint8) for _ in range(self.size)]
        work = dist.all_gather(blocks, block, group=self._group, async_op=True)
        self._finish(work, f"allgatherv of {padded}-byte blocks", timeout_s, block, blocks)
        target = _bytes_of(torch, out)
        offset = 0
        for r, count in enumerate(counts):
            if count:
                target[offset:offset + count] = blocks[r][:count]
            offset += count

    def alltoallv(self, send, send_counts, recv, recv_counts, timeout_s):
        torch, dist = self._torch, self._dist
        source = _bytes_of(torch, send)[:sum(send_counts)] if sum(send_counts) else torch.empty(0, dtype=torch.uint8)
        total = sum(recv_counts)
        target = _bytes_of(torch, recv)[:total] if total else torch.empty(0, dtype=torch.uint8)
        work = dist.all_to_all_single(target, source, output_split_sizes=list(recv_counts),
                                      input_split_sizes=list(send_counts), group=self._group,
                                      async_op=True)
        self._finish(work, "alltoallv", timeout_s, source, target)

    def allgather_u64(self, mine, timeout_s=None):
        torch, dist = self._torch, self._dist
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        block = torch.tensor([_signed(v) for v in mine], dtype=torch.int64)
        blocks = [torch.empty(len(mine), dtype=torch.int64) for _ in range(self.size)]
        work = dist.all_gather(blocks, block, group=self._group, async_op=True)
        self._finish(work, f"allgather_u64 of {len(mine)} values", timeout_s, block, blocks)
        return [v & 0xFFFFFFFFFFFFFFFF for b in blocks for v in b.tolist()]

    def allreduce_f32_sum(self, view, timeout_s):
        torch, dist = self._torch, self._dist
        if len(view) == 0:
            return
        data = torch.frombuffer(view, dtype=torch.float32)
        work = dist.all_reduce(data, op=dist.ReduceOp.SUM, group=self._group, async_op=True)
        self._finish(work, f"allreduce_f32_sum of {data.numel()} floats", timeout_s, data)

    def barrier(self, timeout_s):
        # An all-gather of one value: gloo's barrier has no async handle in every version.
        self.allgather_u64([0], timeout_s)


def _signed(value):
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >= (1 << 63) else value


def _global_rank(dist, group, group_rank):
    if group is dist.group.WORLD or group is None:
        return group_rank
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, group_rank)
    from torch.distributed import distributed_c10d
    return distributed_c10d._get_global_rank(group, group_rank)


def _new_gloo_group(dist, ranks, timeout_s, every_rank_calls):
    timeout = timedelta(seconds=max(1.0, float(timeout_s)))
    if every_rank_calls:
        return dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)
    if "use_local_synchronization" in inspect.signature(dist.new_group).parameters:
        return dist.new_group(ranks=ranks, backend="gloo", timeout=timeout,
                              use_local_synchronization=True)
    raise NotImplementedError(
        "splitting a torch transport that does not span the whole job needs "
        "torch.distributed.new_group(use_local_synchronization=True) (PyTorch 2.1 or later)")
