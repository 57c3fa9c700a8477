"""The operator's bounded search pool: every tuning's search runs in one of at most ``size`` worker
processes, in a fair order, and identical searches are computed once.

- Bounded: ``size`` long-lived worker processes (INFERASIM_SEARCH_WORKERS; default the CPUs this
  process may use, cgroup quota included). 100 tunings applied at once no longer start 100
  searches that starve each other (and the operator's own event loop) of CPU and memory.
- Fair: waiting searches are served round-robin across namespaces, first come first served within
  one; a tuning has one search at a time (its pass holds the tuning's lock), and a retry queues at
  the back. Each waiting search learns its place (phase Queued in the status).
- Computed once: a search is keyed by the spec it searches (workload included), the search
  settings and the anchors on disk (:func:`search_key`). While one runs, an identical one waits for
  it; a finished one is kept (a few, LRU) as a pickled TuneResult, and each tuning only renders its
  own names from it (cheap, also in a worker).
- Backoff: a search that ran past its time limit is not run again for the same key until a
  backoff (doubling) has passed; meanwhile an identical request fails at once with SearchTimeout.
- Workers die with the operator: PR_SET_PDEATHSIG (Linux) and a thread that watches the parent's
  pid; they no longer leave the operator's session (setsid), so a signal to its process group
  reaches them too.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("inferasim_operator")

PR_SET_PDEATHSIG = 1
Report = Callable[[int, int, int], Awaitable[None]]
Target = Callable[[Any, int], None]


class SearchTimeout(TimeoutError):
    """The search ran past its time limit (or an identical one did, and its backoff is not over:
    ``retry_in`` seconds)."""

    def __init__(self, message: str, retry_in: float = 0.0) -> None:
        self.retry_in = retry_in
        super().__init__(message)


class SearchFailed(RuntimeError):
    """The search raised; ``invalid`` is True for bad input (a ValueError: unknown model, GPU ...)."""

    def __init__(self, message: str, invalid: bool) -> None:
        self.invalid = invalid
        super().__init__(message)


# --------------------------------------------------------------------------------------------
# sizing and keys
# --------------------------------------------------------------------------------------------


def _cgroup_cpus() -> float | None:
    """The CPU quota of this process's cgroup in CPUs (a container's CPU limit), if any."""
    try:  # cgroup v2
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def _cgroup_memory() -> int | None:
    """The memory limit of this process's cgroup in bytes (a container's memory limit), if any."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # cgroup v1 writes a huge number for "none"
            return int(text)
    return None


# What one search worker holds at most (measured: benchmarks/operator_scale.py), and what the
# operator itself needs beside its workers; a pod's memory limit caps the pool by them.
WORKER_BYTES = 300 << 20
OPERATOR_BYTES = 400 << 20
MAX_DEFAULT_WORKERS = 16


def default_workers() -> int:
    """Searches that may run at once: the CPUs this process may use (affinity, then a cgroup CPU
    quota), no more than its memory limit holds, and at most MAX_DEFAULT_WORKERS (a 128-core node
    with no CPU limit on the pod would otherwise start 128 workers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota:
        n = min(n, math.ceil(quota))
    memory = _cgroup_memory()
    if memory:
        n = min(n, (memory - OPERATOR_BYTES) // WORKER_BYTES)
    return int(max(1, min(n, MAX_DEFAULT_WORKERS)))


def anchors_fingerprint(dirs: list[str]) -> list[tuple[str, int, int]]:
    """What the search would read from the anchor folders, cheaply: (path, size, mtime) of each file."""
    out = []
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*.json")):
            try:
                st = p.stat()
            except OSError:
                continue
            out.append((str(p), st.st_size, st.st_mtime_ns))
    return out


def search_key(spec: dict[str, Any], stage2_top: int, fingerprint: list[tuple[str, int, int]]) -> str:
    """Identical searches share this key: same spec (its workload included), settings and anchors."""
    text = json.dumps([spec, stage2_top, fingerprint], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# the worker process
# --------------------------------------------------------------------------------------------


def die_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """In a worker: end when the operator ends, even by SIGKILL (no orphan keeps computing, or
    logs BrokenPipeError into a log nobody reads)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)

    def watch() -> None:  # everywhere else, and a second guard: an orphan's parent pid changes
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Worker:
    """One worker process and its pipe, used by one pool slot at a time."""

    def __init__(self, target: Target) -> None:
        ctx = mp.get_context("spawn")  # fork would copy kopf's threads and locks
        self.conn, child = ctx.Pipe(duplex=True)
        # Started from the event loop's thread, which lives as long as the operator: the death
        # signal is tied to the thread that started the process, not only to the process.
        self.proc = ctx.Process(target=target, args=(child, os.getpid()), name="inferasim-search", daemon=True)
        self.proc.start()
        child.close()

    def call(self, request: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...] | None:
        """Send one request and wait for its answer; None after ``timeout_s`` (blocking: run in a thread)."""
        self.conn.send(request)
        if not self.conn.poll(timeout_s):
            return None
        return self.conn.recv()

    def kill(self) -> None:
        if self.proc.pid is not None and self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


