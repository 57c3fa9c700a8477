"""Discrete-event simulator of one engine replica (DESIGN.md section 4).

(Real traffic — traces, Poisson, sessions, prefix caching, routers, prefill/decode pools — is the
trace simulator's: `inferasim.sim.api.simulate_workload`.)

The request-by-request counterpart of the steady-state estimator in `inferasim.model.steady`:
the same benchmarks (closed loop at fixed concurrency, offline batch), the same step-time model
(`inferasim.model.steptime.step_time`), but every request is admitted, chunked, preempted and finished
by the engine's scheduler (`inferasim.sim.engines`, the one the trace simulator and the emulator
run too), so start-up waves, KV pressure, preemption
and the tail are what the policy makes of them rather than a closed-form average.

One clock per replica. The replica has `layout.dp` attention-dp ranks, each with its own
scheduler and KV pool; they step in lockstep (the MoE layers synchronise them every step), so a
step lasts as long as the slowest rank's batch. Clients are split round-robin over the ranks.

Speed: nothing loops per token. When every rank's next steps are decode-only with unchanged
membership, the loop asks each scheduler how many such steps can run before an event (a finish,
a KV block shortage, an admission becoming possible) and jumps over all of them, evaluating the k
step times in one vectorised `step_time` call (context grows by one token per step); an arrival
inside the run cuts it at the step that starts after it.

Client-side latency: `StepParams.t_ttft` (API server, tokenisation, streaming) is added to every
token's delivery time, so TTFT includes it as in the analytic model, and a closed-loop client's
next request leaves when the last token of its previous one is delivered. Offline runs (the LLM
class, no server) leave it out, as `benchmark.offline_batch` does.

Serial front end (`inferasim.sim.front.FrontEnd`): one FIFO server per replica in front of the
ranks' queues, t_front + t_front_token x prompt per request; so a burst of C equal arrivals reaches
the engine one service time apart (mean (C + 1)/2 services, as `benchmark.closed_loop` and
`benchmark.offline_batch` price it; the offline batch passes it too, without the per-token part:
token ids are not tokenised). The loop lets the server take requests up once the clock reaches
their start: every request submitted later is sent at or after the clock, so none could still
overtake them.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from inferasim.model.layoutcost import LayoutCost
from inferasim.model.steady import EngineSched
from inferasim.model.steptime import StepParams, step_time
from inferasim.sim.core import Core
from inferasim.sim.engines import make_core
from inferasim.sim.front import FrontEnd
from inferasim.sim.request import SimRequest

# The closed loop's requests are the schedulers' own (no prefix identity, no prefill pool).
Request = SimRequest

__all__ = ["Request", "SimResult", "Simulator", "simulate_closed_loop", "simulate_offline"]


@dataclass
class SimResult:
    """Per-request records and the benchmark's summary (means as `vllm bench serve` reports)."""

    requests: list[Request]
    duration: float  # s, first request sent to last token delivered
    ttft_mean: float  # s
    tpot_mean: float  # s, mean over requests of (finish - first_token) / (output - 1)
    throughput: float  # output tokens/s of the replica
    kv_peak_tokens: int  # per dp rank, the busiest one
    kv_capacity_tokens: int  # per dp rank
    steps: int  # engine iterations
    preemptions: int = 0

    def _arrays(self, first_rid: int = 0, stop_rid: int | None = None) -> dict[str, np.ndarray]:
        reqs = self.requests[first_rid:stop_rid]
        arrival = np.array([r.arrival for r in reqs])
        first = np.array([r.first_token for r in reqs], dtype=float)
        finish = np.array([r.finish for r in reqs], dtype=float)
        out = np.array([r.output for r in reqs], dtype=float)
        multi = out > 1
        return {"ttft": first - arrival, "e2e": finish - arrival,
                "tpot": (finish - first)[multi] / (out[multi] - 1.0)}

    def means(self, first_rid: int = 0, stop_rid: int | None = None) -> dict[str, float]:
        """Mean TTFT, TPOT and end-to-end latency over requests[first_rid:stop_rid] (issue
        order). Skipping the first `concurrency` requests drops the start-up wave, which is what
        a steady-state estimator describes."""
        return {k: float(v.mean()) if v.size else 0.0 for k, v in self._arrays(first_rid, stop_rid).items()}

    def as_dict(self) -> dict:
        d: dict = {
            "requests": len(self.requests), "duration_s": self.duration, "ttft_mean_s": self.ttft_mean,
            "tpot_mean_s": self.tpot_mean, "throughput_tok_s": self.throughput,
            "kv_peak_tokens": self.kv_peak_tokens, "kv_capacity_tokens": self.kv_capacity_tokens,
            "steps": self.steps, "preemptions": self.preemptions,
        }
        for name, arr in self._arrays().items():
            if arr.size:
                d[f"{name}_mean_s"] = float(arr.mean())
                for q in (50, 90, 99):
                    d[f"{name}_p{q}_s"] = float(np.percentile(arr, q))
        return d


