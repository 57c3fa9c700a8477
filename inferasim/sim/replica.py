"""The event loop of one replica in the trace simulator (DESIGN.md section 4).

Like `inferasim.sim.des.Simulator` (one clock, `dp` attention-dp ranks stepping in lockstep, a
step lasting as long as the slowest rank's batch, decode runs jumped over), on the fast
schedulers of `inferasim.sim.engines`, and able to stop at a horizon so that a router can look at
several replicas between arrivals (`inferasim.sim.cluster`).

Serial front end (`inferasim.sim.front.FrontEnd`, as in `inferasim.sim.des`): one FIFO server per
replica takes the client requests in order of arrival, t_front + t_front_token x prompt each,
before they reach their rank's queue. Requests whose KV comes from a prefill pool (the decode
phase of a disaggregated request) already passed a front end there. A request routed here later
that arrived earlier is served after those already taken up: at most a step late, as the
cluster's clocks allow.

Step times come from `inferasim.model.steptime.step_time` through `StepModel`, which splits it into a
table over the batch's token count (dense, MoE, collectives, pipeline hops: everything that
depends on tokens alone) plus the per-sequence host cost and the attention terms; the split is
checked against `step_time` itself when it is built and falls back to calling it when they
disagree (a change of the model in `steptime.py` can never be silently bypassed).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from inferasim.model.layoutcost import LayoutCost
from inferasim.model.steady import EngineSched
from inferasim.model.steptime import StepParams, micro_batches, step_time
from inferasim.sim.core import Core
from inferasim.sim.engines import core_class
from inferasim.sim.front import FrontEnd
from inferasim.sim.request import SimRequest
from inferasim.sim.tally import FLUSH_STEPS, Tally

INF = math.inf
# (n_dec, ctx_dec, n_pref, ctx_pref) where StepModel's fast forms are checked against step_time.
CHECK_POINTS = ((1, 100.0, 0, 0.0), (37, 2048.5, 500, 300.25), (0, 0.0, 8192, 4000.0), (256, 9000.0, 0, 0.0),
                (3, 70000.0, 1, 65000.5))


class StepModel:
    """`step_time(p, c, n_dec, ctx_dec, n_pref, ctx_pref)` for scalars, fast."""

    def __init__(self, p: StepParams, c: LayoutCost, max_tokens: int = 16384) -> None:
        self.p, self.c = p, c
        pp = c.layout.pp
        self.t_seq = p.t_seq
        self.kv_f = pp / (c.peak_bw * p.e_kv)
        self.at_f = pp / (c.peak_flops_attn * p.e_attn)
        # The latent a DSA layer reads for at most top-k keys is a window of the read, not of the cache.
        sparse = ((c.kv_sparse, c.dsa_topk),) if c.kv_sparse else ()
        self.kv_lin, self.kv_state, self.kv_win = c.kv_coeff_full, c.state_bytes, tuple(c.kv_windows) + sparse
        self.at_lin, self.at_win = c.attn_flops_coeff, tuple(c.attn_windows)
        self.dsa = c.dsa_topk > 0
        # step_time multiplies the whole attention term by pp, as at_f and kv_f carry it.
        self.sparse_t = pp * c.sparse_token_time
        self.pp = pp
        self.nmax = 0
        self.base: list[float] = []
        self._frac: dict[float, float] = {}  # pipeline micro-batch shares that are not whole tokens
        self._build(max(int(max_tokens), 1024))
        self.exact = self._check()
        # The scalar step time the loop calls: `_fast1` (one stage, no DSA) where it gives `_fast`'s
        # very floats at the check points, else `_fast`, else step_time itself.
        fast1 = pp == 1 and not self.dsa and all(self._fast1(*pt) == self._fast(*pt) for pt in CHECK_POINTS)
        self.fn: Callable[..., float] = (self._fast1 if self.exact and fast1 else
                                         self._fast if self.exact else self)

    def _build(self, n: int) -> None:
        tokens = np.arange(n + 1, dtype=float)
        self.base = np.asarray(step_time(self.p, self.c, 0.0, 0.0, tokens, 0.0), dtype=float).tolist()
        self.nmax = n

    def _check(self) -> bool:
        for n_d, ctx, n_p, ctx_p in CHECK_POINTS:
            ref = float(step_time(self.p, self.c, n_d, ctx, n_p, ctx_p))
            got = self._fast(n_d, ctx, n_p, ctx_p)
            if not abs(got - ref) <= 1e-9 * abs(ref):
                return False
        return True

    def kvb(self, ctx: float) -> float:
        out = self.kv_lin * ctx + self.kv_state
        for coeff, window in self.kv_win:
            out += coeff * (ctx if ctx < window else window)
        return out

    def _base(self, tokens: float) -> float:
        """step_time of `tokens` prefill tokens alone (the per-micro-batch part of a step)."""
        whole = int(tokens)
        if whole == tokens:
            if whole > self.nmax:
                self._build(max(whole, 2 * self.nmax))
            return self.base[whole]
        got = self._frac.get(tokens)
        if got is None:
            got = self._frac[tokens] = float(step_time(self.p, self.c, 0.0, 0.0, tokens, 0.0))
        return got

    def _fast(self, n_dec: int, ctx_dec: float, n_pref: int, ctx_pref: float,
              seq_pref: float | None = None) -> float:
        m = micro_batches(n_dec, self.pp)
        t = self._base((n_dec + n_pref) / m) + self.t_seq * n_dec
        if n_dec:
            t += n_dec * self.kvb(ctx_dec) * self.kv_f / m
        if n_pref:
            a = self.at_lin * ctx_pref
            for coeff, window in self.at_win:
                a += coeff * (ctx_pref if ctx_pref < window else window)
            t += n_pref * a * self.at_f / m
            # LayoutCost.sparse_prefill's rule, in scalar Python: this path is the simulator's hot loop.
            if self.dsa and (2.0 * ctx_pref if seq_pref is None else seq_pref) > self.c.dsa_dense_upto:
                t += n_pref * ((self.c.dsa_index_flops - self.c.dsa_dense_coeff) * ctx_pref * self.at_f +
                               self.sparse_t) / m
        return t

    def _fast1(self, n_dec: int, ctx_dec: float, n_pref: int, ctx_pref: float,
               seq_pref: float | None = None) -> float:
        """`_fast` for one pipeline stage and no DSA, the same floats: one micro-batch (its
        divisions by 1.0 left out), `_base` and `kvb` written out. Once per simulated step."""
        n = n_dec + n_pref
        t = (self.base[n] if n <= self.nmax else self._base(float(n))) + self.t_seq * n_dec
        if n_dec:
            kvb = self.kv_lin * ctx_dec + self.kv_state
            for coeff, window in self.kv_win:
                kvb += coeff * (ctx_dec if ctx_dec < window else window)
            t += n_dec * kvb * self.kv_f
        if n_pref:
            a = self.at_lin * ctx_pref
            for coeff, window in self.at_win:
                a += coeff * (ctx_pref if ctx_pref < window else window)
            t += n_pref * a * self.at_f
        return t

    def __call__(self, n_dec: int, ctx_dec: float, n_pref: int = 0, ctx_pref: float = 0.0,
                 seq_pref: float | None = None) -> float:
        if self.exact:
            return self._fast(n_dec, ctx_dec, n_pref, ctx_pref, seq_pref)
        return float(step_time(self.p, self.c, n_dec, ctx_dec, n_pref, ctx_pref, seq_pref))

    def decode_line(self, n: int) -> tuple[float, float]:
        """(a, b): a decode step of n sequences of mean context ctx takes a + b * kvb(ctx), the
        same operations, in the same order, as `decode_run` (exact mode only)."""
        m = micro_batches(n, self.pp)
        return self._base(n / m) + self.t_seq * n, n * self.kv_f / m

    def decode_run(self, n: int, ctx1: float, k: int) -> np.ndarray:
        """Times of k decode steps of n sequences whose mean context starts at ctx1."""
        ctx = ctx1 + np.arange(k, dtype=float)
        if not self.exact:
            return np.asarray(step_time(self.p, self.c, n, ctx), dtype=float)
        a, b = self.decode_line(n)
        kvb = self.kv_lin * ctx + self.kv_state
        for coeff, window in self.kv_win:
            kvb = kvb + coeff * np.minimum(ctx, window)
        return a + b * kvb


class Replica:
    """One engine replica: dp lockstepped ranks fed from per-rank arrival heaps."""

    def __init__(self, p: StepParams, c: LayoutCost, sched: EngineSched, *, engine: str | None = None,
                 mixed: bool | None = None, delivery_delay: float = 0.0, jump: bool = True,
                 prefix_caching: bool = True, host_kv_tokens: int = 0,
                 load_time: Callable[[int], float] | None = None, policy: str = "fcfs",
                 max_context: int | None = None, sample_dt: float = 0.0, index: int = 0,
                 progress: Callable[[float], None] | None = None, tally: Tally | None = None) -> None:
        self.p, self.c, self.sched = p, c, sched
        self.index = index
        self.jump = jump
        engine = engine or sched.engine
        mixed = sched.mixed if mixed is None else mixed
        cls = core_class(engine, mixed)
        capacity = int(sched.kv_tokens * p.kv_scale)
        dp = c.layout.dp
        self.ranks: list[Core] = [
            cls(sched, capacity, delivery_delay, caching=prefix_caching, host_tokens=host_kv_tokens // dp,
                load_time=load_time, policy=policy, mixed_chunk=bool(mixed) and engine == "sglang")
            for _ in range(dp)]
        self.step = StepModel(p, c, max(int(sched.max_batched_tokens), SGLANG_TABLE) + int(sched.max_num_seqs))
        # The longest prompt + output that `fits` cannot refuse (the model's context, the KV pool).
        self._fits_upto = min(max_context or INF, self.ranks[0].max_request_tokens())
        self._pending: list[list[tuple[float, int, SimRequest]]] = [[] for _ in self.ranks]
        self.front: FrontEnd[SimRequest] = FrontEnd(p)
        self._pseq = 0
        self._rr = 0
        self.max_context = max_context
        self.now = 0.0
        self.steps = 0
        self.outstanding = 0
        self.routed_tokens = 0  # prompt + output of requests routed here and not finished
        self.routed = 0
        self.dropped: list[SimRequest] = []
        self._blocked_at = -1.0
        self._blocked_until = INF
        self.sample_dt = float(sample_dt)
        self._next_sample = 0.0 if sample_dt > 0 else INF
        self.series: list[tuple[float, float, float, int, int, int, int]] = []
        self.progress = progress
        # The streaming report, fed every FLUSH_STEPS steps so that the ranks' step-end lists and
        # finished requests stay short (None: the caller flushes).
        self.tally = tally
        self._flush_at = FLUSH_STEPS

    # -- arrivals --------------------------------------------------------------------------------
    def fits(self, req: SimRequest) -> str | None:
        """Why this replica could never run the request (None if it can)."""
        need = req.prompt + req.output
        if self.max_context and need > self.max_context:
            return f"context length: prompt + output = {need} tokens exceeds the model's {self.max_context}"
        limit = self.ranks[0].max_request_tokens()
        if need > limit:
            return f"KV capacity: prompt + output = {need} tokens exceeds the KV pool of {limit} tokens per rank"
        return None

    def submit(self, req: SimRequest, t: float) -> bool:
        """Request `req` reaches this replica at time `t`; False (and `req.dropped` says why) when
        it can never run here."""
        need = req.prompt + req.output
        # `fits`, asked only when the request could be too long: every request passes here.
        if need > self._fits_upto and (why := self.fits(req)) is not None:
            req.dropped = why
            self.dropped.append(req)
            return False
        dp = len(self.ranks)
        if dp > 1:
            rank = self._rr % dp
            self._rr += 1
        else:
            rank = 0
        req.rank = rank
        req.replica = self.index
        self._blocked_at = -1.0
        self._pseq += 1
        if self.front.on and not req.prebuilt:
            self.front.push(t, self._pseq, req)
        else:
            heapq.heappush(self._pending[rank], (t, self._pseq, req))
        self.outstanding += 1
        self.routed += 1
        self.routed_tokens += req.prompt + req.output
        return True

    def _next_event(self, only_accepting: bool) -> float:
        t = INF
        for rank, heap in zip(self.ranks, self._pending, strict=True):
            if heap and heap[0][0] < t and (not only_accepting or rank.accepts_arrivals()):
                t = heap[0][0]
            if rank.loading and rank.loading[0][0] < t:
                t = rank.loading[0][0]
        if self.front.queue:
            # A lower bound whatever its rank: a decode run is cut there if some rank could take it.
            d = self.front.next_departure()
            if d < t and (not only_accepting or any(r.accepts_arrivals() for r in self.ranks)):
                t = d
        return t

    def busy(self) -> bool:
        return self.outstanding > 0

    def event_lb(self) -> float:
        """A lower bound on when this replica can next finish a request (and so cause another
        request): a step lasts at least `step.base[1]`; a decoding batch finishes nothing before
        its first request's last token; a request arriving or loading later, not before then."""
        if not self.outstanding:
            return INF
        s_min = self.step.base[1]
        now = self.now
        lb = INF
        for rank, heap in zip(self.ranks, self._pending, strict=True):
            if heap and heap[0][0] + s_min < lb:
                lb = heap[0][0] + s_min
            if rank.loading and rank.loading[0][0] < lb:
                lb = rank.loading[0][0]
            if rank.waiting or rank.prows or rank.n_loading_rows:
                if now + s_min < lb:
                    lb = now + s_min
            elif rank.n_d:
                t = now + (rank._next_finish() - rank.G) * s_min
                if t < lb:
                    lb = t
        if self.front.queue and self.front.next_departure() + s_min < lb:
            lb = self.front.next_departure() + s_min
        return max(lb, now)

    def next_activity(self) -> float:
        """When this replica next does something: now if any rank has work, else its next
        arrival or KV load (inf when nothing is outstanding)."""
        if not self.outstanding:
            return INF
        now = self.now
        if self._blocked_at == now:
            return max(now, self._blocked_until)
        for rank, heap in zip(self.ranks, self._pending, strict=True):
            if rank.n_d or rank.prows or rank.waiting or (rank.loading and rank.loading[0][0] <= now) or \
                    (heap and heap[0][0] <= now):
                return now
        if self.front.queue and self.front.next_departure() <= now:
            return now
        return self._next_event(False)

    def blocked(self) -> None:
        """A step could not be made now (queued requests wait for KV held by loads in flight):
        nothing happens here before the next arrival or load."""
        self._blocked_at = self.now
        self._blocked_until = self._next_event(False)

    # -- the loop --------------------------------------------------------------------------------
    def run_until(self, horizon: float, on_finish: Callable[[SimRequest], None], at_least_one: bool = False,
                  stop_on_finish: bool = False) -> None:
        """Step while requests are outstanding and the next step starts before `horizon` (with
        `at_least_one`, make one step or jump even if it starts at or after it; with
        `stop_on_finish`, return after a step that finished requests)."""
        ranks, pending, step = self.ranks, self._pending, self.step
        step_fn = step.fn
        single = len(ranks) == 1
        r0 = ranks[0]
        jump = self.jump
        progress = self.progress
        iters = 0
        force = at_least_one
        front = self.front
        queued = front.queue
        while self.outstanding > 0:
            now = self.now
            if now >= horizon and not force:
                return
            force = False
            if queued and queued[0][0] <= now and front.free <= now:  # someone passes (pass_until's test)
                front.pass_until(now, pending)
            if single:
                heap = pending[0]
                while heap and heap[0][0] <= now:
                    r0.waiting.append(heapq.heappop(heap)[2])  # r0.enqueue (SGLang's lpm replaces the deque)
                if r0.loading and r0.loading[0][0] <= now:
                    done = r0.process_ready(now)
                    if done:
                        self._deliver(done, on_finish)
                        continue
                lim = r0.decode_run_limit()
                if lim is None:
                    nxt = self._next_event(False)
                    if nxt == INF:
                        raise RuntimeError("simulator idle with requests outstanding")
                    if nxt >= horizon and nxt > now:
                        return
                    self.now = nxt
                    continue
                if lim == 0:
                    b = r0.schedule(now)
                    if not (b.n_dec or b.pre):
                        if self._wait(now, horizon):
                            return
                        continue
                    end = now + step_fn(b.n_dec, b.ctx_dec, b.n_pref, b.ctx_pref, b.seq_pref)
                    self.now = end
                    finished = r0.commit(end)
                    self.steps += 1
                else:
                    finished = self._jump([0], lim if jump else 1, now, horizon)
            else:
                done = []
                for rank, heap in zip(ranks, pending, strict=True):
                    while heap and heap[0][0] <= now:
                        rank.enqueue(heapq.heappop(heap)[2])
                    if rank.loading and rank.loading[0][0] <= now:
                        done += rank.process_ready(now)
                if done:
                    self._deliver(done, on_finish)
                    continue
                limits = [rank.decode_run_limit() for rank in ranks]
                busy = [i for i, lim in enumerate(limits) if lim is not None]
                if not busy:
                    nxt = self._next_event(False)
                    if nxt == INF:
                        raise RuntimeError("simulator idle with requests outstanding")
                    if nxt >= horizon and nxt > now:
                        return
                    self.now = nxt
                    continue
                if all(limits[i] for i in busy):
                    # Every busy rank runs pure decode steps: jump over k of them at once.
                    k = min(int(limits[i]) for i in busy) if jump else 1  # type: ignore[arg-type]
                    finished = self._jump(busy, k, now, horizon)
                else:
                    dt = 0.0
                    batches = [rank.schedule(now) for rank in ranks]
                    for b in batches:
                        if b.n_dec or b.pre:
                            t = step_fn(b.n_dec, b.ctx_dec, b.n_pref, b.ctx_pref, b.seq_pref)
                            if t > dt:
                                dt = t
                    if dt == 0.0:
                        if self._wait(now, horizon):
                            return
                        continue
                    end = now + dt
                    self.now = end
                    finished = []
                    for rank, b in zip(ranks, batches, strict=True):
                        if b.n_dec or b.pre:
                            finished += rank.commit(end)
                    self.steps += 1
            if finished:
                self._deliver(finished, on_finish)
                if stop_on_finish:
                    return
            if self.now >= self._next_sample:
                self._sample()
            if self.steps >= self._flush_at:
                self.flush()
            iters += 1
            if progress is not None and not iters & 1023:
                progress(self.now)

    def _deliver(self, finished: list[SimRequest], on_finish: Callable[[SimRequest], None]) -> None:
        for req in finished:
            self.outstanding -= 1
            self.routed_tokens -= req.prompt + req.output
            on_finish(req)

    def _wait(self, now: float, horizon: float) -> bool:
        """Nothing could be scheduled (a request may have started loading its KV): move to the
        next arrival or load; True when that is at or past the horizon (stop there)."""
        nxt = self._next_event(False)
        if nxt == INF:
            raise RuntimeError("no rank can schedule its waiting requests")
        if nxt > now and nxt >= horizon:
            return True
        self.now = max(now, nxt)
        return False

    def _jump(self, busy: list[int], k: int, now: float, horizon: float) -> list[SimRequest]:
        """k pure decode steps of every busy rank (fewer if an event or the horizon comes first:
        an arrival joins the first step that starts at or after it)."""
        ranks, step = self.ranks, self.step
        t_cut = self._next_event(True)
        if horizon < t_cut:
            t_cut = horizon
        if k == 1:
            dt = 0.0
            step_fn = step.fn
            for i in busy:
                n, ctx1 = ranks[i].decode_state()
                t = step_fn(n, ctx1, 0, 0.0)
                if t > dt:
                    dt = t
            end = now + dt
            ends = [end]
        elif step.exact and k <= SHORT_RUN:
            # Most runs are short (an arrival cuts them after a few steps): numpy's per-call cost
            # would dominate, so compute `decode_run`'s times, their running sum and the cut one
            # step at a time, with the same float operations in the same order (identical values),
            # stopping at the cut instead of computing all k steps.
            lines = []
            for i in busy:
                n, ctx1 = ranks[i].decode_state()
                a, b = step.decode_line(n)
                lines.append((a, b, ctx1))
            kv_lin, kv_state, kv_win = step.kv_lin, step.kv_state, step.kv_win
            ends = []
            cum = 0.0
            for j in range(k):
                t = -INF
                for a, b, ctx1 in lines:
                    ctx = ctx1 + j
                    kvb = kv_lin * ctx + kv_state
                    for coeff, window in kv_win:
                        kvb = kvb + coeff * (ctx if ctx < window else window)
                    tr = a + b * kvb
                    if tr > t:
                        t = tr
                cum += t
                e = now + cum
                # The first step that would start at or after the cut is not taken (at least one is).
                if e - t >= t_cut and j:
                    break
                ends.append(e)
            k = len(ends)
            end = ends[-1]
        else:
            times: np.ndarray | None = None
            for i in busy:
                n, ctx1 = ranks[i].decode_state()
                t = step.decode_run(n, ctx1, k)
                times = t if times is None else np.maximum(times, t)
            assert times is not None
            cum = np.cumsum(times)
            if t_cut != INF:
                k = max(1, min(k, int(np.searchsorted(now + cum - times, t_cut, side="left"))))
            end = now + float(cum[k - 1])
            ends = (now + cum[:k]).tolist()
        self.now = end
        finished: list[SimRequest] = []
        for i in busy:
            finished += ranks[i].advance_decode(k, ends)
        self.steps += k
        return finished

    def flush(self, final: bool = False) -> None:
        """Hand what the ranks finished to the streaming report (see `inferasim.sim.tally`)."""
        self._flush_at = self.steps + FLUSH_STEPS
        if self.tally is not None:
            self.tally.flush(self.ranks, self.dropped, final)

    # -- observation -----------------------------------------------------------------------------
    def _sample(self) -> None:
        ranks = self.ranks
        total = sum(r.kv.total for r in ranks) or 1
        in_use = sum(r.kv.in_use for r in ranks) / total
        cached = sum(r.kv.used for r in ranks) / total
        hits = sum(r.hit_tokens for r in ranks)
        queried = sum(r.query_tokens for r in ranks)
        running = sum(r.n_alive for r in ranks)
        waiting = sum(len(r.waiting) + len(r.loading) for r in ranks)
        if self.front.on:
            waiting += self._at_front(self.now)
        while self._next_sample <= self.now:
            self.series.append((self._next_sample, in_use, cached, hits, queried, running, waiting))
            self._next_sample += self.sample_dt

    def _at_front(self, now: float) -> int:
        """Requests arrived by `now` that have not reached their rank's queue: queued at the front
        end or passing it (client requests in the pending heaps all came through it). Counts without
        passing anything: a sample must not change the run."""
        return sum(1 for heap in self._pending for _, _, req in heap if not req.prebuilt) + self.front.sent_by(now)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.ranks)

    def kv_peak_fraction(self) -> float:
        return max((r.kv.peak / r.kv.total if r.kv.total else 0.0) for r in self.ranks)

    def load(self) -> int:
        """Outstanding tokens (prompt + output of requests routed here and not finished)."""
        return self.routed_tokens

    def prefix_match(self, req: SimRequest) -> int:
        """Tokens of `req` cached on this replica (the best rank), for a prefix-aware router."""
        best = 0
        for r in self.ranks:
            if r.kv.caching and req.ids is not None:
                m = r.kv.match(req.ids, req.unit, req.id_tokens, req.prompt)
                if m.tokens > best:
                    best = m.tokens
        return best


# Token table size: SGLang prefill batches reach 16384 tokens whatever the vLLM-style budget.
SGLANG_TABLE = 16384
# Decode runs up to this many steps are stepped in Python in `Replica._jump` (cheaper than numpy's
# fixed cost per call at these lengths; the values are the same).
SHORT_RUN = 64