# --------------------------------------------------------------------------------------------
# the pool
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Request:
    kind: str  # "search" or "render"
    key: str
    tenant: str
    args: tuple[Any, ...]
    render: tuple[Any, ...]
    timeout_s: float
    future: asyncio.Future[Any]
    report: Report | None = None
    reported: int = -1  # the place last reported (0: running)
    closed: bool = False  # the requester has its answer: no more reports
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    followers: list[_Request] = field(default_factory=list)  # identical searches waiting for this one
    background: bool = False  # runs only when no other search waits (a refinement)
    quick: bool = False  # ran with the burst's smaller stage 2


class SearchPool:
    """See the module's docstring. One per event loop (:func:`shared_pool`)."""

    def __init__(self, target: Target, size: int = 0, *, cache_size: int = 16, backoff_base_s: float = 30.0,
                 backoff_max_s: float = 1800.0, report_every_s: float = 1.0, burst_stage2_top: int = 0,
                 burst_queue: int = 0) -> None:
        """``target(conn, parent_pid)``: a worker process's main (search.worker_main). Under a burst
        (``burst_queue`` or more searches waiting when one starts; default twice the size), a search
        runs its stage 2 on ``burst_stage2_top`` candidates (0: never): a quick answer now, refined
        later in the background (the payload says ``quick``)."""
        self.target = target
        self.size = size or default_workers()
        self.burst_stage2_top = burst_stage2_top
        self.burst_queue = burst_queue or 2 * self.size
        self._background: collections.deque[_Request] = collections.deque()
        self._burst = False
        self.cache_size = cache_size
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.report_every_s = report_every_s
        self._renders: collections.deque[_Request] = collections.deque()
        self._waiting: dict[str, collections.deque[_Request]] = {}
        self._turn: collections.deque[str] = collections.deque()  # tenants with waiting searches, in turn
        self._leaders: dict[str, _Request] = {}  # key -> the request computing it (waiting or running)
        self._blobs: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._timeouts: dict[str, tuple[int, float]] = {}  # key -> (timeouts in a row, no retry before)
        self._workers: list[_Worker | None] = [None] * self.size
        self._busy = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = collections.Counter[str]()

    # -- what callers use -------------------------------------------------------------------

    async def search(self, *, key: str, tenant: str, search_args: tuple[Any, ...], render_args: tuple[Any, ...],
                     timeout_s: float, report: Report | None = None, background: bool = False) -> dict[str, Any]:
        """The payload of ``search_args`` rendered with ``render_args``; see the module's docstring.
        ``background``: start only when no other search waits, never shortened by a burst."""
        self._start()
        count, not_before = self._timeouts.get(key, (0, 0.0))
        if count and time.monotonic() < not_before:
            self.stats["timeout_backoff"] += 1
            wait = not_before - time.monotonic()
            raise SearchTimeout(f"an identical search timed out {count} time(s) in a row; it is not run again for "
                                f"{wait:.0f} s", retry_in=wait)
        leader = self._leaders.get(key)
        if key not in self._blobs and leader is not None and (background or not leader.background):
            # An identical search is waiting or running: wait for it, shown at its place.
            self.stats["coalesced"] += 1
            follower = self._request("follow", key, tenant, (), render_args, timeout_s, report)
            leader.followers.append(follower)
            try:
                await self._report(follower, max(leader.reported, 0) if leader.reported >= 0 else self._place(leader))
                await asyncio.shield(leader.future)
            finally:
                await self._close(follower)
        # A follower takes what its leader computed, a quick answer too; a new request only a full one.
        quick = key not in self._blobs and leader is not None and key + "#quick" in self._blobs
        blob = self._blobs.get(key + "#quick" if quick else key)
        if blob is not None:
            self._blobs.move_to_end(key + "#quick" if quick else key)
            self.stats["reused"] += 1
            req = self._request("render", key, tenant, (blob, search_args[1]), render_args, timeout_s, None)
            req.quick = quick
            self._renders.append(req)
        else:
            self.stats["searched"] += 1
            req = self._request("search", key, tenant, search_args, render_args, timeout_s, report)
            req.background = background
            self._leaders[key] = req
            if background:
                self._background.append(req)
            else:
                self._waiting.setdefault(tenant, collections.deque()).append(req)
                if tenant not in self._turn:
                    self._turn.append(tenant)
        self._wake.set()
        if req.kind == "search":
            place = self._place(req)
            if place > self.size - self._busy:  # no slot is free for it: Queued, at its place, before waiting
                await self._report(req, place)
        try:
            payload, _ = await req.future
        except asyncio.CancelledError:
            self._drop(req)
            raise
        finally:
            await self._close(req)
        return payload

    def waiting(self) -> int:
        """Searches waiting, background ones left out."""
        return sum(len(q) for q in self._waiting.values())

    def idle(self) -> bool:
        """No search waits or runs: a background refinement may start at once."""
        return self._busy == 0 and not self.waiting() and not self._background

    def close(self) -> None:
        """Stop the slots and kill the workers (a new event loop starts a new pool)."""
        for t in self._tasks:
            t.cancel()
        for i, w in enumerate(self._workers):
            if w is not None:
                w.kill()
                self._workers[i] = None

    # -- order -------------------------------------------------------------------------------

    def _order(self) -> list[_Request]:
        """Waiting searches in the order they will start: round-robin over tenants, FIFO in each."""
        queues = [list(self._waiting[t]) for t in self._turn]
        out: list[_Request] = []
        depth = 0
        while True:
            row = [q[depth] for q in queues if depth < len(q)]
            if not row:
                return out + list(self._background)
            out.extend(row)
            depth += 1

    def _place(self, req: _Request) -> int:
        order = self._order()
        return order.index(req) + 1 if req in order else 0

    def _pop(self) -> _Request | None:
        if self._renders:
            return self._renders.popleft()  # cheap, and their tunings waited already
        while self._turn:
            tenant = self._turn.popleft()
            q = self._waiting.get(tenant)
            if not q:
                self._waiting.pop(tenant, None)
                continue
            req = q.popleft()
            if q:
                self._turn.append(tenant)
            else:
                del self._waiting[tenant]
            return req
        if self._background:
            return self._background.popleft()
        return None

    def _drop(self, req: _Request) -> None:
        """A requester went away (its handler was cancelled) before its search started."""
        q = self._waiting.get(req.tenant)
        if q is not None and req in q:
            q.remove(req)
            if self._leaders.get(req.key) is req:
                del self._leaders[req.key]
                if not req.future.done():
                    req.future.set_exception(SearchFailed("the search was cancelled", invalid=False))
                    req.future.exception()  # retrieved: followers see it, nobody else must
        if req in self._renders:
            self._renders.remove(req)
        if req in self._background:
            self._background.remove(req)
            if self._leaders.get(req.key) is req:
                del self._leaders[req.key]

    # -- slots and workers ----------------------------------------------------------------------

    def _request(self, kind: str, key: str, tenant: str, args: tuple[Any, ...], render: tuple[Any, ...],
                 timeout_s: float, report: Report | None) -> _Request:
        return _Request(kind, key, tenant, args, render, timeout_s, asyncio.get_running_loop().create_future(),
                        report)

    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._slot(i), name=f"search-slot-{i}") for i in range(self.size)]
            self._tasks.append(asyncio.create_task(self._report_loop(), name="search-queue-report"))

    async def _slot(self, i: int) -> None:
        while True:
            req = self._pop()
            if req is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            if req.future.done():
                continue
            self._busy += 1
            try:
                if req.kind == "search":  # phase Searching, for it and the identical ones waiting
                    for r in (req, *req.followers):
                        asyncio.create_task(self._report(r, 0))
                await self._run(i, req)
            finally:
                self._busy -= 1

    async def _run(self, i: int, req: _Request) -> None:
        worker = self._workers[i]
        if worker is None or not worker.proc.is_alive():
            if worker is not None:
                worker.kill()
            worker = self._workers[i] = _Worker(self.target)  # from the loop's thread (see _Worker)
        args = req.args
        if req.kind == "search" and not req.background:
            # A burst begins when burst_queue searches wait, and lasts until the pool is idle again
            # (the tail of a burst would otherwise run full stage 2s, one slow search after another).
            if self.waiting() + 1 >= self.burst_queue:
                self._burst = True
            elif not self.waiting() and self._busy <= 1:
                self._burst = False
        if (req.kind == "search" and not req.background and self.burst_stage2_top and self._burst and
                args[2] > self.burst_stage2_top):
            # A burst: this search runs a smaller stage 2, the rest of the queue sooner.
            args = (*args[:2], self.burst_stage2_top, *args[3:])
            req.quick = True
            self.stats["quick"] += 1
        message = (req.kind, args, req.render)
        t0 = time.monotonic()
        exc: BaseException | None = None
        answer = None
        try:
            answer = await asyncio.to_thread(worker.call, message, req.timeout_s)
        except (EOFError, OSError) as err:
            exc = SearchFailed(f"the search process died (exit code {worker.proc.exitcode}): {err}", invalid=False)
        if answer is None and exc is None:
            worker.kill()
            self._workers[i] = None
            count = self._timeouts.get(req.key, (0, 0.0))[0] + 1
            wait = min(self.backoff_base_s * 2 ** min(count - 1, 16), self.backoff_max_s)
            if req.kind == "search":
                self._timeouts[req.key] = (count, time.monotonic() + wait)
            self.stats["timeouts"] += 1
            exc = SearchTimeout(f"the search did not finish within {req.timeout_s:.0f} s", retry_in=wait)
        if exc is not None:
            if self._workers[i] is not None and not worker.proc.is_alive():
                worker.kill()
                self._workers[i] = None
            self._finish(req, exc=exc)
            return
        assert answer is not None
        kind, data, blob = answer
        if kind == "ok":
            if req.kind == "search":
                self._timeouts.pop(req.key, None)
                if blob is not None:
                    slot = req.key + ("#quick" if req.quick else "")
                    self._blobs[slot] = blob
                    self._blobs.move_to_end(slot)
                    while len(self._blobs) > self.cache_size:
                        self._blobs.popitem(last=False)
                data["stage2_top"] = args[2]
            data["quick"] = req.quick
            self.stats["seconds"] += int(time.monotonic() - t0)
            self._finish(req, value=(data, blob))
        else:
            self._finish(req, exc=SearchFailed(data, invalid=(kind == "invalid")))

    def _finish(self, req: _Request, *, value: Any = None, exc: BaseException | None = None) -> None:
        if self._leaders.get(req.key) is req:
            del self._leaders[req.key]
        if req.future.done():
            return
        if exc is not None:
            req.future.set_exception(exc)
        else:
            req.future.set_result(value)

    # -- places in the queue -------------------------------------------------------------------

    async def _report(self, req: _Request, place: int) -> None:
        async with req.lock:
            if req.closed or place == req.reported:
                return
            req.reported = place
            if req.report is None:
                return
            try:
                await req.report(place, max(self.waiting(), place), self.size)
            except Exception as exc:  # noqa: BLE001 - a place not shown is no reason to fail the search
                log.warning("cannot report a search's place in the queue: %s", exc)

    async def _close(self, req: _Request) -> None:
        async with req.lock:
            req.closed = True

    async def _report_loop(self) -> None:
        """Waiting searches learn their new place as the queue moves: when it moved by a quarter (at
        least one), and every place among the next `size` (about to start)."""
        while True:
            await asyncio.sleep(self.report_every_s)
            jobs = []
            for place, req in enumerate(self._order(), 1):
                old = req.reported
                if old > 0 and place != old and (old - place >= max(1, old // 4) or place <= self.size):
                    jobs.extend(self._report(r, place) for r in (req, *req.followers))
            if jobs:
                await asyncio.gather(*jobs)


_pools: dict[int, SearchPool] = {}


def shared_pool(target: Target, size: int = 0, burst_stage2_top: int = 0) -> SearchPool:
    """The pool of the running event loop (kopf runs one; tests start a loop per asyncio.run: the
    pool of a loop that is gone is closed, its workers killed)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(id(loop))
    if pool is None:
        for other in list(_pools):
            _pools.pop(other).close()
        pool = _pools[id(loop)] = SearchPool(target, size, burst_stage2_top=burst_stage2_top)
    return pool
