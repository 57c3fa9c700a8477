"""The emulated engine: a real-time continuous-batching loop driven by the step-time model.

It runs the engine schedulers every simulator runs (`inferasim.sim.engines`: vLLM V1 mixed
chunked prefill, SGLang separate prefill batches, ATOM prefill first), one per attention-dp rank,
without prefix cache, stepping in lockstep as `inferasim.sim.des.Simulator` does. What differs is
the clock: instead of jumping to the next event, the loop waits until the emulated time of each
step's end has come in real time (`VirtualClock`: emulated = real x speedup), then delivers that
step's tokens.

Why the emulated schedule never drifts: every step starts at the emulated end of the previous
one, not at the real time the loop happened to wake. When the loop wakes late (a busy CPU, many
streams) it catches up: it commits every step that has already ended, in one vectorised jump for
runs of pure decode steps, and delivers their tokens together. Lateness then only delays
delivery, never the emulated timeline, which is what the histograms record.

Why it does not spin: it sleeps until the end of the current step (or the next arrival, or
forever when idle and woken by a submission), and at least `min_tick` real seconds between
wakes, which grows with the number of open streams (token delivery costs one socket write per
stream per wake).

Request life: `submit` stamps the request with its emulated arrival plus `StepParams.t_ttft`
(API server, tokenisation: the per-request latency outside the steps that the analytic model and
the simulator add to TTFT) and queues it; it reaches its rank's scheduler at that stamp. The
serial front end (`StepParams.t_front`: SGLang's TokenizerManager and scheduler admission, vLLM's
API server process) then passes requests one at a time, t_front + t_front_token x prompt each, in
order of arrival, as `inferasim.sim.des` models it: a burst of C equal requests reaches the
schedulers one service time apart. Token
counts are read back from the scheduler's admitted requests after every step (`Core.running`).

SGLang's late first tokens: its overlap scheduler hands a prefill batch's first tokens out only
after launching the next batch, and when that batch is another prefill they leave part-way into
it (`sim.engines.hand_out_late`, which SGLang's scheduler applies at the next commit). So the loop
holds a prefill batch's first tokens back until the next step is committed, then delivers each at
the time the scheduler gives it, waking for it if that time lies inside the step in progress.
"""

from __future__ import annotations

import asyncio
import heapq

import numpy as np

from inferasim.emulator.delivery import TokenDelivery
from inferasim.emulator.metrics import EngineMetrics
from inferasim.emulator.request import EmuRequest, Sink
from inferasim.emulator.timing import VirtualClock
from inferasim.errors import InferasimError, UserError
from inferasim.model.layoutcost import LayoutCost
from inferasim.model.steady import EngineSched
from inferasim.model.steptime import StepParams, step_time
from inferasim.sim.core import Core
from inferasim.sim.engines import SglangCore, make_core
from inferasim.sim.request import Batch, SimRequest

# Real seconds between wakes: a floor, plus a share per open stream (one write each per wake),
# capped so that delivery is never more than a few ms late in real time.
MIN_TICK_BASE = 0.0002
MIN_TICK_PER_STREAM = 4e-6
MIN_TICK_CAP = 0.002
# A loop more than this many real seconds behind its schedule gives up catching up: the emulated
# clock is moved forward (counted in `stats()["clock_slips"]`) instead of replaying the backlog.
MAX_LAG_REAL = 0.5
MAX_JUMP = 512  # pure decode steps evaluated at once when catching up


class RequestRejected(UserError):
    """A request no engine would accept (too long for the model or the KV pool)."""


class EngineUnavailable(InferasimError, RuntimeError):
    """The engine loop has stopped (shutdown or crash)."""


