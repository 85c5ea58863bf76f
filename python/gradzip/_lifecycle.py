"""Background threads of gradzip's Python side, and their orderly end.

gradzip runs work on Python threads of its own: the DDP hook's communication thread (one per
GradzipState) and the torch transport's send reaper (one per engine). They are daemon threads,
so a thread stuck waiting for a peer never keeps the process alive. But a daemon thread that is
inside C++ code with the GIL released when the interpreter finalises (a torch future's
set_result, a gloo wait, a gradzip collective) is ended by pthread_exit as soon as it asks for
the GIL back, and the forced unwind through C++ frames that may not unwind ends the process with
std::terminate ("terminate called without an active exception", exit code 134), so launchers
report a job that trained correctly as failed.

So every such thread is a Worker registered here, and at interpreter exit, before Python's own
shutdown reaches the daemon threads (threading's exit hooks run before it joins non-daemon
threads and before atexit), each worker is stopped: its queue gets a stop marker after the work
already queued, and the thread is joined for at most `EXIT_JOIN_S` seconds. A worker still busy
after that (waiting for a peer that went away) is left to the process's end.
"""
import atexit
import collections
import ctypes
import queue
import threading
import weakref

EXIT_JOIN_S = 30.0

_STOP = object()
_workers = weakref.WeakSet()
_workers_lock = threading.Lock()


class Worker:
    """A daemon thread that runs callables in submission order until stopped.

    run_item(item) is called for each submitted item; it must not raise (a worker has nobody to
    report to: callers catch and deliver their own errors). stop() queues the stop marker behind
    the items already submitted and joins the thread (at most `timeout` seconds); it is
    idempotent, and submit() after it raises RuntimeError naming the worker.
    """

    def __init__(self, name, run_item):
        self.name = name
        self._run_item = run_item
        self._queue = queue.SimpleQueue()
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        with _workers_lock:
            _workers.add(self)

    def submit(self, item):
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"gradzip: {self.name} was closed; it takes no more work")
            self._queue.put(item)

    def stop(self, timeout=EXIT_JOIN_S):
        """Stops the thread after the work already submitted; returns whether it ended."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                self._queue.put(_STOP)
        if threading.current_thread() is self._thread:
            return False  # stopped from inside a task: the loop ends after it
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self):
        return self._thread.is_alive()

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._run_item(item)


class FinishedWorks:
    """Keeps the last `capacity` finished torch.distributed works, and the tensors they used,
    referenced from Python, so that gloo's threads never drop the last reference to them.

    Why: gloo runs a collective on a thread of its own (ProcessGroupGloo::runLoop), marks the
    work complete (our wait() returns) and only then drops its own reference to the work. When
    Python has dropped its references in between, the gloo thread destroys the work's tensors,
    and a tensor made in Python needs the GIL to die. At interpreter finalisation that GIL
    request ends the gloo thread by pthread_exit, through C++ frames that may not unwind:
    std::terminate, exit code 134, about one run in twenty of a hook that had finished its work.

    So each finished work goes into a ring of the last `capacity` (a work leaves it only after
    `capacity` later works finished, long after gloo let go of it), and at interpreter exit,
    after the workers stopped, the rings of live holders are leaked on purpose: nothing in them
    is destroyed during finalisation, by any thread. Thread-safe (deque appends are atomic).
    """

    def __init__(self, capacity=64):
        self._ring = collections.deque(maxlen=capacity)
        _finished_works.add(self)

    def keep(self, work, *tensors):
        self._ring.append((work, tensors))

    def __len__(self):
        return len(self._ring)


_finished_works = weakref.WeakSet()


def stop_all_workers(timeout=EXIT_JOIN_S):
    """Stops every live worker, then leaks every FinishedWorks ring (what interpreter exit does)."""
    with _workers_lock:
        workers = list(_workers)
    for worker in workers:
        worker.stop(timeout)
    leak_finished_works()


def leak_finished_works():
    """Gives the ring of every live FinishedWorks one reference that nobody releases: the rings
    outlive finalisation (the process ends without destroying them), so no gloo thread is ever
    left to destroy what they hold. Called at interpreter exit; harmless at any other time."""
    for holder in list(_finished_works):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(holder._ring))


# threading's exit hooks run first at shutdown, before non-daemon threads are joined and before
# atexit handlers (torch.distributed's among them). Python < 3.9 has none: atexit then.
_register = getattr(threading, "_register_atexit", atexit.register)
_register(stop_all_workers)
