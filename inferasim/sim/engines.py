"""Engine schedulers of the trace simulator, one per attention-dp rank (DESIGN.md section 4).

The same policies as `inferasim.sim.scheduler` (whose numpy `RunningSet` form the closed-loop
simulator and the emulator keep using), rebuilt for speed and extended with what real traffic
needs: a prefix cache, a host KV tier, KV that arrives from a prefill pool, and ATOM's policy.
With no prefix identities the vLLM and SGLang policies here make the same decisions step for step
as those of `scheduler.py` (a test replays closed loops through both).

- `VllmCore` (vLLM V1, mixed batches): running requests first (decodes one token each, partial
  prefills their next chunk, oldest first), then the leftover of `max_num_batched_tokens` to
  waiting requests in FCFS order, bounded by `max_num_seqs` and free KV blocks; a request that
  finds no free block preempts the newest running request by recompute; no admission in a step
  that preempted. Hashed full-block prefix cache (`enable_prefix_caching`, on by default).
  `max_num_seqs` is capped at `max_num_batched_tokens` (vLLM refuses to start otherwise).
- `SglangCore` (SGLang): a prefill batch whenever the queue head passes SGLang's admission check
  (its prompt after the radix-cache match + clipped max_new_tokens against free + evictable
  tokens minus `new_token_ratio` x the running requests' remaining outputs), else one decode
  batch of all running requests; retraction when a decode step does not fit. Radix (token-level)
  prefix cache; `--schedule-policy` fcfs or lpm (longest prefix match first, on queues of at most
  128 requests as SGLang does); `--enable-mixed-chunk` puts the running decodes into prefill
  batches (their tokens come out of the chunk budget). Prefill batches keep to the chunk size and
  to `--max-prefill-tokens`; first tokens leave late when a prefill batch follows a prefill batch.
- `AtomCore` (ATOM, and vLLM V0 without chunked prefill): prefill first. Partial prefills
  continue, then waiting requests are admitted FCFS while their new tokens fit
  `max_num_batched_tokens` (the last one may be chunked) and the blocks of the whole sequence are
  free (allocated at admission, `BlockManager.allocate`); a step with any prefill is prefill
  only; otherwise all running requests decode, and when a block cannot be appended the newest
  running request is preempted (recompute, back to the queue head). Sources:
  `inferasim.catalog.engines` ATOM defaults (atom/model_engine/scheduler.py, block_manager.py).

Speed. Running requests that decode are not touched per step: each rank keeps a decode counter G
and every decoding row stores its context and output counts relative to it, so a decode step is
G += 1. Aggregates answer what a step needs in O(1): the number of rows, the sum of contexts
(mean context of the step), a histogram of context mod block size (blocks the step opens), a heap
of the counter values at which rows finish, and for SGLang the sum of clipped remaining outputs.
Rows are only visited when something happens to them (admission, a prefill chunk, a finish, a
preemption). A run of k decode steps between events costs O(block size) plus one vectorised
step-time evaluation.

Token timing, exactly and compactly: a decoding row emits a token at the end of every decode step
of its rank, so its inter-token gaps are differences of consecutive decode-step end times (`E`),
except its first gap after it starts decoding (from its first token, or from a prefill step of
SGLang/ATOM that paused the decodes: those show up in E's differences too) and gaps across a
preemption, which are recorded one by one. Each decode step also records how many rows continued
from the previous one, which weights E's differences. The pooled ITL distribution and each
request's largest gap follow exactly (`inferasim.sim.report`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from itertools import accumulate

import numpy as np

from inferasim.model.steady import EngineSched
from inferasim.sim.prefix import NO_MATCH, KVPool, Match, Node

# SGLang scheduler constants: the reference scheduler's (python/sglang/global_config.py,
# srt/managers/scheduler.py and schedule_policy.py).
from inferasim.sim.scheduler import (
    SGLANG_CLIP_MAX_NEW_TOKENS,
    SGLANG_INIT_NEW_TOKEN_RATIO,
    SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR,
    SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS,
    SGLANG_RETRACT_DECODE_STEPS,
    hand_out_late,
)

SGLANG_LPM_MAX_QUEUE = 128  # schedule_policy.py: longer queues fall back to fcfs


class SimRequest:
    """One request of the trace simulator and what its client saw (times in s).

    `ids`/`unit`/`id_tokens`: the prefix identity (chained unit keys covering the first
    `id_tokens` tokens of the request's stream: its prompt, and for multi-turn sessions its
    answer too). `prebuilt`: its KV (prompt and first token) comes from a prefill worker and takes
    `load_s` to transfer once the decode worker has allocated it."""

    __slots__ = ("rid", "arrival", "prompt", "output", "ids", "unit", "id_tokens", "rank", "replica",
                 "first_token", "finish", "generated", "preemptions", "prefix_hit", "host_hit", "dropped",
                 "prebuilt", "load_s", "t_last", "max_gap", "segs", "parent", "session", "pinned",
                 "_m_epoch", "_m_known", "_m")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, ids: tuple[int, ...] | None = None,
                 unit: int = 512, id_tokens: int | None = None, session: int = -1) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = int(prompt)
        self.output = int(output)
        self.ids = ids
        self.unit = int(unit)
        self.id_tokens = int(id_tokens) if id_tokens is not None else (len(ids) * self.unit if ids else 0)
        self.rank = 0
        self.replica = -1
        self.first_token: float | None = None
        self.finish: float | None = None
        self.generated = 0
        self.preemptions = 0
        self.prefix_hit = -1  # prompt tokens found cached at its first admission (-1: not admitted)
        self.host_hit = 0
        self.dropped: str | None = None
        self.prebuilt = False
        self.load_s = 0.0
        self.t_last: float | None = None  # engine time of its last token
        self.max_gap = 0.0  # largest inter-token gap recorded one by one (see report for the rest)
        self.segs: list[tuple[int, int]] | None = None  # (first, last) decode-step index ranges
        self.parent: SimRequest | None = None
        self.session = session
        self.pinned: list[Node] | None = None
        self._m_epoch = -1
        self._m_known = -1
        self._m: Match = NO_MATCH

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        assert self.finish is not None
        return self.finish - self.arrival

    @property
    def tpot(self) -> float:
        assert self.first_token is not None and self.finish is not None
        return (self.finish - self.first_token) / max(self.output - 1, 1)

    def __repr__(self) -> str:
        return (f"SimRequest(rid={self.rid}, arrival={self.arrival:.3f}, prompt={self.prompt}, "
                f"output={self.output}, first_token={self.first_token}, finish={self.finish}, "
                f"dropped={self.dropped!r})")


class Row:
    """A request holding KV on a rank. While it decodes, `comp`/`gen` are `cb`/`gb` + G."""

    __slots__ = ("req", "prompt", "out", "seq", "comp", "gen", "cb", "gb", "fin", "jt", "shared", "upto",
                 "nodes", "reg_tok", "tail_open", "reg_stop", "in_d", "alive", "served", "i0", "over_t", "over_tok")

    def __init__(self, req: SimRequest, seq: int, comp: int, gen: int, shared: int, nodes: list[Node],
                 upto: int = 0) -> None:
        self.req = req
        self.prompt = req.prompt
        self.out = req.output
        self.seq = seq
        self.comp = comp
        self.gen = gen
        self.cb = 0
        self.gb = 0
        self.fin = 0
        self.jt = 0
        self.shared = shared  # blocks of its table that are cache nodes (the rest are private)
        self.upto = upto  # tokens whose blocks were allocated ahead of computing them (ATOM)
        self.nodes = nodes
        self.reg_tok = 0  # stream tokens already in cache nodes it references
        self.tail_open = False  # its last node ends where its chain does (it may extend it)
        self.reg_stop = False
        self.in_d = False
        self.alive = True
        self.served = 0
        self.i0 = 0
        self.over_t = 0
        self.over_tok = 0


class Batch:
    __slots__ = ("n_dec", "ctx_dec", "pre", "n_pref", "ctx_pref", "seq_pref")

    def __init__(self, n_dec: int, ctx_dec: float, pre: list[tuple[Row, int, int]]) -> None:
        self.n_dec = n_dec
        self.ctx_dec = ctx_dec
        self.pre = pre
        if pre:
            # Token-weighted mean context of a prefill token (as scheduler.Batch.ctx_pref).
            tot = 0
            acc = 0.0
            longest = 0
            for _, n, s in pre:
                tot += n
                acc += n * (s + n / 2.0)
                longest = max(longest, s + n)
            self.n_pref = tot
            self.ctx_pref = acc / tot if tot else 0.0
            self.seq_pref: float | None = float(longest)  # decides a DSA model's sparse prefill
        else:
            self.n_pref = 0
            self.ctx_pref = 0.0
            self.seq_pref = None

    @property
    def empty(self) -> bool:
        return not self.n_dec and not self.pre


EMPTY = Batch(0, 0.0, [])


class Core:
    """State and bookkeeping common to the policies; subclasses decide what runs."""

    min_compute = 1
    ratio_hook = False  # the policy evolves per step (SGLang's new_token_ratio): call _after_step

    def __init__(self, sched: EngineSched, kv_capacity_tokens: int, delivery_delay: float = 0.0, *,
                 caching: bool = True, host_tokens: int = 0,
                 load_time: Callable[[int], float] | None = None, policy: str = "fcfs",
                 mixed_chunk: bool = False) -> None:
        self.sched = sched
        self.max_seqs = int(sched.max_num_seqs)
        self.max_tokens = int(sched.max_batched_tokens)
        self.B = max(int(sched.block_size), 1)
        self.kv = KVPool(kv_capacity_tokens, self.B, caching, host_tokens, self.min_compute)
        self.delay = delivery_delay
        self.load_time = load_time or (lambda tokens: 0.0)
        self.policy = policy
        self.mixed_chunk = mixed_chunk
        # Decoding rows (aggregates over them).
        self.G = 0
        self.n_d = 0
        self.sum_cb = 0
        self.hist = [0] * self.B
        self.fin_heap: list[tuple[int, int, int, Row]] = []
        self.drows: set[Row] = set()
        self._jt = 0  # join counter (also versions the block histogram, with n_d)
        self._pb_key: tuple[int, int, int] = (-1, -1, -1)
        self._pb: list[int] = []
        # Other rows.
        self.prows: list[Row] = []  # prefilling or recomputing, admission order
        self.order: list[Row] = []  # every row, admission order (dead ones dropped lazily)
        self.waiting: deque[SimRequest] = deque()
        self.loading: list[tuple[float, int, int, object]] = []  # (ready, seq, kind, row or request)
        self.n_loading_rows = 0
        self._lseq = 0
        self._seq = 0
        self._stamp = 0
        self.preemptions = 0
        self.batch: Batch = EMPTY
        # Token timing (see the module docstring).
        self.E: list[float] = []
        self.e_off = 0  # absolute index of E[0]: a streaming report drops E's head (sim/tally.py)
        self.cont: list[int] = []
        self.gaps: list[float] = []
        self.joiners: dict[Row, float] = {}
        self.finished: list[SimRequest] = []  # since the report's last flush
        self.open_segs: list[SimRequest] = []  # requests with a decode range the report has not folded
        # Prefix-cache statistics (first admissions).
        self.hit_tokens = 0
        self.host_hit_tokens = 0
        self.query_tokens = 0
        self.prefill_tokens = 0  # prompt tokens computed (recomputation included)

    # -- sizes -----------------------------------------------------------------------------------
    def max_request_tokens(self) -> int:
        """The longest prompt + output this rank can ever run (whole pool, nothing else running)."""
        return self.kv.capacity_tokens

    @property
    def n_alive(self) -> int:
        return self.n_d + len(self.prows) + self.n_loading_rows

    # -- queue -----------------------------------------------------------------------------------
    def enqueue(self, req: SimRequest) -> None:
        # No back-reference from the request to the core: a cycle would keep a finished
        # simulation alive until the cyclic collector runs (see api.simulate_workload).
        self.waiting.append(req)

    def _match(self, req: SimRequest, known: int) -> Match:
        """The prefix match of a queued request, cached until the pool's cache changes."""
        kv = self.kv
        if not kv.caching or req.ids is None:
            return NO_MATCH
        if req._m_epoch == kv.epoch and req._m_known == known:
            return req._m
        m = kv.match(req.ids, req.unit, req.id_tokens, known)
        req._m, req._m_epoch, req._m_known = m, kv.epoch, known
        return m

    def _count_first(self, req: SimRequest, gpu_hit: int, host_hit: int) -> None:
        if req.prefix_hit < 0:
            req.prefix_hit = gpu_hit + host_hit
            req.host_hit = host_hit
            self.hit_tokens += gpu_hit + host_hit
            self.host_hit_tokens += host_hit
            self.query_tokens += req.prompt

    def _start_host_load(self, req: SimRequest, m: Match, now: float) -> None:
        """Pin the GPU part of the match, bring the host part back into GPU blocks and park the
        request until the copy is done; it then re-enters at the queue head (its blocks pinned)."""
        kv = self.kv
        kv.take(m.nodes)
        promoted = kv.promote(m.host_segs, req.unit)
        req.pinned = list(m.nodes) + promoted
        self._count_first(req, m.gpu, m.host)
        self._lseq += 1
        heapq.heappush(self.loading, (now + self.load_time(m.host), self._lseq, 1, req))

    def _start_prebuilt(self, req: SimRequest, now: float) -> None:
        """A decode worker takes a request prefilled elsewhere: allocate its prompt's KV, then wait
        for the transfer (the request holds its blocks meanwhile)."""
        kv = self.kv
        kv.alloc(kv.blocks_for(req.prompt))
        row = Row(req, 0, req.prompt, 1, 0, [])
        self.n_loading_rows += 1
        self._lseq += 1
        heapq.heappush(self.loading, (now + req.load_s, self._lseq, 2, row))

    def process_ready(self, now: float) -> list[SimRequest]:
        """Requests whose KV finished loading by `now`; returns those that are thereby done (a
        prefilled request asking for one token only)."""
        loading = self.loading
        done: list[SimRequest] = []
        while loading and loading[0][0] <= now:
            t, _, kind, obj = heapq.heappop(loading)
            if kind == 1:
                self.waiting.appendleft(obj)  # type: ignore[arg-type]
            else:
                row: Row = obj  # type: ignore[assignment]
                self.n_loading_rows -= 1
                req = row.req
                self._seq += 1
                row.seq = self._seq
                self.order.append(row)
                req.first_token = t + self.delay  # the prefill worker's token, forwarded
                req.t_last = t
                req.generated = 1
                if row.gen >= row.out:
                    done.append(self._finish(row, t))
                else:
                    self._join(row, t)
        return done

    def _admit(self, req: SimRequest, m: Match, chunk: int, blocks: int, upto: int = 0) -> Row:
        """Move the head of the queue into the running rows: reference its cached prefix, allocate
        `blocks` private blocks, `chunk` tokens scheduled from the end of the match."""
        kv = self.kv
        if m.nodes:
            kv.take(m.nodes)
        if req.pinned is not None:
            kv.drop(req.pinned)
            req.pinned = None
        kv.alloc(blocks)
        self._seq += 1
        b = self.B
        row = Row(req, self._seq, m.gpu, req.generated, m.gpu // b if b > 1 else m.gpu, list(m.nodes), upto)
        row.reg_tok, row.tail_open = m.chain_end, m.tail_open
        self._count_first(req, m.gpu, 0)
        self.prows.append(row)
        self.order.append(row)
        return row

    # -- decoding rows ---------------------------------------------------------------------------
    def _join(self, row: Row, t_prev: float) -> None:
        G = self.G
        cb = row.comp - G
        gb = row.gen - G
        row.cb, row.gb = cb, gb
        row.fin = row.out - gb
        self._jt += 1
        row.jt = self._jt
        self.n_d += 1
        self.sum_cb += cb
        self.hist[cb % self.B] += 1
        heapq.heappush(self.fin_heap, (row.fin, row.seq, row.jt, row))
        self.drows.add(row)
        row.in_d = True
        row.i0 = self.e_off + len(self.E)
        self.joiners[row] = t_prev
        self._on_join(row)

    def _leave(self, row: Row) -> None:
        G = self.G
        self._on_leave(row)
        row.comp = row.cb + G
        row.gen = row.gb + G
        self.n_d -= 1
        self.sum_cb -= row.cb
        self.hist[row.cb % self.B] -= 1
        self.drows.discard(row)
        row.in_d = False
        self.joiners.pop(row, None)
        i1 = self.e_off + len(self.E) - 1
        if i1 > row.i0:
            req = row.req
            if req.segs is None:
                req.segs = []
                self.open_segs.append(req)
            req.segs.append((row.i0, i1))

    def _on_join(self, row: Row) -> None:  # noqa: B027 - optional hook
        """Hook: policy aggregates over decoding rows (SGLang's clipped remaining outputs)."""

    def _on_leave(self, row: Row) -> None:  # noqa: B027 - optional hook
        """Hook: see _on_join."""

    def _need1(self) -> int:
        """Blocks the next decode step of every decoding row opens."""
        if self.B == 1:
            return self.n_d
        return self.hist[(-self.G) % self.B]

    def _prefix_blocks(self) -> list[int]:
        """pre[r] = blocks the first r decode steps open (r < B); a full cycle opens n_d.
        Cached until a row joins or leaves or the counter moves."""
        B = self.B
        key = (self.G, self._jt, self.n_d)
        if key == self._pb_key:
            return self._pb
        hist = self.hist
        # pre[r] sums hist[(-(G + i)) % B] for i < r: the histogram read backwards from
        # (-G) % B, wrapping around.
        s0 = (-self.G) % B
        pre = [0, *accumulate((hist[s0::-1] + hist[:s0:-1])[:B - 1])]
        self._pb_key, self._pb = key, pre
        return pre

    def blocks_after(self, k: int) -> int:
        if self.B == 1:
            return self.n_d * k
        q, r = divmod(k, self.B)
        return self.n_d * q + (self._prefix_blocks()[r] if r else 0)

    def blocks_upto(self, k: int) -> np.ndarray:
        """Cumulative blocks after 1, 2, ..., k decode steps."""
        j = np.arange(1, k + 1, dtype=np.int64)
        if self.B == 1:
            return self.n_d * j
        q, r = np.divmod(j, self.B)
        return self.n_d * q + np.asarray(self._prefix_blocks(), dtype=np.int64)[r]

    def _next_finish(self) -> int:
        heap = self.fin_heap
        while heap:
            fin, _, jt, row = heap[0]
            if row.in_d and row.jt == jt:
                return fin
            heapq.heappop(heap)
        return 1 << 62

    def _run_to_event(self) -> int:
        """Decode steps until the first finish, capped where the blocks run out."""
        k_fin = self._next_finish() - self.G
        free = self.kv.free
        n = self.n_d
        if self.B == 1:
            return k_fin if n * k_fin <= free else free // n
        pre = self._prefix_blocks()
        q, r = divmod(k_fin, self.B)
        if n * q + (pre[r] if r else 0) <= free:
            return k_fin
        q = free // n
        left = free - n * q
        r = 0
        for i in range(self.B - 1, 0, -1):
            if pre[i] <= left:
                r = i
                break
        return q * self.B + r

    def decode_state(self) -> tuple[int, float]:
        n = self.n_d
        return n, (self.sum_cb + n * self.G) / n + 1.0

    # -- applying steps --------------------------------------------------------------------------
    def _record_decode(self, t_end: float, n: int) -> None:
        self.E.append(t_end)
        j = self.joiners
        if j:
            gaps = self.gaps
            for row, tp in j.items():
                g = t_end - tp
                gaps.append(g)
                req = row.req
                if g > req.max_gap:
                    req.max_gap = g
            self.cont.append(n - len(j))
            j.clear()
        else:
            self.cont.append(n)

    def _pop_finished(self) -> list[Row]:
        heap, G = self.fin_heap, self.G
        out = []
        while heap and heap[0][0] <= G:
            _, _, jt, row = heapq.heappop(heap)
            if row.in_d and row.jt == jt:
                out.append(row)
        if len(out) > 1:
            out.sort(key=lambda r: r.seq)
        return out

    def commit(self, t_end: float) -> list[SimRequest]:
        """Apply the scheduled step (it ended at `t_end`); returns the requests that finished."""
        b = self.batch
        self.batch = EMPTY
        done: list[SimRequest] = []
        if b.n_dec:
            self.G += 1
            self._record_decode(t_end, b.n_dec)
            for row in self._pop_finished():
                done.append(self._finish(row, t_end))
        if b.pre:
            kv = self.kv
            delay = self.delay
            for row, chunk, _ in b.pre:
                row.comp += chunk
                self.prefill_tokens += chunk
                req = row.req
                if req.ids is not None and not row.reg_stop and kv.caching and \
                        min(row.comp, req.id_tokens) >= row.reg_tok + self.B:
                    kv.register(row, row.comp)
                if row.comp == row.prompt + row.gen:
                    row.gen += 1
                    if req.first_token is None:
                        req.first_token = t_end + delay
                    elif req.t_last is not None:
                        g = t_end - req.t_last  # across a preemption
                        self.gaps.append(g)
                        if g > req.max_gap:
                            req.max_gap = g
                    req.t_last = t_end
                    if row.gen >= row.out:
                        done.append(self._finish(row, t_end))
                    else:
                        self.prows.remove(row)
                        self._join(row, t_end)
        if self.ratio_hook:
            self._after_step(1)
        if len(self.order) > 2 * (self.n_d + len(self.prows)) + 64:
            self._tidy()
        return done

    def advance_decode(self, k: int, ends: list[float]) -> list[SimRequest]:
        """Apply k pure decode steps of every decoding row at once (checked by decode_run_limit);
        `ends` are the steps' end times."""
        n = self.n_d
        self.kv.alloc(self.blocks_after(k))
        self.G += k
        t_end = ends[-1]
        if k == 1:
            self._record_decode(t_end, n)
        else:
            self._record_decode(ends[0], n)
            self.E.extend(ends[1:])
            self.cont.extend([n] * (k - 1))
        self._after_step(k)
        done = [self._finish(row, t_end) for row in self._pop_finished()]
        if len(self.order) > 2 * (self.n_d + len(self.prows)) + 64:
            self._tidy()
        return done

    def _after_step(self, k: int) -> None:  # noqa: B027 - optional hook
        """Hook: policy state that evolves per step (SGLang's new_token_ratio)."""

    def _finish(self, row: Row, t_end: float) -> SimRequest:
        if row.in_d:
            self._leave(row)
        else:
            try:
                self.prows.remove(row)
            except ValueError:
                pass
        req = row.req
        req.generated = row.gen
        req.finish = t_end + self.delay
        if req.first_token is None:
            req.first_token = req.finish
        req.t_last = t_end
        self._release(row)
        self.finished.append(req)
        return req

    def _release(self, row: Row) -> None:
        kv = self.kv
        req = row.req
        if req.ids is not None and not row.reg_stop and kv.caching and \
                min(row.comp, req.id_tokens) >= row.reg_tok + self.B:
            kv.register(row, row.comp)
        if row.nodes:
            kv.drop(row.nodes)
        held = row.comp if row.comp > row.upto else row.upto
        kv.release(kv.blocks_for(held) - row.shared)
        row.alive = False

    def _preempt(self, row: Row, to_head: bool = True) -> None:
        """Recompute preemption: the row's KV goes (its computed full blocks stay in the prefix
        cache, as in the engines); its sampled tokens stay and are prefilled again."""
        req = row.req
        if row.in_d:
            tp = self.joiners.get(row)
            req.t_last = tp if tp is not None else (self.E[-1] if self.E else req.t_last)
            self._leave(row)
        else:
            self.prows.remove(row)
        req.generated = row.gen
        req.preemptions += 1
        self.preemptions += 1
        self._release(row)
        if to_head:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    def _newest(self) -> Row:
        order = self.order
        while not order[-1].alive:
            order.pop()
        return order[-1]

    def _newest_unserved(self, stamp: int) -> Row:
        for row in reversed(self.order):
            if row.alive and not row.in_d and row.served != stamp:
                return row
        raise RuntimeError("no request left to preempt")

    def _tidy(self) -> None:
        self.order = [r for r in self.order if r.alive]

    # -- policy ----------------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        raise NotImplementedError

    def decode_run_limit(self) -> int | None:
        raise NotImplementedError

    def accepts_arrivals(self) -> bool:
        raise NotImplementedError

    def idle_limit(self) -> int | None:
        """decode_run_limit's answer for a rank with no decoding request: schedule a step if
        there is prefill work or a queue, else idle (KV loads in flight are the loop's events)."""
        return 0 if (self.waiting or self.prows) else None

    def _new_blocks(self, known: int, h: int, chunk: int, reserve_prompt: bool) -> int:
        """Private blocks a request starting with `h` cached tokens of `known` allocates: those of
        its first `chunk` (vLLM), or of the whole known sequence (ATOM, `reserve_prompt`)."""
        B = self.B
        if reserve_prompt:
            return self.kv.blocks_for(known) - h // B
        return -(-(h + chunk) // B) - h // B

    def _head_kv_fits(self, free: int, budget: int, reserve_prompt: bool) -> bool:
        """Whether the head of the queue could be admitted into `free` blocks, by the same rule as
        `_admit_waiting` (a prebuilt request, a host reload, or a prompt's first chunk)."""
        req = self.waiting[0]
        if req.prebuilt:
            return self.kv.blocks_for(req.prompt) <= free
        known = req.prompt + req.generated
        m = self._match(req, known)
        if m.host:
            return m.host_blocks + m.revived <= free
        return self._new_blocks(known, m.gpu, min(known - m.gpu, budget), reserve_prompt) + m.revived <= free

    def _admit_waiting(self, now: float, budget: int, pre: list[tuple[Row, int, int]],
                       reserve_prompt: bool = False) -> int:
        """Admit from the head of the queue while the token budget, the sequence limit and free KV
        allow; each admitted prompt's first chunk joins `pre`. vLLM allocates the blocks of the
        scheduled chunk only (`reserve_prompt` False); ATOM reserves the whole prompt at admission.
        Returns the budget left."""
        kv = self.kv
        waiting = self.waiting
        max_seqs = self.max_seqs
        while waiting and budget > 0 and self.n_alive < max_seqs:
            req = waiting[0]
            if req.prebuilt:
                if kv.blocks_for(req.prompt) > kv.free:
                    break
                waiting.popleft()
                self._start_prebuilt(req, now)
                continue
            known = req.prompt + req.generated
            m = self._match(req, known)
            if m.host:
                if m.host_blocks + m.revived > kv.free:
                    break
                waiting.popleft()
                self._start_host_load(req, m, now)
                continue
            h = m.gpu
            chunk = min(known - h, budget)
            blocks = self._new_blocks(known, h, chunk, reserve_prompt)
            if blocks + m.revived > kv.free:
                break
            waiting.popleft()
            row = self._admit(req, m, chunk, blocks, upto=known) if reserve_prompt else self._admit(req, m, chunk,
                                                                                                   blocks)
            pre.append((row, chunk, h))
            budget -= chunk
        return budget


class VllmCore(Core):
    """vLLM V1 (vllm/v1/core/sched/scheduler.py): chunked prefill, hashed full-block prefix cache."""

    def __init__(self, sched: EngineSched, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(sched, *args, **kwargs)
        self.max_seqs = min(self.max_seqs, self.max_tokens)

    def schedule(self, now: float) -> Batch:
        kv = self.kv
        B = self.B
        self._stamp += 1
        stamp = self._stamp
        budget = self.max_tokens
        need = self._need1()
        preempted = False
        if need > kv.free:
            # V1 pops the newest running request until the older ones fit.
            while need > kv.free:
                victim = self._newest()
                if victim.in_d and (victim.cb + self.G) % B == 0:
                    need -= 1
                self._preempt(victim)
                preempted = True
        if need:
            kv.alloc(need)
        n_d = self.n_d
        budget -= n_d
        ctx = (self.sum_cb + n_d * self.G) / n_d + 1.0 if n_d else 0.0
        pre: list[tuple[Row, int, int]] = []
        if self.prows:
            # Partially prefilled (or recomputing) requests continue, oldest first.
            for row in list(self.prows):
                if budget <= 0:
                    break
                if not row.alive:
                    continue
                comp = row.comp
                chunk = min(row.prompt + row.gen - comp, budget)
                blocks = -(-(comp + chunk) // B) - -(-comp // B)
                while blocks > kv.free and row.alive:
                    self._preempt(self._newest_unserved(stamp))
                    preempted = True
                if not row.alive:
                    break  # preempted itself: V1 stops scheduling the running queue
                kv.alloc(blocks)
                row.served = stamp
                pre.append((row, chunk, comp))
                budget -= chunk
        if not preempted:
            self._admit_waiting(now, budget, pre)
        self.batch = b = Batch(n_d, ctx, pre)
        return b

    def _head_admissible(self, n: int, free_blocks: int) -> bool:
        budget = self.max_tokens - n
        if not self.waiting or budget <= 0 or n >= self.max_seqs:
            return False
        return self._head_kv_fits(free_blocks, budget, reserve_prompt=False)

    def decode_run_limit(self) -> int | None:
        if not self.n_d:
            return self.idle_limit()
        n = self.n_alive
        if self.prows or n > self.max_tokens:
            return 0
        first = self._need1()
        free = self.kv.free
        if first > free:
            return 0
        # Blocks only get scarcer during a decode run, so a head blocked now stays blocked.
        if self.waiting and self._head_admissible(n, free - first):
            return 0
        return self._run_to_event()

    def accepts_arrivals(self) -> bool:
        n = self.n_alive
        return not self.waiting and n < self.max_seqs and n < self.max_tokens


class SglangCore(Core):
    """SGLang (srt/managers/scheduler.py + schedule_policy.PrefillAdder), radix prefix cache."""

    min_compute = 1
    ratio_hook = True

    def __init__(self, sched: EngineSched, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(sched, *args, **kwargs)
        self.chunked: Row | None = None
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.min_ratio = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay = (SGLANG_INIT_NEW_TOKEN_RATIO - self.min_ratio) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self._decoded = False
        # Clipped remaining outputs of decoding rows: sum(out - gb) - n_d G, minus the excess of
        # rows whose remaining output is above the clip (those with G < over_t).
        self.sum_rem0 = 0
        self.over_heap: list[tuple[int, int, Row]] = []
        self.n_over = 0
        self.sum_over = 0
        self._otok = 0
        self._lpm_sorted_epoch = -1
        self.max_prefill = int(sched.max_prefill_tokens)
        self._t_prefill = 0.0  # when the prefill batch being run was scheduled
        self._late: list[Row] = []  # rows whose first token the last prefill batch sampled
        self._late_end = 0.0  # when that batch ended

    def max_request_tokens(self) -> int:
        return self.kv.capacity_tokens - 1  # admission is a strict inequality

    # -- clipped remaining outputs ---------------------------------------------------------------------
    def _on_join(self, row: Row) -> None:
        rem0 = row.out - row.gb
        self.sum_rem0 += rem0
        t = rem0 - SGLANG_CLIP_MAX_NEW_TOKENS
        if t > self.G:
            self._otok += 1
            row.over_t, row.over_tok = t, self._otok
            heapq.heappush(self.over_heap, (t, self._otok, row))
            self.n_over += 1
            self.sum_over += t

    def _on_leave(self, row: Row) -> None:
        self._update_over()
        self.sum_rem0 -= row.out - row.gb
        if row.over_tok:
            self.n_over -= 1
            self.sum_over -= row.over_t
            row.over_tok = 0

    def _update_over(self) -> None:
        heap, G = self.over_heap, self.G
        while heap and heap[0][0] <= G:
            t, tok, row = heapq.heappop(heap)
            if row.over_tok == tok:
                self.n_over -= 1
                self.sum_over -= t
                row.over_tok = 0

    def _clipped_rem_d(self) -> int:
        self._update_over()
        G = self.G
        return (self.sum_rem0 - self.n_d * G) - (self.sum_over - self.n_over * G)

    def _reserved(self, ratio: float) -> float:
        """Tokens SGLang keeps back for the running requests' future outputs (and the rest of the
        chunked request, counted in full so no one takes its room)."""
        clip = SGLANG_CLIP_MAX_NEW_TOKENS
        s = self._clipped_rem_d()
        for row in self.prows:
            s += min(row.out - row.gen, clip)
        res = ratio * float(s)
        row = self.chunked
        if row is not None:
            res += (1.0 - ratio) * float(min(row.out - row.gen, clip))
            res += float(row.prompt + row.gen - row.comp)
        return res

    def _demand(self, req: SimRequest) -> tuple[int, int, Match]:
        known = req.prompt + req.generated
        m = self._match(req, known)
        return known - m.tokens, min(req.output - req.generated, SGLANG_CLIP_MAX_NEW_TOKENS), m

    def _sort_lpm(self) -> None:
        w = self.waiting
        if len(w) < 2 or len(w) > SGLANG_LPM_MAX_QUEUE:
            return
        items = list(w)
        items.sort(key=lambda r: -self._match(r, r.prompt + r.generated).tokens if not r.prebuilt else 0)
        self.waiting = deque(items)

    def _head_admissible(self) -> bool:
        if not self.waiting or self.n_alive >= self.max_seqs or self.chunked is not None:
            return False
        if self.policy == "lpm":
            self._sort_lpm()
        req = self.waiting[0]
        kv = self.kv
        if req.prebuilt:
            mn = min(req.output - 1, SGLANG_CLIP_MAX_NEW_TOKENS)
            return req.prompt + mn < kv.free * self.B - self._reserved(self.ratio)
        ext, mn, m = self._demand(req)
        return ext + mn + (m.revived + m.host_blocks) * self.B < kv.free * self.B - self._reserved(self.ratio)

    def schedule(self, now: float) -> Batch:
        """PrefillAdder's budgets: `rem_chunk` (--chunked-prefill-size) and `rem_input`
        (--max-prefill-tokens) both shrink by every entry's new tokens (and by the decodes mixed
        in); an entry after the first whose new tokens are >= rem_input closes the batch, one
        above rem_chunk is chunked to it."""
        kv, B = self.kv, self.B
        pre: list[tuple[Row, int, int]] = []
        rem_chunk = max(self.max_tokens, 256)
        rem_input = self.max_prefill
        n_mix = self.n_d if self.mixed_chunk else 0
        rem_chunk -= n_mix
        rem_input -= n_mix
        avail = kv.free * B - self._reserved(self.ratio)
        row = self.chunked
        if row is not None:
            comp = row.comp
            remaining = row.prompt + row.gen - comp
            chunk = min(remaining, rem_chunk)
            if chunk > 0:
                blocks = -(-(comp + chunk) // B) - -(-comp // B)
                kv.alloc(blocks)
                pre.append((row, chunk, comp))
                rem_chunk -= chunk
                rem_input -= chunk
                if chunk == remaining:
                    self.chunked = None
        if self.policy == "lpm" and self.waiting and self.chunked is None:
            self._sort_lpm()
        waiting = self.waiting
        while (waiting and rem_chunk > 0 and rem_input > 0 and self.chunked is None
               and self.n_alive < self.max_seqs):
            req = waiting[0]
            if req.prebuilt:
                mn = min(req.output - 1, SGLANG_CLIP_MAX_NEW_TOKENS)
                if req.prompt + mn >= avail or kv.blocks_for(req.prompt) > kv.free:
                    break
                waiting.popleft()
                self._start_prebuilt(req, now)
                avail -= req.prompt + mn
                continue
            ext, mn, m = self._demand(req)
            extra = (m.revived + m.host_blocks) * B
            if ext + mn + extra >= avail:
                break
            if ext >= rem_input and pre:
                break
            waiting.popleft()
            if m.host:
                self._start_host_load(req, m, now)
                avail -= extra
                continue
            h = m.gpu
            chunk = min(ext, rem_chunk)
            blocks = -(-(h + chunk) // B) - h // B
            row = self._admit(req, m, chunk, blocks)
            avail -= (ext + mn if chunk == ext else chunk) + extra
            if chunk < ext:
                self.chunked = row
            pre.append((row, chunk, h))
            rem_chunk -= chunk
            rem_input -= chunk
        if pre:
            self._decoded = False
            self._t_prefill = now
            n_d = 0
            ctx = 0.0
            if n_mix:
                need = self._need1()
                if need <= kv.free:
                    kv.alloc(need)
                    n_d = self.n_d
                    ctx = (self.sum_cb + n_d * self.G) / n_d + 1.0
            self.batch = b = Batch(n_d, ctx, pre)
            return b
        n = self.n_d
        if n == 0:
            self.batch = EMPTY
            return EMPTY
        need = self._need1()
        if need > kv.free:
            self._retract()
            need = self._need1()
        kv.alloc(need)
        self._decoded = True
        n = self.n_d
        self.batch = b = Batch(n, (self.sum_cb + n * self.G) / n + 1.0, pre)
        return b

    def commit(self, t_end: float) -> list[SimRequest]:
        """As the base, then the overlap scheduler's late first tokens (as
        scheduler.SglangScheduler.commit, through scheduler.hand_out_late)."""
        pre = self.batch.pre
        if not pre:
            self._late = []
            return super().commit(t_end)
        if self._late:
            hand_out_late([row.req for row in self._late], self._late_end, self._t_prefill, t_end, self.delay)
            for row in self._late:
                if row in self.joiners:  # the first decode gap starts at the late first token
                    self.joiners[row] = row.req.t_last
        fresh = [row for row, _, _ in pre if row.req.first_token is None]
        done = super().commit(t_end)
        self._late = [row for row in fresh if row.req.first_token is not None and row.req.finish is None]
        self._late_end = t_end
        return done

    def _retract(self) -> None:
        """SGLang retract_decode: drop the requests with the fewest outputs (then the longest
        prompts) until 20 decode steps of the rest fit, and raise new_token_ratio to the share of
        output the survivors have produced."""
        kv, G = self.kv, self.G
        rows = sorted(self.drows, key=lambda r: (r.gb + G, -r.prompt, r.seq))
        left = len(rows)
        for row in rows:
            if left <= 1:
                break
            if kv.free * kv.block_size >= SGLANG_RETRACT_DECODE_STEPS * left:
                break
            self._preempt(row, to_head=True)
            left -= 1
        assert self._need1() <= kv.free, "one request alone does not fit the KV pool"
        decoded = 0
        total = 0
        for row in self.drows:
            decoded += row.gb + G
            total += row.out
        self.ratio = min(1.0, (float(decoded) + SGLANG_RETRACT_DECODE_STEPS * self.n_d) / max(float(total), 1.0))

    def _after_step(self, k: int) -> None:
        if self._decoded:
            self.ratio = max(self.min_ratio, self.ratio - self.decay * k)

    def advance_decode(self, k: int, ends: list[float]) -> list[SimRequest]:
        self._decoded = True
        return super().advance_decode(k, ends)

    def decode_run_limit(self) -> int | None:
        if not self.n_d:
            return self.idle_limit()
        n = self.n_alive
        if self.chunked is not None or self.prows or self._head_admissible():
            return 0
        first = self._need1()
        free = self.kv.free
        if first > free:
            return 0
        k = self._run_to_event()
        if k >= 1 and self.waiting and n < self.max_seqs:
            # Admission can open up during the run (the reservation shrinks with the remaining
            # outputs and the decaying ratio): find the first step after which the head fits.
            req = self.waiting[0]
            if req.prebuilt:
                ext, mn, extra = req.prompt, min(req.output - 1, SGLANG_CLIP_MAX_NEW_TOKENS), 0
            else:
                ext, mn, m = self._demand(req)
                extra = (m.revived + m.host_blocks) * self.B
            j = np.arange(1, k + 1)
            cum = self.blocks_upto(k)
            ratio = np.maximum(self.min_ratio, self.ratio - self.decay * j)
            self._update_over()
            G = self.G
            base = (self.sum_rem0 - n * G) - n * j
            if self.n_over:
                excess = np.sort(np.array([t - G for t, tok, r in self.over_heap if r.over_tok == tok],
                                          dtype=np.int64))
                suffix = np.concatenate([np.cumsum(excess[::-1])[::-1], [0]])
                idx = np.searchsorted(excess, j, side="right")
                base = base - (suffix[idx] - j * (excess.size - idx))
            reserved = ratio * base
            ok = ext + mn + extra < (free - cum) * self.B - reserved
            if ok.any():
                k = int(np.argmax(ok)) + 1
        return k

    def accepts_arrivals(self) -> bool:
        return (self.policy == "lpm" or not self.waiting) and self.n_alive < self.max_seqs and self.chunked is None


class AtomCore(Core):
    """ATOM (atom/model_engine/scheduler.py, nano-vLLM lineage) and vLLM V0 without chunked
    prefill: prefill-only batches first, whole-sequence block allocation at admission, decode of
    all running requests with preemption of the newest when a block cannot be appended."""

    def __init__(self, sched: EngineSched, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(sched, *args, **kwargs)

    def _head_fits(self, free: int) -> bool:
        if not self.waiting or self.n_alive >= self.max_seqs:
            return False
        return self._head_kv_fits(free, self.max_tokens, reserve_prompt=True)

    def schedule(self, now: float) -> Batch:
        kv, B = self.kv, self.B
        budget = self.max_tokens
        pre: list[tuple[Row, int, int]] = []
        for row in self.prows:
            if budget <= 0:
                break
            comp = row.comp
            chunk = min(row.prompt + row.gen - comp, budget)
            pre.append((row, chunk, comp))  # its blocks were allocated at admission
            budget -= chunk
        # ATOM reserves a prompt's blocks at admission (its chunks never wait for KV mid-prompt).
        budget = self._admit_waiting(now, budget, pre, reserve_prompt=True)
        if pre:
            self.batch = b = Batch(0, 0.0, pre)
            return b
        if self.n_d == 0:
            self.batch = EMPTY
            return EMPTY
        need = self._need1()
        while need > kv.free:
            victim = self._newest()
            if victim.in_d and (victim.cb + self.G) % B == 0:
                need -= 1
            self._preempt(victim)
        kv.alloc(need)
        n = self.n_d
        self.batch = b = Batch(n, (self.sum_cb + n * self.G) / n + 1.0, pre)
        return b

    def decode_run_limit(self) -> int | None:
        if not self.n_d:
            return self.idle_limit()
        if self.prows:
            return 0
        free = self.kv.free
        if self._head_fits(free):
            return 0
        if self._need1() > free:
            return 0
        return self._run_to_event()

    def accepts_arrivals(self) -> bool:
        return not self.waiting and self.n_alive < self.max_seqs


def core_class(engine: str, mixed: bool) -> type[Core]:
    """The policy of an engine: vLLM V1 (mixed) or V0 (prefill first), SGLang, ATOM."""
    if engine == "sglang":
        return SglangCore
    if engine == "atom":
        return AtomCore
    return VllmCore if mixed else AtomCore
