"""Engine schedulers of the discrete-event simulator (DESIGN.md section 4), one per dp rank.

Two policies share one interface, used by the closed-loop simulator (`inferasim.sim.des`) and the
emulator. The trace simulator runs the same policies (and ATOM's), extended with the prefix cache,
the host KV tier and KV arriving from a prefill pool, on the faster schedulers of
`inferasim.sim.engines`; a test checks that both make the same decisions step for step.

- `VllmScheduler` (vLLM V1, `EngineSched.mixed`): every step the running requests first (decodes
  one token each, partially prefilled requests their next chunk), then the leftover of
  `max_num_batched_tokens` to waiting requests in FCFS order, bounded by `max_num_seqs` and free
  KV blocks. A decode that finds no free block preempts the newest running request by recompute.
- `SglangScheduler` (SGLang without mixed chunking): a prefill-only batch whenever the head of
  the queue passes SGLang's KV admission check (prompt + clipped max_new_tokens against free
  tokens minus `new_token_ratio` x the running requests' remaining outputs), else one decode-only
  batch of all running requests; retraction when a decode step does not fit. A prefill batch
  keeps to the chunk size and to `--max-prefill-tokens` (PrefillAdder), and its first tokens
  leave late when another prefill batch follows it (the overlap scheduler).

The interface the event loop uses:
    enqueue(req)              a request reached this rank
    schedule(now) -> Batch    the next step's work (allocates its KV)
    commit(batch, t_end)      apply a step; returns the requests that finished
    decode_run_limit()        how many pure-decode steps with unchanged membership follow
    decode_state()            (batch, mean context at the first of those steps)
    advance_decode(k, t_end)  apply k such steps at once
    accepts_arrivals()        could a new arrival change the next step?

Running requests live in a struct of numpy arrays (`RunningSet`, with `Request` and `Batch` in
`inferasim.sim.running`), not in Python objects: a step touches all of them, and the vectorised
form is what keeps the simulator usable inside searches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Any

import numpy as np

from inferasim.model.steady import SGLANG_CONSECUTIVE_PREFILL_DELAY, EngineSched
from inferasim.sim.kvcache import DecodeBlocks, KVCache
from inferasim.sim.running import Batch, Request, RunningSet


class Scheduler(ABC):
    """State and bookkeeping common to the engine policies; subclasses decide what runs."""

    def __init__(self, sched: EngineSched, kv_capacity_tokens: int, delivery_delay: float = 0.0) -> None:
        self.sched = sched
        self.kv = KVCache(kv_capacity_tokens, sched.block_size)
        self.run = RunningSet()
        self.waiting: deque[Request] = deque()
        self.reqs: dict[int, Request] = {}
        self.delay = delivery_delay  # client-side latency added to every delivered token
        self._seq = 0  # admission counter: larger = newer
        self.preemptions = 0
        self._all_decode = True  # every running row is decoding (kept by commit)
        self._prof: DecodeBlocks | None = None  # block profile of the current decode batch

    # -- queue -----------------------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        self.reqs[req.rid] = req
        self.waiting.append(req)

    def max_request_tokens(self) -> int:
        """The longest prompt + output this rank can ever run (whole pool, nothing else running)."""
        return self.kv.capacity_tokens

    def _admit(self, req: Request, chunk: int) -> int:
        """Move the head of the queue into the running set with `chunk` prompt tokens scheduled."""
        self.kv.allocate(self.kv.blocks_for(chunk))
        self._seq += 1
        return self.run.add(req.rid, req.prompt, req.output, req.generated, 0, self._seq)

    def _preempt(self, row: int, to_head: bool = True) -> None:
        """Recompute preemption: drop the row's KV; its sampled tokens stay and are re-prefilled."""
        r = self.run
        req = self.reqs[int(r.rid[row])]
        req.generated = int(r.gen[row])
        req.preemptions += 1
        self.preemptions += 1
        self.kv.free(self.kv.blocks_for(int(r.comp[row])))
        r.kill(row)
        self._prof = None
        if to_head:
            self.waiting.appendleft(req)
        else:
            self.waiting.append(req)

    # -- policy ----------------------------------------------------------------------------------
    @abstractmethod
    def schedule(self, now: float) -> Batch:
        """Choose the next step's work and allocate its KV (may preempt)."""

    @abstractmethod
    def decode_run_limit(self) -> int | None:
        """None when the rank is idle; 0 when the next step is not a pure decode step of all
        running requests; else k >= 1 such steps that can run with no finish, KV shortage or
        admission in between (arrivals are the event loop's business)."""

    @abstractmethod
    def accepts_arrivals(self) -> bool:
        """Whether a request arriving now could join the next step (False when the queue head is
        blocked or the running set is full: an arrival then changes nothing)."""

    # -- applying steps --------------------------------------------------------------------------
    def commit(self, batch: Batch, t_end: float) -> list[Request]:
        r = self.run
        if batch.dec_rows.size:
            r.comp[batch.dec_rows] += 1
        if batch.pre_rows:
            pre = np.asarray(batch.pre_rows, dtype=np.int64)
            r.comp[pre] += np.asarray(batch.pre_chunks, dtype=np.int64)
            touched = np.concatenate([batch.dec_rows, pre])
        else:
            touched = batch.dec_rows
        sampled = touched[r.comp[touched] == r.prompt[touched] + r.gen[touched]]
        r.gen[sampled] += 1
        self._after_step(1)
        if batch.pre_rows:
            t_tok = t_end + self.delay
            for row in sampled[r.gen[sampled] == 1]:
                req = self.reqs[int(r.rid[row])]
                if req.first_token is None:
                    req.first_token = t_tok
        done = sampled[r.gen[sampled] >= r.out[sampled]]
        finished = self._finish(done, t_end)
        r.compact()
        n = r.n
        self._all_decode = bool(np.all((r.gen[:n] >= 1) & (r.comp[:n] == r.prompt[:n] + r.gen[:n] - 1)))
        self._prof = None
        return finished

    def _finish(self, rows: np.ndarray, t_end: float) -> list[Request]:
        r = self.run
        out = []
        for row in rows:
            req = self.reqs.pop(int(r.rid[row]))
            req.generated = int(r.gen[row])
            req.finish = t_end + self.delay
            if req.first_token is None:  # output == 1 and first token in the same step
                req.first_token = req.finish
            self.kv.free(self.kv.blocks_for(int(r.comp[row])))
            r.kill(int(row))
            out.append(req)
        return out

    def _after_step(self, k: int) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Hook: policy state that evolves per step (SGLang's new_token_ratio)."""

    def decode_state(self) -> tuple[int, float]:
        """Rows of the pure decode batch and their mean context at its first step."""
        n = self.run.n
        return n, float(self.run.comp[:n].mean()) + 1.0

    def advance_decode(self, k: int, t_end: float) -> list[Request]:
        """Apply k pure decode steps of every running row at once (checked by decode_run_limit)."""
        r = self.run
        n = r.n
        self.kv.allocate(self._profile().at(k))
        r.comp[:n] += k
        r.gen[:n] += k
        self._after_step(k)
        done = np.flatnonzero(r.gen[:n] >= r.out[:n])
        finished = self._finish(done, t_end) if done.size else []
        r.compact()
        self._prof = None
        return finished

    # -- helpers for the run limit -----------------------------------------------------------------
    def _profile(self) -> DecodeBlocks:
        if self._prof is None:
            self._prof = self.kv.decode_profile(self.run.comp[: self.run.n])
        return self._prof

    def _run_to_event(self) -> tuple[int, np.ndarray | None]:
        """Steps until the first finish, capped where decode blocks run out; also the cumulative
        blocks per step when they were needed (None when the pool is ample)."""
        r = self.run
        n = r.n
        k_fin = int((r.out[:n] - r.gen[:n]).min())
        free = self.kv.free_blocks
        prof = self._profile()
        if prof.at(k_fin) <= free:
            return k_fin, None
        cum = prof.upto(k_fin)
        return int(np.searchsorted(cum, free, side="right")), cum


class VllmScheduler(Scheduler):
    """vLLM V1 (vllm/v1/core/sched/scheduler.py), chunked prefill on, no prefix cache."""

    def schedule(self, now: float) -> Batch:
        r, kv = self.run, self.kv
        n = r.n
        budget = self.sched.max_batched_tokens
        known = r.prompt[:n] + r.gen[:n]
        comp = r.comp[:n]
        is_dec = (r.gen[:n] >= 1) & (comp == known - 1)
        dec = np.flatnonzero(is_dec)
        if dec.size > budget:  # more decodes than the token budget: the oldest go first
            dec = np.sort(dec[np.argsort(r.seq[dec], kind="stable")[:budget]])
        need = (comp[dec] % kv.block_size == 0).astype(np.int64)  # writing a token that opens a block
        total = int(need.sum())
        preempted = False
        if total > kv.free_blocks:
            # V1 pops the newest running request until the older ones fit; it is never one that
            # was already served this step, so the oldest decodes keep their blocks.
            dec_need = np.zeros(n, dtype=np.int64)
            dec_need[dec] = need
            for row in np.argsort(-r.seq[:n], kind="stable"):
                if total <= kv.free_blocks:
                    break
                self._preempt(int(row))
                total -= int(dec_need[row])
                preempted = True
            keep = r.alive[dec]
            dec = dec[keep]
        kv.allocate(total)
        budget -= int(dec.size)
        batch = Batch(dec_rows=dec, ctx_dec=float(comp[dec].mean()) + 1.0 if dec.size else 0.0)
        # Partially prefilled (or recomputing) requests continue, oldest first.
        part = np.flatnonzero(~is_dec & r.alive[:n])
        if part.size:
            served = np.zeros(n, dtype=bool)
            served[dec] = True
            for row in part[np.argsort(r.seq[part], kind="stable")]:
                row = int(row)
                if budget <= 0:
                    break
                if not r.alive[row]:
                    continue
                chunk = min(int(known[row] - comp[row]), budget)
                blocks = int(kv.blocks_needed(int(comp[row]), chunk))
                while blocks > kv.free_blocks and r.alive[row]:
                    # The newest request not yet served this step (V1 pops the running queue's
                    # tail, which is never one it already scheduled); possibly this one.
                    cand = np.flatnonzero(r.alive[:n] & ~served)
                    victim = int(cand[np.argmax(r.seq[cand])])
                    self._preempt(victim)
                    preempted = True
                if not r.alive[row]:
                    break  # preempted itself: V1 stops scheduling the running queue
                kv.allocate(blocks)
                served[row] = True
                batch.pre_rows.append(row)
                batch.pre_chunks.append(chunk)
                batch.pre_starts.append(int(comp[row]))
                budget -= chunk
        # Waiting requests, FCFS; V1 admits none in a step that preempted.
        if not preempted:
            max_seqs = self.sched.max_num_seqs
            while self.waiting and budget > 0 and r.n_alive < max_seqs:
                req = self.waiting[0]
                chunk = min(req.prompt + req.generated, budget)
                if kv.blocks_for(chunk) > kv.free_blocks:
                    break
                self.waiting.popleft()
                batch.pre_rows.append(self._admit(req, chunk))
                batch.pre_chunks.append(chunk)
                batch.pre_starts.append(0)
                budget -= chunk
        return batch

    def _head_admissible(self, n: int, free_blocks: int) -> bool:
        budget = self.sched.max_batched_tokens - n
        if not self.waiting or budget <= 0 or n >= self.sched.max_num_seqs:
            return False
        req = self.waiting[0]
        return self.kv.blocks_for(min(req.prompt + req.generated, budget)) <= free_blocks

    def decode_run_limit(self) -> int | None:
        n = self.run.n
        if n == 0:
            return None if not self.waiting else 0
        if n > self.sched.max_batched_tokens or not self._all_decode:
            return 0
        first = self._profile().at(1)
        if first > self.kv.free_blocks:
            return 0
        # Blocks only get scarcer during a decode run, so a head blocked now stays blocked.
        if self._head_admissible(n, self.kv.free_blocks - first):
            return 0
        k, _ = self._run_to_event()
        return k

    def accepts_arrivals(self) -> bool:
        n = self.run.n
        return not self.waiting and n < self.sched.max_num_seqs and n < self.sched.max_batched_tokens


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


def hand_out_late(late: list[Any], t_prev: float, t_start: float, t_end: float, delivery: float) -> None:
    """SGLang's late first tokens (SGLANG_CONSECUTIVE_PREFILL_DELAY): the overlap scheduler reads
    a prefill batch's results only after launching the next batch. `late` are the requests whose
    first token the prefill batch that ended at `t_prev` sampled; when the batch that ran next was
    another prefill and started right away (`t_start` == `t_prev`), their first token leaves that
    share of it late (never after it ends, so before any second token). Shared with
    engines.SglangCore; requests of either simulator carry `first_token` (and engines' `t_last`)."""
    if not late or t_start > t_prev + 1e-12:
        return
    t_tok = t_prev + SGLANG_CONSECUTIVE_PREFILL_DELAY * (t_end - t_prev)
    for req in late:
        req.first_token = t_tok + delivery
        if getattr(req, "t_last", None) is not None:
            req.t_last = t_tok


def _sum_clipped(rem: np.ndarray, steps: np.ndarray, clip: int) -> np.ndarray:
    """sum_i min(rem_i - j, clip) for every j in `steps`, in O(N log N + len(steps))."""
    base = int(rem.sum()) - rem.size * steps
    excess = np.sort(rem - clip)
    excess = excess[excess > 0]
    if not excess.size:
        return base
    suffix = np.concatenate([np.cumsum(excess[::-1])[::-1], [0]])
    idx = np.searchsorted(excess, steps, side="right")
    over = suffix[idx] - steps * (excess.size - idx)
    return base - over


class SglangScheduler(Scheduler):
    """SGLang (srt/managers/scheduler.py + schedule_policy.PrefillAdder), fcfs, no radix hits,
    `--enable-mixed-chunk` off: prefill and decode never share a step."""

    def __init__(self, sched: EngineSched, kv_capacity_tokens: int, delivery_delay: float = 0.0) -> None:
        super().__init__(sched, kv_capacity_tokens, delivery_delay)
        self.chunked_row: int | None = None  # the one request SGLang prefills in chunks
        self.ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        self.min_ratio = SGLANG_INIT_NEW_TOKEN_RATIO * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
        self.decay = (SGLANG_INIT_NEW_TOKEN_RATIO - self.min_ratio) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        self._decoded = False  # the last step was a decode step (the ratio decays per decode)
        self._t_prefill = 0.0  # when the prefill batch being run was scheduled
        self._late: list[Request] = []  # first tokens of the last prefill batch, maybe late
        self._late_end = 0.0  # when that batch ended

    def max_request_tokens(self) -> int:
        return self.kv.capacity_tokens - 1  # admission is a strict inequality

    # -- admission -------------------------------------------------------------------------------
    def _reserved(self, ratio: float) -> float:
        """Tokens SGLang keeps back for the running requests' future outputs (and the rest of
        the chunked request, which this model counts in full so no one takes its room)."""
        r = self.run
        n = r.n
        rem = np.minimum(r.out[:n] - r.gen[:n], SGLANG_CLIP_MAX_NEW_TOKENS)
        res = ratio * float(rem.sum())
        if self.chunked_row is not None:
            row = self.chunked_row
            res += (1.0 - ratio) * float(rem[row])  # full output for the chunked one
            res += float(r.prompt[row] + r.gen[row] - r.comp[row])
        return res

    @staticmethod
    def _demand(req: Request) -> tuple[int, int]:
        return req.prompt + req.generated, min(req.output - req.generated, SGLANG_CLIP_MAX_NEW_TOKENS)

    def _head_admissible(self) -> bool:
        if not self.waiting or self.run.n >= self.sched.max_num_seqs or self.chunked_row is not None:
            return False
        ext, mn = self._demand(self.waiting[0])
        return ext + mn < self.kv.free_blocks * self.kv.block_size - self._reserved(self.ratio)

    def schedule(self, now: float) -> Batch:
        """PrefillAdder's budgets: `rem_chunk` (--chunked-prefill-size) and `rem_input`
        (--max-prefill-tokens) both shrink by every entry's new tokens; an entry after the first
        whose new tokens are >= rem_input closes the batch, one above rem_chunk is chunked to it."""
        r, kv = self.run, self.kv
        batch = Batch()
        rem_chunk = int(self.sched.prefill_chunk)
        rem_input = int(self.sched.max_prefill_tokens)
        avail = kv.free_blocks * kv.block_size - self._reserved(self.ratio)
        if self.chunked_row is not None:
            row = self.chunked_row
            remaining = int(r.prompt[row] + r.gen[row] - r.comp[row])
            chunk = min(remaining, rem_chunk)
            kv.allocate(kv.blocks_needed(int(r.comp[row]), chunk))
            batch.pre_rows.append(row)
            batch.pre_chunks.append(chunk)
            batch.pre_starts.append(int(r.comp[row]))
            rem_chunk -= chunk
            rem_input -= chunk
            if chunk == remaining:
                self.chunked_row = None
        while (self.waiting and rem_chunk > 0 and rem_input > 0 and self.chunked_row is None
               and r.n_alive < self.sched.max_num_seqs):
            ext, mn = self._demand(self.waiting[0])
            if ext + mn >= avail:
                break
            if ext >= rem_input and batch.pre_rows:
                break
            req = self.waiting.popleft()
            chunk = min(ext, rem_chunk)
            row = self._admit(req, chunk)
            avail -= ext + mn if chunk == ext else chunk
            if chunk < ext:
                self.chunked_row = row
            batch.pre_rows.append(row)
            batch.pre_chunks.append(chunk)
            batch.pre_starts.append(0)
            rem_chunk -= chunk
            rem_input -= chunk
        if batch.pre_rows:
            self._decoded = False
            self._t_prefill = now
            return batch
        n = r.n
        if n == 0:
            return batch
        need = int(kv.blocks_needed(r.comp[:n], 1).sum())
        if need > kv.free_blocks:
            self._retract()
            n = r.n
            need = int(kv.blocks_needed(r.comp[:n], 1).sum())
        kv.allocate(need)
        self._decoded = True
        rows = np.arange(n)
        batch.dec_rows = rows
        batch.ctx_dec = float(r.comp[rows].mean()) + 1.0
        return batch

    @property
    def held_first_tokens(self) -> list[Request]:
        """Requests whose first token the last prefill batch sampled: when it leaves depends on
        the next step (late if that is a prefill batch launched back to back; see commit)."""
        return self._late

    def release_on_time(self) -> None:
        """A decode step follows (the emulator's decode runs): the held first tokens keep their
        on-time stamp."""
        self._late = []

    def commit(self, batch: Batch, t_end: float) -> list[Request]:
        """As the base, then the overlap scheduler's late first tokens (hand_out_late): those of
        the previous prefill batch move into this one when this one is a prefill batch too."""
        if not batch.pre_rows:
            self._late = []
            return super().commit(batch, t_end)
        hand_out_late(self._late, self._late_end, self._t_prefill, t_end, self.delay)
        rid = self.run.rid
        fresh = [req for req in (self.reqs[int(rid[row])] for row in batch.pre_rows) if req.first_token is None]
        finished = super().commit(batch, t_end)
        # A request that finished with its first token is handed back now: it stays on time.
        self._late = [req for req in fresh if req.first_token is not None and req.finish is None]
        self._late_end = t_end
        return finished

    def _retract(self) -> None:
        """SGLang retract_decode: drop the requests with the fewest outputs (then the longest
        prompts) until 20 decode steps of the rest fit, and raise new_token_ratio to the share of
        output the survivors have produced."""
        r, kv = self.run, self.kv
        n = r.n
        order = np.lexsort((-r.prompt[:n], r.gen[:n]))  # fewest outputs first, longest prompt first
        left = n
        for row in order:
            if left <= 1:
                break
            if kv.free_blocks * kv.block_size >= SGLANG_RETRACT_DECODE_STEPS * left:
                break
            self._preempt(int(row), to_head=True)
            left -= 1
        alive = np.flatnonzero(r.alive[:n])
        need = int(kv.blocks_needed(r.comp[alive], 1).sum())
        assert need <= kv.free_blocks, "one request alone does not fit the KV pool"
        decoded = float(r.gen[alive].sum())
        total = float(r.out[alive].sum())
        self.ratio = min(1.0, (decoded + SGLANG_RETRACT_DECODE_STEPS * alive.size) / max(total, 1.0))
        r.compact()

    def _after_step(self, k: int) -> None:
        if self._decoded:
            self.ratio = max(self.min_ratio, self.ratio - self.decay * k)

    def advance_decode(self, k: int, t_end: float) -> list[Request]:
        self._decoded = True
        return super().advance_decode(k, t_end)

    def decode_run_limit(self) -> int | None:
        r = self.run
        n = r.n
        if n == 0:
            return None if not self.waiting else 0
        if self.chunked_row is not None or self._head_admissible():
            return 0
        first = self._profile().at(1)
        if first > self.kv.free_blocks:
            return 0
        k, cum = self._run_to_event()
        if k >= 1 and self.waiting and n < self.sched.max_num_seqs:
            # Admission can open up during the run (the reservation shrinks with the remaining
            # outputs and the decaying ratio): find the first step after which the head fits.
            j = np.arange(1, k + 1)
            cum = self._profile().upto(k) if cum is None else cum[:k]
            ratio = np.maximum(self.min_ratio, self.ratio - self.decay * j)
            rem = r.out[:n] - r.gen[:n]
            reserved = ratio * _sum_clipped(rem, j, SGLANG_CLIP_MAX_NEW_TOKENS)
            ext, mn = self._demand(self.waiting[0])
            ok = ext + mn < (self.kv.free_blocks - cum) * self.kv.block_size - reserved
            if ok.any():
                k = int(np.argmax(ok)) + 1
        return k

    def accepts_arrivals(self) -> bool:
        return not self.waiting and self.run.n < self.sched.max_num_seqs and self.chunked_row is None


def make_scheduler(sched: EngineSched, kv_capacity_tokens: int, delivery_delay: float = 0.0) -> Scheduler:
    """The policy `sched` describes: mixed steps are vLLM V1 style, separate ones SGLang style."""
    cls = VllmScheduler if sched.mixed else SglangScheduler
    return cls(sched, kv_capacity_tokens, delivery_delay)
