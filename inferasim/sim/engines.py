"""Engine schedulers, one per attention-dp rank (DESIGN.md section 4): each engine's policy,
written once, for every discrete-event user: the trace simulator (`inferasim.sim.replica`), the
closed-loop benchmark simulator (`inferasim.sim.des`) and the emulator
(`inferasim.emulator.engine`). They add what real traffic needs on top of the policies: a prefix
cache, a host KV tier and KV that arrives from a prefill pool (the closed loop and the emulator
run without them, `make_core(..., caching=False)`). The closed form of the same policies is
`inferasim.model.steady`, the fast path of predict and tune; tests/unit/test_des.py checks it
against these schedulers run request by request.

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

The machinery the three share (queue, admission, prefix and host KV, decode runs, preemption, and
how tokens are timed) is :class:`inferasim.sim.core.Core`; the request types are in
:mod:`inferasim.sim.request`.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from inferasim.model.steady import SGLANG_CONSECUTIVE_PREFILL_DELAY, EngineSched
from inferasim.sim.core import Core
from inferasim.sim.prefix import Match
from inferasim.sim.request import EMPTY, Batch, Row, SimRequest

# SGLang scheduler constants (python/sglang/global_config.py, srt/managers/scheduler.py and
# schedule_policy.py): new_token_ratio starts at 0.7 and decays linearly over 600 decode steps to
# 0.7 x 0.14; max_new_tokens estimates are clipped at 4096; a retraction frees room for 20 decode
# steps of the remaining requests. --max-prefill-tokens comes with the deployment
# (EngineSched.max_prefill_tokens).
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
SGLANG_RETRACT_DECODE_STEPS = 20
SGLANG_LPM_MAX_QUEUE = 128  # schedule_policy.py: longer queues fall back to fcfs


def hand_out_late(late: list[SimRequest], t_prev: float, t_start: float, t_end: float, delivery: float) -> None:
    """SGLang's late first tokens (SGLANG_CONSECUTIVE_PREFILL_DELAY): the overlap scheduler reads
    a prefill batch's results only after launching the next batch. `late` are the requests whose
    first token the prefill batch that ended at `t_prev` sampled; when the batch that ran next was
    another prefill and started right away (`t_start` == `t_prev`), their first token leaves that
    share of it late (never after it ends, so before any second token)."""
    if not late or t_start > t_prev + 1e-12:
        return
    t_tok = t_prev + SGLANG_CONSECUTIVE_PREFILL_DELAY * (t_end - t_prev)
    for req in late:
        req.first_token = t_tok + delivery
        req.t_last = t_tok


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
        # _need1 and kv.free written out: once or more per step.
        need = self.n_d if B == 1 else self.hist[(-self.G) % B]
        preempted = False
        if need > kv.total - kv.used + kv.evictable:
            # V1 pops the newest running request until the older ones fit.
            while need > kv.free:
                victim = self._newest()
                if victim.in_d and (victim.cb + self.G) % B == 0:
                    need -= 1
                self._preempt(victim)
                preempted = True
        # The decode blocks are allocated with the first continuing prefill's when no preemption
        # comes between: without a host tier, evicting a then b blocks from the head of the LRU
        # is evicting a + b (the same pool, one eviction call less per step).
        owed = need if not kv.host_cap else 0
        if need and not owed:
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
                chunk = row.prompt + row.gen - comp
                if chunk > budget:
                    chunk = budget
                blocks = -(-(comp + chunk) // B) - -(-comp // B)
                if blocks + owed > kv.total - kv.used + kv.evictable:
                    if owed:
                        kv.alloc(owed)
                        owed = 0
                    while blocks > kv.total - kv.used + kv.evictable and row.alive:
                        self._preempt(self._newest_unserved(stamp))
                        preempted = True
                    if not row.alive:
                        break  # preempted itself: V1 stops scheduling the running queue
                kv.alloc(blocks + owed)
                owed = 0
                row.served = stamp
                pre.append((row, chunk, comp))
                budget -= chunk
        if owed:
            kv.alloc(owed)
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
        n_d = self.n_d
        if not n_d:
            return self.idle_limit()
        if self.prows:
            return 0
        n = n_d + self.n_loading_rows  # n_alive, written out (as _need1 and kv.free): at every step
        if n > self.max_tokens:
            return 0
        B = self.B
        first = n_d if B == 1 else self.hist[(-self.G) % B]
        kv = self.kv
        free = kv.total - kv.used + kv.evictable
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
    row_hooks = True

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
        """As the base, then the overlap scheduler's late first tokens (hand_out_late): those of
        the previous prefill batch move into this one when this one is a prefill batch too."""
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

    @property
    def held_first_tokens(self) -> list[SimRequest]:
        """Requests whose first token the last prefill batch sampled: when it leaves depends on
        the next step (late if that is a prefill batch launched back to back; see commit). The
        emulator holds their delivery until it knows."""
        return [row.req for row in self._late]

    def release_on_time(self) -> None:
        """A decode step follows (the emulator's decode runs): the held first tokens keep their
        on-time stamp."""
        self._late = []

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


def make_core(sched: EngineSched, kv_capacity_tokens: int, delivery_delay: float = 0.0, *,
              caching: bool = False) -> Core:
    """The scheduler `sched` describes, as the closed-loop simulator and the emulator run it: the
    engine's own policy (`sched.engine`, and `sched.mixed` for vLLM V1 or V0 and SGLang's
    --enable-mixed-chunk), no prefix cache unless asked (their prompts share nothing), no host
    tier, no KV from a prefill pool."""
    mixed = bool(sched.mixed)
    return core_class(sched.engine, mixed)(sched, kv_capacity_tokens, delivery_delay, caching=caching,
                                           mixed_chunk=mixed and sched.engine == "sglang")