class Simulator:
    """The event loop of one replica: dp lockstepped ranks fed from per-rank arrival heaps."""

    def __init__(self, p: StepParams, c: LayoutCost, sched: EngineSched, delivery_delay: float = 0.0,
                 jump: bool = True) -> None:
        self.p, self.c, self.sched = p, c, sched
        self.jump = jump  # False steps one iteration at a time (the reference the tests compare to)
        capacity = int(sched.kv_tokens * p.kv_scale)
        self.ranks: list[Core] = [make_core(sched, capacity, delivery_delay) for _ in range(c.layout.dp)]
        self._pending: list[list[tuple[float, int, Request]]] = [[] for _ in self.ranks]
        self.front: FrontEnd[Request] = FrontEnd(p)
        self.now = 0.0
        self.steps = 0
        self.outstanding = 0

    def submit(self, req: Request, t: float) -> None:
        """Request `req` reaches its rank's queue at time `t`."""
        limit = self.ranks[req.rank].max_request_tokens()
        if req.prompt + req.output > limit:
            raise ValueError(f"request of {req.prompt} + {req.output} tokens cannot fit the KV pool of "
                             f"{limit} tokens per rank; no engine would ever finish it")
        if self.front.on:
            self.front.push(t, req.rid, req)
        else:
            heapq.heappush(self._pending[req.rank], (t, req.rid, req))
        self.outstanding += 1

    def _step_time(self, n_dec: float, ctx_dec: float | np.ndarray, n_pref: float = 0.0,
                   ctx_pref: float = 0.0, seq_pref: float | None = None) -> float | np.ndarray:
        return step_time(self.p, self.c, n_dec, ctx_dec, n_pref, ctx_pref, seq_pref)

    def _next_arrival(self, only_accepting: bool) -> float:
        t = math.inf
        for rank, heap in zip(self.ranks, self._pending, strict=True):
            if heap and heap[0][0] < t and (not only_accepting or rank.accepts_arrivals()):
                t = heap[0][0]
        if self.front.queue:
            # A request submitted later could only come sooner; the loop looks again after every
            # step. A lower bound for any rank: cut a decode run there if some rank could take it.
            d = self.front.next_departure()
            if d < t and (not only_accepting or any(r.accepts_arrivals() for r in self.ranks)):
                t = d
        return t

    def run(self, on_finish: Callable[[Request], None]) -> None:
        """Step until every submitted request (including those `on_finish` submits) is done."""
        ranks, pending = self.ranks, self._pending
        front = self.front
        queued = front.queue
        while self.outstanding > 0:
            now = self.now
            if queued:
                front.pass_until(now, pending)
            for rank, heap in zip(ranks, pending, strict=True):
                while heap and heap[0][0] <= now:
                    rank.enqueue(heapq.heappop(heap)[2])
            limits = [rank.decode_run_limit() for rank in ranks]
            busy = [i for i, lim in enumerate(limits) if lim is not None]
            if not busy:
                nxt = self._next_arrival(False)
                if math.isinf(nxt):
                    raise RuntimeError("simulator idle with requests outstanding")
                self.now = nxt
                continue
            finished: list[Request] = []
            if all(limits[i] for i in busy):
                # Every busy rank runs pure decode steps: jump over k of them at once.
                k = min(int(limits[i]) for i in busy) if self.jump else 1  # type: ignore[arg-type]
                times: np.ndarray | None = None
                for i in busy:
                    n, ctx1 = ranks[i].decode_state()
                    t = np.asarray(self._step_time(n, ctx1 + np.arange(k, dtype=float)), dtype=float)
                    times = t if times is None else np.maximum(times, t)
                assert times is not None
                cum = np.cumsum(times)
                t_arr = self._next_arrival(True)
                if not math.isinf(t_arr):
                    # An arrival joins the first step that starts at or after it.
                    k = max(1, min(k, int(np.searchsorted(now + cum - times, t_arr, side="left"))))
                ends = (now + cum[:k]).tolist()  # the steps' end times (the cores time tokens by them)
                self.now = ends[-1]
                for i in busy:
                    finished += ranks[i].advance_decode(k, ends)
                self.steps += k
            else:
                batches = [rank.schedule(now) for rank in ranks]
                dt = 0.0
                for b in batches:
                    if not b.empty:
                        dt = max(dt, float(self._step_time(b.n_dec, b.ctx_dec, b.n_pref, b.ctx_pref, b.seq_pref)))
                if dt == 0.0:
                    nxt = self._next_arrival(False)
                    if math.isinf(nxt):
                        raise RuntimeError("no rank can schedule its waiting requests")
                    self.now = max(now, nxt)
                    continue
                self.now = now + dt
                for rank, b in zip(ranks, batches, strict=True):
                    if not b.empty:
                        finished += rank.commit(self.now)
                self.steps += 1
            for req in finished:
                self.outstanding -= 1
                on_finish(req)

    def result(self, requests: list[Request]) -> SimResult:
        arrival = np.array([r.arrival for r in requests])
        first = np.array([r.first_token for r in requests], dtype=float)
        finish = np.array([r.finish for r in requests], dtype=float)
        out = np.array([r.output for r in requests], dtype=float)
        multi = out > 1
        duration = float(finish.max() - arrival.min())
        tpot = (finish - first)[multi] / (out[multi] - 1.0)
        return SimResult(
            requests=requests, duration=duration, ttft_mean=float((first - arrival).mean()),
            tpot_mean=float(tpot.mean()) if tpot.size else 0.0,
            throughput=float(out.sum() / duration) if duration > 0 else 0.0,
            kv_peak_tokens=max(r.kv.peak for r in self.ranks) * self.ranks[0].kv.block_size,
            kv_capacity_tokens=self.ranks[0].kv.capacity_tokens, steps=self.steps,
            preemptions=sum(r.preemptions for r in self.ranks),
        )