class EngineLoop(TokenDelivery):
    """One replica of `layout.dp` lockstepped ranks; see the module docstring. Token accounting and
    delivery are :class:`~inferasim.emulator.delivery.TokenDelivery`'s."""

    def __init__(self, params: StepParams, cost: LayoutCost, sched: EngineSched, metrics: EngineMetrics,
                 clock: VirtualClock, stall: tuple[int, float] | None = None) -> None:
        self.params = params
        self.cost = cost
        self.sched = sched
        self.metrics = metrics
        self.clock = clock
        self.dp = cost.layout.dp
        # KV pool as the simulator sizes it: the memory model's tokens x the fitted kv_scale.
        self.kv_capacity = int(sched.kv_tokens * params.kv_scale)
        self.ranks: list[Core] = [make_core(sched, self.kv_capacity) for _ in range(self.dp)]
        self.v = 0.0  # emulated time the engine is free (end of the last committed step)
        # Fault injection (EmulatorConfig.stall_at_batch): (batch, emulated s), spent at first use.
        self._stall = stall
        self.stalls = 0
        self._pending: list[tuple[float, int, EmuRequest]] = []  # (enq_v, serial, req) heap
        self._slots: list[EmuRequest | None] = []
        self._free: list[int] = []
        super().__init__(cap=256)  # the delivery's per-slot counts, marks and held first tokens
        self._aborts: list[EmuRequest] = []
        self._serial = 0
        self._front_free = 0.0  # emulated time the serial front end has passed its last request
        self._rr = 0
        self._waiter: asyncio.Future[None] | None = None
        self._stopping = False
        self.crashed: str | None = None
        self.open = 0  # live requests (pending + queued + running + undelivered)
        # statistics
        self.steps = 0
        self.max_lag_real = 0.0
        self.clock_slips = 0
        self.wakes = 0
        self._gen_total = 0
        self._tput_mark = (0.0, 0)
        self._gen_tput = 0.0

    # ---- public API (event-loop thread) ----------------------------------------------------------
    def max_request_tokens(self) -> int:
        return min(r.max_request_tokens() for r in self.ranks)

    def submit(self, prompt: int, output: int, max_tokens: int, finish_reason: str, sink: Sink) -> EmuRequest:
        """Queue a request; `sink(req)` is called whenever tokens or the finish are delivered."""
        if self.crashed or self._stopping:
            raise EngineUnavailable(self.crashed or "the emulated engine is shutting down")
        limit = self.max_request_tokens()
        if prompt + output > limit:
            raise RequestRejected(
                f"the request needs {prompt + output} tokens of KV cache ({prompt} prompt + {output} output) "
                f"but one engine rank holds at most {limit}; reduce the prompt or max_tokens")
        now = self.clock.now()
        rid = self._free.pop() if self._free else self._new_slot()
        rank = self._pick_rank()
        self._serial += 1
        enq = now + self.params.t_ttft
        t_front = float(self.params.front_time(prompt))
        if t_front > 0.0:  # submissions come in emulated-time order: FIFO at once
            enq = max(enq, self._front_free) + t_front
            self._front_free = enq
        req = EmuRequest(rid=rid, serial=self._serial, rank=rank, prompt=prompt, output=output,
                         max_tokens=max_tokens, finish_reason=finish_reason, recv_v=now,
                         enq_v=enq, sink=sink)
        req.sim = SimRequest(rid, req.enq_v, prompt, output, rank=rank)
        self._slots[rid] = req
        self._emitted[rid] = 0
        self._last[rid] = 0.0
        heapq.heappush(self._pending, (req.enq_v, req.serial, req))
        self.open += 1
        self._wake()
        return req

    def abort(self, req: EmuRequest) -> None:
        """The client went away: stop the request at the next step boundary."""
        if req.finished or req.aborted:
            return
        req.aborted = True
        self._aborts.append(req)
        self._wake()

    def set_params(self, params: StepParams) -> None:
        """New step-time parameters from the next step on (drift tests). `kv_scale` only sizes
        the KV pool at start-up: live KV allocations cannot shrink under running requests."""
        self.params = params

    def stop(self) -> None:
        self._stopping = True
        self._wake()

    def stats(self) -> dict[str, float | int]:
        return {
            "emulated_now_s": self.clock.now(), "engine_free_at_s": self.v, "steps": self.steps,
            "open_requests": self.open, "running": sum(r.n_alive for r in self.ranks),
            "waiting": sum(len(r.waiting) for r in self.ranks) + len(self._pending),
            "max_lag_real_s": self.max_lag_real, "clock_slips": self.clock_slips, "wakes": self.wakes,
            "speedup": self.clock.speedup, "kv_capacity_tokens_per_rank": self.kv_capacity,
            "preemptions": sum(r.preemptions for r in self.ranks), "stalls": self.stalls,
        }

    # ---- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        except Exception as exc:
            # An emulator bug must not leave clients hanging: fail every open request, report,
            # and let /health say so (vLLM's /health also fails once its engine core is dead).
            import traceback

            traceback.print_exc()
            self.crashed = f"{type(exc).__name__}: {exc}"
            self._stopping = True
            self._fail_all(f"emulated engine crashed: {self.crashed}")

    def _fail_all(self, message: str) -> None:
        for req in self._slots:
            if req is not None and not req.finished:
                req.error = message
                req.aborted = True
                req.finished = True
                req.finish_v = self.v
                self._dirty.add(req.rid)
        try:
            self._flush()
        except Exception:  # the sinks write to sockets that may be gone; nothing more to do
            pass

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self.wakes += 1
            now_v = self.clock.now()
            lag = (now_v - self.v) / self.clock.speedup if self._busy() else 0.0
            self.max_lag_real = max(self.max_lag_real, lag)
            if lag > MAX_LAG_REAL:
                # Hopelessly behind (the host is overloaded): move the emulated clock instead of
                # replaying seconds of backlog at once. Visible in stats(), never silent.
                self.clock_slips += 1
                self.clock.t0 += lag - MIN_TICK_CAP
                now_v = self.clock.now()
            self._apply_aborts()
            wake_v = self._advance(now_v)
            self._update_gauges(now_v)
            if self._stopping:
                break
            if wake_v is None:
                await self._sleep(loop, None, wake_on_submit=True)
                continue
            delay = max(self.clock.real_delay(wake_v), self._min_tick())
            # Sleeping until a step's end: arrivals need not wake us (they join the next step
            # anyway). Sleeping until an arrival's stamp: an earlier one may come.
            await self._sleep(loop, delay, wake_on_submit=not self._busy())

    def _busy(self) -> bool:
        return any(r.n_alive or r.waiting for r in self.ranks)

    def _min_tick(self) -> float:
        return min(MIN_TICK_BASE + MIN_TICK_PER_STREAM * self.open, MIN_TICK_CAP)

    async def _sleep(self, loop: asyncio.AbstractEventLoop, delay: float | None, wake_on_submit: bool) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        self._waiter = fut if wake_on_submit else None
        handle = loop.call_later(delay, _resolve, fut) if delay is not None else None
        try:
            await fut
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self._waiter = None

    # ---- stepping --------------------------------------------------------------------------------
    def _advance(self, now_v: float) -> float | None:
        """Commit every step that has ended by `now_v`, deliver their tokens, then commit the
        step in progress. Returns the emulated time to wake at, or None when idle."""
        ranks = self.ranks
        if self._release_due(now_v) and now_v < self.v:
            # Woken for a late first token inside the step in progress: deliver it, nothing more
            # (the step in progress keeps its tokens until its end, and the next step is
            # committed then, as always).
            self._flush_due()
            return min(self.v, self._releases[0][0]) if self._releases else self.v
        guard = 0
        while True:
            guard += 1
            if guard > 100000:  # a bound on work per wake; the next wake continues
                self._flush()
                return self.v
            self._enqueue_due(self.v)
            limits = [rank.decode_run_limit() for rank in ranks]
            busy = [i for i, lim in enumerate(limits) if lim is not None]
            if not busy:
                nxt = self._next_pending()
                if nxt is None:
                    self.v = max(self.v, now_v)
                    self._flush()
                    return None
                if nxt <= now_v:
                    self.v = max(self.v, nxt)
                    continue
                self._flush()
                return nxt
            if all(limits[i] for i in busy):
                # Pure decode steps: commit the ones that have ended in one vectorised jump, or
                # the single step in progress (cheaper than schedule + commit).
                k = min(min(int(limits[i]) for i in busy), MAX_JUMP)  # type: ignore[arg-type]
                end = self._jump(busy, k, now_v)
                if end > now_v:
                    return min(end, self._releases[0][0]) if self._releases else end
                continue
            batches = [rank.schedule(self.v) for rank in ranks]
            dt = 0.0
            for b in batches:
                if not b.empty:
                    dt = max(dt, float(step_time(self.params, self.cost, b.n_dec, b.ctx_dec, b.n_pref, b.ctx_pref)))
            if self._stall is not None and dt > 0.0 and \
                    any(b.n_dec + len(b.pre) >= self._stall[0] for b in batches if not b.empty):
                # A batch only grows through a step that admits (prefills) requests, never in a
                # pure decode run, so the first step at the stall's size is always one scheduled here.
                dt += self._stall[1]
                self._stall = None
                self.stalls += 1
            if dt == 0.0:
                if not self._reject_stuck():
                    nxt = self._next_pending()
                    if nxt is None:
                        self._flush()
                        return None
                    self.v = max(self.v, nxt)
                continue
            end = self.v + dt
            future = end > now_v
            if future:
                self._flush()  # everything committed so far has ended: deliver it first
            start = self.v
            for i, (rank, b) in enumerate(zip(ranks, batches, strict=True)):
                if not b.empty:
                    self._commit_step(i, rank, b, start, end, now_v)
            self.v = end
            self.steps += 1
            if future:
                # First tokens this commit released at a time already passed leave now, not with
                # the step just committed.
                self._flush_due()
                return min(end, self._releases[0][0]) if self._releases else end

    def _jump(self, busy: list[int], k: int, now_v: float) -> float:
        """Commit the pure decode steps (of all busy ranks) that ended by `now_v`, up to k and
        not past the next arrival; when none has ended, flush and commit the one in progress.
        Returns the emulated end of the last committed step."""
        times: np.ndarray | None = None
        states = []
        for i in busy:
            n, ctx1 = self.ranks[i].decode_state()
            states.append((i, n))
            t = np.asarray(step_time(self.params, self.cost, n, ctx1 + np.arange(k, dtype=float)), dtype=float)
            times = t if times is None else np.maximum(times, t)
        assert times is not None
        ends = self.v + np.cumsum(times)
        nxt = self._next_pending()
        if nxt is not None:
            # An arrival joins the first step that starts at or after it.
            k = max(1, min(k, int(np.searchsorted(ends - times, nxt, side="left"))))
        # A decode step after a prefill batch: the held first tokens leave on time, before it.
        for i, _ in states:
            self._deliver_held_first(i, self.ranks[i], now_v)
        k_due = int(np.searchsorted(ends[:k], now_v, side="right"))
        if k_due < 1:
            self._flush()  # deliver what has ended before committing a step that has not
            k_due = 1
        end = float(ends[k_due - 1])
        gaps_tail = times[1:k_due]
        for i, n in states:
            rank = self.ranks[i]
            # Every admitted request decodes in a decode run (decode_run_limit made sure).
            rids = np.array([req.rid for req in rank.running()[0]], dtype=np.int64)
            finished = rank.advance_decode(k_due, ends[:k_due].tolist())
            rank.drop_records()
            first_gaps = ends[0] - self._last[rids]
            self._emitted[rids] += k_due
            self._last[rids] = end
            self._dirty.update(rids.tolist())
            gaps = np.concatenate([first_gaps, gaps_tail])
            weights = np.concatenate([np.ones(n), np.full(gaps_tail.size, float(n))])
            self.metrics.on_tokens(i, n * k_due, gaps, weights, np.full(k_due, float(n)))
            self._gen_total += n * k_due
            for sim in finished:
                self._finish(sim.rid, end)
        self.v = end
        self.steps += k_due
        return end

    def _commit_step(self, i: int, rank: Core, batch: Batch, start: float, end: float,
                     now_v: float | None = None) -> None:
        pre_before = rank.preemptions
        if batch.pre:
            for row, _, s in batch.pre:
                if s == 0:
                    req = self._slots[row.req.rid]
                    if req is not None and req.first_sched_v is None:
                        req.first_sched_v = start
                        self.metrics.on_admitted(i, req.prompt)
        previous = rank.held_first_tokens if isinstance(rank, SglangCore) else []
        finished = rank.commit(end)
        rank.drop_records()
        self.metrics.on_preempted(i, rank.preemptions - pre_before)
        # The previous prefill batch's first tokens: this commit has set when they leave.
        release: dict[int, float] = {}
        for sim in previous:
            if self._held.get(sim.rid) is sim:
                del self._held[sim.rid]
                release[sim.rid] = (sim.first_token if sim.first_token is not None else end) - rank.delay
        if isinstance(rank, SglangCore):
            for sim in rank.held_first_tokens:
                self._held[sim.rid] = sim
        self._account(i, rank, finished, end, release, now_v)
        # A released request that this step retracted is neither running nor finished, so the
        # accounting above did not see it; its first token was sampled all the same.
        missed = {rid: t for rid, t in release.items() if self._emitted[rid] == 0 and self._slots[rid] is not None}
        if missed:
            self._emit_first_tokens(i, missed, now_v)

    # ---- queues ------------------------------------------------------------------------------------
    def _new_slot(self) -> int:
        rid = len(self._slots)
        self._slots.append(None)
        if rid >= self._emitted.size:
            grow = self._emitted.size * 2
            self._emitted = np.concatenate([self._emitted, np.zeros(grow - self._emitted.size, dtype=np.int64)])
            self._last = np.concatenate([self._last, np.zeros(grow - self._last.size)])
        return rid

    def _pick_rank(self) -> int:
        """vLLM's DP front end sends a request to the least loaded engine core; ties go round robin."""
        if self.dp == 1:
            return 0
        loads = [0] * self.dp
        for _, _, req in self._pending:
            loads[req.rank] += 1
        for i, r in enumerate(self.ranks):
            loads[i] += r.n_alive + len(r.waiting)
        best = min(loads)
        for j in range(self.dp):
            cand = (self._rr + j) % self.dp
            if loads[cand] == best:
                self._rr = cand + 1
                return cand
        return 0

    def _next_pending(self) -> float | None:
        heap = self._pending
        while heap and heap[0][2].aborted:
            _, _, req = heapq.heappop(heap)
            self._drop_unstarted(req)
        return heap[0][0] if heap else None

    def _enqueue_due(self, v: float) -> None:
        heap = self._pending
        while heap and heap[0][0] <= v:
            _, _, req = heapq.heappop(heap)
            if req.aborted:
                self._drop_unstarted(req)
                continue
            self.ranks[req.rank].enqueue(req.sim)

    def _drop_unstarted(self, req: EmuRequest) -> None:
        req.finish_v = max(self.v, req.enq_v)
        req.finished = True
        self._dirty.add(req.rid)
        self._record_finish(req)

    def _apply_aborts(self) -> None:
        if not self._aborts:
            return
        aborts, self._aborts = self._aborts, []
        for req in aborts:
            if req.finished:
                continue
            rank = self.ranks[req.rank]
            if req.sim in rank.waiting:
                rank.waiting.remove(req.sim)
                self._drop_unstarted(req)
                continue
            # Finish at its next sampled token: the scheduler owns the KV bookkeeping, and a
            # request that stops producing tokens is released the ordinary way. Not admitted:
            # still pending (tokenising); dropped when it reaches the head of the heap.
            rank.cut_short(req.sim)

    def _reject_stuck(self) -> bool:
        """Nothing can be scheduled although requests wait and nothing runs: fail the head of
        each such queue (submit() checks sizes, so this only guards against a parameter change)."""
        any_rejected = False
        for rank in self.ranks:
            if rank.waiting and rank.n_alive == 0:
                sim = rank.waiting.popleft()
                req = self._slots[sim.rid]
                if req is not None:
                    req.error = "the request does not fit the emulated KV cache"
                    req.aborted = True
                    self._drop_unstarted(req)
                any_rejected = True
        return any_rejected

    def _update_gauges(self, now_v: float) -> None:
        mark_v, mark_n = self._tput_mark
        if now_v - mark_v >= 1.0:
            self._gen_tput = (self._gen_total - mark_n) / (now_v - mark_v)
            self._tput_mark = (now_v, self._gen_total)
        for i, rank in enumerate(self.ranks):
            # Waiting = the engine core's queue (requests still in the API server are not counted,
            # as in vLLM's scheduler stats).
            self.metrics.set_state(i, rank.n_alive, len(rank.waiting), rank.kv.in_use * rank.kv.block_size,
                                   self._gen_tput)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def emulated_capacity_note(sched: EngineSched, params: StepParams) -> str:
    return (f"max_num_seqs {sched.max_num_seqs}, max_batched_tokens {sched.max_batched_tokens}, KV "
            f"{int(sched.kv_tokens * params.kv_scale)} tokens per rank, block {sched.block_size}, "
            f"{'mixed' if sched.mixed else 'separate'} prefill")


__all__ = ["EngineLoop", "EngineUnavailable", "RequestRejected", "emulated_capacity_note"]
