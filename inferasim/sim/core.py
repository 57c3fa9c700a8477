"""What every engine scheduler shares (:class:`Core`, one per attention-dp rank; the policies are
in :mod:`inferasim.sim.engines`, run by the trace simulator, the closed-loop simulator and the
emulator): the queue, admission of a row with its prefix match and KV blocks, prefix and host-tier
KV, decode runs, finishes and preemption.

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
from inferasim.sim.prefix import NO_MATCH, KVPool, Match
from inferasim.sim.request import EMPTY, Batch, Row, SimRequest


class Core:
    """State and bookkeeping common to the policies; subclasses decide what runs."""

    min_compute = 1
    ratio_hook = False  # the policy evolves per step (SGLang's new_token_ratio): call _after_step
    row_hooks = False  # the policy keeps aggregates over decoding rows (SGLang): call _on_join/_on_leave

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
        self._tidy_at = 64
        self.waiting: deque[SimRequest] = deque()
        self.loading: list[tuple[float, int, int, object]] = []  # (ready, seq, kind, row or request)
        self.n_loading_rows = 0
        self._lseq = 0
        self._seq = 0
        self._stamp = 0
        self.preemptions = 0
        # The most rows alive at once (n_alive, which every max_num_seqs check compares): a replay
        # whose peak stayed below the limit is the same replay under any limit above the peak
        # (search.stage2 shares it across candidates that differ only in max_num_seqs).
        self.peak_alive = 0
        self.batch: Batch = EMPTY
        # Token timing (see the module docstring).
        self.E: list[float] = []
        self.e_off = 0  # absolute index of E[0]: a streaming report drops E's head (sim/tally.py)
        self.cont: list[int] = []
        self.gaps: list[float] = []
        self.joiners: dict[Row, float] = {}
        self.finished: list[SimRequest] = []  # since the report's last flush
        self.open_segs: list[tuple[SimRequest, int, int]] = []  # (request, first, last) step ranges, unfolded
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
        req._m, req._m_epoch = NO_MATCH, -1  # spent (see _admit)
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
        self.peak_alive = max(self.peak_alive, self.n_alive)
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
        nodes = m.nodes
        if nodes:
            kv.take(nodes)
        if req.pinned is not None:
            kv.drop(req.pinned)
            req.pinned = None
        kv.alloc(blocks)
        self._seq += 1
        b = self.B
        g = m.gpu
        # The match is spent: the row takes its nodes (NO_MATCH's list is shared), the request drops
        # it (kept, the run's matches outlive it as young objects that the collector scans once
        # re-enabled). A preempted request matches afresh: the same answer, keyed by the epoch.
        row = Row(req, self._seq, g, req.generated, g // b if b > 1 else g, nodes if m is not NO_MATCH else [], upto)
        row.reg_tok, row.tail_open = m.chain_end, m.tail_open
        req._m, req._m_epoch = NO_MATCH, -1
        self._count_first(req, g, 0)
        self.prows.append(row)
        self.order.append(row)
        self.peak_alive = max(self.peak_alive, self.n_d + len(self.prows) + self.n_loading_rows)  # n_alive
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
        if self.row_hooks:
            self._on_join(row)

    def _leave(self, row: Row) -> None:
        G = self.G
        if self.row_hooks:
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
            self.open_segs.append((row.req, row.i0, i1))

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
            G = self.G = self.G + 1
            self._record_decode(t_end, b.n_dec)
            heap = self.fin_heap
            if heap and heap[0][0] <= G:
                for row in self._pop_finished():
                    done.append(self._finish(row, t_end))
        pre = b.pre
        if pre:
            kv, delay, B, tokens = self.kv, self.delay, self.B, 0
            caching = kv.caching
            for row, chunk, _ in pre:
                comp = row.comp = row.comp + chunk
                tokens += chunk
                req = row.req
                if caching and not row.reg_stop and req.ids is not None and \
                        (comp if comp < req.id_tokens else req.id_tokens) >= row.reg_tok + B:
                    kv.register(row, comp)
                if comp == row.prompt + row.gen:
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
            self.prefill_tokens += tokens
        if self.ratio_hook:
            self._after_step(1)
        if len(self.order) > self._tidy_at:
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
        if len(self.order) > self._tidy_at:
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
        comp = row.comp
        if req.ids is not None and not row.reg_stop and kv.caching and \
                (comp if comp < req.id_tokens else req.id_tokens) >= row.reg_tok + self.B:
            kv.register(row, comp)
        if row.nodes:
            kv.drop(row.nodes)
        held = comp if comp > row.upto else row.upto
        kv.release(-(-held // self.B) - row.shared)  # kv.blocks_for(held)
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
        # Dead rows are skipped wherever `order` is read: when they go is only a cost (here: once it doubled).
        self.order = [r for r in self.order if r.alive]
        self._tidy_at = 2 * len(self.order) + 64

    # -- for drivers that follow requests token by token (the emulator) -------------------------
    def running(self) -> tuple[list[SimRequest], list[int]]:
        """The admitted requests in admission order and the tokens each has sampled (a decoding
        row's count lives in the counter G until it leaves; see the module docstring)."""
        G = self.G
        reqs, gens = [], []
        for row in self.order:
            if row.alive:
                reqs.append(row.req)
                gens.append(row.gb + G if row.in_d else row.gen)
        return reqs, gens

    def cut_short(self, req: SimRequest) -> bool:
        """Make an admitted request finish at its next sampled token (a client that went away:
        its KV is released the ordinary way). False when it is not admitted here."""
        for row in self.order:
            if row.alive and row.req is req:
                break
        else:
            return False
        if not row.in_d:
            row.out = min(row.out, row.gen + 1)
            return True
        # A decoding row's finish is keyed in the heap (and SGLang's clipped outputs) by `out`:
        # leave those aggregates, change it, and enter them again under a new join stamp.
        self._on_leave(row)
        row.out = min(row.out, row.gb + self.G + 1)
        row.fin = row.out - row.gb
        self._jt += 1
        row.jt = self._jt
        heapq.heappush(self.fin_heap, (row.fin, row.seq, row.jt, row))
        self._on_join(row)
        return True

    def drop_records(self, keep: int = 4096) -> None:
        """Forget the token-timing records only the trace simulator's report reads (decode-step
        end times, gaps, finished requests), so that a driver that never reports (the emulator,
        running for days) does not grow them without end. The last step end stays: a preempted
        row's last token time may be read from it."""
        E = self.E
        if len(E) <= keep and len(self.finished) <= keep:
            return
        self.e_off += len(E) - 1
        del E[:-1]
        self.cont.clear()
        self.gaps.clear()
        self.finished.clear()
        self.open_segs.clear()

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
        prows, B = self.prows, self.B
        # n_alive, kv.free and _new_blocks(..., False) written out: this loop runs at every step.
        while waiting and budget > 0 and self.n_d + len(prows) + self.n_loading_rows < max_seqs:
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
            chunk = known - h if known - h < budget else budget
            blocks = self._new_blocks(known, h, chunk, True) if reserve_prompt else -(-(h + chunk) // B) - h // B
            if blocks + m.revived > kv.total - kv.used + kv.evictable:
                break
            waiting.popleft()
            row = self._admit(req, m, chunk, blocks, upto=known) if reserve_prompt else self._admit(req, m, chunk,
                                                                                                   blocks)
            pre.append((row, chunk, h))
            budget -= chunk
        return budget