def _lengths(rng: np.random.Generator, mean: int, n: int, range_ratio: float) -> np.ndarray:
    """Lengths as `vllm bench serve --dataset-name random --random-range-ratio r` draws them:
    uniform integers in [mean (1 - r), mean (1 + r)]; r = 0 gives the fixed length."""
    if range_ratio <= 0.0:
        return np.full(n, int(mean), dtype=np.int64)
    lo = max(int(mean * (1.0 - range_ratio)), 1)
    hi = max(int(mean * (1.0 + range_ratio)), lo)
    return rng.integers(lo, hi + 1, size=n)


def simulate_closed_loop(p: StepParams, c: LayoutCost, sched: EngineSched, isl: int, osl: int,
                         concurrency: int, num_requests: int | None = None, seed: int = 0,
                         range_ratio: float = 0.0, think_time: float = 0.0, jump: bool = True) -> SimResult:
    """`vllm bench serve --max-concurrency C --num-prompts N` with random ISL/OSL prompts: C
    clients each send a request and the next one when the previous is fully delivered, until N
    have been sent (default 10 x C, at least 50). Client i talks to dp rank i mod dp.

    `range_ratio` draws lengths as `--random-range-ratio` does. `think_time` (s, mean of an
    exponential pause before a client's next request) models client-side jitter. Both break the
    lockstep waves that fixed lengths keep forever in a deterministic replay (see the tests)."""
    num = int(num_requests) if num_requests is not None else max(10 * int(concurrency), 50)
    rng = np.random.default_rng(seed)
    prompts = _lengths(rng, isl, num, range_ratio)
    outputs = _lengths(rng, osl, num, range_ratio)
    sim = Simulator(p, c, sched, delivery_delay=p.t_ttft, jump=jump)
    dp = len(sim.ranks)
    requests: list[Request] = []
    client_of: list[int] = []
    # A client with a connection limit (StepParams.client_cap) sends at most that many at once; the
    # rest wait for a free connection in order, and their TTFT counts from when they were issued.
    connections = int(p.client_cap) if p.client_cap >= 1 else None
    held: deque[Request] = deque()
    in_flight = 0

    def send(req: Request, t: float) -> None:
        nonlocal in_flight
        in_flight += 1
        sim.submit(req, t)

    def issue(client: int, t: float) -> None:
        rid = len(requests)
        req = Request(rid, t, int(prompts[rid]), int(outputs[rid]), rank=client % dp)
        requests.append(req)
        client_of.append(client)
        if connections is not None and in_flight >= connections:
            held.append(req)
        else:
            send(req, t)

    for client in range(min(int(concurrency), num)):
        issue(client, 0.0)

    def on_finish(req: Request) -> None:
        nonlocal in_flight
        assert req.finish is not None
        in_flight -= 1
        if held:
            send(held.popleft(), req.finish)
        if len(requests) < num:
            pause = float(rng.exponential(think_time)) if think_time > 0.0 else 0.0
            issue(client_of[req.rid], req.finish + pause)

    sim.run(on_finish)
    return sim.result(requests)


def simulate_offline(p: StepParams, c: LayoutCost, sched: EngineSched, isl: int, osl: int,
                     batch: int, jump: bool = True) -> SimResult:
    """`batch` requests handed to the engine at once, no refill (vLLM benchmark_latency /
    benchmark_throughput). `duration` is the batch latency. No API-server latency: the offline
    benchmarks call the engine in-process; the requests still pass the serial front end
    (`t_front`, as `benchmark.offline_batch` prices it)."""
    # Token ids in, nothing tokenised: the front end's per-token part does not apply offline.
    sim = Simulator(replace(p, t_front_token=0.0), c, sched, delivery_delay=0.0, jump=jump)
    dp = len(sim.ranks)
    requests = [Request(i, 0.0, int(isl), int(osl), rank=i % dp)
                for i in range(int(batch))]
    for req in requests:
        sim.submit(req, 0.0)
    sim.run(lambda req: None)
    return sim.result(requests)
